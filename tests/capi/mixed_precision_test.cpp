// bf16 and fp16 parameters with the fp32 outer state (docs/algorithm.md, "Mixed precision").
//
// The trajectories are checked against a float64 reference written here from the document:
// the parameters hold bf16/fp16 values (the reference rounds to nearest even with frexp and
// nearbyint, not with the library's bit tricks), every delta is taken from those rounded
// parameters against the rounded start the rank trained from, R(a) (a master copy's delta), and
// every parameter write rounds the result.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <algorithm>
#include <string>
#include <vector>

#include "co2/co2.h"
#include "runtime/outer/param_types.hpp"
#include "tests/capi/rank_threads.hpp"

namespace {

using co2test::run_ranks;

// ---- the reference's rounding (independent of runtime/outer/param_types.hpp) ----

struct Format {
  int precision;   // significant bits, the leading one included
  int min_exp;     // exponent of the smallest normal number
  double max;      // largest finite value
  co2_dtype_t dtype;
  const char* name;
};
const Format kBf16{8, -126, 0x1.fep127, CO2_DTYPE_BF16, "bf16"};
const Format kFp16{11, -14, 65504.0, CO2_DTYPE_FP16, "fp16"};
const Format kFp32{24, -126, 0x1.fffffep127, CO2_DTYPE_FP32, "fp32"};

double round_to(double x, const Format& f) {
  if (!std::isfinite(x) || x == 0.0) return x;
  int e;
  std::frexp(std::fabs(x), &e);  // |x| = m * 2^e, m in [0.5, 1): the leading bit is 2^(e-1)
  const int lead = std::max(e - 1, f.min_exp);
  const double ulp = std::ldexp(1.0, lead - (f.precision - 1));
  const double r = std::nearbyint(x / ulp) * ulp;  // the default rounding mode: ties to even
  return std::fabs(r) > f.max ? std::copysign(INFINITY, x) : r;
}

// ---- raw parameter storage of one dtype ----

struct Params {
  const Format* format;
  std::vector<uint16_t> half;  // bf16 / fp16 bits
  std::vector<float> single;   // fp32
  Params(const Format& f, size_t n) : format(&f) {
    if (f.dtype == CO2_DTYPE_FP32) single.assign(n, 0.0f);
    else half.assign(n, 0);
  }
  void* data() { return format->dtype == CO2_DTYPE_FP32 ? static_cast<void*>(single.data()) : half.data(); }
  float get(size_t i) const {
    switch (format->dtype) {
      case CO2_DTYPE_BF16: return co2::widen(co2::Bf16{half[i]});
      case CO2_DTYPE_FP16: return co2::widen(co2::Fp16{half[i]});
      default: return single[i];
    }
  }
  void set(size_t i, float v) {
    switch (format->dtype) {
      case CO2_DTYPE_BF16: half[i] = co2::narrow<co2::Bf16>(v).bits; break;
      case CO2_DTYPE_FP16: half[i] = co2::narrow<co2::Fp16>(v).bits; break;
      default: single[i] = v;
    }
  }
};

// ---- conversions ----

bool same_value(double a, double b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

// Floats from every binade of both formats, the halfway points between neighbours, and the edges.
std::vector<float> probe_floats() {
  std::vector<float> out = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 65504.0f, 65519.99f, 65520.0f, 65536.0f,
                            0x1.fep127f, 0x1.ffp127f, 0x1.fffffep127f, 0x1p-14f, 0x1p-24f, 0x1p-25f, 0x1.8p-25f,
                            0x1p-26f, 0x1p-126f, 0x1p-133f, 0x1p-134f, 0x1p-149f};
  uint32_t state = 12345u;
  for (int i = 0; i < 400000; ++i) {
    state = state * 1664525u + 1013904223u;
    uint32_t bits = state;
    // Half of them on or next to a tie of the 16-bit formats (low bits 0x8000 / 0x1000 +-1).
    if (i % 4 == 1) bits = (bits & 0xffff0000u) | 0x8000u;
    if (i % 4 == 2) bits = (bits & 0xffffe000u) | (0x1000u + (state >> 31) * 2u - 1u);
    float f;
    std::memcpy(&f, &bits, sizeof f);
    out.push_back(f);
  }
  return out;
}

TEST(MixedPrecision, ConversionsRoundToNearestEven) {
  for (uint32_t bits = 0; bits < 0x10000u; ++bits) {
    // Widening is exact: every 16-bit value rounds back to itself.
    const float b = co2::widen(co2::Bf16{uint16_t(bits)});
    const float h = co2::widen(co2::Fp16{uint16_t(bits)});
    ASSERT_TRUE(same_value(round_to(b, kBf16), b)) << std::hex << bits;
    ASSERT_TRUE(same_value(round_to(h, kFp16), h)) << std::hex << bits;
    if (!std::isnan(b)) {
      ASSERT_EQ(co2::narrow<co2::Bf16>(b).bits, bits) << std::hex << bits;
    }
    if (!std::isnan(h)) {
      ASSERT_EQ(co2::narrow<co2::Fp16>(h).bits, bits) << std::hex << bits;
    }
  }
  // fp16 decoding of a few known values, against the format's definition.
  EXPECT_EQ(co2::widen(co2::Fp16{0x3c00}), 1.0f);
  EXPECT_EQ(co2::widen(co2::Fp16{0x7bff}), 65504.0f);
  EXPECT_EQ(co2::widen(co2::Fp16{0x0001}), 0x1p-24f);
  EXPECT_EQ(co2::widen(co2::Fp16{0xc000}), -2.0f);
  EXPECT_EQ(co2::widen(co2::Bf16{0x3f80}), 1.0f);
  for (float x : probe_floats()) {
    ASSERT_TRUE(same_value(co2::widen(co2::narrow<co2::Bf16>(x)), round_to(x, kBf16))) << std::hexfloat << x;
    ASSERT_TRUE(same_value(co2::widen(co2::narrow<co2::Fp16>(x)), round_to(x, kFp16))) << std::hexfloat << x;
  }
}

// ---- the engine against the reference ----

enum class Algo { Co2Delayed, Co2Eager, Diloco, LocalSgd, Sync };

struct TensorSpec {
  const Format* format;
  size_t count;
  co2_tensor_role_t role;
};

constexpr int kTau = 3;
constexpr int kRounds = 4;
constexpr double kAlpha = 0.7;
constexpr double kBeta = 0.5;
constexpr float kInnerLr = 0.25f;

float initial_value(int rank, size_t tensor, size_t i) {
  // Differs by rank (commit must broadcast rank 0's) and is not representable in 16 bits.
  return 0.3f + 0.01f * float(rank) + 0.0137f * float(i % 23) - 0.05f * float(tensor);
}
float target(int rank, size_t tensor, size_t i) { return 1.0f + 0.17f * float(rank) + 0.011f * float((i + tensor) % 7); }

// One inner step, the same float computation on the engine's parameters and the reference's.
float inner_step(float p, int rank, size_t tensor, size_t i) { return p - kInnerLr * (p - target(rank, tensor, i)); }

// Under sync the engine never moves PARAMETER tensors (the gradients are averaged instead, not
// modelled here), so they take the same steps on every rank, as with averaged gradients; the
// anchor check compares them.
int stepping_rank(Algo algo, co2_tensor_role_t role, int rank) {
  return algo == Algo::Sync && role == CO2_ROLE_PARAMETER ? 0 : rank;
}
bool has_anchor(Algo algo) { return algo != Algo::LocalSgd && algo != Algo::Sync; }

// The reference of one run: W ranks, float64 outer state, rounded parameters.
struct Reference {
  std::vector<TensorSpec> specs;
  int world;
  Algo algo;
  // Per tensor: anchor, momentum, pending average; per rank and tensor: params, eager e and q.
  std::vector<std::vector<double>> anchor, momentum, pending;
  std::vector<std::vector<std::vector<double>>> params, offset, own_momentum;
  bool have_pending = false;

  Reference(std::vector<TensorSpec> s, int w, Algo a) : specs(std::move(s)), world(w), algo(a) {
    params.resize(size_t(w));
    offset.resize(size_t(w));
    own_momentum.resize(size_t(w));
    for (size_t t = 0; t < specs.size(); ++t) {
      std::vector<double> init(specs[t].count);
      for (size_t i = 0; i < init.size(); ++i) init[i] = round_to(initial_value(0, t, i), *specs[t].format);
      anchor.push_back(init);
      momentum.emplace_back(init.size(), 0.0);
      pending.emplace_back(init.size(), 0.0);
      for (int r = 0; r < w; ++r) {
        params[size_t(r)].push_back(init);
        offset[size_t(r)].emplace_back(init.size(), 0.0);
        own_momentum[size_t(r)].emplace_back(init.size(), 0.0);
      }
    }
  }
  bool trained(size_t t) const { return specs[t].role == CO2_ROLE_PARAMETER; }
  double R(size_t t, double x) const { return round_to(x, *specs[t].format); }
  // What a parameter set from the fp32 master value of x holds: x is the engine's fp32 state
  // (or a sum of it), so the reference rounds it to fp32 first and decides a rounding tie the
  // way the engine's fp32 value does.
  double master(size_t t, double x) const { return R(t, double(float(x))); }

  void step() {
    for (int r = 0; r < world; ++r)
      for (size_t t = 0; t < specs.size(); ++t)
        for (size_t i = 0; i < specs[t].count; ++i) {
          double& p = params[size_t(r)][t][i];
          p = R(t, inner_step(float(p), stepping_rank(algo, specs[t].role, r), t, i));
        }
  }

  // co2's BUFFER tensors carry their values (the deltas and the update start from 0).
  double anchor_weight(size_t t) const {
    return !trained(t) && (algo == Algo::Co2Delayed || algo == Algo::Co2Eager) ? 0.0 : 1.0;
  }

  // a <- a - alpha * s of the average `avg` (BUFFER tensors: a <- w*a - avg).
  void update(size_t t, const std::vector<double>& avg) {
    for (size_t i = 0; i < avg.size(); ++i) {
      if (!trained(t)) {
        anchor[t][i] = anchor_weight(t) * anchor[t][i] - avg[i];
        continue;
      }
      momentum[t][i] = kBeta * momentum[t][i] + avg[i];
      anchor[t][i] -= kAlpha * momentum[t][i];
    }
  }

  void boundary() {
    for (size_t t = 0; t < specs.size(); ++t) {
      const size_t n = specs[t].count;
      std::vector<double> mean(n, 0.0);
      if (algo == Algo::Sync && trained(t)) continue;  // only BUFFER tensors are averaged
      if (algo == Algo::LocalSgd || algo == Algo::Sync) {
        for (int r = 0; r < world; ++r)
          for (size_t i = 0; i < n; ++i) mean[i] += params[size_t(r)][t][i] / world;
        for (int r = 0; r < world; ++r)
          for (size_t i = 0; i < n; ++i) params[size_t(r)][t][i] = master(t, mean[i]);
        continue;
      }
      const bool eager = algo == Algo::Co2Eager && trained(t);
      std::vector<std::vector<double>> delta(static_cast<size_t>(world), std::vector<double>(n));
      for (int r = 0; r < world; ++r)
        for (size_t i = 0; i < n; ++i) {
          const double start = anchor_weight(t) * anchor[t][i] + (eager ? offset[size_t(r)][t][i] : 0.0);
          delta[size_t(r)][i] = master(t, start) - params[size_t(r)][t][i];  // what the rank trained from
          mean[i] += delta[size_t(r)][i] / world;
        }
      if (algo == Algo::Diloco) {
        update(t, mean);
      } else {
        if (have_pending) update(t, pending[t]);
        pending[t] = mean;
      }
      for (int r = 0; r < world; ++r)
        for (size_t i = 0; i < n; ++i) {
          double e = 0.0;
          if (eager) {
            double& q = own_momentum[size_t(r)][t][i];
            q = kBeta * q + delta[size_t(r)][i];
            e = offset[size_t(r)][t][i] = -(kAlpha / world) * q;
          }
          params[size_t(r)][t][i] = master(t, anchor[t][i] + e);
        }
    }
    have_pending = algo == Algo::Co2Delayed || algo == Algo::Co2Eager;
  }

  void finalize() {
    if (!has_anchor(algo)) return boundary();  // synchronize: one more average
    for (size_t t = 0; t < specs.size(); ++t) {
      if (have_pending) update(t, pending[t]);
      for (int r = 0; r < world; ++r)
        for (size_t i = 0; i < specs[t].count; ++i) params[size_t(r)][t][i] = master(t, anchor[t][i]);
    }
    have_pending = false;
    for (int r = 0; r < world; ++r)  // every rank's own deltas are in what was applied
      for (size_t t = 0; t < specs.size(); ++t) {
        std::fill(offset[size_t(r)][t].begin(), offset[size_t(r)][t].end(), 0.0);
        std::fill(own_momentum[size_t(r)][t].begin(), own_momentum[size_t(r)][t].end(), 0.0);
      }
  }

  // co2_engine_synchronize one step into a round: a boundary now (an average for the
  // anchor-less algorithms), then co2's average applied at once.
  void synchronize_after_one_step() {
    step();
    boundary();
    if (has_anchor(algo)) finalize();
  }
};

// The round after which the run synchronizes one step into the next round.
constexpr int kSynchronizeAfter = 2;

co2_algorithm_t algorithm_of(Algo a) {
  switch (a) {
    case Algo::Diloco: return CO2_ALGO_DILOCO;
    case Algo::LocalSgd: return CO2_ALGO_LOCALSGD;
    case Algo::Sync: return CO2_ALGO_SYNC;
    default: return CO2_ALGO_CO2;
  }
}

const char* name_of(Algo a) {
  switch (a) {
    case Algo::Co2Delayed: return "co2 delayed";
    case Algo::Co2Eager: return "co2 eager";
    case Algo::Diloco: return "diloco";
    case Algo::Sync: return "sync";
    default: return "localsgd";
  }
}

co2_engine_config_t config_of(Algo algo, bool shard = false) {
  co2_engine_config_t c = CO2_ENGINE_CONFIG_INIT;
  c.shard_outer_state = shard ? 1 : 0;
  c.algorithm = algorithm_of(algo);
  c.tau = kTau;
  c.outer_lr = kAlpha;
  c.outer_momentum = kBeta;
  c.eager = algo == Algo::Co2Eager ? 1 : 0;
  c.anchor_check_interval = 1;
  return c;
}

// Registers one tensor per spec (names t0, t1, ...) and commits.
void register_all(co2_engine_t e, std::vector<Params>& storage, const std::vector<TensorSpec>& specs,
                  std::vector<std::string>& names) {
  for (size_t t = 0; t < specs.size(); ++t) {
    co2_tensor_t d = CO2_TENSOR_INIT;
    names.push_back("t" + std::to_string(t));
    d.name = names.back().c_str();
    d.data = storage[t].data();
    d.count = specs[t].count;
    d.dtype = specs[t].format->dtype;
    d.role = specs[t].role;
    CO2_ASSERT_OK(co2_engine_register_tensor(e, &d));
  }
}

// Runs W ranks through kRounds rounds and finalize; after each boundary every rank's
// parameters must equal the reference's bit for bit, except where the fp32 anchor and the
// float64 one fall on different sides of a rounding tie (counted; at most one ulp of the
// parameter's format). The anchor (consensus) must match to fp32 accuracy.
void check_trajectory(const std::vector<TensorSpec>& specs, int world, Algo algo, bool shard = false) {
  SCOPED_TRACE(std::string(name_of(algo)) + " W=" + std::to_string(world) + (shard ? " sharded" : ""));
  Reference ref(specs, world, algo);
  // [0]: after commit, [round], [kRounds + 1]: after finalize, [kRounds + 2]: after the
  // synchronize; [..][rank]: flattened params.
  std::vector<std::vector<std::vector<float>>> seen(kRounds + 3);
  std::vector<std::vector<float>> consensus(static_cast<size_t>(world));
  for (auto& s : seen) s.resize(size_t(world));
  run_ranks(world, [&](int rank, co2_comm_t comm) {
    co2_engine_config_t c = config_of(algo, shard);
    co2_engine_t e = nullptr;
    CO2_ASSERT_OK(co2_engine_create(comm, &c, &e));
    std::vector<Params> storage;
    for (size_t t = 0; t < specs.size(); ++t) {
      storage.emplace_back(*specs[t].format, specs[t].count);
      for (size_t i = 0; i < specs[t].count; ++i) storage[t].set(i, initial_value(rank, t, i));
    }
    std::vector<std::string> names;
    register_all(e, storage, specs, names);
    CO2_ASSERT_OK(co2_engine_commit(e));
    auto record = [&](std::vector<float>& out) {
      for (size_t t = 0; t < specs.size(); ++t)
        for (size_t i = 0; i < specs[t].count; ++i) out.push_back(storage[t].get(i));
    };
    record(seen[0][size_t(rank)]);
    auto inner = [&] {
      for (size_t t = 0; t < specs.size(); ++t)
        for (size_t i = 0; i < specs[t].count; ++i)
          storage[t].set(i, inner_step(storage[t].get(i), stepping_rank(algo, specs[t].role, rank), t, i));
    };
    for (int round = 1; round <= kRounds; ++round) {
      for (int s = 0; s < kTau; ++s) {
        inner();
        int boundary = 0;
        CO2_ASSERT_OK(co2_engine_step(e, nullptr, &boundary));
        ASSERT_EQ(boundary, s == kTau - 1);
      }
      record(seen[size_t(round)][size_t(rank)]);
      if (round == kSynchronizeAfter) {
        inner();
        CO2_ASSERT_OK(co2_engine_step(e, nullptr, nullptr));
        CO2_ASSERT_OK(co2_engine_synchronize(e));
        record(seen[kRounds + 2][size_t(rank)]);
      }
    }
    CO2_ASSERT_OK(co2_engine_finalize(e));
    size_t n = 0;
    CO2_ASSERT_OK(co2_engine_num_elements(e, &n));
    consensus[size_t(rank)].resize(n);
    if (has_anchor(algo))
      CO2_ASSERT_OK(co2_engine_consensus(e, CO2_CONSENSUS_ANCHOR, consensus[size_t(rank)].data(), n));
    std::vector<float>& final_params = seen[kRounds + 1][size_t(rank)];
    record(final_params);
    if (has_anchor(algo)) {
      size_t j = 0;
      for (size_t t = 0; t < specs.size(); ++t)
        for (size_t i = 0; i < specs[t].count; ++i, ++j)
          ASSERT_EQ(final_params[j], float(round_to(consensus[size_t(rank)][j], *specs[t].format)))
              << "finalize leaves parameters = the rounded anchor, tensor " << t << " element " << i;
    }
    CO2_EXPECT_OK(co2_engine_destroy(e));
  });
  if (::testing::Test::HasFailure()) return;

  auto compare = [&](int round, const std::vector<float>& got, int rank) {
    size_t j = 0, ties = 0;
    for (size_t t = 0; t < specs.size(); ++t)
      for (size_t i = 0; i < specs[t].count; ++i, ++j) {
        const double want = ref.params[size_t(rank)][t][i];
        if (double(got[j]) == want) continue;
        if (specs[t].format == &kFp32) {  // fp32 parameters: the float arithmetic's own error
          ASSERT_NEAR(got[j], want, 1e-5 * (1.0 + std::fabs(want)))
              << "round " << round << " rank " << rank << " tensor " << t << " element " << i;
          continue;
        }
        // Only a rounding that the fp32 and the float64 anchor decide differently.
        const double ulp = std::ldexp(1.0, std::max(std::ilogb(want), specs[t].format->min_exp) -
                                               (specs[t].format->precision - 1));
        ASSERT_LE(std::fabs(double(got[j]) - want), ulp * 1.0001)
            << "round " << round << " rank " << rank << " tensor " << t << " element " << i << ": " << got[j]
            << " vs reference " << want;
        ++ties;
      }
    EXPECT_LE(ties, j / 20 + 1) << "round " << round << " rank " << rank << ": too many one-ulp differences";
  };
  for (int r = 0; r < world; ++r) compare(0, seen[0][size_t(r)], r);
  for (int round = 1; round <= kRounds; ++round) {
    ref.step();
    ref.step();
    ref.step();
    ref.boundary();
    for (int r = 0; r < world; ++r) compare(round, seen[size_t(round)][size_t(r)], r);
    if (round == kSynchronizeAfter) {
      ref.synchronize_after_one_step();
      for (int r = 0; r < world; ++r) compare(kRounds + 2, seen[kRounds + 2][size_t(r)], r);
    }
  }
  ref.finalize();
  for (int r = 0; r < world; ++r) compare(kRounds + 1, seen[kRounds + 1][size_t(r)], r);
  if (!has_anchor(algo)) return;
  size_t j = 0;
  for (size_t t = 0; t < specs.size(); ++t)
    for (size_t i = 0; i < specs[t].count; ++i, ++j)
      for (int r = 0; r < world; ++r)
        ASSERT_NEAR(consensus[size_t(r)][j], ref.anchor[t][i], 2e-5 * (1.0 + std::fabs(ref.anchor[t][i])))
            << "anchor of tensor " << t << " element " << i << " rank " << r;
}

TEST(MixedPrecision, Bf16TrajectoryMatchesReference) {
  const std::vector<TensorSpec> specs = {{&kBf16, 37, CO2_ROLE_PARAMETER}, {&kBf16, 16, CO2_ROLE_PARAMETER},
                                         {&kBf16, 5, CO2_ROLE_BUFFER}};
  for (Algo algo : {Algo::Co2Delayed, Algo::Co2Eager})
    for (int world = 1; world <= 3; ++world) check_trajectory(specs, world, algo);
  for (Algo algo : {Algo::Diloco, Algo::LocalSgd, Algo::Sync}) check_trajectory(specs, 2, algo);
  // The sharded passes (delayed and eager) take their deltas the same way.
  for (Algo algo : {Algo::Co2Delayed, Algo::Co2Eager})
    for (int world = 2; world <= 3; ++world) check_trajectory(specs, world, algo, /*shard=*/true);
}

TEST(MixedPrecision, Fp16TrajectoryMatchesReference) {
  const std::vector<TensorSpec> specs = {{&kFp16, 41, CO2_ROLE_PARAMETER}, {&kFp16, 4, CO2_ROLE_BUFFER}};
  for (Algo algo : {Algo::Co2Delayed, Algo::Co2Eager})
    for (int world = 1; world <= 3; ++world) check_trajectory(specs, world, algo);
}

// The reference without rounding would not match: the test can tell rounded parameters from
// fp32 ones (a guard against a reference too loose to notice the dtype).
TEST(MixedPrecision, ReferenceDistinguishesRounding) {
  const std::vector<TensorSpec> bf = {{&kBf16, 37, CO2_ROLE_PARAMETER}};
  const std::vector<TensorSpec> f32 = {{&kFp32, 37, CO2_ROLE_PARAMETER}};
  Reference a(bf, 2, Algo::Co2Delayed), b(f32, 2, Algo::Co2Delayed);
  for (int round = 0; round < 2; ++round) {
    for (int s = 0; s < kTau; ++s) {
      a.step();
      b.step();
    }
    a.boundary();
    b.boundary();
  }
  size_t differ = 0;
  for (size_t i = 0; i < 37; ++i) differ += std::fabs(a.anchor[0][i] - b.anchor[0][i]) > 1e-4;
  EXPECT_GT(differ, 10u);
}

// Issue 23, item 6: the delta is taken from the rounded start the rank trained from, R(a), as a
// master copy would, not from the fp32 anchor a. One bf16 element at 1.0, rank 0 adds one ulp
// (2^-7) per step, rank 1 nothing, W 2, tau 1, alpha 1, beta 0: the average of the parameters
// rises by half an ulp per round, so after 10 rounds and finalize the anchor is
// 1 + 10 * 2^-8 = 1.0390625 (exact in fp32 and in bf16), as with fp32 parameters. Taking the
// delta from a instead subtracts a - R(a) every round: a half-ulp anchor rounds back to the
// start, the idle rank sends +half an ulp, and the anchor stays near 1.0039.
TEST(MixedPrecision, Bf16DeltaIsTakenFromTheRoundedStart) {
  struct Variant {
    const char* name;
    co2_algorithm_t algorithm;
    int eager;
    int shard;
  };
  const Variant variants[] = {{"co2 delayed", CO2_ALGO_CO2, 0, 0},        {"co2 eager", CO2_ALGO_CO2, 1, 0},
                              {"co2 delayed sharded", CO2_ALGO_CO2, 0, 1}, {"co2 eager sharded", CO2_ALGO_CO2, 1, 1},
                              {"diloco", CO2_ALGO_DILOCO, 0, 0}};
  constexpr int kRoundsHere = 10;
  const double want = 1.0 + kRoundsHere * 0x1p-8;
  for (const Variant& v : variants) {
    SCOPED_TRACE(v.name);
    std::vector<float> anchor(2, 0.0f), param(2, 0.0f);
    run_ranks(2, [&](int rank, co2_comm_t comm) {
      co2_engine_config_t c = CO2_ENGINE_CONFIG_INIT;
      c.algorithm = v.algorithm;
      c.tau = 1;
      c.outer_lr = 1.0;
      c.outer_momentum = 0.0;
      c.eager = v.eager;
      c.shard_outer_state = v.shard;
      co2_engine_t e = nullptr;
      CO2_ASSERT_OK(co2_engine_create(comm, &c, &e));
      uint16_t p = co2::narrow<co2::Bf16>(1.0f).bits;
      co2_tensor_t d = CO2_TENSOR_INIT;
      d.name = "w";
      d.data = &p;
      d.count = 1;
      d.dtype = CO2_DTYPE_BF16;
      CO2_ASSERT_OK(co2_engine_register_tensor(e, &d));
      CO2_ASSERT_OK(co2_engine_commit(e));
      for (int round = 0; round < kRoundsHere; ++round) {
        if (rank == 0) p = uint16_t(p + 1);  // one ulp up (a positive normal number)
        CO2_ASSERT_OK(co2_engine_step(e, nullptr, nullptr));
      }
      CO2_ASSERT_OK(co2_engine_finalize(e));
      CO2_ASSERT_OK(co2_engine_consensus(e, CO2_CONSENSUS_ANCHOR, &anchor[size_t(rank)], 1));
      param[size_t(rank)] = co2::widen(co2::Bf16{p});
      CO2_EXPECT_OK(co2_engine_destroy(e));
    });
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(double(anchor[size_t(r)]), want) << "anchor of rank " << r;
      EXPECT_EQ(double(param[size_t(r)]), want) << "parameter of rank " << r;
    }
  }
}

// Tensors of different dtypes in one engine: each keeps its own.
TEST(MixedPrecision, MixedDtypesInOneLayout) {
  const std::vector<TensorSpec> specs = {{&kBf16, 19, CO2_ROLE_PARAMETER}, {&kFp32, 11, CO2_ROLE_PARAMETER},
                                         {&kFp16, 13, CO2_ROLE_PARAMETER}, {&kFp32, 3, CO2_ROLE_BUFFER}};
  for (Algo algo : {Algo::Co2Delayed, Algo::Co2Eager}) check_trajectory(specs, 2, algo);
}

// Flat storage in bf16: alloc_flat gives 2-byte elements and segments address them; the ranks
// end with the same parameters, the rounded anchor.
TEST(MixedPrecision, Bf16FlatStorage) {
  std::vector<std::vector<uint16_t>> final_flat(2);
  run_ranks(2, [&](int rank, co2_comm_t comm) {
    co2_engine_config_t c = config_of(Algo::Co2Delayed);
    co2_engine_t e = nullptr;
    CO2_ASSERT_OK(co2_engine_create(comm, &c, &e));
    void* data = nullptr;
    CO2_ASSERT_OK(co2_engine_alloc_flat(e, 21, CO2_DTYPE_BF16, CO2_DEVICE_HOST, 0, &data));
    auto* flat = static_cast<uint16_t*>(data);
    for (int i = 0; i < 21; ++i) EXPECT_EQ(flat[i], 0u) << "zero-initialised";
    for (int i = 0; i < 21; ++i) flat[i] = co2::narrow<co2::Bf16>(float(i + 1) * float(rank + 1)).bits;
    co2_segment_t a = CO2_SEGMENT_INIT, b = CO2_SEGMENT_INIT;
    a.name = "a";
    a.count = 16;
    b.name = "b";
    b.offset = 16;
    b.count = 5;
    b.role = CO2_ROLE_BUFFER;
    CO2_ASSERT_OK(co2_engine_add_segment(e, &a));
    CO2_ASSERT_OK(co2_engine_add_segment(e, &b));
    CO2_ASSERT_OK(co2_engine_commit(e));
    // Rank 0's values everywhere, element by element (segment b starts at byte 32).
    for (int i = 0; i < 21; ++i) ASSERT_EQ(co2::widen(co2::Bf16{flat[i]}), float(i + 1)) << i;
    for (int s = 0; s < 2 * kTau; ++s) {
      for (int i = 0; i < 21; ++i)
        flat[i] = co2::narrow<co2::Bf16>(co2::widen(co2::Bf16{flat[i]}) + 0.5f * float(rank + 1)).bits;
      CO2_ASSERT_OK(co2_engine_step(e, nullptr, nullptr));
    }
    CO2_ASSERT_OK(co2_engine_finalize(e));
    std::vector<float> anchor(21);
    CO2_ASSERT_OK(co2_engine_consensus(e, CO2_CONSENSUS_ANCHOR, anchor.data(), anchor.size()));
    for (int i = 0; i < 21; ++i) {
      EXPECT_EQ(flat[i], co2::narrow<co2::Bf16>(anchor[i]).bits) << i;
      EXPECT_GT(anchor[i], float(i + 1)) << "the anchor moved with the training, element " << i;
    }
    final_flat[size_t(rank)].assign(flat, flat + 21);
    CO2_EXPECT_OK(co2_engine_destroy(e));
  });
  EXPECT_EQ(final_flat[0], final_flat[1]);
}

// ---- checkpoints ----

struct Blob {
  std::vector<unsigned char> bytes;
  size_t read = 0;
  static int write(void* user, const void* data, size_t n) {
    auto* b = static_cast<Blob*>(user);
    b->bytes.insert(b->bytes.end(), static_cast<const unsigned char*>(data), static_cast<const unsigned char*>(data) + n);
    return 0;
  }
  static int read_fn(void* user, void* data, size_t n) {
    auto* b = static_cast<Blob*>(user);
    if (b->read + n > b->bytes.size()) return 1;
    std::memcpy(data, b->bytes.data() + b->read, n);
    b->read += n;
    return 0;
  }
};

// A bf16 engine saved at a boundary and restored into a fresh engine continues bit for bit; the
// blob's layout names the dtype, so an fp32 engine of the same shape refuses it.
TEST(MixedPrecision, Bf16CheckpointRoundTrip) {
  run_ranks(1, [&](int, co2_comm_t comm) {
    const co2_engine_config_t c = config_of(Algo::Co2Delayed);
    const size_t n = 29;
    auto make = [&](Params& p, co2_engine_t* out) {
      CO2_ASSERT_OK(co2_engine_create(comm, &c, out));
      co2_tensor_t d = CO2_TENSOR_INIT;
      d.name = "w";
      d.data = p.data();
      d.count = n;
      d.dtype = p.format->dtype;
      CO2_ASSERT_OK(co2_engine_register_tensor(*out, &d));
      CO2_ASSERT_OK(co2_engine_commit(*out));
    };
    auto train = [&](co2_engine_t e, Params& p, int rounds) {
      for (int s = 0; s < rounds * kTau; ++s) {
        for (size_t i = 0; i < n; ++i) p.set(i, inner_step(p.get(i), 0, 0, i));
        CO2_ASSERT_OK(co2_engine_step(e, nullptr, nullptr));
      }
    };
    Params pa(kBf16, n), pb(kBf16, n), pf(kFp32, n);
    for (size_t i = 0; i < n; ++i) {
      pa.set(i, initial_value(0, 0, i));
      pb.set(i, -3.0f);
    }
    co2_engine_t a = nullptr, b = nullptr, f = nullptr;
    make(pa, &a);
    train(a, pa, 2);
    Blob blob;
    CO2_ASSERT_OK(co2_engine_save(a, &Blob::write, &blob));
    make(pb, &b);
    CO2_ASSERT_OK(co2_engine_load(b, &Blob::read_fn, &blob));
    EXPECT_EQ(pb.half, pa.half) << "the restored parameters are the rounded round-start point";
    train(a, pa, 2);
    train(b, pb, 2);
    CO2_ASSERT_OK(co2_engine_finalize(a));
    CO2_ASSERT_OK(co2_engine_finalize(b));
    EXPECT_EQ(pb.half, pa.half);
    std::vector<float> anchor_a(n), anchor_b(n);
    CO2_ASSERT_OK(co2_engine_consensus(a, CO2_CONSENSUS_ANCHOR, anchor_a.data(), n));
    CO2_ASSERT_OK(co2_engine_consensus(b, CO2_CONSENSUS_ANCHOR, anchor_b.data(), n));
    EXPECT_EQ(0, std::memcmp(anchor_a.data(), anchor_b.data(), n * sizeof(float)));
    make(pf, &f);
    blob.read = 0;
    CO2_EXPECT_STATUS(CO2_ERR_CHECKPOINT_MISMATCH, co2_engine_load(f, &Blob::read_fn, &blob));
    for (co2_engine_t e : {a, b, f}) CO2_EXPECT_OK(co2_engine_destroy(e));
  });
}

// ---- gradients ----

// reduce_gradients with bf16 gradients: summed in fp32, averaged, rounded once; a NULL entry
// contributes zeros. Under sync (comm buffer) and co2 (its own gradient buffer).
TEST(MixedPrecision, ReduceBf16Gradients) {
  for (co2_algorithm_t algo : {CO2_ALGO_SYNC, CO2_ALGO_CO2}) {
    const int world = 3;
    const size_t n = 45;
    run_ranks(world, [&](int rank, co2_comm_t comm) {
      co2_engine_config_t c = CO2_ENGINE_CONFIG_INIT;
      c.algorithm = algo;
      co2_engine_t e = nullptr;
      CO2_ASSERT_OK(co2_engine_create(comm, &c, &e));
      Params w(kBf16, n), v(kFp16, 7);
      co2_tensor_t d = CO2_TENSOR_INIT;
      d.name = "w";
      d.data = w.data();
      d.count = n;
      d.dtype = CO2_DTYPE_BF16;
      CO2_ASSERT_OK(co2_engine_register_tensor(e, &d));
      d.name = "v";
      d.data = v.data();
      d.count = 7;
      d.dtype = CO2_DTYPE_FP16;
      CO2_ASSERT_OK(co2_engine_register_tensor(e, &d));
      CO2_ASSERT_OK(co2_engine_commit(e));
      Params g(kBf16, n), h(kFp16, 7);
      auto grad = [](int r, size_t i) { return 0.01f * float(i) - 0.3f + 0.1234f * float(r); };
      for (size_t i = 0; i < n; ++i) g.set(i, grad(rank, i));
      for (size_t i = 0; i < 7; ++i) h.set(i, grad(rank, i));
      void* grads[2] = {g.data(), rank == 1 ? nullptr : h.data()};
      CO2_ASSERT_OK(co2_engine_reduce_gradients(e, grads, 2, nullptr));
      for (size_t i = 0; i < n; ++i) {
        double mean = 0.0;
        for (int r = 0; r < world; ++r) mean += round_to(grad(r, i), kBf16) / world;
        const double want = round_to(mean, kBf16);
        // Averaged in fp32 first: at most a tie decided the other way (one ulp).
        const double ulp = std::ldexp(1.0, std::ilogb(want) - 7);
        EXPECT_LE(std::fabs(g.get(i) - want), ulp * 1.0001) << i << ": " << g.get(i) << " vs " << want;
        EXPECT_EQ(g.get(i), float(round_to(g.get(i), kBf16)));
      }
      for (size_t i = 0; i < 7; ++i) {
        if (rank == 1) {
          EXPECT_EQ(h.get(i), float(round_to(grad(1, i), kFp16))) << "a NULL entry receives nothing";
          continue;
        }
        const double mean = (round_to(grad(0, i), kFp16) + round_to(grad(2, i), kFp16)) / world;
        EXPECT_LE(std::fabs(h.get(i) - round_to(mean, kFp16)), std::ldexp(1.0, std::ilogb(mean) - 10) * 1.0001) << i;
      }
      CO2_EXPECT_OK(co2_engine_destroy(e));
    });
  }
}

// ---- the NaN guard ----

// A bf16 NaN in one rank's parameters: that boundary's local delta is non-finite, the next
// boundary refuses the average on every rank and leaves the anchor as it was.
TEST(MixedPrecision, Bf16NanGuard) {
  run_ranks(2, [&](int rank, co2_comm_t comm) {
    co2_engine_config_t c = config_of(Algo::Co2Delayed);
    c.tau = 1;
    co2_engine_t e = nullptr;
    CO2_ASSERT_OK(co2_engine_create(comm, &c, &e));
    Params w(kBf16, 10);
    for (size_t i = 0; i < 10; ++i) w.set(i, 1.0f);
    co2_tensor_t d = CO2_TENSOR_INIT;
    d.name = "w";
    d.data = w.data();
    d.count = 10;
    d.dtype = CO2_DTYPE_BF16;
    CO2_ASSERT_OK(co2_engine_register_tensor(e, &d));
    CO2_ASSERT_OK(co2_engine_commit(e));
    if (rank == 1) w.half[3] = 0x7fc0;  // bf16 quiet NaN
    CO2_ASSERT_OK(co2_engine_step(e, nullptr, nullptr));
    co2_engine_stats_t stats;
    stats.size = sizeof stats;
    CO2_ASSERT_OK(co2_engine_get_stats(e, &stats));
    EXPECT_EQ(stats.nonfinite_local, rank == 1 ? 1u : 0u);
    CO2_EXPECT_STATUS(CO2_ERR_NONFINITE, co2_engine_step(e, nullptr, nullptr));
    std::vector<float> anchor(10);
    CO2_ASSERT_OK(co2_engine_consensus(e, CO2_CONSENSUS_ANCHOR, anchor.data(), 10));
    for (float a : anchor) EXPECT_EQ(a, 1.0f);
    for (size_t i = 0; i < 10; ++i) EXPECT_EQ(w.get(i), 1.0f) << i;
    CO2_EXPECT_OK(co2_engine_destroy(e));
  });
}

// ---- what is refused ----

TEST(MixedPrecision, RefusedDtypes) {
  run_ranks(1, [&](int, co2_comm_t comm) {
    co2_engine_t e = nullptr;
    CO2_ASSERT_OK(co2_engine_create(comm, nullptr, &e));
    double wide[4] = {0, 0, 0, 0};
    co2_tensor_t d = CO2_TENSOR_INIT;
    d.name = "w";
    d.data = wide;
    d.count = 4;
    d.dtype = CO2_DTYPE_FP64;
    CO2_EXPECT_STATUS(CO2_ERR_UNSUPPORTED, co2_engine_register_tensor(e, &d));
    const std::string fp64 = co2_last_error_message();
    EXPECT_NE(fp64.find("fp64 parameters are not supported"), std::string::npos) << fp64;
    EXPECT_NE(fp64.find("model.float()"), std::string::npos) << fp64;
    // bf16/fp16 CUDA tensors are trained by the device path (co2, diloco; localsgd and sync refuse
    // them at commit): tests/runtime/backends/device/host_executor_test.cpp.
    CO2_EXPECT_OK(co2_engine_destroy(e));
  });
}

}  // namespace

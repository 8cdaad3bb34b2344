// The engine's outer-update math against the independent fp64 reference (reference.hpp), through
// the public C API only, W ranks as threads over the local transport.
//
// How a case runs: the reference first executes the case's script (inner steps, τ changes,
// finalize, synchronize, LOCAL_AVERAGE consensus, NaN injection) and records what every check
// point must show; then every rank executes the same script against the engine and compares
// its parameters, co2_engine_consensus and co2_engine_get_stats with the records.
//
// Tolerance (see tolerance() below for the derivation from fp32 rounding) and margins: data that
// come too close to a branch of the algorithm (a clip threshold, g = 0 in the gap penalty) would
// let fp32 and fp64 take different branches; the setup measures the distance in the reference
// and moves φ (or the seed) until every branch is decided by a margin larger than the error
// bound, and fails the setup if it cannot.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <mutex>
#include <thread>
#include <sstream>
#include <string>
#include <vector>

#include "co2/co2.h"
#include "rank_threads.hpp"
#include "reference.hpp"
#include "synthetic.hpp"

using namespace co2test;

namespace {

// Unit roundoff of fp32: every fp32 operation rounds with relative error <= 2^-24.
constexpr double kU32 = 5.9604644775390625e-08;

enum class Op { Step, SetTau, Finalize, Synchronize, LocalAverage, InjectNonFinite };
struct Action {
  Op op = Op::Step;
  int value = 0;        // SetTau: τ; InjectNonFinite: rank
  size_t element = 0;   // InjectNonFinite: element of the concatenated state
  double x = 0.0;       // InjectNonFinite: the value (NaN / Inf)
};

std::vector<Action> steps(int n) { return std::vector<Action>(n, Action{Op::Step}); }
std::vector<Action>& operator+=(std::vector<Action>& a, const std::vector<Action>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

struct MathCase {
  std::string label;
  co2_algorithm_t algo = CO2_ALGO_CO2;
  int world = 2;
  int tau = 3;
  Layout layout = layout_mixed();
  co2_penalty_t penalty = CO2_PENALTY_NONE;
  double penalty_constant = 1.0;
  co2_clip_t clip = CO2_CLIP_NONE;
  double phi = 1.0;
  int nesterov = 0;
  double alpha = 1.0;
  double beta = 0.0;  // CO2_OUTER_MOMENTUM_AUTO allowed
  int warmup = 0;
  int rounds = 7;     // used when `script` is empty: rounds * tau steps
  uint64_t seed = 1;
  int eager = 0;
  int shard = 0;  // shard_outer_state: the same reference, within the same rounding bound
  int apply_step = 0;  // co2: CO2_APPLY_AT_BOUNDARY or a step k >= 1
  std::vector<Action> script;
};

co2ref::Config ref_config(const MathCase& c) {
  co2ref::Config r;
  r.algo = c.algo == CO2_ALGO_CO2      ? co2ref::Algo::Co2
           : c.algo == CO2_ALGO_DILOCO ? co2ref::Algo::Diloco
           : c.algo == CO2_ALGO_SYNC   ? co2ref::Algo::Sync
                                       : co2ref::Algo::LocalSgd;
  r.tau = c.tau;
  r.warmup_sync_rounds = c.warmup;
  r.alpha = c.alpha;
  r.beta = c.beta;
  r.nesterov = c.nesterov != 0;
  r.penalty = c.penalty == CO2_PENALTY_NONE       ? co2ref::Penalty::None
              : c.penalty == CO2_PENALTY_CONSTANT ? co2ref::Penalty::Constant
                                                  : co2ref::Penalty::Gap;
  r.penalty_constant = c.penalty_constant;
  r.clip = c.clip == CO2_CLIP_NONE    ? co2ref::Clip::None
           : c.clip == CO2_CLIP_VALUE ? co2ref::Clip::Value
                                      : co2ref::Clip::Norm;
  r.phi = c.phi;
  r.eager = c.eager != 0;
  r.apply_step = c.apply_step;
  return r;
}

co2_engine_config_t engine_config(const MathCase& c) {
  co2_engine_config_t e = CO2_ENGINE_CONFIG_INIT;
  e.eager = 0;  // the delayed schedule (eager has its own cases)
  e.algorithm = c.algo;
  e.tau = uint32_t(c.tau);
  e.warmup_sync_rounds = uint32_t(c.warmup);
  e.outer_lr = c.alpha;
  e.outer_momentum = c.beta;
  e.nesterov = c.nesterov;
  e.penalty = c.penalty;
  e.penalty_constant = c.penalty_constant;
  e.clip = c.clip;
  e.clip_threshold = c.phi;
  e.eager = c.eager;
  e.shard_outer_state = c.shard;
  e.apply_step = c.apply_step;
  return e;
}

std::vector<co2ref::Segment> ref_segments(const Layout& l) {
  std::vector<co2ref::Segment> s;
  for (const auto& t : l.tensors)
    if (t.role != CO2_ROLE_EXCLUDED) s.push_back({t.count, t.role == CO2_ROLE_BUFFER});
  return s;
}

// The bound |x32 - x64| <= tolerance(...) after `updates` rounds (boundaries, finalize and
// synchronize each count as one).
//
// Derivation. Every fp32 operation rounds its result with relative error <= u = 2^-24, i.e. adds
// an absolute error <= u * S, where S bounds every magnitude in the trajectory (the reference's
// scale(): parameters, targets, anchors, momentum, averages). Per round and element the fp32 side
// performs: τ inner steps of 3 roundings (p - t, lr * ., p - .), the delta a - p (1), the ring
// all-reduce (W - 1 additions and one scaling by 1/W: W), u = βm + Λc (3), the clip (1), s under
// Nesterov (2), a - αs (2), and Λ itself, a ratio of fp32 step norms accumulated in fp64 whose
// relative error is a few u (counted as 4): ops = 3τ + W + 13 roundings. The round map does not
// expand errors in a and p (the inner step contracts towards the target, an average of deltas
// re-centres a), except through the momentum, which carries an error on with weight β per
// round (sum <= 1/(1-β)) and which Nesterov applies once more (factor 1+β). Errors of successive
// rounds therefore add: after R rounds |x32 - x64| <= R * ops * u * S * (1+β)/(1-β). We allow a
// factor 2 over this first-order bound for second-order terms (products of two rounding errors,
// O(u^2)) and the rounding of the fp64 reference itself (O(2^-53)). For scale: τ = 3, W = 4,
// R = 8, β = 0 gives 5e-5 S (observed errors are ~1e-7, printed per case); a wrong equation
// (stale vs fresh average, a lost β or Λ term, a clip not applied, an off-by-one in the gap
// history) moves parameters by 1e-2..1e-1 S, hundreds of times the bound.
double tolerance(const MathCase& c, double beta, double scale, int updates) {
  const double ops = 3.0 * c.tau + c.world + 13.0;
  const double momentum = (1.0 + beta) / (1.0 - beta);
  return 2.0 * std::max(updates, 1) * ops * kU32 * std::max(scale, 1.0) * momentum;
}

// What the engine must show at one point of the script.
struct Expect {
  Op op = Op::Step;
  bool boundary = false;
  co2_status_t status = CO2_OK;
  bool check_params = false;            // rank r's params equal `params[r]`
  std::vector<std::vector<double>> params;
  bool check_anchor = false;            // consensus(ANCHOR) equals `anchor`
  std::vector<double> anchor;
  std::vector<double> average;          // LocalAverage
  double tol = 0.0;
  // statistics
  uint64_t steps = 0, rounds = 0, outer_updates = 0, nonfinite_rounds = 0;
  uint64_t arrival_updates = 0;
  int last_apply_step = 0;
  std::vector<uint64_t> nonfinite_local;
  bool has_update = false;
  co2ref::UpdateRecord last;
  bool plain_so_far = true;  // no finalize/synchronize/LOCAL_AVERAGE yet: byte and update
                             // counters have exactly one reading
};

struct Prepared {
  MathCase c;
  Data data;
  std::vector<Expect> expect;
  double beta = 0.0;
  double scale = 0.0;
  double final_tol = 0.0;
  double gap_rms_min = 0.0;
  std::vector<float> rank0_init;  // concatenated state
};

// Every rank's parameters (they differ under eager).
// consensus(ANCHOR): the anchor; with sharded outer state, which pairs no collective for it,
// the anchor the next boundary starts from (the average in flight applied, or refused).
std::vector<double> expected_consensus_anchor(const co2ref::Reference& ref, const MathCase& c) {
  return c.shard ? ref.next_anchor() : ref.anchor();
}

void record_params(co2ref::Reference& ref, Expect& e) {
  e.params.clear();
  for (int r = 0; r < ref.world_size(); ++r) e.params.push_back(ref.p(r));
}

// Runs the reference over the script. Returns "" or why the data are too close to a branch.
std::string run_reference(Prepared& p) {
  const MathCase& c = p.c;
  p.data = make_data(c.layout, c.world, c.seed);
  std::vector<double> init = concat_state(c.layout, p.data.init[0]);
  p.rank0_init.assign(init.begin(), init.end());
  co2ref::Reference ref(ref_config(c), ref_segments(c.layout), c.world, init);
  std::vector<std::vector<double>> targets;
  for (int r = 0; r < c.world; ++r) {
    targets.push_back(concat_state(c.layout, p.data.target[r]));
    ref.observe(targets.back());
  }
  p.beta = ref.beta();
  p.expect.clear();
  int updates = 0;
  bool plain = true;
  uint64_t k = 0;
  for (const Action& a : c.script) {
    Expect e;
    e.op = a.op;
    switch (a.op) {
      case Op::Step: {
        for (int r = 0; r < c.world; ++r) ref_inner_step(ref.p(r), targets[r], k);
        ++k;
        e.boundary = ref.step();
        e.status = ref.last_boundary_nonfinite() ? CO2_ERR_NONFINITE : CO2_OK;
        if (ref.last_step_arrival()) {  // the average applied at this step, between boundaries
          ++updates;
          e.check_params = true;
          record_params(ref, e);
          e.check_anchor = true;
          e.anchor = expected_consensus_anchor(ref, c);
        }
        if (e.boundary) {
          ++updates;
          // localsgd with a skipped average leaves the ranks' params different.
          e.check_params = !(c.algo == CO2_ALGO_LOCALSGD && ref.last_boundary_nonfinite()) &&
                           c.algo != CO2_ALGO_SYNC;
          if (e.check_params) record_params(ref, e);
          e.check_anchor = c.algo == CO2_ALGO_CO2 || c.algo == CO2_ALGO_DILOCO;
          if (e.check_anchor) e.anchor = expected_consensus_anchor(ref, c);
        }
        break;
      }
      case Op::SetTau:
        ref.set_tau(a.value);
        break;
      case Op::Finalize:
      case Op::Synchronize:
        if (a.op == Op::Finalize)
          ref.finalize();
        else
          ref.synchronize();
        ++updates;
        plain = false;
        e.check_params = true;
        record_params(ref, e);
        e.check_anchor = c.algo == CO2_ALGO_CO2 || c.algo == CO2_ALGO_DILOCO;
        if (e.check_anchor) e.anchor = expected_consensus_anchor(ref, c);
        break;
      case Op::LocalAverage:
        plain = false;
        e.average = ref.local_average();
        break;
      case Op::InjectNonFinite:
        ref.p(a.value)[a.element] = a.x;
        break;
    }
    e.steps = ref.steps();
    e.rounds = ref.rounds();
    e.outer_updates = ref.outer_updates();
    e.nonfinite_rounds = ref.nonfinite_rounds();
    e.arrival_updates = ref.arrival_updates();
    e.last_apply_step = ref.last_apply_step();
    for (int r = 0; r < c.world; ++r) e.nonfinite_local.push_back(ref.nonfinite_local(r));
    e.has_update = ref.has_update();
    e.last = ref.last_update();
    e.plain_so_far = plain;
    e.tol = updates;  // replaced by the tolerance below, once the scale is known
    p.expect.push_back(std::move(e));
  }
  p.scale = ref.scale();
  for (auto& e : p.expect) e.tol = tolerance(c, p.beta, p.scale, int(e.tol) + 1);
  p.final_tol = tolerance(c, p.beta, p.scale, updates + 1);
  p.gap_rms_min = ref.min_gap_rms();

  // Margins. The engine's u = βm + Λc carries at most ~2 tol of error per element (c is a
  // difference of two quantities within tol); a branch decided by less than 4 tol could go the
  // other way in fp32.
  std::ostringstream why;
  if (c.clip == CO2_CLIP_VALUE && ref.min_value_clip_distance() <= 4.0 * p.final_tol)
    why << "an element of u came within " << ref.min_value_clip_distance() << " of phi";
  if (c.clip == CO2_CLIP_NORM && ref.min_norm_clip_distance() <= 4.0 * p.final_tol)
    why << "a segment norm came within " << ref.min_norm_clip_distance()
        << " * sqrt(n) of phi";
  // g ~ 0: the rms step of every segment that had one must be far above its error, so that the
  // g = 0 branch cannot be taken in fp32 where fp64 has g > 0 and the ratio g / ḡ stays well
  // conditioned (10 x the bound: |δΛ/Λ| <= 2 |δg|/g <= 20% in the worst case the bound
  // allows; in practice ~1e-6).
  if (c.penalty == CO2_PENALTY_GAP && p.gap_rms_min <= 10.0 * p.final_tol)
    why << "a gap step came within " << p.gap_rms_min << " of 0";
  return why.str();
}

Prepared prepare(const MathCase& in) {
  Prepared p;
  p.c = in;
  if (p.c.script.empty()) p.c.script = steps(p.c.rounds * p.c.tau);
  std::string why;
  // Move φ (clip policies) or the seed (gap policy) until every branch has its margin. The
  // reference of a small layout costs microseconds, so many attempts are cheap.
  const int attempts = in.layout.state_elements() > 10000 ? 5 : 300;
  for (int attempt = 0; attempt < attempts; ++attempt) {
    p.c.phi = in.phi * (1.0 + 0.005 * (attempt % 60));
    p.c.seed = in.seed + (in.penalty == CO2_PENALTY_GAP ? 101 * (attempt % 7) : 0) +
               (in.clip != CO2_CLIP_NONE ? 1009 * (attempt / 60) : 0);
    why = run_reference(p);
    if (why.empty()) return p;
  }
  ADD_FAILURE() << in.label << ": test data stay too close to a branch: " << why;
  p.expect.clear();
  return p;
}

// Per-rank comparison with a bounded number of reported mismatches.
struct Checker {
  int rank = 0;
  std::string label;
  int reported = 0;
  double max_ratio = 0.0;  // max |x32 - x64| / tol over every compared element
  double max_err = 0.0;

  void compare(const float* got, const std::vector<double>& want, double tol,
               const std::string& what) {
    size_t bad = 0, first = 0;
    double worst = 0.0;
    for (size_t i = 0; i < want.size(); ++i) {
      const double err = std::fabs(double(got[i]) - want[i]);
      if (!(err <= tol)) {
        if (bad++ == 0) first = i;
      }
      if (std::isfinite(err)) {
        worst = std::max(worst, err);
      } else {
        worst = std::numeric_limits<double>::infinity();
      }
    }
    max_err = std::max(max_err, worst);
    max_ratio = std::max(max_ratio, worst / tol);
    if (bad > 0 && reported++ < 4) {
      ADD_FAILURE() << label << " rank " << rank << " " << what << ": " << bad << " of "
                    << want.size() << " elements beyond tol " << tol << "; first [" << first
                    << "] engine " << got[first] << " reference " << want[first]
                    << "; max error " << worst;
    }
  }
};

void check_stats(const Prepared& p, const Expect& e, const co2_engine_stats_t& st, int rank,
                 const std::string& where) {
  const MathCase& c = p.c;
  const size_t n = c.layout.state_elements();
  EXPECT_EQ(st.world_size, c.world) << where;
  EXPECT_EQ(st.steps, e.steps) << where;
  EXPECT_EQ(st.rounds, e.rounds) << where;
  EXPECT_EQ(st.nonfinite_rounds, e.nonfinite_rounds) << where;
  if (c.algo == CO2_ALGO_CO2) {
    EXPECT_EQ(st.nonfinite_local, e.nonfinite_local[rank]) << where;
  }
  if (e.plain_so_far && c.algo != CO2_ALGO_SYNC) {
    // One all-reduce of the N-element buffer per boundary (co2: submitted at every boundary;
    // diloco: the blocking one; localsgd: the copy of p).
    EXPECT_EQ(st.bytes_reduced, e.rounds * n * sizeof(float)) << where;
  }
  if (c.algo == CO2_ALGO_LOCALSGD || c.algo == CO2_ALGO_SYNC) return;
  EXPECT_EQ(st.arrival_updates, e.arrival_updates) << where;
  if (e.has_update) {
    EXPECT_EQ(st.last_apply_step, uint32_t(e.last_apply_step)) << where;
  }
  EXPECT_EQ(st.resolved_outer_momentum, p.beta) << where;
  if (e.plain_so_far) {
    EXPECT_EQ(st.outer_updates, e.outer_updates) << where;
  }
  if (!e.has_update) return;
  const co2ref::UpdateRecord& u = e.last;
  if (!u.lambda.empty()) {
    const double lmin = *std::min_element(u.lambda.begin(), u.lambda.end());
    const double lmax = *std::max_element(u.lambda.begin(), u.lambda.end());
    // Λ's relative error: none/constant: 1/c, exact up to an fp32 round trip (1e-6 allowed);
    // gap: <= 2 tol / (rms step) (the margin above keeps it below 20%), + 1e-6.
    double rel = 1e-6;
    if (c.penalty == CO2_PENALTY_GAP) rel += 2.0 * e.tol / p.gap_rms_min;
    EXPECT_NEAR(st.last_penalty_min, lmin, rel * lmin) << where << " last_penalty_min";
    EXPECT_NEAR(st.last_penalty_max, lmax, rel * lmax) << where << " last_penalty_max";
  }
  if (c.clip == CO2_CLIP_NONE) {
    EXPECT_EQ(st.last_clip_scale_min, 1.0) << where;
    EXPECT_EQ(st.last_clip_fraction, 0.0) << where;
  } else if (c.clip == CO2_CLIP_VALUE) {
    // The margin guarantees fp32 decides every element as fp64 does: exact count.
    EXPECT_DOUBLE_EQ(st.last_clip_fraction, double(u.clamped) / double(u.clip_elements))
        << where << " (fraction of PARAMETER momentum elements clamped)";
  } else {
    const double smin = *std::min_element(u.clip_scale.begin(), u.clip_scale.end());
    // scale = φ/‖u‖: relative error <= ‖δu‖/‖u‖ <= 2 tol sqrt(n)/φ when clipped.
    EXPECT_NEAR(st.last_clip_scale_min, smin, 2.0 * e.tol * std::sqrt(double(n)) / c.phi + 1e-6)
        << where << " last_clip_scale_min";
    EXPECT_DOUBLE_EQ(st.last_clip_fraction,
                     double(u.segments_scaled) / double(c.layout.num_parameter_tensors()))
        << where << " (fraction of PARAMETER segments scaled)";
  }
}

std::mutex print_mutex;

void run_case(const MathCase& in) {
  Prepared p = prepare(in);
  if (p.expect.empty()) return;
  const MathCase& c = p.c;
  // Clipping cases must exercise both branches somewhere in the run.
  if (c.clip != CO2_CLIP_NONE && (c.algo == CO2_ALGO_CO2 || c.algo == CO2_ALGO_DILOCO)) {
    bool clipped = false, unclipped = false;
    for (const Expect& e : p.expect) {
      if (!e.has_update) continue;
      const size_t hit = c.clip == CO2_CLIP_VALUE ? e.last.clamped : e.last.segments_scaled;
      const size_t all = c.clip == CO2_CLIP_VALUE ? e.last.clip_elements : e.last.clip_scale.size();
      clipped = clipped || hit > 0;
      unclipped = unclipped || hit < all;
    }
    // (A layout with a single PARAMETER segment cannot have both under norm clipping.)
    if (c.clip == CO2_CLIP_NORM && c.layout.num_parameter_tensors() == 1) unclipped = true;
    EXPECT_TRUE(clipped && unclipped) << c.label << ": phi " << c.phi << " clips "
                                      << (clipped ? "everything" : "nothing");
  }
  const size_t n = c.layout.state_elements();
  std::vector<double> max_ratio(c.world, 0.0), max_err(c.world, 0.0);
  std::vector<std::vector<float>> averages(c.world);  // LOCAL_AVERAGE results, for bit-equality

  run_ranks(c.world, [&](int rank, co2_comm_t comm) {
    LocalModel model(c.layout, p.data, rank);
    EngineGuard eg;
    co2_engine_config_t cfg = engine_config(c);
    CO2_ASSERT_OK(co2_engine_create(comm, &cfg, &eg.engine));
    CO2_ASSERT_OK(model.register_with(eg.engine));
    CO2_ASSERT_OK(co2_engine_commit(eg.engine));
    // Commit broadcasts rank 0's values bit for bit.
    EXPECT_TRUE(bitwise_equal(model.gather_state(), p.rank0_init)) << "rank " << rank;
    size_t count = 0;
    CO2_ASSERT_OK(co2_engine_num_elements(eg.engine, &count));
    ASSERT_EQ(count, n);
    {
      const co2_engine_stats_t st = get_stats(eg.engine);
      EXPECT_EQ(st.world_size, c.world);
      if (c.algo == CO2_ALGO_CO2 || c.algo == CO2_ALGO_DILOCO) {
        EXPECT_EQ(st.resolved_outer_momentum, p.beta) << "after commit";
      }
      EXPECT_EQ(st.steps, 0u);
      EXPECT_EQ(st.rounds, 0u);
    }
    Checker chk{rank, c.label};
    std::vector<float> buf(n);
    bool anchor_unsupported_checked = false;
    uint64_t k = 0;
    for (size_t i = 0; i < c.script.size(); ++i) {
      const Action& a = c.script[i];
      const Expect& e = p.expect[i];
      std::ostringstream where_s;
      where_s << c.label << " rank " << rank << " action " << i << " (round " << e.rounds << ")";
      const std::string where = where_s.str();
      switch (a.op) {
        case Op::Step: {
          model.inner_step(k++);
          int b = -1;
          const co2_status_t s = co2_engine_step(eg.engine, nullptr, &b);
          ASSERT_EQ(s, e.status) << where << ": " << co2_status_string(s) << ": "
                                 << co2_last_error_message();
          // out_boundary is an output: written on success only.
          if (s == CO2_OK) {
            EXPECT_EQ(b, e.boundary ? 1 : 0) << where << " out_boundary";
          }
          break;
        }
        case Op::SetTau:
          CO2_ASSERT_OK(co2_engine_set_param(eg.engine, CO2_PARAM_TAU, double(a.value)));
          break;
        case Op::Finalize:
          CO2_ASSERT_OK(co2_engine_finalize(eg.engine));
          break;
        case Op::Synchronize:
          CO2_ASSERT_OK(co2_engine_synchronize(eg.engine));
          break;
        case Op::LocalAverage:
          CO2_ASSERT_OK(
              co2_engine_consensus(eg.engine, CO2_CONSENSUS_LOCAL_AVERAGE, buf.data(), n));
          chk.compare(buf.data(), e.average, e.tol, where + " consensus(LOCAL_AVERAGE)");
          averages[rank].insert(averages[rank].end(), buf.begin(), buf.end());
          break;
        case Op::InjectNonFinite:
          if (a.value == rank) *model.state_element(a.element) = float(a.x);
          break;
      }
      if (e.check_params) {
        const std::vector<float> got = model.gather_state();
        chk.compare(got.data(), e.params[size_t(rank)], e.tol, where + " params");
      }
      if (e.check_anchor) {
        CO2_ASSERT_OK(co2_engine_consensus(eg.engine, CO2_CONSENSUS_ANCHOR, buf.data(), n));
        chk.compare(buf.data(), e.anchor, e.tol, where + " consensus(ANCHOR)");
      } else if (c.algo == CO2_ALGO_LOCALSGD && !anchor_unsupported_checked) {
        anchor_unsupported_checked = true;
        CO2_EXPECT_STATUS(CO2_ERR_UNSUPPORTED,
                          co2_engine_consensus(eg.engine, CO2_CONSENSUS_ANCHOR, buf.data(), n));
      }
      if (e.boundary || e.check_params || a.op == Op::Finalize || a.op == Op::Synchronize)
        check_stats(p, e, get_stats(eg.engine), rank, where);
      if (::testing::Test::HasFatalFailure()) return;
    }
    EXPECT_TRUE(model.excluded_untouched()) << c.label << " rank " << rank
                                            << ": an EXCLUDED tensor was written";
    max_ratio[rank] = chk.max_ratio;
    max_err[rank] = chk.max_err;
    eg.reset();
  });

  // LOCAL_AVERAGE is an all-reduce: bit-identical on every rank.
  for (int r = 1; r < c.world; ++r)
    EXPECT_TRUE(bitwise_equal(averages[r], averages[0])) << c.label << " rank " << r;
  std::lock_guard<std::mutex> lock(print_mutex);
  std::printf("[ math ] %-44s max|x32-x64| = %.3g  (%.2g of tol %.3g, scale %.3g)\n",
              c.label.c_str(), *std::max_element(max_err.begin(), max_err.end()),
              *std::max_element(max_ratio.begin(), max_ratio.end()), p.final_tol, p.scale);
}

// ------------------------------------------------------------------------------------------
// Case lists
// ------------------------------------------------------------------------------------------

const char* algo_name(co2_algorithm_t a) {
  switch (a) {
    case CO2_ALGO_CO2: return "co2";
    case CO2_ALGO_DILOCO: return "diloco";
    case CO2_ALGO_LOCALSGD: return "localsgd";
    default: return "sync";
  }
}
const char* penalty_name(co2_penalty_t p) {
  return p == CO2_PENALTY_NONE ? "none" : p == CO2_PENALTY_CONSTANT ? "const" : "gap";
}
const char* clip_name(co2_clip_t c) {
  return c == CO2_CLIP_NONE ? "none" : c == CO2_CLIP_VALUE ? "value" : "norm";
}

// Every algorithm with an anchor or averaging, every W, τ in {1, 3}; β = 0.5 so the momentum
// path is exercised (localsgd ignores it).
std::vector<MathCase> sweep_cases() {
  std::vector<MathCase> out;
  for (co2_algorithm_t algo : {CO2_ALGO_CO2, CO2_ALGO_DILOCO, CO2_ALGO_LOCALSGD})
    for (int w : {1, 2, 3, 4})
      for (int tau : {1, 3}) {
        MathCase c;
        c.algo = algo;
        c.world = w;
        c.tau = tau;
        c.beta = 0.5;
        c.alpha = 0.8;
        c.seed = 11 + 7 * w + tau;
        c.label = std::string(algo_name(algo)) + "_W" + std::to_string(w) + "_tau" +
                  std::to_string(tau);
        out.push_back(c);
      }
  return out;
}

// Every penalty x clip x Nesterov for co2 and diloco, W = 3, τ = 3.
std::vector<MathCase> policy_cases() {
  std::vector<MathCase> out;
  for (co2_algorithm_t algo : {CO2_ALGO_CO2, CO2_ALGO_DILOCO})
    for (co2_penalty_t pen : {CO2_PENALTY_NONE, CO2_PENALTY_CONSTANT, CO2_PENALTY_GAP})
      for (co2_clip_t clip : {CO2_CLIP_NONE, CO2_CLIP_VALUE, CO2_CLIP_NORM})
        for (int nest : {0, 1}) {
          MathCase c;
          c.algo = algo;
          c.world = 3;
          c.tau = 3;
          c.penalty = pen;
          c.penalty_constant = 2.5;
          c.clip = clip;
          // value: |u| is O(0.1) here, so φ = 0.05 clamps some elements and not others;
          // norm: segment norms range from O(0.1) (1 element) to O(1) (31 elements).
          // The layout has 39 PARAMETER elements, so prepare() finds a φ near 0.05 whose
          // distance to every |u| of the run exceeds the fp32 error bound (run_case checks that
          // some elements are clamped and some are not, so the case is not vacuous).
          c.phi = clip == CO2_CLIP_VALUE ? 0.05 : 0.3;
          c.nesterov = nest;
          c.alpha = 0.7;
          // Value clipping with a large β: a clamped m gives u = βφ + Λc, which hovers within a
          // few percent of φ once the averages shrink, too close for any margin; β = 0.5 there.
          c.beta = clip == CO2_CLIP_VALUE ? 0.5 : 0.8;
          c.rounds = 8;
          c.seed = 100 + 10 * int(pen) + 3 * int(clip) + nest;
          c.label = std::string(algo_name(algo)) + "_pen_" + penalty_name(pen) + "_clip_" +
                    clip_name(clip) + (nest ? "_nesterov" : "");
          out.push_back(c);
        }
  return out;
}

// Layout variations: tensor sizes 1 and 7 alone, the flat storage (owned and adopted), and the
// 1000003-element tensor in a few combinations only (runtime).
std::vector<MathCase> layout_cases() {
  std::vector<MathCase> out;
  auto add = [&](MathCase c) { out.push_back(c); };
  for (size_t n : {size_t(1), size_t(7)})
    for (co2_algorithm_t algo : {CO2_ALGO_CO2, CO2_ALGO_DILOCO}) {
      MathCase c;
      c.layout = layout_single(n);
      c.algo = algo;
      c.world = 3;
      c.beta = 0.6;
      c.penalty = CO2_PENALTY_GAP;
      c.label = std::string(algo_name(algo)) + "_single" + std::to_string(n) + "_gap";
      add(c);
    }
  for (Storage st : {Storage::AllocFlat, Storage::AdoptFlat})
    for (co2_algorithm_t algo : {CO2_ALGO_CO2, CO2_ALGO_DILOCO, CO2_ALGO_LOCALSGD}) {
      MathCase c;
      c.layout = layout_mixed(st);
      c.algo = algo;
      c.world = 3;
      c.beta = 0.5;
      c.clip = CO2_CLIP_NORM;
      c.phi = 0.3;
      c.label = std::string(algo_name(algo)) + "_" + c.layout.name;
      add(c);
    }
  {
    MathCase c;
    c.layout = layout_big();
    c.algo = CO2_ALGO_CO2;
    c.world = 2;
    c.tau = 3;
    c.beta = 0.9;
    c.alpha = 0.7;
    c.nesterov = 1;
    c.penalty = CO2_PENALTY_GAP;
    c.clip = CO2_CLIP_NORM;
    c.phi = 30.0;  // the big segment's ‖u‖ is O(100): clipped
    c.rounds = 6;
    c.label = "co2_big_W2_gap_norm_nesterov";
    add(c);
    c = MathCase{};
    c.layout = layout_big();
    c.algo = CO2_ALGO_DILOCO;
    c.world = 3;
    c.tau = 1;
    c.beta = 0.5;
    c.penalty = CO2_PENALTY_CONSTANT;
    c.penalty_constant = 2.0;
    c.rounds = 6;
    c.label = "diloco_big_W3_const";
    add(c);
    c = MathCase{};
    c.layout = layout_big();
    c.algo = CO2_ALGO_CO2;
    c.world = 4;
    c.tau = 1;
    c.beta = CO2_OUTER_MOMENTUM_AUTO;
    c.rounds = 6;
    c.label = "co2_big_W4_auto_beta";
    add(c);
    c = MathCase{};
    c.layout = layout_big();
    c.algo = CO2_ALGO_LOCALSGD;
    c.world = 4;
    c.tau = 3;
    c.rounds = 5;
    c.label = "localsgd_big_W4";
    add(c);
  }
  return out;
}

// warmup_sync_rounds: boundaries 0..K-1 as diloco, boundary K like t = 0 of co2.
std::vector<MathCase> warmup_cases() {
  std::vector<MathCase> out;
  MathCase c;
  c.algo = CO2_ALGO_CO2;
  c.world = 3;
  c.tau = 3;
  c.warmup = 2;
  c.beta = 0.8;
  c.nesterov = 1;
  c.penalty = CO2_PENALTY_GAP;
  c.clip = CO2_CLIP_NORM;
  c.phi = 0.3;
  c.rounds = 7;
  c.label = "co2_warmup2_gap_norm_nesterov";
  out.push_back(c);
  c = MathCase{};
  c.algo = CO2_ALGO_CO2;
  c.world = 2;
  c.tau = 1;
  c.warmup = 3;
  c.beta = 0.0;
  c.rounds = 7;
  c.label = "co2_warmup3_tau1";
  out.push_back(c);
  return out;
}

// Scripts beyond plain rounds: τ changes, finalize/synchronize, LOCAL_AVERAGE, NaN skips.
std::vector<MathCase> script_cases() {
  std::vector<MathCase> out;
  // τ = 3; during round 1 set τ = 5 (round 1 still has 3 steps, round 2 has 5); during round 2
  // (after 4 of its 5 steps) set τ = 2: round 2 still ends after 5, round 3 has 2.
  for (co2_algorithm_t algo : {CO2_ALGO_CO2, CO2_ALGO_DILOCO, CO2_ALGO_LOCALSGD}) {
    MathCase c;
    c.algo = algo;
    c.world = 2;
    c.tau = 3;
    c.beta = 0.5;
    c.script = steps(3);
    c.script += steps(1);
    c.script.push_back({Op::SetTau, 5});
    c.script += steps(2 + 4);
    c.script.push_back({Op::SetTau, 2});
    c.script += steps(1 + 2 + 2);
    c.label = std::string(algo_name(algo)) + "_tau_change";
    out.push_back(c);
  }
  // LOCAL_AVERAGE mid-round (collective, does not change the trajectory).
  for (co2_algorithm_t algo : {CO2_ALGO_CO2, CO2_ALGO_DILOCO, CO2_ALGO_LOCALSGD}) {
    MathCase c;
    c.algo = algo;
    c.world = 3;
    c.tau = 3;
    c.beta = 0.5;
    for (int r = 0; r < 4; ++r) {
      c.script += steps(2);
      c.script.push_back({Op::LocalAverage});
      c.script += steps(1);
    }
    c.label = std::string(algo_name(algo)) + "_local_average_mid_round";
    out.push_back(c);
  }
  // finalize after a boundary, then more rounds (the next boundary behaves like t = 0);
  // synchronize mid-round (one more update with the fresh average, the next round starts
  // afresh) and right after a boundary.
  for (co2_algorithm_t algo : {CO2_ALGO_CO2, CO2_ALGO_DILOCO, CO2_ALGO_LOCALSGD}) {
    MathCase c;
    c.algo = algo;
    c.world = 3;
    c.tau = 3;
    c.beta = 0.6;
    c.penalty = algo == CO2_ALGO_LOCALSGD ? CO2_PENALTY_NONE : CO2_PENALTY_GAP;
    c.script = steps(9);
    c.script.push_back({Op::Finalize});
    c.script += steps(6);
    c.script.push_back({Op::Synchronize});  // right after a boundary
    c.script += steps(3 + 1);
    c.script.push_back({Op::Synchronize});  // mid-round, 1 step into the round
    c.script += steps(9);
    c.label = std::string(algo_name(algo)) + "_finalize_synchronize";
    out.push_back(c);
  }
  // finalize mid-round keeps the partial round (one more update with the fresh average of its
  // deltas, as synchronize), and with fewer steps than tau it returns the average of the ranks'
  // models, not the initial weights.
  for (co2_algorithm_t algo : {CO2_ALGO_CO2, CO2_ALGO_DILOCO, CO2_ALGO_LOCALSGD}) {
    MathCase c;
    c.algo = algo;
    c.world = 3;
    c.tau = 3;
    c.beta = 0.6;
    c.penalty = algo == CO2_ALGO_LOCALSGD ? CO2_PENALTY_NONE : CO2_PENALTY_GAP;
    c.script = steps(9 + 2);
    c.script.push_back({Op::Finalize});  // 2 steps into the round
    c.script += steps(6);
    c.script.push_back({Op::SetTau, 48});
    c.script += steps(3 + 30);  // the boundary at step 3 starts a round of tau 48
    c.script.push_back({Op::Finalize});  // 30 of its 48 steps
    c.label = std::string(algo_name(algo)) + "_finalize_mid_round";
    out.push_back(c);
    c.tau = 48;
    c.script = steps(30);  // never a boundary: finalize alone averages the work
    c.script.push_back({Op::Finalize});
    c.label = std::string(algo_name(algo)) + "_finalize_before_the_first_boundary";
    out.push_back(c);
  }
  // A NaN in one rank's params before a co2 boundary: OK there (nonfinite_local), the next
  // boundary skips the average (CO2_ERR_NONFINITE everywhere, a, m and the gap history
  // unchanged), and the run continues as the reference says. diloco: skipped at once.
  for (co2_algorithm_t algo : {CO2_ALGO_CO2, CO2_ALGO_DILOCO}) {
    for (double bad : {std::nan(""), double(INFINITY)}) {
      MathCase c;
      c.algo = algo;
      c.world = 3;
      c.tau = 3;
      c.beta = 0.7;
      c.penalty = CO2_PENALTY_GAP;
      c.script = steps(6 + 2);
      c.script.push_back({Op::InjectNonFinite, 1, 30, bad});
      c.script += steps(1 + 12);
      c.label = std::string(algo_name(algo)) + (std::isnan(bad) ? "_nan" : "_inf") +
                "_skips_round";
      out.push_back(c);
    }
  }
  return out;
}

// The eager policy: a twin of every co2 case of the lists above, and β = 0 without Nesterov
// (the offset without its own momentum buffer) at every W.
std::vector<MathCase> eager_cases() {
  std::vector<MathCase> out;
  for (auto list : {sweep_cases, policy_cases, layout_cases, warmup_cases, script_cases})
    for (MathCase c : list()) {
      if (c.algo != CO2_ALGO_CO2) continue;
      c.eager = 1;
      c.label += "_eager";
      out.push_back(c);
    }
  for (int w : {1, 2, 3, 4}) {
    MathCase c;
    c.world = w;
    c.tau = 2;
    c.beta = 0.0;
    c.alpha = 0.9;
    c.eager = 1;
    c.seed = 500 + w;
    c.label = "co2_eager_beta0_W" + std::to_string(w);
    out.push_back(c);
  }
  return out;
}

// Sharded outer state: a twin of every co2 case of the lists above, delayed and eager, against
// the same float64 reference.
std::vector<MathCase> sharded_cases() {
  std::vector<MathCase> out;
  for (auto list : {sweep_cases, policy_cases, layout_cases, warmup_cases, script_cases, eager_cases})
    for (MathCase c : list()) {
      if (c.algo != CO2_ALGO_CO2) continue;
      c.shard = 1;
      c.label += "_sharded";
      out.push_back(c);
    }
  return out;
}

// Applying the average on arrival at a fixed step: a twin of every co2 case of the lists above,
// delayed and eager, at step 1 of the round (and at step 2 for rounds of more than two steps:
// the eager twins), against the reference's arrival rule. τ = 1 and τ changes make some rounds
// shorter than the step: those apply at the boundary, as the rule says.
// Of the million-element layouts (3 s each) one case: the pass is the same at every size.
std::vector<MathCase> arrival_cases() {
  std::vector<MathCase> out;
  for (auto list : {sweep_cases, policy_cases, layout_cases, warmup_cases, script_cases, eager_cases})
    for (MathCase c : list()) {
      if (c.algo != CO2_ALGO_CO2) continue;
      if (c.layout.state_elements() > 10000 && c.label != "co2_big_W2_gap_norm_nesterov_eager") continue;
      c.apply_step = c.eager && c.tau > 2 ? 2 : 1;
      c.label += "_arrival" + std::to_string(c.apply_step);
      out.push_back(c);
    }
  return out;
}

// The same with sharded outer state (small layouts: Sharded/* covers the big one's shards).
std::vector<MathCase> sharded_arrival_cases() {
  std::vector<MathCase> out;
  for (MathCase c : arrival_cases()) {
    if (c.layout.state_elements() > 10000) continue;
    c.shard = 1;
    c.label += "_sharded";
    out.push_back(c);
  }
  return out;
}

class EngineMath : public ::testing::TestWithParam<MathCase> {};
TEST_P(EngineMath, MatchesReference) { run_case(GetParam()); }

std::string case_name(const ::testing::TestParamInfo<MathCase>& info) { return info.param.label; }

INSTANTIATE_TEST_SUITE_P(AlgoWorldTau, EngineMath, ::testing::ValuesIn(sweep_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Policies, EngineMath, ::testing::ValuesIn(policy_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Layouts, EngineMath, ::testing::ValuesIn(layout_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Warmup, EngineMath, ::testing::ValuesIn(warmup_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Scripts, EngineMath, ::testing::ValuesIn(script_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Eager, EngineMath, ::testing::ValuesIn(eager_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Sharded, EngineMath, ::testing::ValuesIn(sharded_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Arrival, EngineMath, ::testing::ValuesIn(arrival_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(ShardedArrival, EngineMath, ::testing::ValuesIn(sharded_arrival_cases()), case_name);

// ------------------------------------------------------------------------------------------
// Specific properties
// ------------------------------------------------------------------------------------------

// The eager policy is Kale et al.'s rule (arXiv 2502.12996) as the paper states it: every rank
// keeps its own outer parameters θ_i and outer momentum M_i and applies
// Δ̃_i = Δ̄_{t-1} + (Δ_i,t - Δ_i,t-1)/W. The engine keeps one anchor for the group and a rank-local
// offset instead (docs/algorithm.md derives the equivalence for penalty none and clip none).
// Here, in fp64 on both sides, the reference's anchor + offset against a direct simulation of the
// per-rank rule; the engine matches the reference in the Eager cases above.
TEST(EngineMathProperty, EagerIsKalesPerRankOuterOptimizer) {
  const Layout layout = layout_single(29);
  for (int w : {1, 2, 4})
    for (double beta : {0.0, 0.5, 0.9})
      for (bool nesterov : {false, true}) {
        const double alpha = 0.8;
        const int tau = 3, rounds = 8;
        const Data data = make_data(layout, w, 77 + uint64_t(w));
        const std::vector<double> init = concat_state(layout, data.init[0]);
        std::vector<std::vector<double>> targets;
        for (int r = 0; r < w; ++r) targets.push_back(concat_state(layout, data.target[r]));
        co2ref::Config cfg;
        cfg.tau = tau;
        cfg.alpha = alpha;
        cfg.beta = beta;
        cfg.nesterov = nesterov;
        cfg.eager = true;
        co2ref::Reference ref(cfg, ref_segments(layout), w, init);

        const size_t n = init.size();
        std::vector<std::vector<double>> theta(size_t(w), init), p = theta;
        std::vector<std::vector<double>> momentum(size_t(w), std::vector<double>(n, 0.0));
        std::vector<std::vector<double>> previous_delta = momentum;
        std::vector<double> stale_average(n, 0.0);  // Δ̄_{t-1}; zero before the first round
        uint64_t k = 0;
        double worst = 0.0;
        for (int round = 0; round < rounds; ++round) {
          for (int step = 0; step < tau; ++step, ++k) {
            for (int r = 0; r < w; ++r) {
              ref_inner_step(ref.p(r), targets[size_t(r)], k);
              ref_inner_step(p[size_t(r)], targets[size_t(r)], k);
            }
            ref.step();
          }
          std::vector<double> average(n, 0.0);
          for (int r = 0; r < w; ++r) {
            auto& th = theta[size_t(r)];
            for (size_t i = 0; i < n; ++i) {
              const double delta = th[i] - p[size_t(r)][i];
              average[i] += delta / double(w);
              const double eager = stale_average[i] + (delta - previous_delta[size_t(r)][i]) / double(w);
              previous_delta[size_t(r)][i] = delta;
              double& m = momentum[size_t(r)][i];
              m = beta * m + eager;
              th[i] -= alpha * (nesterov ? beta * m + eager : m);
            }
            p[size_t(r)] = th;
          }
          stale_average = average;
          for (int r = 0; r < w; ++r)
            for (size_t i = 0; i < n; ++i)
              worst = std::max(worst, std::fabs(ref.p(r)[i] - theta[size_t(r)][i]));
        }
        EXPECT_LT(worst, 1e-12 * std::max(1.0, ref.scale()))
            << "W " << w << " beta " << beta << (nesterov ? " nesterov" : "");
        // Not vacuous: the ranks really start their rounds from different points.
        if (w > 1) { EXPECT_GT(std::fabs(theta[0][0] - theta[1][0]), 1e-6); }
      }
}

// β = 0 with α = 1 still averages (the released code switches itself off there). diloco: the
// anchor after a boundary is the plain mean of the ranks' params before it. co2: the update at
// boundary t is -Δ̄_{t-1} = -(a_start(t-1) - mean_i p_i^{t-1}): the stale mean; BUFFER elements
// carry their values, so their anchor is the stale mean itself. Checked against values the test
// computes itself from what the ranks held (not via the reference).
TEST(EngineMathProperty, BetaZeroAlphaOneAverages) {
  for (co2_algorithm_t algo : {CO2_ALGO_DILOCO, CO2_ALGO_CO2}) {
    for (double beta : {0.0, CO2_OUTER_MOMENTUM_AUTO}) {
      const int W = 3, tau = 2, R = 5;
      const Layout layout = layout_mixed();
      const Data data = make_data(layout, W, 77);
      const size_t n = layout.state_elements();
      // before[t][r]: rank r's params just before boundary t; anchor[t]: after boundary t.
      std::vector<std::vector<std::vector<float>>> before(R, std::vector<std::vector<float>>(W));
      std::vector<std::vector<float>> anchor(R), committed(1);
      run_ranks(W, [&](int rank, co2_comm_t comm) {
        LocalModel model(layout, data, rank);
        EngineGuard eg;
        co2_engine_config_t cfg = CO2_ENGINE_CONFIG_INIT;
        cfg.eager = 0;  // the delayed schedule (eager has its own cases)
        cfg.algorithm = algo;
        cfg.tau = tau;
        cfg.outer_lr = 1.0;
        cfg.outer_momentum = beta;
        CO2_ASSERT_OK(co2_engine_create(comm, &cfg, &eg.engine));
        CO2_ASSERT_OK(model.register_with(eg.engine));
        CO2_ASSERT_OK(co2_engine_commit(eg.engine));
        if (rank == 0) committed[0] = model.gather_state();
        EXPECT_EQ(get_stats(eg.engine).resolved_outer_momentum, 0.0);
        uint64_t k = 0;
        std::vector<float> buf(n);
        for (int t = 0; t < R; ++t) {
          for (int j = 0; j < tau; ++j) {
            model.inner_step(k++);
            if (j == tau - 1) before[t][rank] = model.gather_state();
            CO2_ASSERT_OK(co2_engine_step(eg.engine, nullptr, nullptr));
          }
          CO2_ASSERT_OK(co2_engine_consensus(eg.engine, CO2_CONSENSUS_ANCHOR, buf.data(), n));
          if (rank == 0) anchor[t] = buf;
        }
      });
      if (HasFailure()) return;
      std::vector<bool> buffer_element;
      for (const auto& spec : layout.tensors)
        if (spec.role != CO2_ROLE_EXCLUDED) buffer_element.insert(buffer_element.end(), spec.count, spec.role == CO2_ROLE_BUFFER);
      // Tolerance: a handful of fp32 roundings of O(1) values per round (see tolerance()).
      const double tol = 1e-5;
      for (int t = 0; t < R; ++t) {
        const std::vector<float>& a_prev = t == 0 ? committed[0] : anchor[t - 1];
        double moved = 0.0;
        for (size_t i = 0; i < n; ++i) {
          double want;
          if (algo == CO2_ALGO_DILOCO) {
            want = 0.0;
            for (int r = 0; r < W; ++r) want += before[t][r][i];
            want /= W;
          } else if (t == 0) {
            want = a_prev[i];  // round 0 of co2 applies nothing
          } else {
            const std::vector<float>& a_start = t == 1 ? committed[0] : anchor[t - 2];
            double mean = 0.0;
            for (int r = 0; r < W; ++r) mean += before[t - 1][r][i];
            mean /= W;
            want = buffer_element[i] ? mean : double(a_prev[i]) - (double(a_start[i]) - mean);
          }
          ASSERT_NEAR(anchor[t][i], want, tol)
              << algo_name(algo) << " beta " << beta << " boundary " << t << " element " << i;
          moved = std::max(moved, std::fabs(double(anchor[t][i]) - a_prev[i]));
        }
        if (algo == CO2_ALGO_DILOCO || t > 0) {
          EXPECT_GT(moved, 1e-3) << "the anchor did not move at boundary " << t
                                 << ": averaging switched itself off";
        }
      }
    }
  }
}

void leave_matches_the_reference(bool sharded) {
  SCOPED_TRACE(sharded ? "sharded outer state" : "replicated outer state");
  const int W = 3, tau = 3, leaver = 1;
  const uint64_t request_at = 7, total_steps = 30;
  const double alpha = 0.8, beta = 0.5;
  const Layout layout = layout_mixed();
  const Data data = make_data(layout, W, 91);
  std::vector<uint64_t> changed_at(W, 0);
  std::vector<std::vector<float>> final_state(W);  // the members after finalize, the leaver when let go
  std::vector<int32_t> final_size(W, 0);
  co2test::CommOptions options;
  options.elastic_min_ranks = 1;
  run_ranks(W, [&](int rank, co2_comm_t comm) {
    LocalModel model(layout, data, rank);
    EngineGuard eg;
    co2_engine_config_t cfg = CO2_ENGINE_CONFIG_INIT;
    cfg.tau = tau;
    cfg.outer_lr = alpha;
    cfg.outer_momentum = beta;
    cfg.shard_outer_state = sharded;
    CO2_ASSERT_OK(co2_engine_create(comm, &cfg, &eg.engine));
    CO2_ASSERT_OK(model.register_with(eg.engine));
    CO2_ASSERT_OK(co2_engine_commit(eg.engine));
    for (uint64_t k = 0; get_stats(eg.engine).steps < total_steps; ++k) {
      if (rank == leaver && k == request_at) CO2_ASSERT_OK(co2_engine_leave(eg.engine));
      model.inner_step(k);
      const co2_status_t s = co2_engine_step(eg.engine, nullptr, nullptr);
      if (s == CO2_OK) continue;
      ASSERT_EQ(s, rank == leaver ? CO2_LEFT : CO2_MEMBERSHIP_CHANGED) << co2_last_error_message();
      changed_at[rank] = get_stats(eg.engine).steps;
      if (rank == leaver) {
        final_state[rank] = model.gather_state();
        CO2_EXPECT_STATUS(CO2_LEFT, co2_engine_step(eg.engine, nullptr, nullptr));
        return;
      }
    }
    CO2_ASSERT_OK(co2_engine_finalize(eg.engine));
    final_state[rank] = model.gather_state();
    CO2_ASSERT_OK(co2_comm_size(comm, &final_size[rank]));
  }, options);
  if (::testing::Test::HasFailure()) return;
  const uint64_t change = changed_at[0];
  for (int r = 0; r < W; ++r) ASSERT_EQ(changed_at[r], change) << "rank " << r << " saw the leave elsewhere";
  ASSERT_GT(change, request_at);
  ASSERT_LE(change, request_at + 2 * tau) << "not let go at the second boundary after the request";
  EXPECT_EQ(final_size[0], W - 1);
  EXPECT_EQ(final_size[2], W - 1);

  co2ref::Config rc;
  rc.tau = tau;
  rc.alpha = alpha;
  rc.beta = beta;
  rc.eager = true;
  co2ref::Reference ref(rc, ref_segments(layout), W, concat_state(layout, data.init[0]));
  std::vector<std::vector<double>> targets;
  for (int r = 0; r < W; ++r) targets.push_back(concat_state(layout, data.target[r]));
  std::vector<int> thread_of = {0, 1, 2};  // reference rank -> the thread (its data)
  std::vector<double> left_with;
  for (uint64_t k = 0; k < total_steps; ++k) {
    for (int r = 0; r < ref.world_size(); ++r) ref_inner_step(ref.p(r), targets[size_t(thread_of[size_t(r)])], k);
    ref.step();
    if (k + 1 == change) {
      ref.leave(leaver);
      thread_of.erase(thread_of.begin() + leaver);
      left_with = ref.p(0);  // every rank's parameters after the synchronize
    }
  }
  ref.finalize();
  ASSERT_EQ(ref.world_size(), W - 1);
  const double tol = 2e-5 * std::max(ref.scale(), 1.0);
  double leave_moved = 0.0;
  for (size_t i = 0; i < left_with.size(); ++i) {
    ASSERT_NEAR(final_state[leaver][i], left_with[i], tol) << "the leaver's parameters, element " << i;
    ASSERT_NEAR(final_state[0][i], ref.p(0)[i], tol) << "rank 0 after finalize, element " << i;
    ASSERT_EQ(final_state[0][i], final_state[2][i]) << "the members differ at element " << i;
    leave_moved = std::max(leave_moved, std::fabs(double(final_state[0][i]) - left_with[i]));
  }
  EXPECT_GT(leave_moved, 1e-3) << "the members did not train after the leave";
}

// A rank that leaves an elastic group (co2_engine_leave over the local transport; docs/algorithm.md,
// "Leaving"): W = 3, rank 1 asks at step 7, every rank learns at one boundary that it goes; there
// the group synchronizes and the others train on at W = 2 to step 30 and finalize. The fp64
// reference replays the same membership: 3 ranks up to that step, the rank removed after a
// synchronize, 2 ranks after it. Eager (the default) and outer momentum 0.5, handed over; the
// outer state replicated, and sharded (the leaver's shard gathered before it goes).
TEST(EngineMathProperty, ALeaveMatchesTheReferenceOverTheChangingMembership) {
  for (bool sharded : {false, true}) leave_matches_the_reference(sharded);
}

// A thread that joins a running elastic group (over the local transport; docs/algorithm.md,
// "Joining"): W = 2 train; at step 8 they wait until a third thread asked co2_comm_create for the
// same group, and it is admitted at a later boundary: the members synchronize, the joiner receives the
// anchor, outer momentum and gap history, and all three train on to step 30 and finalize. The
// fp64 reference replays it: 2 ranks, a synchronize, 3 ranks. Eager and outer momentum 0.5;
// replicated and sharded outer state (the members' shards re-cut for 3 ranks).
void join_matches_the_reference(bool sharded) {
  SCOPED_TRACE(sharded ? "sharded outer state" : "replicated outer state");
  const int members = 2, W = 3, tau = 3;
  const uint64_t ask_after = 7, total_steps = 30;
  const double alpha = 0.8, beta = 0.5;
  const Layout layout = layout_mixed();
  const Data data = make_data(layout, W, 93);
  const std::string group = co2test::unique_group_name();
  co2test::CommOptions options;
  options.elastic_min_ranks = 1;
  std::atomic<bool> members_passed{false}, joiner_asking{false};
  std::vector<uint64_t> changed_at(W, 0);
  std::vector<std::vector<float>> final_state(W);
  std::vector<int32_t> final_rank(W, -1), final_size(W, 0);
  co2test::run_threads(W, [&](int thread) {
    const bool joiner = thread == members;
    if (joiner) {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      while (!members_passed.load() && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      ASSERT_TRUE(members_passed.load()) << "the members never reached step " << ask_after;
      joiner_asking = true;
    }
    co2_comm_t comm = nullptr;
    // The joiner's rank and size are its wish; the group assigns them.
    ASSERT_EQ(co2test::create_comm(group, joiner ? 0 : thread, joiner ? 1 : members, &comm, options), CO2_OK)
        << co2_last_error_message();
    {
      LocalModel model(layout, data, thread);
      EngineGuard eg;
      co2_engine_config_t cfg = CO2_ENGINE_CONFIG_INIT;
      cfg.tau = tau;
      cfg.outer_lr = alpha;
      cfg.outer_momentum = beta;
      cfg.shard_outer_state = sharded;
      CO2_ASSERT_OK(co2_engine_create(comm, &cfg, &eg.engine));
      CO2_ASSERT_OK(model.register_with(eg.engine));
      CO2_ASSERT_OK(co2_engine_commit(eg.engine));
      if (joiner) changed_at[thread] = get_stats(eg.engine).steps;
      for (uint64_t k = get_stats(eg.engine).steps; get_stats(eg.engine).steps < total_steps; ++k) {
        model.inner_step(k);
        const co2_status_t s = co2_engine_step(eg.engine, nullptr, nullptr);
        if (!joiner && get_stats(eg.engine).steps == ask_after + 1) {
          // The members wait until the joiner has asked, so that they admit it while they train.
          members_passed = true;
          const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
          while (!joiner_asking.load() && std::chrono::steady_clock::now() < deadline)
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
          std::this_thread::sleep_for(std::chrono::milliseconds(100));  // its request is at the door
        }
        if (s == CO2_OK) continue;
        ASSERT_EQ(s, CO2_MEMBERSHIP_CHANGED) << co2_last_error_message();
        ASSERT_FALSE(joiner) << "the joiner saw a membership change";
        changed_at[thread] = get_stats(eg.engine).steps;
      }
      CO2_ASSERT_OK(co2_engine_finalize(eg.engine));
      final_state[thread] = model.gather_state();
    }
    CO2_ASSERT_OK(co2_comm_rank(comm, &final_rank[thread]));
    CO2_ASSERT_OK(co2_comm_size(comm, &final_size[thread]));
    co2_comm_destroy(comm);
  });
  if (::testing::Test::HasFailure()) return;
  const uint64_t change = changed_at[0];
  for (int r = 0; r < W; ++r) ASSERT_EQ(changed_at[r], change) << "thread " << r << " saw the join elsewhere";
  ASSERT_GT(change, ask_after);
  for (int r = 0; r < W; ++r) {
    EXPECT_EQ(final_rank[r], r);
    EXPECT_EQ(final_size[r], W);
  }

  co2ref::Config rc;
  rc.tau = tau;
  rc.alpha = alpha;
  rc.beta = beta;
  rc.eager = true;
  co2ref::Reference ref(rc, ref_segments(layout), members, concat_state(layout, data.init[0]));
  std::vector<std::vector<double>> targets;
  for (int r = 0; r < W; ++r) targets.push_back(concat_state(layout, data.target[r]));
  for (uint64_t k = 0; k < total_steps; ++k) {
    for (int r = 0; r < ref.world_size(); ++r) ref_inner_step(ref.p(r), targets[size_t(r)], k);
    ref.step();
    if (k + 1 == change) ref.join();
  }
  ref.finalize();
  ASSERT_EQ(ref.world_size(), W);
  const double tol = 2e-5 * std::max(ref.scale(), 1.0);
  for (size_t i = 0; i < final_state[0].size(); ++i) {
    ASSERT_NEAR(final_state[0][i], ref.p(0)[i], tol) << "rank 0 after finalize, element " << i;
    for (int r = 1; r < W; ++r) ASSERT_EQ(final_state[0][i], final_state[r][i]) << "rank " << r << " differs at element " << i;
  }
}

TEST(EngineMathProperty, AJoinMatchesTheReferenceOverTheChangingMembership) {
  for (bool sharded : {false, true}) join_matches_the_reference(sharded);
}

// Auto β resolves by the number of outer participants: 0 up to 16 ranks (17: 0.2).
TEST(EngineMathProperty, AutoBetaResolvesByWorldSize) {
  for (int W : {1, 2, 3, 4, 16, 17}) {
    const Layout layout = layout_single(7);
    const Data data = make_data(layout, W, 5);
    run_ranks(W, [&](int rank, co2_comm_t comm) {
      LocalModel model(layout, data, rank);
      EngineGuard eg;
      co2_engine_config_t cfg = CO2_ENGINE_CONFIG_INIT;  // β = CO2_OUTER_MOMENTUM_AUTO
      cfg.eager = 0;  // the delayed schedule (eager has its own cases)
      cfg.tau = 1;
      CO2_ASSERT_OK(co2_engine_create(comm, &cfg, &eg.engine));
      CO2_ASSERT_OK(model.register_with(eg.engine));
      CO2_ASSERT_OK(co2_engine_commit(eg.engine));
      model.inner_step(0);
      CO2_ASSERT_OK(co2_engine_step(eg.engine, nullptr, nullptr));
      EXPECT_EQ(get_stats(eg.engine).resolved_outer_momentum, co2ref::auto_beta(W))
          << "W = " << W;
    });
  }
  EXPECT_EQ(co2ref::auto_beta(16), 0.0);
  EXPECT_EQ(co2ref::auto_beta(17), 0.2);
}

// step's out_boundary: 1 exactly on every τ-th call, 0 otherwise; NULL is allowed.
TEST(EngineMathProperty, StepReportsBoundary) {
  const int W = 2, tau = 4;
  const Layout layout = layout_single(7);
  const Data data = make_data(layout, W, 9);
  run_ranks(W, [&](int rank, co2_comm_t comm) {
    LocalModel model(layout, data, rank);
    EngineGuard eg;
    co2_engine_config_t cfg = CO2_ENGINE_CONFIG_INIT;
    cfg.eager = 0;  // the delayed schedule (eager has its own cases)
    cfg.tau = tau;
    CO2_ASSERT_OK(co2_engine_create(comm, &cfg, &eg.engine));
    CO2_ASSERT_OK(model.register_with(eg.engine));
    CO2_ASSERT_OK(co2_engine_commit(eg.engine));
    for (int i = 1; i <= 4 * tau; ++i) {
      model.inner_step(i);
      if (i % 3 == 0) {
        CO2_ASSERT_OK(co2_engine_step(eg.engine, nullptr, nullptr));
      } else {
        int b = -1;
        CO2_ASSERT_OK(co2_engine_step(eg.engine, nullptr, &b));
        EXPECT_EQ(b, i % tau == 0 ? 1 : 0) << "step " << i;
      }
    }
    const co2_engine_stats_t st = get_stats(eg.engine);
    EXPECT_EQ(st.steps, uint64_t(4 * tau));
    EXPECT_EQ(st.rounds, 4u);
  });
}

// A τ set right after a boundary: the round that boundary started is already in progress, so
// by docs/algorithm.md ("the round in progress ends after the τ that was in force when it
// began") it keeps the old τ; the new one applies from the following boundary on.
TEST(EngineMathProperty, TauSetRightAfterBoundaryAppliesFromTheNextBoundary) {
  const int W = 2;
  const Layout layout = layout_single(7);
  const Data data = make_data(layout, W, 13);
  run_ranks(W, [&](int rank, co2_comm_t comm) {
    LocalModel model(layout, data, rank);
    EngineGuard eg;
    co2_engine_config_t cfg = CO2_ENGINE_CONFIG_INIT;
    cfg.eager = 0;  // the delayed schedule (eager has its own cases)
    cfg.tau = 2;
    CO2_ASSERT_OK(co2_engine_create(comm, &cfg, &eg.engine));
    CO2_ASSERT_OK(model.register_with(eg.engine));
    CO2_ASSERT_OK(co2_engine_commit(eg.engine));
    std::vector<int> flags;
    uint64_t k = 0;
    auto step = [&] {
      model.inner_step(k++);
      int b = -1;
      CO2_EXPECT_OK(co2_engine_step(eg.engine, nullptr, &b));
      flags.push_back(b);
    };
    step();
    step();  // boundary 0 (τ = 2)
    CO2_ASSERT_OK(co2_engine_set_param(eg.engine, CO2_PARAM_TAU, 4.0));
    double tau = 0;
    CO2_ASSERT_OK(co2_engine_get_param(eg.engine, CO2_PARAM_TAU, &tau));
    EXPECT_EQ(tau, 4.0);
    for (int i = 0; i < 2 + 4; ++i) step();
    EXPECT_EQ(flags, (std::vector<int>{0, 1, 0, 1, 0, 0, 0, 1})) << "rank " << rank;
  });
}

// CO2_APPLY_ON_ARRIVAL: the step comes from the ranks' agreed measurements (here the ranks' steps
// vary), the same on every rank, and every rank applies the average there; the trajectory is
// the reference's with the average applied at those steps, which the test reads from the
// engine's statistics (last_apply_step, arrival_updates).
TEST(EngineMathProperty, AgreedArrivalAppliesAtOneStepOnEveryRankAsTheReference) {
  int total_mid_round = 0;
  for (int W : {2, 3, 4})
    for (int eager : {0, 1}) {
      MathCase c;
      c.world = W;
      c.tau = 6;
      c.beta = 0.5;
      c.alpha = 0.8;
      c.eager = eager;
      c.layout = layout_mixed();
      c.seed = 70 + 10 * W + eager;
      const int rounds = 10;  // the first few apply at the boundary, until the ranks have measured
      const Data data = make_data(c.layout, W, c.seed);
      const size_t n = c.layout.state_elements();
      std::vector<std::vector<int>> applied(W);  // per rank and step: the round's step it applied at, or 0
      std::vector<std::vector<float>> params(W), anchors(W, std::vector<float>(n));
      run_ranks(W, [&](int rank, co2_comm_t comm) {
        LocalModel model(c.layout, data, rank);
        EngineGuard eg;
        co2_engine_config_t cfg = engine_config(c);
        cfg.apply_step = CO2_APPLY_ON_ARRIVAL;
        CO2_ASSERT_OK(co2_engine_create(comm, &cfg, &eg.engine));
        CO2_ASSERT_OK(model.register_with(eg.engine));
        CO2_ASSERT_OK(co2_engine_commit(eg.engine));
        uint64_t arrivals = 0;
        for (int i = 0; i < rounds * c.tau; ++i) {
          model.inner_step(uint64_t(i));
          // Steps of a few milliseconds, longer than a loopback all-reduce of this model; each
          // rank's steps vary (the same on average over W steps), so that the ranks see an
          // average arrive at different steps.
          std::this_thread::sleep_for(std::chrono::milliseconds(3 + ((i + rank) % W == 0 ? 2 : 0)));
          CO2_ASSERT_OK(co2_engine_step(eg.engine, nullptr, nullptr));
          const co2_engine_stats_t st = get_stats(eg.engine);
          applied[rank].push_back(st.arrival_updates > arrivals ? int(st.last_apply_step) : 0);
          arrivals = st.arrival_updates;
        }
        params[rank] = model.gather_state();
        CO2_ASSERT_OK(co2_engine_consensus(eg.engine, CO2_CONSENSUS_ANCHOR, anchors[rank].data(), n));
      });
      const std::string label = "W" + std::to_string(W) + (eager ? " eager" : " delayed");
      int mid_round = 0;
      for (int r = 1; r < W; ++r) EXPECT_EQ(applied[r], applied[0]) << label << ": rank " << r << " applied elsewhere";
      for (int k : applied[0]) mid_round += k > 0;
      std::printf("[ math ] agreed arrival %-12s %d of %d rounds applied their average mid-round\n", label.c_str(),
                  mid_round, rounds - 1);
      total_mid_round += mid_round;
      for (int r = 1; r < W; ++r) EXPECT_TRUE(bitwise_equal(anchors[r], anchors[0])) << label << " rank " << r;

      std::vector<double> init = concat_state(c.layout, data.init[0]);
      co2ref::Reference ref(ref_config(c), ref_segments(c.layout), W, init);
      std::vector<std::vector<double>> targets;
      for (int r = 0; r < W; ++r) targets.push_back(concat_state(c.layout, data.target[r]));
      for (int i = 0; i < rounds * c.tau; ++i) {
        if (i % c.tau == 0) {  // the step this round applies at, as the engine agreed it
          int k = 0;
          for (int j = i; j < i + c.tau; ++j) k = std::max(k, applied[0][size_t(j)]);
          ref.set_apply_step(k);
        }
        for (int r = 0; r < W; ++r) ref_inner_step(ref.p(r), targets[r], uint64_t(i));
        ref.step();
      }
      const double tol = tolerance(c, ref.beta(), ref.scale(), 2 * rounds + 1);
      for (int r = 0; r < W; ++r) {
        Checker chk{r, label};
        chk.compare(params[r].data(), ref.p(r), tol, "params");
        chk.compare(anchors[r].data(), ref.anchor(), tol, "anchor");
      }
    }
  // Over loopback an average arrives within a step: once measured, rounds apply it mid-round (as
  // printed); a loaded machine may delay some, but not all of them, or this test checks nothing.
  EXPECT_GT(total_mid_round, 0);
}

// sync: reduce_gradients averages the gradients passed in that call; step only counts and
// averages BUFFER segments every τ steps. Against the reference, W in {1..4}.
class EngineMathSync : public ::testing::TestWithParam<int> {};
TEST_P(EngineMathSync, ReduceGradientsAndBuffersMatchReference) {
  const int W = GetParam(), tau = 3, S = 10;
  const Layout layout = layout_mixed();
  const Data data = make_data(layout, W, 31 + W);
  const size_t n = layout.state_elements();
  co2ref::Config rc;
  rc.algo = co2ref::Algo::Sync;
  rc.tau = tau;
  std::vector<double> init = concat_state(layout, data.init[0]);
  co2ref::Reference ref(rc, ref_segments(layout), W, init);
  std::vector<std::vector<double>> targets;
  for (int r = 0; r < W; ++r) targets.push_back(concat_state(layout, data.target[r]));
  std::vector<bool> is_param;
  for (const auto& t : layout.tensors)
    if (t.role != CO2_ROLE_EXCLUDED)
      for (size_t i = 0; i < t.count; ++i) is_param.push_back(t.role == CO2_ROLE_PARAMETER);
  // Reference: grad_r = p_r - target_r on PARAMETER elements, averaged, p -= lr * avg;
  // BUFFER elements take the synthetic inner step locally.
  std::vector<std::vector<double>> expect_grad(S), expect_state(S);
  for (int k = 0; k < S; ++k) {
    std::vector<std::vector<double>> g(W, std::vector<double>(n, 0.0));
    for (int r = 0; r < W; ++r)
      for (size_t i = 0; i < n; ++i)
        if (is_param[i]) g[r][i] = ref.p(r)[i] - targets[r][i];
    std::vector<std::vector<double>*> gp;
    for (auto& x : g) gp.push_back(&x);
    co2ref::Reference::average_gradients(gp);
    expect_grad[k] = g[0];
    const double lr = inner_lr(k);
    for (int r = 0; r < W; ++r)
      for (size_t i = 0; i < n; ++i)
        ref.p(r)[i] = is_param[i] ? ref.p(r)[i] - lr * g[r][i]
                                  : ref.p(r)[i] - lr * (ref.p(r)[i] - targets[r][i]);
    ref.step();
    expect_state[k] = ref.p(0);  // only compared at boundaries (buffers differ in between)
  }
  // ~ (3 + W) roundings per step on O(1) values over S steps (see tolerance()).
  const double tol = 8.0 * S * (3 + W + 4) * kU32 * 2.0;
  run_ranks(W, [&](int rank, co2_comm_t comm) {
    LocalModel model(layout, data, rank);
    EngineGuard eg;
    co2_engine_config_t cfg = CO2_ENGINE_CONFIG_INIT;
    cfg.eager = 0;  // the delayed schedule (eager has its own cases)
    cfg.algorithm = CO2_ALGO_SYNC;
    cfg.tau = tau;
    CO2_ASSERT_OK(co2_engine_create(comm, &cfg, &eg.engine));
    CO2_ASSERT_OK(model.register_with(eg.engine));
    CO2_ASSERT_OK(co2_engine_commit(eg.engine));
    std::vector<std::vector<float>> grads;
    std::vector<size_t> param_tensors;
    for (size_t t = 0; t < model.num_tensors(); ++t)
      if (model.role(t) == CO2_ROLE_PARAMETER) {
        param_tensors.push_back(t);
        grads.emplace_back(model.count(t));
      }
    Checker chk{rank, "sync"};
    std::vector<float> buf(n);
    for (int k = 0; k < S; ++k) {
      const float lr = inner_lr(k);
      // Fresh gradient buffers every call (frameworks reallocate them).
      std::vector<std::vector<float>> g(param_tensors.size());
      std::vector<void*> ptrs;
      for (size_t j = 0; j < param_tensors.size(); ++j) {
        const size_t t = param_tensors[j];
        g[j].resize(model.count(t));
        for (size_t i = 0; i < model.count(t); ++i)
          g[j][i] = model.tensor(t)[i] - data.target[rank][t][i];
        ptrs.push_back(g[j].data());
      }
      CO2_ASSERT_OK(co2_engine_reduce_gradients(eg.engine, ptrs.data(), ptrs.size(), nullptr));
      // Compare the averaged gradient (PARAMETER elements of the concatenation).
      std::vector<float> flat_g;
      std::vector<double> want_g;
      size_t off = 0;
      for (size_t t = 0, j = 0; t < model.num_tensors(); ++t) {
        if (model.role(t) == CO2_ROLE_EXCLUDED) continue;
        if (model.role(t) == CO2_ROLE_PARAMETER) {
          flat_g.insert(flat_g.end(), g[j].begin(), g[j].end());
          want_g.insert(want_g.end(), expect_grad[k].begin() + off,
                        expect_grad[k].begin() + off + model.count(t));
          ++j;
        }
        off += model.count(t);
      }
      chk.compare(flat_g.data(), want_g, tol, "averaged gradient step " + std::to_string(k));
      // The optimizer step.
      for (size_t j = 0; j < param_tensors.size(); ++j) {
        float* p = model.tensor(param_tensors[j]);
        for (size_t i = 0; i < g[j].size(); ++i) p[i] = p[i] - lr * g[j][i];
      }
      for (size_t t = 0; t < model.num_tensors(); ++t) {
        if (model.role(t) != CO2_ROLE_BUFFER) continue;
        float* p = model.tensor(t);
        for (size_t i = 0; i < model.count(t); ++i)
          p[i] = p[i] - lr * (p[i] - data.target[rank][t][i]);
      }
      int b = -1;
      CO2_ASSERT_OK(co2_engine_step(eg.engine, nullptr, &b));
      EXPECT_EQ(b, (k + 1) % tau == 0 ? 1 : 0);
      if (b == 1) {
        const std::vector<float> got = model.gather_state();
        chk.compare(got.data(), expect_state[k], tol, "state after boundary " + std::to_string(k));
        // sync has no anchor: consensus(ANCHOR) copies the parameters.
        CO2_ASSERT_OK(co2_engine_consensus(eg.engine, CO2_CONSENSUS_ANCHOR, buf.data(), n));
        EXPECT_TRUE(bitwise_equal(buf, got)) << "rank " << rank << " step " << k;
      }
    }
    const co2_engine_stats_t st = get_stats(eg.engine);
    EXPECT_EQ(st.steps, uint64_t(S));
    EXPECT_EQ(st.rounds, uint64_t(S / tau));
    EXPECT_TRUE(model.excluded_untouched());
  });
}
INSTANTIATE_TEST_SUITE_P(World, EngineMathSync, ::testing::Values(1, 2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return "W" + std::to_string(i.param);
                         });

// sync: a NULL gradient entry contributes zeros and receives nothing.
TEST(EngineMathSyncNull, NullEntryContributesZeros) {
  const int W = 3;
  const Layout layout{"two", {{"a", 7, CO2_ROLE_PARAMETER}, {"b", 5, CO2_ROLE_PARAMETER}}};
  const Data data = make_data(layout, W, 3);
  std::vector<std::vector<float>> got_a(W), got_b(W);
  auto grad = [](int r, int t, size_t i) { return float(r + 1) * 0.25f + float(t) + 0.125f * float(i); };
  run_ranks(W, [&](int rank, co2_comm_t comm) {
    LocalModel model(layout, data, rank);
    EngineGuard eg;
    co2_engine_config_t cfg = CO2_ENGINE_CONFIG_INIT;
    cfg.eager = 0;  // the delayed schedule (eager has its own cases)
    cfg.algorithm = CO2_ALGO_SYNC;
    cfg.tau = 1;
    CO2_ASSERT_OK(co2_engine_create(comm, &cfg, &eg.engine));
    CO2_ASSERT_OK(model.register_with(eg.engine));
    CO2_ASSERT_OK(co2_engine_commit(eg.engine));
    std::vector<float> a(7), b(5);
    for (size_t i = 0; i < 7; ++i) a[i] = grad(rank, 0, i);
    for (size_t i = 0; i < 5; ++i) b[i] = grad(rank, 1, i);
    std::vector<float> b_before = b;
    void* ptrs[2] = {a.data(), rank == 1 ? nullptr : b.data()};
    CO2_ASSERT_OK(co2_engine_reduce_gradients(eg.engine, ptrs, 2, nullptr));
    got_a[rank] = a;
    got_b[rank] = b;
    if (rank == 1) {
      EXPECT_TRUE(bitwise_equal(b, b_before)) << "a NULL entry received nothing";
    }
    // num_grads must equal the number of trained tensors.
    CO2_EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT,
                      co2_engine_reduce_gradients(eg.engine, ptrs, 1, nullptr));
  });
  // Values are multiples of 1/8 below 16: the sums and the division by 3 are exact in fp32
  // up to one rounding of the quotient.
  for (int r = 0; r < W; ++r) {
    for (size_t i = 0; i < 7; ++i) {
      double want = 0;
      for (int q = 0; q < W; ++q) want += grad(q, 0, i);
      EXPECT_NEAR(got_a[r][i], want / W, 4 * kU32 * 8) << r << " " << i;
    }
    if (r == 1) continue;
    for (size_t i = 0; i < 5; ++i) {
      double want = 0;
      for (int q = 0; q < W; ++q)
        if (q != 1) want += grad(q, 1, i);
      EXPECT_NEAR(got_b[r][i], want / W, 4 * kU32 * 8) << r << " " << i;
    }
  }
}

}  // namespace

// co2 applies an average a round after its deltas were submitted, with the outer settings in
// effect at that submission (docs/algorithm.md, "The split boundary pass"): an α set during
// round 2 scales round 2's deltas (applied at the end), not round 1's average already in flight.
// One fp32 parameter, every inner step p -= 1, β = 0, no penalty or clip: all values exact.
TEST(EngineMathProperty, OuterSettingsApplyFromTheDeltasSubmittedAfterTheChange) {
  run_ranks(2, [&](int rank, co2_comm_t comm) {
    EngineGuard eg;
    co2_engine_config_t cfg = CO2_ENGINE_CONFIG_INIT;
    cfg.eager = 0;  // the delayed schedule (eager has its own cases)
    cfg.tau = 1;
    cfg.outer_lr = 1.0;
    cfg.outer_momentum = 0.0;
    CO2_ASSERT_OK(co2_engine_create(comm, &cfg, &eg.engine));
    void* flat = nullptr;
    CO2_ASSERT_OK(co2_engine_alloc_flat(eg.engine, 1, CO2_DTYPE_FP32, CO2_DEVICE_HOST, 0, &flat));
    float* p = static_cast<float*>(flat);
    co2_segment_t seg = CO2_SEGMENT_INIT;
    seg.name = "p";
    seg.count = 1;
    CO2_ASSERT_OK(co2_engine_add_segment(eg.engine, &seg));
    CO2_ASSERT_OK(co2_engine_commit(eg.engine));
    *p = 0.0f;
    *p -= 1.0f;
    CO2_ASSERT_OK(co2_engine_step(eg.engine, nullptr, nullptr));  // submits delta 1 (alpha 1)
    EXPECT_EQ(*p, 0.0f) << "rank " << rank;
    CO2_ASSERT_OK(co2_engine_set_param(eg.engine, CO2_PARAM_OUTER_LR, 0.5));
    *p -= 1.0f;
    CO2_ASSERT_OK(co2_engine_step(eg.engine, nullptr, nullptr));  // applies average 1 with alpha 1
    EXPECT_EQ(*p, -1.0f) << "rank " << rank << ": round 1's average takes round 1's alpha";
    CO2_ASSERT_OK(co2_engine_finalize(eg.engine));  // applies average 2 with alpha 0.5
    EXPECT_EQ(*p, -1.5f) << "rank " << rank << ": round 2's average takes the new alpha";
  });
}

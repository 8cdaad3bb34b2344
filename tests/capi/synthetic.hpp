// Test helper: parameter layouts, deterministic per-rank data, and the synthetic "inner
// optimizer" that the tests run on the framework side (fp32) and that the reference
// (reference.hpp) replays in fp64.
//
// Inner step k (k = global step index, the same on every rank) of rank r, for every PARAMETER
// and BUFFER element:    p <- p - lr_k * (p - target_r)       (fp32 here, fp64 in the reference)
// EXCLUDED elements are written (never read) with a per-rank value, so the test can check that the
// engine never touches them.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "co2/co2.h"

namespace co2test {

enum class Storage { Registered, AllocFlat, AdoptFlat };

struct TensorSpec {
  std::string name;
  size_t count;
  co2_tensor_role_t role;
};

struct Layout {
  std::string name;
  std::vector<TensorSpec> tensors;
  Storage storage = Storage::Registered;

  // PARAMETER + BUFFER elements (what consensus and the outer state hold).
  size_t state_elements() const {
    size_t n = 0;
    for (const auto& t : tensors)
      if (t.role != CO2_ROLE_EXCLUDED) n += t.count;
    return n;
  }
  size_t num_parameter_tensors() const {
    size_t n = 0;
    for (const auto& t : tensors)
      if (t.role == CO2_ROLE_PARAMETER) ++n;
    return n;
  }
};

inline Layout layout_single(size_t count) {
  return Layout{"single" + std::to_string(count), {{"w", count, CO2_ROLE_PARAMETER}}};
}
// Several tensors whose sizes divide nothing, with BUFFER and EXCLUDED roles in between.
inline Layout layout_mixed(Storage storage = Storage::Registered) {
  Layout l{"mixed",
           {{"layer0.weight", 7, CO2_ROLE_PARAMETER},
            {"layer0.bias", 1, CO2_ROLE_PARAMETER},
            {"bn.running_mean", 13, CO2_ROLE_BUFFER},
            {"rank_private", 5, CO2_ROLE_EXCLUDED},
            {"layer1.weight", 31, CO2_ROLE_PARAMETER},
            {"bn.num_batches", 3, CO2_ROLE_BUFFER}},
           storage};
  if (storage == Storage::AllocFlat) l.name += "_alloc_flat";
  if (storage == Storage::AdoptFlat) l.name += "_adopt_flat";
  return l;
}
// The large case: 1000003 elements plus a small buffer.
inline Layout layout_big() {
  return Layout{"big", {{"big.weight", 1000003, CO2_ROLE_PARAMETER}, {"bn", 7, CO2_ROLE_BUFFER}}};
}

// splitmix64: a fast, seedable, platform-independent generator.
inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
// Uniform in [lo, hi), exactly representable in fp32 (24 random bits).
inline float uniform_float(uint64_t key, float lo, float hi) {
  const double u = double(splitmix64(key) >> 40) / double(1ull << 24);
  return float(lo + (hi - lo) * u);
}

// Per-rank inputs of a run: initial parameters (different on every rank: commit must broadcast
// rank 0's) and targets of the synthetic inner optimizer.
struct Data {
  int world_size = 0;
  std::vector<std::vector<std::vector<float>>> init;    // [rank][tensor][element]
  std::vector<std::vector<std::vector<float>>> target;  // [rank][tensor][element]
};

inline Data make_data(const Layout& layout, int world_size, uint64_t seed) {
  Data d;
  d.world_size = world_size;
  d.init.resize(world_size);
  d.target.resize(world_size);
  for (int r = 0; r < world_size; ++r) {
    for (size_t t = 0; t < layout.tensors.size(); ++t) {
      const size_t n = layout.tensors[t].count;
      std::vector<float> init(n), target(n);
      const uint64_t base = splitmix64(seed * 1000003ull + uint64_t(r) * 7919ull + t);
      for (size_t i = 0; i < n; ++i) {
        init[i] = uniform_float(base + 2 * i, -1.0f, 1.0f);
        target[i] = uniform_float(base + 2 * i + 1, -1.0f, 1.0f);
      }
      d.init[r].push_back(std::move(init));
      d.target[r].push_back(std::move(target));
    }
  }
  return d;
}

// Learning rate of inner step k: varies with k so that rounds differ; exact in fp32.
inline float inner_lr(uint64_t k) { return 0.0625f + 0.015625f * float(k % 5); }

// Concatenation of the PARAMETER and BUFFER tensors of `per_tensor`, in registration order.
inline std::vector<double> concat_state(const Layout& layout,
                                        const std::vector<std::vector<float>>& per_tensor) {
  std::vector<double> out;
  out.reserve(layout.state_elements());
  for (size_t t = 0; t < layout.tensors.size(); ++t) {
    if (layout.tensors[t].role == CO2_ROLE_EXCLUDED) continue;
    out.insert(out.end(), per_tensor[t].begin(), per_tensor[t].end());
  }
  return out;
}

// The synthetic inner step in fp64 on a concatenated state vector (what the reference replays).
inline void ref_inner_step(std::vector<double>& p, const std::vector<double>& target,
                           uint64_t k) {
  const double lr = double(inner_lr(k));
  for (size_t i = 0; i < p.size(); ++i) p[i] = p[i] - lr * (p[i] - target[i]);
}

// One rank's framework-side model: the tensors (or the flat storage) the engine is given.
class LocalModel {
 public:
  LocalModel(const Layout& layout, const Data& data, int rank)
      : layout_(layout), data_(data), rank_(rank) {
    size_t off = 0;
    for (const auto& t : layout_.tensors) {
      offsets_.push_back(off);
      off += t.count;
    }
    total_ = off;
    if (layout_.storage == Storage::Registered) {
      tensors_.resize(layout_.tensors.size());
      for (size_t t = 0; t < layout_.tensors.size(); ++t) tensors_[t] = data_.init[rank_][t];
    } else if (layout_.storage == Storage::AdoptFlat) {
      adopted_.resize(total_);
    }
  }
  LocalModel(const LocalModel&) = delete;
  LocalModel& operator=(const LocalModel&) = delete;

  const Layout& layout() const { return layout_; }
  size_t num_tensors() const { return layout_.tensors.size(); }
  size_t count(size_t t) const { return layout_.tensors[t].count; }
  co2_tensor_role_t role(size_t t) const { return layout_.tensors[t].role; }

  float* tensor(size_t t) {
    switch (layout_.storage) {
      case Storage::Registered:
        return tensors_[t].data();
      case Storage::AdoptFlat:
        return adopted_.data() + offsets_[t];
      case Storage::AllocFlat:
        return flat_ + offsets_[t];
    }
    return nullptr;
  }

  // Registers the layout with `engine` and writes this rank's initial values. Call before
  // co2_engine_commit.
  co2_status_t register_with(co2_engine_t engine) {
    co2_status_t s = CO2_OK;
    if (layout_.storage == Storage::Registered) {
      for (size_t t = 0; t < layout_.tensors.size(); ++t) {
        co2_tensor_t desc = CO2_TENSOR_INIT;
        desc.name = layout_.tensors[t].name.c_str();
        desc.data = tensors_[t].data();
        desc.count = layout_.tensors[t].count;
        desc.role = layout_.tensors[t].role;
        if ((s = co2_engine_register_tensor(engine, &desc)) != CO2_OK) return s;
      }
      return CO2_OK;
    }
    if (layout_.storage == Storage::AllocFlat) {
      void* data = nullptr;
      if ((s = co2_engine_alloc_flat(engine, total_, CO2_DTYPE_FP32, CO2_DEVICE_HOST, 0, &data)) !=
          CO2_OK)
        return s;
      flat_ = static_cast<float*>(data);
    } else {
      if ((s = co2_engine_adopt_flat(engine, adopted_.data(), total_, CO2_DTYPE_FP32,
                                     CO2_DEVICE_HOST, 0)) != CO2_OK)
        return s;
    }
    for (size_t t = 0; t < layout_.tensors.size(); ++t) {
      std::memcpy(tensor(t), data_.init[rank_][t].data(), count(t) * sizeof(float));
      co2_segment_t seg = CO2_SEGMENT_INIT;
      seg.name = layout_.tensors[t].name.c_str();
      seg.offset = offsets_[t];
      seg.count = layout_.tensors[t].count;
      seg.role = layout_.tensors[t].role;
      if ((s = co2_engine_add_segment(engine, &seg)) != CO2_OK) return s;
    }
    return CO2_OK;
  }

  // The synthetic inner optimizer step k (fp32).
  void inner_step(uint64_t k) {
    const float lr = inner_lr(k);
    for (size_t t = 0; t < layout_.tensors.size(); ++t) {
      float* p = tensor(t);
      const size_t n = count(t);
      if (role(t) == CO2_ROLE_EXCLUDED) {
        for (size_t i = 0; i < n; ++i) p[i] = excluded_value(t, i, k);
        last_excluded_step_ = k;
        wrote_excluded_ = true;
        continue;
      }
      const float* target = data_.target[rank_][t].data();
      for (size_t i = 0; i < n; ++i) p[i] = p[i] - lr * (p[i] - target[i]);
    }
  }

  // What inner_step(k) wrote into an EXCLUDED tensor (before any step: the initial values).
  float excluded_value(size_t t, size_t i, uint64_t k) const {
    return float(rank_ * 1000 + int(t) * 100) + float(i) + 0.5f * float(k % 1000);
  }
  // True when every EXCLUDED tensor holds exactly what the test last wrote into it.
  bool excluded_untouched() {
    for (size_t t = 0; t < layout_.tensors.size(); ++t) {
      if (role(t) != CO2_ROLE_EXCLUDED) continue;
      const float* p = tensor(t);
      for (size_t i = 0; i < count(t); ++i) {
        const float want = wrote_excluded_ ? excluded_value(t, i, last_excluded_step_)
                                           : data_.init[rank_][t][i];
        if (std::memcmp(&p[i], &want, sizeof(float)) != 0) return false;
      }
    }
    return true;
  }

  // PARAMETER + BUFFER elements in registration order (the consensus order).
  std::vector<float> gather_state() {
    std::vector<float> out;
    out.reserve(layout_.state_elements());
    for (size_t t = 0; t < layout_.tensors.size(); ++t) {
      if (role(t) == CO2_ROLE_EXCLUDED) continue;
      out.insert(out.end(), tensor(t), tensor(t) + count(t));
    }
    return out;
  }
  // Every tensor, EXCLUDED included (the per-rank framework state a checkpoint would save).
  std::vector<std::vector<float>> snapshot_all() {
    std::vector<std::vector<float>> out(layout_.tensors.size());
    for (size_t t = 0; t < layout_.tensors.size(); ++t)
      out[t].assign(tensor(t), tensor(t) + count(t));
    return out;
  }
  void restore_all(const std::vector<std::vector<float>>& snap) {
    for (size_t t = 0; t < layout_.tensors.size(); ++t)
      std::memcpy(tensor(t), snap[t].data(), count(t) * sizeof(float));
  }
  // Element `i` of the concatenated PARAMETER+BUFFER state (for fault injection).
  float* state_element(size_t i) {
    for (size_t t = 0; t < layout_.tensors.size(); ++t) {
      if (role(t) == CO2_ROLE_EXCLUDED) continue;
      if (i < count(t)) return tensor(t) + i;
      i -= count(t);
    }
    return nullptr;
  }

 private:
  const Layout layout_;
  const Data& data_;
  const int rank_;
  std::vector<size_t> offsets_;
  size_t total_ = 0;
  std::vector<std::vector<float>> tensors_;
  std::vector<float> adopted_;
  float* flat_ = nullptr;
  uint64_t last_excluded_step_ = 0;
  bool wrote_excluded_ = false;
};

// Owns an engine handle (destroyed first, before the model whose memory it references).
struct EngineGuard {
  co2_engine_t engine = nullptr;
  EngineGuard() = default;
  EngineGuard(const EngineGuard&) = delete;
  EngineGuard& operator=(const EngineGuard&) = delete;
  ~EngineGuard() { reset(); }
  void reset() {
    if (engine != nullptr) co2_engine_destroy(engine);
    engine = nullptr;
  }
};

inline co2_engine_stats_t get_stats(co2_engine_t engine) {
  co2_engine_stats_t st{};  // (CO2_ENGINE_STATS_INIT trips -Wmissing-field-initializers in C++)
  st.size = sizeof(st);
  st.version = CO2_ABI_VERSION;
  co2_engine_get_stats(engine, &st);
  return st;
}

inline bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

inline size_t first_difference(const std::vector<float>& a, const std::vector<float>& b) {
  const size_t n = a.size() < b.size() ? a.size() : b.size();
  for (size_t i = 0; i < n; ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return i;
  return n;
}

}  // namespace co2test

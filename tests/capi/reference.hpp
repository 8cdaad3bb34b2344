// An independent fp64 reference of the algorithms exactly as docs/algorithm.md writes them.
// It is written from the document only (not from runtime/engine/engine.cpp) and plainly: one loop per
// equation, no fusion, no fp32 anywhere, all W ranks simulated in one object.
//
// What it models (docs/algorithm.md section by section):
//  - commit: every rank's p and the anchor a start from rank 0's values; m = 0, c = 0.
//  - co2 boundary t (per segment l):  pending average Δ̄_{t-1} applied if t >= 1 (and finite),
//        d_i = a - p_i (with the anchor *before* this boundary's update),
//        u = β m + Λ_l Δ̄, m <- clip(u), s = nesterov ? β m + Λ_l Δ̄ : m, a <- a - α s,
//        next pending = (1/W) Σ_i d_i, p_i <- a.
//  - diloco boundary: the same update with the fresh average of this round's deltas.
//  - warmup_sync_rounds K: boundaries 0..K-1 as diloco, boundary K like t = 0 of co2.
//  - localsgd: p_i <- (1/W) Σ p_i every τ steps.
//  - sync: step only counts; every τ steps BUFFER segments are averaged; gradients are averaged
//    by reduce_gradients (average_gradients below).
//  - BUFFER segments: α = 1, β = 0, Λ = 1, no clip: a_b <- a_b - Δ̄_b; no part in norms. Under
//    co2 they carry values: d_b = -p_b and a_b <- -Δ̄_b (the stale average of the values).
//  - penalties none / constant / gap; clip none / value / norm.
//  - non-finite rules: co2 skips a non-finite arriving average (a, m, history unchanged) and
//    still sets the next pending average and p <- a; a non-finite local delta is counted per
//    rank; diloco skips a non-finite fresh average (p <- a); localsgd leaves p as it was.
//  - finalize / synchronize, τ changes at the next boundary, a rank that leaves.
//  - eager (co2 only, docs/algorithm.md "The eager policy"): per rank an offset e_i and a
//    momentum q_i of its own deltas; d_i = (a + e_i) - p_i on PARAMETER segments; after the
//    boundary's update q_i <- β q_i + d_i, e_i <- -(α/W)(nesterov ? β q_i + d_i : q_i),
//    p_i <- a + e_i; a rank whose d_i is not finite gets e_i = q_i = 0 and p_i <- a;
//    finalize / synchronize set e = q = 0 (after taking synchronize's deltas).
//  - apply on arrival (co2, apply_step = k >= 1; docs/algorithm.md "Applying the average on
//    arrival"): at the k-th step of a round (k < the round's τ) the pending average is applied
//    there instead of at the next boundary: with progress_i = (a + e_i) - p_i taken before the
//    update (BUFFER segments: a - p_i), p_i <- a' - progress_i and e_i <- 0; a non-finite average
//    is skipped (that step reports it). The next boundary then has nothing to apply.
//
// Besides the trajectory it records what the float engine cannot reproduce exactly if data
// come close to a branch (clip thresholds, g = 0), so tests can refuse such data (margins).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace co2ref {

enum class Algo { Co2, Sync, LocalSgd, Diloco };
enum class Penalty { None, Constant, Gap };
enum class Clip { None, Value, Norm };

struct Config {
  Algo algo = Algo::Co2;
  int tau = 12;
  int warmup_sync_rounds = 0;
  double alpha = 1.0;
  double beta = -1.0;  // < 0: automatic, resolved by the number of ranks
  bool nesterov = false;
  Penalty penalty = Penalty::None;
  double penalty_constant = 1.0;
  Clip clip = Clip::None;
  double phi = 1.0;
  bool eager = false;
  int apply_step = 0;  // co2: k >= 1 applies the pending average at step k of the round
};

// docs/algorithm.md "Defaults": W <= 16 -> 0, <= 32 -> 0.2, <= 64 -> 0.5, > 64 -> 0.6.
inline double auto_beta(int world_size) {
  if (world_size <= 16) return 0.0;
  if (world_size <= 32) return 0.2;
  if (world_size <= 64) return 0.5;
  return 0.6;
}

struct Segment {
  size_t count = 0;
  bool buffer = false;  // BUFFER role (else PARAMETER); EXCLUDED segments are not listed
};

inline bool all_finite(const std::vector<double>& v) {
  for (double x : v)
    if (!std::isfinite(x)) return false;
  return true;
}

// What one outer update did: the expected statistics, and how close it came to a branch.
struct UpdateRecord {
  std::vector<double> lambda;      // Λ per PARAMETER segment
  std::vector<double> clip_scale;  // norm clip: min(1, φ/‖u_l‖) per PARAMETER segment
  std::vector<double> u_norm;      // ‖u_l‖ per PARAMETER segment
  std::vector<double> gap;         // g_l used by this update (gap policy)
  std::vector<double> gap_mean;    // ḡ_l used by this update
  size_t clip_elements = 0;        // PARAMETER momentum elements
  size_t clamped = 0;              // value clip: elements with |u| > φ (fp64 decision)
  size_t segments_scaled = 0;      // norm clip: segments with ‖u‖ > φ
  // Branch proximity: value clip: min over elements of ||u| - φ| (absolute);
  // norm clip: min over segments of |‖u‖ - φ| / sqrt(n_l) (absolute, per-element scale);
  // gap: min over segments with g > 0 of g_l / (α sqrt(n_l)) (rms step size).
  double value_clip_distance = std::numeric_limits<double>::infinity();
  double norm_clip_distance = std::numeric_limits<double>::infinity();
  double gap_rms_min = std::numeric_limits<double>::infinity();
};

class Reference {
 public:
  Reference(const Config& config, std::vector<Segment> segments, int world_size,
            const std::vector<double>& rank0_init)
      : cfg_(config), segs_(std::move(segments)), world_(world_size) {
    for (const auto& s : segs_) {
      offsets_.push_back(n_);
      n_ += s.count;
    }
    beta_ = cfg_.beta < 0 ? auto_beta(world_size) : cfg_.beta;
    // co2's BUFFER segments carry their values: deltas and updates start from 0, not the anchor.
    anchor_weight_.assign(n_, 1.0);
    for (size_t l = 0; l < segs_.size(); ++l)
      if (segs_[l].buffer && cfg_.algo == Algo::Co2)
        std::fill(anchor_weight_.begin() + long(offsets_[l]), anchor_weight_.begin() + long(offsets_[l] + segs_[l].count), 0.0);
    tau_current_ = tau_next_ = cfg_.tau;
    // Commit: rank 0's PARAMETER and BUFFER values into every rank's p and the anchor.
    p_.assign(world_size, rank0_init);
    a_ = rank0_init;
    m_.assign(n_, 0.0);
    pending_.assign(n_, 0.0);
    gap_prev_.assign(segs_.size(), 0.0);
    gap_sum_.assign(segs_.size(), 0.0);
    gap_n_.assign(segs_.size(), 0);
    nonfinite_local_.assign(world_size, 0);
    e_.assign(world_size, std::vector<double>(n_, 0.0));
    q_ = e_;
    observe(a_);
  }

  int world_size() const { return world_; }
  size_t size() const { return n_; }
  double beta() const { return beta_; }
  std::vector<double>& p(int rank) { return p_[rank]; }
  const std::vector<double>& anchor() const { return a_; }
  const std::vector<double>& momentum() const { return m_; }

  uint64_t steps() const { return steps_; }
  uint64_t rounds() const { return rounds_; }
  uint64_t outer_updates() const { return outer_updates_; }
  uint64_t nonfinite_rounds() const { return nonfinite_rounds_; }
  uint64_t nonfinite_local(int rank) const { return nonfinite_local_[rank]; }
  bool last_boundary_nonfinite() const { return last_nonfinite_; }
  // The last step applied the pending average on arrival (finite or skipped).
  bool last_step_arrival() const { return last_arrival_; }
  uint64_t arrival_updates() const { return arrival_updates_; }
  int last_apply_step() const { return last_apply_step_; }
  bool has_update() const { return outer_updates_ > 0 || extra_updates_ > 0; }
  const UpdateRecord& last_update() const { return last_; }
  // Smallest branch distances over every update so far (see UpdateRecord).
  double min_value_clip_distance() const { return min_value_clip_; }
  double min_norm_clip_distance() const { return min_norm_clip_; }
  double min_gap_rms() const { return min_gap_rms_; }
  // max |x| over every value the trajectory produced (p, a, m, averages, observed inputs).
  double scale() const { return scale_; }
  void observe(const std::vector<double>& v) {
    for (double x : v)
      if (std::isfinite(x)) scale_ = std::max(scale_, std::fabs(x));
  }

  // The step of the rounds to come at which the pending average is applied (0: at the boundary):
  // CO2_APPLY_ON_ARRIVAL's agreed step, which the test learns from the engine.
  void set_apply_step(int k) { apply_step_ = k; }

  // τ change: takes effect at the next boundary (the round in progress keeps its τ).
  void set_tau(int tau) { tau_next_ = tau; }
  int steps_in_round() const { return steps_in_round_; }

  // Counts one step on every rank (call after replaying every rank's inner step into p(r)).
  // Returns true when this step was a boundary.
  bool step() {
    ++steps_;
    last_nonfinite_ = false;
    last_arrival_ = false;
    for (auto& p : p_) observe(p);
    if (++steps_in_round_ < tau_current_) {
      if (cfg_.algo == Algo::Co2 && apply_step_ > 0 && steps_in_round_ == apply_step_ && pending_valid_)
        arrive();
      return false;
    }
    boundary();
    return true;
  }

  // --- finalize / synchronize (docs/algorithm.md "End of training, evaluation") ---
  // finalize is synchronize: no step's work is lost, the partial round included.
  void finalize() { synchronize(); }
  // co2: the pending update, then (if steps happened since the last boundary) one blocking
  // update with the fresh average of those local deltas. The local deltas are those of the
  // steps since the last boundary, i.e. relative to the anchor that round started from (the
  // anchor before the pending update), as a boundary would compute them.
  void synchronize() {
    if (cfg_.algo == Algo::LocalSgd) {
      average_params();
    } else if (cfg_.algo == Algo::Sync) {
      average_buffers();
    } else {
      const bool stepped = steps_in_round_ > 0;
      std::vector<std::vector<double>> d;
      if (stepped) d = deltas();
      if (cfg_.algo == Algo::Co2) apply_pending();
      if (stepped) {
        std::vector<double> avg = mean(d);
        if (all_finite(avg)) {
          update(avg);
          ++extra_updates_;
          last_apply_step_ = 0;
        }
      }
      clear_eager();
      for (auto& p : p_) p = a_;
    }
    steps_in_round_ = 0;
    tau_current_ = tau_next_;
  }

  // Elastic groups, a rank that leaves (docs/algorithm.md "Leaving"): the group synchronizes,
  // then goes on without it at W - 1 ranks, which keep their order; the anchor, outer momentum
  // and gap history stay, an automatic β follows the new W.
  void leave(int rank) {
    synchronize();
    p_.erase(p_.begin() + rank);
    e_.erase(e_.begin() + rank);
    q_.erase(q_.begin() + rank);
    nonfinite_local_.erase(nonfinite_local_.begin() + rank);
    --world_;
    if (cfg_.beta < 0) beta_ = auto_beta(world_);
  }

  // Elastic groups, a rank that joins (docs/algorithm.md "Joining"): the group synchronizes, then
  // goes on at W + 1 ranks, the joiner last, starting from the anchor; the anchor, outer momentum
  // and gap history stay, an automatic β follows the new W.
  void join() {
    synchronize();
    p_.push_back(a_);
    e_.push_back(std::vector<double>(n_, 0.0));
    q_.push_back(std::vector<double>(n_, 0.0));
    nonfinite_local_.push_back(0);
    ++world_;
    if (cfg_.beta < 0) beta_ = auto_beta(world_);
  }

  // The anchor the next boundary starts from: the pending average applied (when finite).
  std::vector<double> next_anchor() const {
    Reference next = *this;
    next.apply_pending();
    return next.a_;
  }

  // The average of the ranks' current parameters (consensus LOCAL_AVERAGE).
  std::vector<double> local_average() const { return mean(p_); }

  // sync: averages one gradient per rank (nullptr = contributes zeros, receives nothing).
  static void average_gradients(std::vector<std::vector<double>*> grads) {
    size_t n = 0;
    for (auto* g : grads)
      if (g != nullptr) n = g->size();
    std::vector<double> sum(n, 0.0);
    for (auto* g : grads)
      if (g != nullptr)
        for (size_t i = 0; i < n; ++i) sum[i] += (*g)[i];
    for (auto* g : grads)
      if (g != nullptr)
        for (size_t i = 0; i < n; ++i) (*g)[i] = sum[i] / double(grads.size());
  }

 private:
  // d_i = (a + e_i) - p_i: e is zero except under eager, on PARAMETER segments.
  std::vector<std::vector<double>> deltas() const {
    std::vector<std::vector<double>> d(world_, std::vector<double>(n_));
    for (int r = 0; r < world_; ++r)
      for (size_t i = 0; i < n_; ++i) d[r][i] = (anchor_weight_[i] * a_[i] + e_[r][i]) - p_[r][i];
    return d;
  }
  void clear_eager() {
    for (int r = 0; r < world_; ++r) {
      std::fill(e_[r].begin(), e_[r].end(), 0.0);
      std::fill(q_[r].begin(), q_[r].end(), 0.0);
    }
  }
  std::vector<double> mean(const std::vector<std::vector<double>>& v) const {
    std::vector<double> out(n_, 0.0);
    for (const auto& x : v)
      for (size_t i = 0; i < n_; ++i) out[i] += x[i];
    for (size_t i = 0; i < n_; ++i) out[i] /= double(world_);
    return out;
  }

  void average_params() {
    std::vector<double> avg = mean(p_);
    if (!all_finite(avg)) {
      last_nonfinite_ = true;
      ++nonfinite_rounds_;
      return;  // every rank's p stays as it was
    }
    for (auto& p : p_) p = avg;
  }
  void average_buffers() {
    std::vector<double> avg = mean(p_);
    for (size_t l = 0; l < segs_.size(); ++l) {
      if (!segs_[l].buffer) continue;
      for (auto& p : p_)
        for (size_t i = 0; i < segs_[l].count; ++i) p[offsets_[l] + i] = avg[offsets_[l] + i];
    }
  }

  void arrive() {
    pending_valid_ = false;
    last_arrival_ = true;
    if (!all_finite(pending_)) {
      last_nonfinite_ = true;
      ++nonfinite_rounds_;
      return;
    }
    std::vector<std::vector<double>> progress(world_, std::vector<double>(n_));
    for (int r = 0; r < world_; ++r)
      for (size_t i = 0; i < n_; ++i) progress[r][i] = (a_[i] + e_[r][i]) - p_[r][i];
    update(pending_);
    ++outer_updates_;
    ++arrival_updates_;
    last_apply_step_ = steps_in_round_;
    for (int r = 0; r < world_; ++r) {
      for (size_t i = 0; i < n_; ++i) p_[r][i] = a_[i] - progress[r][i];
      std::fill(e_[r].begin(), e_[r].end(), 0.0);
      observe(p_[r]);
    }
  }

  void apply_pending() {
    if (!pending_valid_) return;
    pending_valid_ = false;
    if (!all_finite(pending_)) {
      last_nonfinite_ = true;
      ++nonfinite_rounds_;
      return;
    }
    update(pending_);
    ++extra_updates_;
    last_apply_step_ = 0;
  }

  void boundary() {
    last_nonfinite_ = false;
    const uint64_t t = rounds_;
    steps_in_round_ = 0;
    tau_current_ = tau_next_;
    ++rounds_;
    switch (cfg_.algo) {
      case Algo::LocalSgd:
        average_params();
        return;
      case Algo::Sync:
        average_buffers();
        return;
      case Algo::Diloco:
        diloco_boundary();
        return;
      case Algo::Co2:
        if (t < uint64_t(cfg_.warmup_sync_rounds)) {
          diloco_boundary();
          pending_valid_ = false;  // boundary K then behaves like t = 0
        } else {
          co2_boundary();
        }
        return;
    }
  }

  void diloco_boundary() {
    std::vector<double> avg = mean(deltas());
    observe(avg);
    if (all_finite(avg)) {
      update(avg);
      ++outer_updates_;
    } else {
      last_nonfinite_ = true;
      ++nonfinite_rounds_;
    }
    for (auto& p : p_) p = a_;
  }

  void co2_boundary() {
    // (b) d with the anchor before this boundary's update.
    std::vector<std::vector<double>> d = deltas();
    for (int r = 0; r < world_; ++r)
      if (!all_finite(d[r])) ++nonfinite_local_[r];
    // (a)+(b) apply the average that arrived (if any and finite).
    if (pending_valid_) {
      if (all_finite(pending_)) {
        update(pending_);
        ++outer_updates_;
        last_apply_step_ = 0;
      } else {
        last_nonfinite_ = true;
        ++nonfinite_rounds_;
      }
    }
    // c <- d, submitted: the next boundary's average. p <- a (+ e under eager).
    pending_ = mean(d);
    observe(pending_);
    pending_valid_ = true;
    for (auto& p : p_) p = a_;
    if (!cfg_.eager) return;
    for (int r = 0; r < world_; ++r) {
      if (!all_finite(d[r])) {
        std::fill(e_[r].begin(), e_[r].end(), 0.0);
        std::fill(q_[r].begin(), q_[r].end(), 0.0);
        continue;
      }
      for (size_t l = 0; l < segs_.size(); ++l) {
        if (segs_[l].buffer) continue;
        for (size_t i = offsets_[l]; i < offsets_[l] + segs_[l].count; ++i) {
          q_[r][i] = beta_ * q_[r][i] + d[r][i];
          const double filtered = cfg_.nesterov ? beta_ * q_[r][i] + d[r][i] : q_[r][i];
          e_[r][i] = -(cfg_.alpha / double(world_)) * filtered;
          p_[r][i] = a_[i] + e_[r][i];
        }
      }
      observe(e_[r]);
      observe(q_[r]);
    }
  }

  // One outer update of every segment with the average `avg`.
  void update(const std::vector<double>& avg) {
    UpdateRecord rec;
    for (size_t l = 0; l < segs_.size(); ++l) {
      const size_t o = offsets_[l], n = segs_[l].count;
      if (segs_[l].buffer) {
        // α = 1, β = 0, Λ = 1, no clip: a_b <- a_b - Δ̄_b; co2: a_b <- 0 - (-p)‾ = p̄ (the values
        // travelled, one round stale).
        for (size_t i = 0; i < n; ++i) a_[o + i] = anchor_weight_[o + i] * a_[o + i] - avg[o + i];
        continue;
      }
      // Λ_l.
      double lambda = 1.0;
      if (cfg_.penalty == Penalty::Constant) {
        lambda = 1.0 / cfg_.penalty_constant;
      } else if (cfg_.penalty == Penalty::Gap) {
        const double g = gap_prev_[l];
        gap_sum_[l] += g;
        gap_n_[l] += 1;
        const double gbar = gap_sum_[l] / double(gap_n_[l]);
        lambda = (g == 0.0) ? 1.0 : 1.0 / (1.0 + g / (gbar + 1e-12));
        rec.gap.push_back(g);
        rec.gap_mean.push_back(gbar);
        if (g != 0.0) rec.gap_rms_min = std::min(rec.gap_rms_min, g / (cfg_.alpha * std::sqrt(double(n))));
      }
      rec.lambda.push_back(lambda);
      // u = β m + Λ c.
      std::vector<double> u(n);
      for (size_t i = 0; i < n; ++i) u[i] = beta_ * m_[o + i] + lambda * avg[o + i];
      // m <- clip(u).
      double unorm2 = 0.0;
      for (size_t i = 0; i < n; ++i) unorm2 += u[i] * u[i];
      const double unorm = std::sqrt(unorm2);
      rec.u_norm.push_back(unorm);
      double scale = 1.0;
      if (cfg_.clip == Clip::Norm) {
        if (unorm > cfg_.phi) {
          scale = cfg_.phi / unorm;
          ++rec.segments_scaled;
        }
        rec.norm_clip_distance =
            std::min(rec.norm_clip_distance, std::fabs(unorm - cfg_.phi) / std::sqrt(double(n)));
      }
      rec.clip_scale.push_back(scale);
      rec.clip_elements += n;
      for (size_t i = 0; i < n; ++i) {
        double v = u[i];
        if (cfg_.clip == Clip::Value) {
          rec.value_clip_distance =
              std::min(rec.value_clip_distance, std::fabs(std::fabs(v) - cfg_.phi));
          if (v > cfg_.phi) {
            v = cfg_.phi;
            ++rec.clamped;
          } else if (v < -cfg_.phi) {
            v = -cfg_.phi;
            ++rec.clamped;
          }
        } else if (cfg_.clip == Clip::Norm) {
          v = u[i] * scale;
        }
        m_[o + i] = v;
      }
      // s and a <- a - α s.
      double snorm2 = 0.0;
      for (size_t i = 0; i < n; ++i) {
        const double s = cfg_.nesterov ? beta_ * m_[o + i] + lambda * avg[o + i] : m_[o + i];
        snorm2 += s * s;
        a_[o + i] = a_[o + i] - cfg_.alpha * s;
      }
      // g_l of the next update: α ‖s‖_l of this step.
      gap_prev_[l] = cfg_.alpha * std::sqrt(snorm2);
    }
    observe(a_);
    observe(m_);
    min_value_clip_ = std::min(min_value_clip_, rec.value_clip_distance);
    min_norm_clip_ = std::min(min_norm_clip_, rec.norm_clip_distance);
    min_gap_rms_ = std::min(min_gap_rms_, rec.gap_rms_min);
    last_ = std::move(rec);
  }

  const Config cfg_;
  const std::vector<Segment> segs_;
  int world_;
  std::vector<size_t> offsets_;
  size_t n_ = 0;
  double beta_ = 0.0;
  int tau_current_ = 1, tau_next_ = 1;
  int steps_in_round_ = 0;

  std::vector<std::vector<double>> p_;
  std::vector<double> a_, m_, pending_;
  std::vector<double> anchor_weight_;  // per element: 0 for co2 BUFFER elements, else 1
  std::vector<std::vector<double>> e_, q_;  // eager: per rank offset and own-delta momentum
  bool pending_valid_ = false;
  std::vector<double> gap_prev_, gap_sum_;
  std::vector<uint64_t> gap_n_;

  uint64_t steps_ = 0, rounds_ = 0, outer_updates_ = 0, extra_updates_ = 0;
  uint64_t nonfinite_rounds_ = 0;
  std::vector<uint64_t> nonfinite_local_;
  bool last_nonfinite_ = false;
  bool last_arrival_ = false;
  uint64_t arrival_updates_ = 0;
  int last_apply_step_ = 0;
  int apply_step_ = cfg_.apply_step;
  UpdateRecord last_;
  double min_value_clip_ = std::numeric_limits<double>::infinity();
  double min_norm_clip_ = std::numeric_limits<double>::infinity();
  double min_gap_rms_ = std::numeric_limits<double>::infinity();
  double scale_ = 0.0;
};

}  // namespace co2ref

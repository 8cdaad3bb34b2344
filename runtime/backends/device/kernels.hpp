// The device side of the boundary: fused kernels over the engine's segment table, launched on a
// given stream (a cudaStream_t passed as void*, so that this header compiles without CUDA). The
// element math is boundary_pass.hpp's (CO2_HOST_DEVICE), shared with the host pass. Launchers
// return a cudaError_t value (0 = success).
#pragma once

#include <cstddef>
#include <cstdint>

#include "runtime/backends/device/selection.hpp"
#include "runtime/outer/elements.hpp"
#include "runtime/outer/update_summary.hpp"

namespace co2::device::kernels {

// One registered tensor / flat segment that takes part in averaging.
struct SegmentEntry {
  void* params;           // the framework's parameters (device memory), of `dtype`
  uint64_t state_offset;  // into anchor / momentum / comm buffer
  uint64_t count;
  uint32_t first_chunk;   // its chunks are [first_chunk, next segment's first_chunk)
  uint32_t is_parameter;  // 1: PARAMETER (outer update), 0: BUFFER (plain average)
  uint32_t dtype;         // ParamDType: 0 fp32, 1 bf16, 2 fp16 (read widened, written rounded)
  uint32_t reserved;
};

// The gap penalty's history of one segment (engine_state.hpp's GapHistory, on the device).
struct GapState {
  double last_step_norm;
  double gap_sum;
  unsigned long long updates;
};

// Per segment, written by the coefficients kernels and read by the pass.
struct SegmentCoefficients {
  double lambda;      // staleness penalty
  double norm_scale;  // norm clipping factor (1 = not clipped)
  // The gap history once this update is applied: the fold commits it (with the new step norm)
  // only when the update happens, so an update refused after the coefficients (the result
  // probe) leaves the history as it was.
  GapState history_after;
};

// What one boundary did; copied to pinned host memory and folded into the statistics.
struct Report {
  uint32_t update_requested;  // an average had arrived
  uint32_t applied;           // ... and it was finite, so the update happened
  uint32_t delta_nonfinite;   // some a - p was NaN/Inf
  uint32_t reserved;
  UpdateSummary summary;      // of the applied update
};

struct Config {
  float alpha = 1.0f, beta = 0.0f;
  double clip_threshold = 1.0;  // phi (value and norm clipping)
  double penalty_constant = 1.0;
  int penalty = 0;  // 0 none, 1 constant, 2 gap
  int clip = 0;     // 0 none, 1 value, 2 norm
  bool nesterov = false;
  bool momentum = false;       // the momentum buffer exists (beta > 0 or Nesterov)
  bool update_requested = false;  // an average is in the comm buffer (applied if it is finite)
  bool write_delta = false;    // c <- a - p (co2, and diloco's first pass)
  bool buffer_values = false;  // co2: BUFFER segments send -p and take the average of the values
  // co2's eager policy on PARAMETER segments: the delta from anchor + offset, the offset and
  // its filter advanced, the parameters set to the new anchor + offset (docs/algorithm.md).
  bool eager = false;
  EagerCoefficients eager_coefficients;
  // Applying the average on arrival (with update, without write_delta): the parameters keep their
  // progress since the boundary on top of the new anchor, and the eager offsets are spent
  // (docs/algorithm.md, "Applying the average on arrival").
  bool keep_progress = false;
};

// Device pointers of the engine's device state.
struct Tables {
  const SegmentEntry* segments = nullptr;
  uint32_t num_segments = 0;
  const Chunk* chunks = nullptr;
  uint32_t num_chunks = 0;
  float* anchor = nullptr;
  float* momentum = nullptr;  // null when not stored
  float* comm = nullptr;
  // Scratch: one slot per chunk / per segment.
  double* chunk_squares = nullptr;
  unsigned int* chunk_clamped = nullptr;
  SegmentCoefficients* coefficients = nullptr;
  GapState* gap = nullptr;
  int* average_nonfinite = nullptr;  // set by finite_check: 1 if the average has NaN/Inf
  int* delta_nonfinite = nullptr;
  Report* report = nullptr;
  unsigned long long* checksum = nullptr;  // the anchor check's hash
  float* eager_offset = nullptr;    // e (eager policy), indexed like the anchor
  float* eager_momentum = nullptr;  // q: the filter of this rank's own deltas; null when not stored
};

// Elements per chunk: 256 threads x 16 elements. Fixed: the norms' summation order depends on it.
constexpr uint32_t kChunkElements = 4096;

// *flag = 1 if any of data[0, n) is NaN or infinite, else 0.
int finite_check(const float* data, size_t n, int* flag, void* stream);

// *out = state_checksum(data, n) (runtime/backends/device/state_checksum.hpp), computed on the device.
int checksum(const float* data, size_t n, unsigned long long* out, void* stream);

// Penalty and norm-clip scale of every segment, and the gap history the update would leave
// (committed by boundary_pass's fold); reads average_nonfinite to decide whether it happens.
int coefficients(const Tables& t, const Config& c, void* stream);

// After coefficients(t, c) of a requested update: a read-only pass over a, m and c that computes
// every new anchor and momentum element as the pass would and, when one is not finite, sets
// *t.average_nonfinite, so that the pass, the fold and the report treat the update as not
// applied (docs/algorithm.md, "Results, not only inputs").
int update_result_probe(const Tables& t, const Config& c, void* stream);

// The fused pass over every chunk, then the per-segment fold of the step norms (gap history)
// and the boundary's report. Under the eager policy, a rank whose delta was not finite then
// restarts from the anchor: its offsets and their filter are cleared (as the host backend does).
int boundary_pass(const Tables& t, const Config& c, void* stream);

// dst[0, n) <- the parameters src of `dtype` (ParamDType), widened to fp32.
int widen_params(const void* src, uint32_t dtype, float* dst, size_t n, void* stream);
// dst (parameters of `dtype`) <- src[0, n) rounded to nearest even.
int narrow_params(const float* src, void* dst, uint32_t dtype, size_t n, void* stream);

// A kernel that spins for about `nanoseconds` (benchmarks' synthetic training step, and the test
// that a non-boundary step does not synchronise the host).
int spin(uint64_t nanoseconds, void* stream);

}  // namespace co2::device::kernels

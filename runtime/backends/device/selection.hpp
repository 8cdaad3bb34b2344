// The host-side choices of the GPU path, as plain functions of their inputs so that they are
// unit-tested on machines without a GPU (tests/runtime/backends/device/selection_test.cpp): where the
// outer state lives, how the comm buffer is averaged, which stream each piece of a boundary runs
// on and which events order them, how the flat state is cut into the fixed chunks that make the
// device norms deterministic.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace co2::device {

// Where an engine's parameters (and so its outer state) live.
enum class Placement { Host, Device };

// How the device comm buffer is averaged.
enum class Averaging {
  HostRing,     // host tensors: the communicator's ring over point-to-point (no device work)
  Collective,   // device tensors over a collective transport (NCCL): in place, stream-ordered
  StagedHost,   // device tensors over point-to-point (UCX, local), or with a compressed wire:
                // copied to pinned host memory, averaged by the communicator, copied back
};

// placement: where the engine's tensors are; collective_transport: the communicator runs a
// collective-kind transport (NCCL); compressed_wire: the outer average travels in a wire format
// other than fp32, whose encoding runs on the host (so over NCCL too the deltas are staged).
// NCCL with host tensors is refused (InvalidArgument message in *why): NCCL would stage every
// host byte through the device for nothing.
Averaging choose_averaging(Placement placement, bool collective_transport, bool compressed_wire, std::string* why);

// A raw collective (co2_allreduce, co2_broadcast) on `cuda_buffer` memory over a communicator
// whose transport is (not) collective-kind: "" when it can run, otherwise why not. Point-to-point
// transports move host memory on the CPU and would read device addresses there.
std::string raw_collective_refusal(bool cuda_buffer, bool collective_transport);

// --- the stream plan of a co2 boundary on the device ---------------------------------------
enum class Stream : uint8_t { Caller, Comm };
enum class Event : uint8_t {
  AverageReady,  // comm stream: the arrived average (and its finiteness flag) is in the comm buffer
  PassDone,      // caller stream: the fused pass wrote the new delta into the comm buffer
  StagedOut,     // comm stream: the delta is in pinned host memory (staged averaging)
  ReportReady,   // caller stream: the boundary's report is in pinned host memory
};
enum class OpKind : uint8_t {
  RecordEvent,       // record `event` on `stream`
  StreamWaitEvent,   // `stream` waits for `event` (the host does not block)
  HostWaitEvent,     // the host blocks until `event` completed
  HostWaitAverage,   // the host waits for the communicator's request; a failed collective
                     // throws here, before anything of its average is applied
  HostReadFinite,    // the host learns whether the arrived average is finite: staged, from the
                     // progress thread's scan; collective, from the pinned flag (CopyFlagOut)
  CopyAverageIn,     // pinned average -> device comm buffer
  CopyDeltaOut,      // device comm buffer -> pinned host buffer
  FiniteCheck,       // device flag: is the arrived average finite
  CopyFlagOut,       // that flag -> pinned host memory
  Coefficients,      // per segment: penalty, norm-clip scale (reads momentum and the average)
  Pass,              // the fused pass over every segment (reads/writes framework memory)
  Report,            // the boundary's report (norms, clamps, flags) -> pinned host memory
  DeviceAllReduce,   // the collective transport averages the comm buffer in place
  SubmitHostAverage, // hand the pinned delta to the communicator (progress thread)
};
struct Op {
  OpKind kind;
  Stream stream;
  Event event;  // for the event kinds only
  bool operator==(const Op& o) const { return kind == o.kind && stream == o.stream && event == o.event; }
};

// The ordered work of one co2 boundary; have_average: an all-reduce from the previous boundary
// is in flight (its AverageReady was recorded then, so every wait here is on an event recorded
// earlier). Kernels that touch framework memory run on the caller's stream; only the comm
// buffer's copies and all-reduce run on the comm stream. Before an average is applied the host
// sees its collective succeed (HostWaitAverage: an aborted NCCL collective releases its stream
// with a half-reduced buffer, which must never reach the anchor) and learns its finiteness
// (HostReadFinite), so that NONFINITE is reported by the boundary that skipped the update. On the
// collective path both waits are on the previous round's collective, which had τ steps of time:
// they return at once unless the device is a whole round behind the host. The staged plan
// also blocks the host once after the delta left the device (HostWaitEvent StagedOut), because
// the communicator's submissions must stay in issue order on the training thread.
std::vector<Op> co2_boundary_plan(Averaging averaging, bool have_average);

// The same plan in the three phases runtime/engine/engine.cpp calls in turn (runtime/backends/backend.hpp):
// collect (the host waits for the average and learns its finiteness; the caller's stream waits
// for it), pass (the fused pass on the caller's stream), submit (the deltas' all-reduce). The
// engine checks the anchor, when due, between pass and submit; finalize runs collect and pass.
struct BoundaryPhases {
  std::vector<Op> collect, pass, submit;
};
BoundaryPhases co2_boundary_phases(Averaging averaging, bool have_average);

// Checks the invariants above for a sequence of boundary plans run back to back (events start
// unrecorded): every waited event was recorded before, Pass/Coefficients/Report run on the
// caller stream, DeviceAllReduce/copies of the comm buffer on the comm stream, the comm buffer
// is never written on one stream while the other may still use it. Returns "" or what is wrong.
std::string check_plan_sequence(const std::vector<std::vector<Op>>& plans);

// --- deterministic chunking of the state ---------------------------------------------------
// Every segment is cut into chunks of at most `chunk` elements (a chunk never spans two
// segments); the device reduces each chunk to one partial sum and then folds a segment's
// partials in chunk order, so the norms depend only on the segment sizes.
struct Chunk {
  uint32_t segment;  // index into the segment table
  uint64_t begin;    // element offset inside the segment
  uint32_t count;
};
std::vector<Chunk> make_chunks(const std::vector<size_t>& segment_counts, uint32_t chunk);
// first[s] = index of segment s's first chunk; first[segments] = total.
std::vector<uint32_t> first_chunk_of_segments(const std::vector<Chunk>& chunks, size_t segments);

// --- reports of boundaries still on the device ---------------------------------------------
// Boundary reports are copied into a ring of pinned slots and folded into the statistics, in
// order, once their event completed; the host blocks only when the ring is full (the device is a
// whole ring of boundaries behind).
class ReportRing {
 public:
  explicit ReportRing(size_t slots) : slots_(slots) {}
  size_t slots() const { return slots_; }
  size_t in_flight() const { return size_t(next_ - oldest_); }
  bool full() const { return in_flight() == slots_; }
  bool empty() const { return next_ == oldest_; }
  size_t push() { return size_t(next_++ % slots_); }  // slot of the next report; not when full
  size_t oldest() const { return size_t(oldest_ % slots_); }
  void pop() { ++oldest_; }

 private:
  size_t slots_;
  uint64_t next_ = 0, oldest_ = 0;
};

// Usable CUDA devices from cudaGetDeviceCount's result: any error (no driver: 35) or a count of 0
// means none, and GPU tests skip.
int usable_device_count(int cuda_error, int count);

}  // namespace co2::device

#include "runtime/backends/device/selection.hpp"

#include <algorithm>
#include <map>

namespace co2::device {

Averaging choose_averaging(Placement placement, bool collective_transport, bool compressed_wire, std::string* why) {
  if (placement == Placement::Host) {
    if (collective_transport && why)
      *why = "the NCCL transport needs CUDA tensors: register device memory (CO2_DEVICE_CUDA) or "
             "use CO2_TRANSPORT_LOCAL / CO2_TRANSPORT_UCX for host tensors";
    return Averaging::HostRing;
  }
  return collective_transport && !compressed_wire ? Averaging::Collective : Averaging::StagedHost;
}

BoundaryPhases co2_boundary_phases(Averaging averaging, bool have_average) {
  BoundaryPhases phases;
  std::vector<Op>* plan = &phases.collect;
  auto op = [&](OpKind k, Stream s, Event e = Event::AverageReady) { plan->push_back(Op{k, s, e}); };
  const bool staged = averaging == Averaging::StagedHost;
  if (have_average) {
    op(OpKind::HostWaitAverage, Stream::Comm);
    if (staged) {
      op(OpKind::HostReadFinite, Stream::Comm);
      op(OpKind::CopyAverageIn, Stream::Comm);
      op(OpKind::FiniteCheck, Stream::Comm);
      op(OpKind::RecordEvent, Stream::Comm, Event::AverageReady);
    } else {
      // AverageReady was recorded on the comm stream at the previous boundary, after the flag.
      op(OpKind::HostWaitEvent, Stream::Comm, Event::AverageReady);
      op(OpKind::HostReadFinite, Stream::Comm);
    }
    op(OpKind::StreamWaitEvent, Stream::Caller, Event::AverageReady);
  }
  plan = &phases.pass;
  op(OpKind::Coefficients, Stream::Caller);
  op(OpKind::Pass, Stream::Caller);
  op(OpKind::Report, Stream::Caller);
  op(OpKind::RecordEvent, Stream::Caller, Event::ReportReady);
  op(OpKind::RecordEvent, Stream::Caller, Event::PassDone);
  plan = &phases.submit;
  op(OpKind::StreamWaitEvent, Stream::Comm, Event::PassDone);
  if (staged) {
    op(OpKind::CopyDeltaOut, Stream::Comm);
    op(OpKind::RecordEvent, Stream::Comm, Event::StagedOut);
    op(OpKind::HostWaitEvent, Stream::Comm, Event::StagedOut);
    op(OpKind::SubmitHostAverage, Stream::Comm);
  } else {
    op(OpKind::DeviceAllReduce, Stream::Comm);
    op(OpKind::FiniteCheck, Stream::Comm);
    op(OpKind::CopyFlagOut, Stream::Comm);
    op(OpKind::RecordEvent, Stream::Comm, Event::AverageReady);
  }
  return phases;
}

std::vector<Op> co2_boundary_plan(Averaging averaging, bool have_average) {
  BoundaryPhases phases = co2_boundary_phases(averaging, have_average);
  std::vector<Op> plan = std::move(phases.collect);
  plan.insert(plan.end(), phases.pass.begin(), phases.pass.end());
  plan.insert(plan.end(), phases.submit.begin(), phases.submit.end());
  return plan;
}

namespace {

const char* name_of(OpKind k) {
  switch (k) {
    case OpKind::RecordEvent: return "RecordEvent";
    case OpKind::StreamWaitEvent: return "StreamWaitEvent";
    case OpKind::HostWaitEvent: return "HostWaitEvent";
    case OpKind::HostWaitAverage: return "HostWaitAverage";
    case OpKind::HostReadFinite: return "HostReadFinite";
    case OpKind::CopyFlagOut: return "CopyFlagOut";
    case OpKind::CopyAverageIn: return "CopyAverageIn";
    case OpKind::CopyDeltaOut: return "CopyDeltaOut";
    case OpKind::FiniteCheck: return "FiniteCheck";
    case OpKind::Coefficients: return "Coefficients";
    case OpKind::Pass: return "Pass";
    case OpKind::Report: return "Report";
    case OpKind::DeviceAllReduce: return "DeviceAllReduce";
    case OpKind::SubmitHostAverage: return "SubmitHostAverage";
  }
  return "?";
}

bool on_caller(OpKind k) { return k == OpKind::Coefficients || k == OpKind::Pass || k == OpKind::Report; }
bool on_comm(OpKind k) {
  return k == OpKind::DeviceAllReduce || k == OpKind::CopyAverageIn || k == OpKind::CopyDeltaOut ||
         k == OpKind::FiniteCheck;
}
bool touches_comm_buffer(OpKind k) { return on_caller(k) || on_comm(k); }
// Ops whose completion another stream or the host may wait for (position in their stream).
bool counted(OpKind k) { return touches_comm_buffer(k) || k == OpKind::CopyFlagOut; }

}  // namespace

std::string check_plan_sequence(const std::vector<std::vector<Op>>& plans) {
  // Vector clocks: position = number of ops enqueued on a stream so far. An event remembers the
  // position it was recorded at; waiting on it makes the waiter (a stream, or the host and thus
  // every later op) ordered after everything before that position.
  uint64_t position[2] = {0, 0};
  uint64_t seen[2][2] = {{0, 0}, {0, 0}};  // seen[x][y]: stream x is ordered after y's ops < this
  uint64_t host_seen[2] = {0, 0};
  uint64_t last_buffer_access[2] = {0, 0};  // 1-based position of the last comm buffer access
  uint64_t last_delta_out = 0, last_flag_out = 0;
  std::map<Event, std::pair<int, uint64_t>> recorded;
  for (size_t b = 0; b < plans.size(); ++b) {
    bool average_waited = false, finite_read = false;
    for (size_t i = 0; i < plans[b].size(); ++i) {
      const Op& o = plans[b][i];
      const int x = int(o.stream), y = 1 - x;
      const std::string where = "boundary " + std::to_string(b) + " op " + std::to_string(i) + " (" + name_of(o.kind) + "): ";
      if (on_caller(o.kind) && o.stream != Stream::Caller)
        return where + "touches framework memory, must run on the caller's stream";
      if (on_comm(o.kind) && o.stream != Stream::Comm) return where + "comm buffer traffic must run on the comm stream";
      switch (o.kind) {
        case OpKind::RecordEvent:
          recorded[o.event] = {x, position[x]};
          break;
        case OpKind::StreamWaitEvent:
        case OpKind::HostWaitEvent: {
          auto it = recorded.find(o.event);
          if (it == recorded.end()) return where + "waits on an event that was never recorded";
          const auto [stream, pos] = it->second;
          if (o.kind == OpKind::StreamWaitEvent)
            seen[x][stream] = std::max(seen[x][stream], pos);
          else
            host_seen[stream] = std::max(host_seen[stream], pos);
          break;
        }
        case OpKind::SubmitHostAverage:
          if (last_delta_out == 0 || host_seen[int(Stream::Comm)] < last_delta_out)
            return where + "hands the pinned delta to the host before the copy out completed";
          break;
        case OpKind::HostWaitAverage:
          average_waited = true;
          break;
        case OpKind::HostReadFinite:
          if (!average_waited) return where + "reads the finiteness before the collective completed";
          if (last_flag_out > host_seen[int(Stream::Comm)])
            return where + "reads the pinned flag before its copy out completed";
          finite_read = true;
          break;
        case OpKind::CopyAverageIn:
        case OpKind::Coefficients:
        case OpKind::Pass:
          // Applying (or staging in) an average: its collective must have succeeded, and its
          // finiteness be known to the host, first.
          if (average_waited != finite_read) return where + "applies an average whose finiteness the host does not know";
          break;
        default:
          break;
      }
      if (o.kind == OpKind::StreamWaitEvent && o.stream == Stream::Caller && o.event == Event::AverageReady &&
          !average_waited)
        return where + "lets the pass use an average whose collective the host has not seen succeed";
      if (counted(o.kind)) ++position[x];
      if (o.kind == OpKind::CopyFlagOut) last_flag_out = position[x];
      if (touches_comm_buffer(o.kind)) {
        const uint64_t ordered = std::max(seen[x][y], host_seen[y]);
        if (last_buffer_access[y] > ordered)
          return where + "races with the other stream's access to the comm buffer";
        last_buffer_access[x] = position[x];
        if (o.kind == OpKind::CopyDeltaOut) last_delta_out = position[x];
      }
    }
  }
  return "";
}

std::vector<Chunk> make_chunks(const std::vector<size_t>& segment_counts, uint32_t chunk) {
  std::vector<Chunk> chunks;
  if (chunk == 0) return chunks;
  for (size_t s = 0; s < segment_counts.size(); ++s)
    for (size_t begin = 0; begin < segment_counts[s]; begin += chunk)
      chunks.push_back(Chunk{uint32_t(s), uint64_t(begin),
                             uint32_t(std::min<size_t>(chunk, segment_counts[s] - begin))});
  return chunks;
}

std::vector<uint32_t> first_chunk_of_segments(const std::vector<Chunk>& chunks, size_t segments) {
  std::vector<uint32_t> first(segments + 1, uint32_t(chunks.size()));
  for (size_t i = chunks.size(); i-- > 0;) first[chunks[i].segment] = uint32_t(i);
  // Segments without chunks (none in practice: counts are >= 1) start where the next one does.
  for (size_t s = segments; s-- > 0;) first[s] = std::min(first[s], first[s + 1]);
  return first;
}

int usable_device_count(int cuda_error, int count) { return cuda_error != 0 || count < 0 ? 0 : count; }

std::string raw_collective_refusal(bool cuda_buffer, bool collective_transport) {
  if (!cuda_buffer || collective_transport) return "";
  return "the buffer is CUDA device memory, but this communicator's transport moves host memory: "
         "create the communicator with CO2_TRANSPORT_NCCL for device buffers, or pass host memory";
}

}  // namespace co2::device

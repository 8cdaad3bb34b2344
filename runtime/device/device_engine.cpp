// The engine's device path (CUDA tensors): outer state in device memory, the boundary as fused
// kernels on the caller's stream, the comm buffer averaged either by a collective transport
// (NCCL, in place on its stream) or staged through pinned host memory over the communicator
// (UCX, local). The co2 boundary is runtime/device/selection.cpp's plan, executed op by op.
#include <atomic>
#include <chrono>
#include <deque>
#include <thread>
#include <vector>

#include "runtime/boundary_pass.hpp"

#include "runtime/checksum.hpp"
#include "runtime/device/cuda_api.hpp"
#include "runtime/device/kernels.hpp"
#include "runtime/device/selection.hpp"
#include "runtime/engine_state.hpp"
#include "runtime/log.hpp"

namespace co2 {

bool device_path_built() { return true; }

namespace device {
namespace {

using S = Engine::State;

// Boundaries whose reports may still be on the device before the host waits for the oldest.
constexpr size_t kReportSlots = 4;

void throw_nonfinite() {
  fail(Status::NonFinite,
       "the averaged update contains NaN or Inf; nothing was applied on any rank (the anchor "
       "is unchanged): lower the learning rate or skip the offending data");
}

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

class CudaPath final : public DevicePath {
 public:
  explicit CudaPath(int device_index) : device_(device_index), selected_(device_index) {
    own_stream_ = std::make_unique<CudaStream>();
    for (size_t i = 0; i < kReportSlots; ++i) report_ready_.push_back(std::make_unique<CudaEvent>());
  }

  void check_device_memory(const void* data, size_t bytes, const std::string& what) override {
    const char* last = static_cast<const char*>(data) + (bytes ? bytes - 1 : 0);
    for (const void* p : {data, static_cast<const void*>(last)}) {
      cudaPointerAttributes attributes{};
      const cudaError_t e = cudaPointerGetAttributes(&attributes, p);
      if (e != cudaSuccess) cudaGetLastError();
      const bool device_memory =
          e == cudaSuccess && (attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged);
      require(device_memory && attributes.device == device_, Status::InvalidArgument,
              what + " is declared CUDA device " + std::to_string(device_) +
                  " memory but is not (host memory, another device, or not allocated)");
    }
  }

  void* allocate_flat(S& s, size_t count) override {
    make_current();
    flat_ = DeviceMemory(count * sizeof(float), device_, s.allocator, own_stream_->get());
    return flat_.as();
  }

  void commit(S& s) override {
    const int comm_device = s.comm->collective_device();
    require(comm_device < 0 || comm_device == device_, Status::InvalidArgument,
            "the tensors are on CUDA device " + std::to_string(device_) + " but the NCCL communicator on device " +
                std::to_string(comm_device) + ": set co2_comm_config_t.device_index (default: LOCAL_RANK) to "
                "the tensors' device, or move the model there (torch.cuda.set_device(LOCAL_RANK) before building it)");
    make_current();
    std::string why;
    averaging_ = choose_averaging(Placement::Device, s.comm->collective_stream() != nullptr, &why);
    comm_stream_ = averaging_ == Averaging::Collective ? as_stream(s.comm->collective_stream()) : own_stream_->get();
    build_tables(s);
    buffer_values_ = s.config.algorithm == Algorithm::Co2;
    const size_t bytes = s.state_count * sizeof(float);
    comm_ = alloc(s, bytes);
    if (s.has_anchor()) anchor_ = alloc(s, bytes);
    if (s.has_anchor() && s.momentum_needed()) momentum_ = alloc(s, bytes);
    if (averaging_ == Averaging::StagedHost) staging_ = PinnedMemory(bytes);
    reports_ = PinnedMemory(kReportSlots * sizeof(kernels::Report));
    flag_host_ = PinnedMemory(sizeof(int));
    average_flag_host_ = PinnedMemory(sizeof(int));
    refresh_tables();

    // Rank 0's values become everyone's parameters and anchor, once the framework's
    // initialisation is finished (commit has no stream argument: see wait_for_caller).
    wait_for_caller(s, "commit");
    cudaStream_t st = own_stream_->get();
    pack(s, comm_.as<float>(), st, false);
    check(cudaStreamSynchronize(st), "cudaStreamSynchronize (commit)");
    broadcast_from_rank0(s, comm_.as<float>(), s.state_count);
    unpack(s, comm_.as<float>(), st, false);
    if (!anchor_.empty())
      check(cudaMemcpyAsync(anchor_.as(), comm_.as(), bytes, cudaMemcpyDeviceToDevice, st), "copy anchor");
    check(cudaMemsetAsync(comm_.as(), 0, bytes, st), "clear comm buffer");
    check(cudaStreamSynchronize(st), "cudaStreamSynchronize (commit)");
  }

  bool boundary(S& s, void* stream) override {
    make_current();
    caller_stream_ = stream;
    fold_reports(s, false);
    cudaStream_t caller = as_stream(stream);
    const bool warmup = s.stats.rounds <= s.config.warmup_sync_rounds;
    bool applied = true;
    switch (s.config.algorithm) {
      case Algorithm::Co2:
        applied = warmup ? diloco_boundary(s, caller) : co2_boundary(s, caller);
        break;
      case Algorithm::Diloco:
        applied = diloco_boundary(s, caller);
        break;
      case Algorithm::LocalSgd:
        applied = localsgd_boundary(s, caller);
        break;
      case Algorithm::Sync:
        applied = sync_boundary(s, caller);
        break;
    }
    const uint32_t k = s.config.anchor_check_interval;
    if (applied && k && s.stats.rounds % k == 0) check_anchor(s, caller);
    return take_nonfinite() && applied;
  }

  void reduce_gradients(S& s, void* const* grads, size_t, void* stream) override {
    make_current();
    caller_stream_ = stream;
    cudaStream_t caller = as_stream(stream);
    float* packed;
    if (s.config.algorithm == Algorithm::Sync) {
      packed = comm_.as<float>();
    } else {
      if (gradients_.empty()) gradients_ = alloc(s, s.trained_count * sizeof(float));
      packed = gradients_.as<float>();
    }
    size_t offset = 0, i = 0;
    for (const Segment& seg : s.segments) {
      if (seg.role != Role::Parameter) continue;
      const size_t bytes = seg.count * sizeof(float);
      if (grads[i])
        check(cudaMemcpyAsync(packed + offset, grads[i], bytes, cudaMemcpyDeviceToDevice, caller), "pack gradients");
      else
        check(cudaMemsetAsync(packed + offset, 0, bytes, caller), "zero gradients");
      offset += seg.count;
      ++i;
    }
    if (!average_blocking(s, packed, s.trained_count, caller, blocking_flag(), Purpose::GradientAverage))
      fail(Status::NonFinite,
           "the averaged gradient contains NaN or Inf; the gradients were left as they were: skip "
           "this optimizer step");
    offset = 0;
    i = 0;
    for (const Segment& seg : s.segments) {
      if (seg.role != Role::Parameter) continue;
      if (grads[i])
        check(cudaMemcpyAsync(grads[i], packed + offset, seg.count * sizeof(float), cudaMemcpyDeviceToDevice, caller),
              "unpack gradients");
      offset += seg.count;
      ++i;
    }
  }

  void synchronize(S& s) override {
    make_current();
    wait_for_caller(s, "synchronize");
    cudaStream_t caller = nullptr;
    const bool mid_round = s.steps_in_round > 0;
    s.steps_in_round = 0;
    s.round_tau = s.config.tau;
    bool applied = true;
    switch (s.config.algorithm) {
      case Algorithm::Co2:
        if (mid_round) applied = co2_boundary(s, caller);
        applied = apply_pending(s, caller) && applied;
        break;
      case Algorithm::Diloco:
        if (mid_round)
          applied = diloco_boundary(s, caller);
        else
          unpack(s, anchor_.as<float>(), caller, false);
        break;
      case Algorithm::LocalSgd:
        applied = localsgd_boundary(s, caller);
        break;
      case Algorithm::Sync:
        applied = sync_boundary(s, caller);
        break;
    }
    fold_reports(s, true);
    applied = take_nonfinite() && applied;
    if (!applied) throw_nonfinite();
    check_anchor(s, caller);
  }

  void finalize(S& s) override {
    make_current();
    wait_for_caller(s, "finalize");
    s.steps_in_round = 0;
    s.round_tau = s.config.tau;
    bool applied = apply_pending(s, nullptr);
    fold_reports(s, true);
    applied = take_nonfinite() && applied;
    wait_for_caller(s, "finalize");  // the last pass ran on the caller's stream
    if (!applied) throw_nonfinite();
  }

  void consensus(S& s, ConsensusKind kind, float* out, size_t count) override {
    make_current();
    wait_for_caller(s, "consensus");
    const size_t bytes = count * sizeof(float);
    switch (kind) {
      case ConsensusKind::Anchor:
        if (!anchor_.empty()) {
          check(cudaMemcpy(out, anchor_.as(), bytes, cudaMemcpyDefault), "copy anchor out");
          return;
        }
        require(s.config.algorithm == Algorithm::Sync, Status::Unsupported,
                "localsgd keeps no anchor: use CO2_CONSENSUS_LOCAL_AVERAGE");
        pack(s, out, nullptr, false);
        check(cudaStreamSynchronize(nullptr), "cudaStreamSynchronize (consensus)");
        return;
      case ConsensusKind::LocalAverage: {
        if (scratch_.empty()) scratch_ = alloc(s, s.state_count * sizeof(float));
        pack(s, scratch_.as<float>(), nullptr, false);
        average_blocking(s, scratch_.as<float>(), count, nullptr, blocking_flag(), Purpose::Consensus);
        check(cudaMemcpy(out, scratch_.as(), bytes, cudaMemcpyDefault), "copy average out");
        return;
      }
    }
    fail(Status::UnknownEnum, "unknown consensus kind " + std::to_string(int(kind)));
  }

  void momentum_needed(S& s) override {
    if (!momentum_.empty() || comm_.empty()) return;
    make_current();
    momentum_ = alloc(s, s.state_count * sizeof(float));  // starts from zero momentum
    refresh_tables();
  }

  void fold_reports(S& s, bool wait) override {
    while (!ring_.empty()) {
      const size_t slot = ring_.oldest();
      if (wait)
        report_ready_[slot]->synchronize();
      else if (!report_ready_[slot]->done())
        break;
      fold(s, reports_.as<kernels::Report>()[slot]);
      ring_.pop();
    }
    while (!in_flight_.empty()) {
      // A failed all-reduce has failed the communicator: its error surfaces at the next call.
      if (wait) {
        if (in_flight_.front()->wait_status() != Status::Ok) {
          in_flight_.pop_front();
          continue;
        }
      } else {
        bool done = false;
        try {
          done = in_flight_.front()->test();
        } catch (const Error&) {
          in_flight_.pop_front();
          continue;
        }
        if (!done) break;
      }
      s.stats.collective_ns += uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                            in_flight_.front()->completed_at() - in_flight_.front()->submitted_at())
                                            .count());
      const Clock::time_point now = Clock::now();
      observe_collective(s, *in_flight_.front(), now, now);  // the host did not wait for it
      in_flight_.pop_front();
    }
  }

  void drain(S& s) noexcept override {
    // The collective first: it is bounded by the communicator's timeout (a dead peer aborts the
    // NCCL communicator, which releases the comm stream).
    if (s.pending) s.pending->wait_status();
    for (auto& r : in_flight_) r->wait_status();
    // Our streams only (another library's kernels are none of ours to wait for), bounded: a
    // device that hangs leaks the state rather than the process.
    for (void* stream : {caller_stream_, static_cast<void*>(comm_stream_), static_cast<void*>(own_stream_->get())}) {
      try {
        wait_for_stream(s, stream, "shutdown");
      } catch (const Error& e) {
        log::warn(std::string("engine shutdown: ") + e.what());
        return;
      }
    }
  }

 private:
  // Calls without a stream argument (commit, synchronize, finalize, consensus) order after the
  // caller's stream of the last step or reduce_gradients — before the first one, the legacy
  // default stream, which every blocking stream's earlier work precedes. Not
  // cudaDeviceSynchronize: that also waits for other libraries' streams (a data loader's
  // copies, another communicator's collectives), which no timeout of ours could end.
  void wait_for_caller(S& s, const char* what) { wait_for_stream(s, caller_stream_, what); }

  // Polls an event on `stream` up to the communicator's timeout (Status::Timeout after it).
  void wait_for_stream(S& s, void* stream, const char* what) {
    CudaEvent reached;
    reached.record(as_stream(stream));
    const auto timeout = s.comm->options().timeout;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!reached.done()) {
      require(std::chrono::steady_clock::now() < deadline, Status::Timeout,
              std::string(what) + ": the CUDA stream's work did not finish within " +
                  std::to_string(timeout.count()) + " ms (the communicator's timeout): a kernel hangs");
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  // The engine's device for this thread (the caller may have switched): one cheap call.
  void make_current() const { check(cudaSetDevice(device_), "cudaSetDevice"); }

  DeviceMemory alloc(S& s, size_t bytes) { return DeviceMemory(bytes, device_, s.allocator, own_stream_->get()); }

  void build_tables(S& s) {
    std::vector<size_t> counts;
    std::vector<kernels::SegmentEntry> entries;
    for (const Segment& seg : s.segments) {
      if (seg.role == Role::Excluded) continue;
      counts.push_back(seg.count);
      entries.push_back(kernels::SegmentEntry{static_cast<float*>(seg.data), seg.state_offset, seg.count, 0,
                                              uint32_t(seg.role == Role::Parameter)});
    }
    const auto chunks = make_chunks(counts, kernels::kChunkElements);
    const auto first = first_chunk_of_segments(chunks, counts.size());
    for (size_t i = 0; i < entries.size(); ++i) entries[i].first_chunk = first[i];
    num_segments_ = uint32_t(entries.size());
    num_chunks_ = uint32_t(chunks.size());
    segments_ = alloc(s, entries.size() * sizeof(kernels::SegmentEntry));
    chunks_ = alloc(s, chunks.size() * sizeof(Chunk));
    check(cudaMemcpy(segments_.as(), entries.data(), segments_.bytes(), cudaMemcpyHostToDevice), "upload segments");
    check(cudaMemcpy(chunks_.as(), chunks.data(), chunks_.bytes(), cudaMemcpyHostToDevice), "upload chunks");
    chunk_squares_ = alloc(s, chunks.size() * sizeof(double));
    chunk_clamped_ = alloc(s, chunks.size() * sizeof(unsigned int));
    coefficients_ = alloc(s, entries.size() * sizeof(kernels::SegmentCoefficients));
    gap_ = alloc(s, entries.size() * sizeof(kernels::GapState));
    flags_ = alloc(s, 3 * sizeof(int));
    report_ = alloc(s, sizeof(kernels::Report));
  }

  void refresh_tables() {
    t_.segments = segments_.as<kernels::SegmentEntry>();
    t_.num_segments = num_segments_;
    t_.chunks = chunks_.as<Chunk>();
    t_.num_chunks = num_chunks_;
    t_.anchor = anchor_.as<float>();
    t_.momentum = momentum_.as<float>();
    t_.comm = comm_.as<float>();
    t_.chunk_squares = chunk_squares_.as<double>();
    t_.chunk_clamped = chunk_clamped_.as<unsigned int>();
    t_.coefficients = coefficients_.as<kernels::SegmentCoefficients>();
    t_.gap = gap_.as<kernels::GapState>();
    t_.average_nonfinite = flags_.as<int>();
    t_.delta_nonfinite = flags_.as<int>() + 1;
    t_.report = report_.as<kernels::Report>();
  }

  int* blocking_flag() { return flags_.as<int>() + 2; }

  // co2 applies an average with the settings in effect when its deltas were submitted
  // (s.prepared.settings, as on the host); diloco with the current ones.
  kernels::Config config_of(const OuterSettings& o, bool update_requested, bool write_delta) const {
    kernels::Config c;
    c.alpha = float(o.outer_lr);
    c.beta = float(o.beta);
    c.clip_threshold = o.clip_threshold;
    c.penalty_constant = o.penalty_constant;
    c.penalty = int(o.penalty);
    c.clip = int(o.clip);
    c.nesterov = o.nesterov;
    c.momentum = !momentum_.empty();
    c.update_requested = update_requested;
    c.write_delta = write_delta;
    c.buffer_values = buffer_values_;  // by algorithm: also before the first prepared settings
    return c;
  }

  void pack(const S& s, float* dst, cudaStream_t st, bool buffers_only) {
    for (const Segment& seg : s.segments) {
      if (seg.role == Role::Excluded || (buffers_only && seg.role != Role::Buffer)) continue;
      check(cudaMemcpyAsync(dst + seg.state_offset, seg.data, seg.count * sizeof(float), cudaMemcpyDefault, st),
            "pack parameters");
    }
  }

  void unpack(const S& s, const float* src, cudaStream_t st, bool buffers_only) {
    for (const Segment& seg : s.segments) {
      if (seg.role == Role::Excluded || (buffers_only && seg.role != Role::Buffer)) continue;
      check(cudaMemcpyAsync(seg.data, src + seg.state_offset, seg.count * sizeof(float), cudaMemcpyDefault, st),
            "unpack parameters");
    }
  }

  PinnedMemory& blocking_staging(size_t count) {
    if (blocking_staging_.bytes() < count * sizeof(float)) blocking_staging_ = PinnedMemory(count * sizeof(float));
    return blocking_staging_;
  }

  void broadcast_from_rank0(S& s, float* data, size_t count) {
    if (averaging_ == Averaging::Collective) {
      // Ordered on the NCCL stream.
      auto request = s.comm->broadcast(data, count, DataType::F32, 0, s.id(Purpose::InitialBroadcast));
      if (request->wait_status() != Status::Ok) fail(s.comm->error_status(), s.comm->error_message());
      return;
    }
    PinnedMemory& pin = blocking_staging(count);
    const size_t bytes = count * sizeof(float);
    check(cudaMemcpyAsync(pin.as(), data, bytes, cudaMemcpyDeviceToHost, comm_stream_), "stage out");
    check(cudaStreamSynchronize(comm_stream_), "cudaStreamSynchronize (stage out)");
    auto request = s.comm->broadcast(pin.as(), count, DataType::F32, 0, s.id(Purpose::InitialBroadcast));
    if (request->wait_status() != Status::Ok) fail(s.comm->error_status(), s.comm->error_message());
    check(cudaMemcpyAsync(data, pin.as(), bytes, cudaMemcpyHostToDevice, comm_stream_), "stage in");
    check(cudaStreamSynchronize(comm_stream_), "cudaStreamSynchronize (stage in)");
  }

  // Blocking average of device `data` after the caller's stream's work; the caller's stream then
  // waits for the result. *flag (device) = 1 if the average is not finite. Returns finiteness.
  bool average_blocking(S& s, float* data, size_t count, cudaStream_t caller, int* flag,
                        Purpose purpose) {
    ordered_.record(caller);
    ordered_.make_wait(comm_stream_);
    const size_t bytes = count * sizeof(float);
    s.stats.bytes_reduced += bytes;
    if (averaging_ == Averaging::Collective) {
      wait_charged(s, s.comm->allreduce(data, count, DataType::F32, ReduceOp::Avg, s.id(purpose)));
    } else {
      PinnedMemory& pin = blocking_staging(count);
      check(cudaMemcpyAsync(pin.as(), data, bytes, cudaMemcpyDeviceToHost, comm_stream_), "stage out");
      check(cudaStreamSynchronize(comm_stream_), "cudaStreamSynchronize (stage out)");
      wait_charged(s, s.comm->allreduce(pin.as(), count, DataType::F32, ReduceOp::Avg, s.id(purpose)));
      check(cudaMemcpyAsync(data, pin.as(), bytes, cudaMemcpyHostToDevice, comm_stream_), "stage in");
    }
    check(kernels::finite_check(data, count, flag, comm_stream_), "finite check");
    check(cudaMemcpyAsync(flag_host_.as(), flag, sizeof(int), cudaMemcpyDeviceToHost, comm_stream_), "read flag");
    check(cudaStreamSynchronize(comm_stream_), "cudaStreamSynchronize (average)");
    averaged_.record(comm_stream_);
    averaged_.make_wait(caller);
    return *flag_host_.as<int>() == 0;
  }

  CudaEvent& event(device::Event e) {
    switch (e) {
      case device::Event::AverageReady: return average_ready_;
      case device::Event::PassDone: return pass_done_;
      case device::Event::StagedOut: return staged_out_;
      case device::Event::ReportReady: break;
    }
    return *report_ready_[last_report_slot_];
  }

  void report(cudaStream_t caller) {
    if (ring_.full()) {  // the device is a whole ring of boundaries behind: wait for the oldest
      report_ready_[ring_.oldest()]->synchronize();
      fold(*folding_state_, reports_.as<kernels::Report>()[ring_.oldest()]);
      ring_.pop();
    }
    last_report_slot_ = ring_.push();
    check(cudaMemcpyAsync(reports_.as<kernels::Report>() + last_report_slot_, t_.report, sizeof(kernels::Report),
                          cudaMemcpyDeviceToHost, caller),
          "copy boundary report");
    report_ready_[last_report_slot_]->record(caller);
  }

  void fold(S& s, const kernels::Report& r) {
    if (r.delta_nonfinite) ++s.stats.nonfinite_local;
    if (r.update_requested && !r.applied) {
      ++s.stats.nonfinite_rounds;
      // A co2 boundary that read the average's flag has already reported it.
      if (nonfinite_reported_early_ > 0)
        --nonfinite_reported_early_;
      else
        nonfinite_pending_ = true;
    }
    if (!r.applied) return;
    ++s.stats.outer_updates;
    s.stats.last_penalty_min = s.num_trained ? r.penalty_min : 1.0;
    s.stats.last_penalty_max = s.num_trained ? r.penalty_max : 1.0;
    s.stats.last_clip_scale_min = r.scale_min;
    if (s.config.clip == Clip::Value)
      s.stats.last_clip_fraction = r.trained_elements ? double(r.clamped) / double(r.trained_elements) : 0.0;
    else if (s.config.clip == Clip::Norm)
      s.stats.last_clip_fraction = s.num_trained ? double(r.scaled_segments) / double(s.num_trained) : 0.0;
    else
      s.stats.last_clip_fraction = 0.0;
  }

  bool take_nonfinite() {
    const bool ok = !nonfinite_pending_;
    nonfinite_pending_ = false;
    return ok;
  }

  // co2: the plan of selection.cpp, op by op. Never blocks the host on the collective path; the
  // staged path blocks once, until the delta is in pinned memory.
  bool co2_boundary(S& s, cudaStream_t caller) {
    folding_state_ = &s;
    const bool have_average = s.pending != nullptr;
    const kernels::Config config = config_of(s.prepared.settings, have_average, /*write_delta=*/true);
    s.prepared.settings = outer_settings_of(s);  // for the average submitted below
    const size_t count = s.state_count, bytes = count * sizeof(float);
    bool average_finite = true;
    auto stream_of = [&](device::Stream st) { return st == device::Stream::Caller ? caller : comm_stream_; };
    for (const Op& op : co2_boundary_plan(averaging_, have_average)) {
      cudaStream_t st = stream_of(op.stream);
      switch (op.kind) {
        case OpKind::RecordEvent:
          event(op.event).record(st);
          break;
        case OpKind::StreamWaitEvent:
          event(op.event).make_wait(st);
          break;
        case OpKind::HostWaitEvent:
          event(op.event).synchronize();
          break;
        case OpKind::HostWaitAverage: {
          auto request = std::move(s.pending);
          s.pending.reset();
          wait_charged(s, request);  // throws when the collective failed: nothing is applied
          break;
        }
        case OpKind::HostReadFinite:
          average_finite = averaging_ == Averaging::StagedHost ? !staged_average_nonfinite_.load()
                                                               : *average_flag_host_.as<int>() == 0;
          break;
        case OpKind::CopyFlagOut:
          check(cudaMemcpyAsync(average_flag_host_.as(), t_.average_nonfinite, sizeof(int), cudaMemcpyDeviceToHost, st),
                "copy the average's finiteness flag out");
          break;
        case OpKind::CopyAverageIn:
          check(cudaMemcpyAsync(comm_.as(), staging_.as(), bytes, cudaMemcpyHostToDevice, st), "stage average in");
          break;
        case OpKind::CopyDeltaOut:
          check(cudaMemcpyAsync(staging_.as(), comm_.as(), bytes, cudaMemcpyDeviceToHost, st), "stage delta out");
          break;
        case OpKind::FiniteCheck:
          check(kernels::finite_check(comm_.as<float>(), count, t_.average_nonfinite, st), "finite check");
          break;
        case OpKind::Coefficients:
          check(kernels::coefficients(t_, config, st), "coefficients kernels");
          break;
        case OpKind::Pass:
          check(kernels::boundary_pass(t_, config, st), "boundary pass kernel");
          break;
        case OpKind::Report:
          report(st);
          break;
        case OpKind::DeviceAllReduce:
          if (s.pending) in_flight_.push_back(std::move(s.pending));
          s.pending = s.comm->allreduce(comm_.as(), count, DataType::F32, ReduceOp::Avg,
                                        s.id(Purpose::OuterAverage));
          s.stats.bytes_reduced += bytes;
          break;
        case OpKind::SubmitHostAverage: {
          // The progress thread scans the arrived average, off the training thread, so that
          // the next boundary knows its finiteness without copying it to the device first.
          const float* average = staging_.as<float>();
          std::atomic<bool>* nonfinite = &staged_average_nonfinite_;
          s.pending = s.comm->allreduce_then(
              staging_.as(), count, DataType::F32, ReduceOp::Avg,
              [average, count, nonfinite] { nonfinite->store(!all_finite(average, count)); },
              s.id(Purpose::OuterAverage));
          s.stats.bytes_reduced += bytes;
          break;
        }
      }
    }
    if (!average_finite) ++nonfinite_reported_early_;
    return average_finite;  // the pass skipped the update on every rank (the flag is the same)
  }

  // co2 end: applies the average in flight (the host waits for it), parameters = anchor.
  bool apply_pending(S& s, cudaStream_t caller) {
    folding_state_ = &s;
    if (!s.pending) {
      unpack(s, anchor_.as<float>(), caller, false);
      return true;
    }
    auto request = std::move(s.pending);
    s.pending.reset();
    wait_charged(s, request);
    if (averaging_ == Averaging::StagedHost) {
      check(cudaMemcpyAsync(comm_.as(), staging_.as(), s.state_count * sizeof(float), cudaMemcpyHostToDevice,
                            comm_stream_),
            "stage average in");
      check(kernels::finite_check(comm_.as<float>(), s.state_count, t_.average_nonfinite, comm_stream_),
            "finite check");
      average_ready_.record(comm_stream_);
    }
    average_ready_.make_wait(caller);
    const kernels::Config config = config_of(s.prepared.settings, true, false);
    check(kernels::coefficients(t_, config, caller), "coefficients kernels");
    check(kernels::boundary_pass(t_, config, caller), "boundary pass kernel");
    report(caller);
    return true;
  }

  bool diloco_boundary(S& s, cudaStream_t caller) {
    folding_state_ = &s;
    // c = a - p (and p = a, which is also what a non-finite average leaves).
    const OuterSettings now = outer_settings_of(s);
    check(kernels::boundary_pass(t_, config_of(now, false, true), caller), "delta kernel");
    average_blocking(s, comm_.as<float>(), s.state_count, caller, t_.average_nonfinite,
                     Purpose::OuterAverage);
    const kernels::Config config = config_of(now, true, false);
    check(kernels::coefficients(t_, config, caller), "coefficients kernels");
    check(kernels::boundary_pass(t_, config, caller), "boundary pass kernel");
    report(caller);
    fold_reports(s, true);
    return take_nonfinite();
  }

  // Blocking average of the parameters (buffers_only: of the BUFFER segments) across ranks.
  bool average_parameters(S& s, cudaStream_t caller, bool buffers_only) {
    pack(s, comm_.as<float>(), caller, buffers_only);
    if (!average_blocking(s, comm_.as<float>(), s.state_count, caller, blocking_flag(),
                          Purpose::ParameterAverage)) {
      ++s.stats.nonfinite_rounds;
      return false;
    }
    unpack(s, comm_.as<float>(), caller, buffers_only);
    return true;
  }

  bool localsgd_boundary(S& s, cudaStream_t caller) { return average_parameters(s, caller, false); }

  bool sync_boundary(S& s, cudaStream_t caller) {
    return s.state_count == s.trained_count || average_parameters(s, caller, true);
  }

  // The anchor (or, without one, the parameters) hashed on the host and compared across ranks.
  // Blocks the host until the caller's stream reached this point: every K boundaries only.
  void check_anchor(S& s, cudaStream_t caller) {
    ++s.stats.anchor_checks;
    std::vector<float> host(s.state_count);
    if (!anchor_.empty())
      check(cudaMemcpyAsync(host.data(), anchor_.as(), host.size() * sizeof(float), cudaMemcpyDeviceToHost, caller),
            "copy anchor for its checksum");
    else
      pack(s, host.data(), caller, false);
    check(cudaStreamSynchronize(caller), "cudaStreamSynchronize (anchor check)");
    WordHasher hasher;
    hasher.update(host.data(), host.size());
    if (!same_on_every_rank(s, hasher.digest(), Purpose::AnchorCheck))
      fail(Status::AnchorMismatch,
           "anchor checksums differ across ranks: the ranks no longer train the same model "
           "(memory corruption or a non-deterministic framework step); restore a checkpoint");
  }

  // Selects the device before any member creates a stream or an event on it.
  struct DeviceSelected {
    explicit DeviceSelected(int index) { use_device(index); }
  };
  const int device_;
  DeviceSelected selected_;
  std::unique_ptr<CudaStream> own_stream_;  // staged copies, commit work
  cudaStream_t comm_stream_ = nullptr;   // own_stream_ or the collective transport's stream
  Averaging averaging_ = Averaging::StagedHost;
  DeviceMemory flat_;
  DeviceMemory comm_, anchor_, momentum_, gradients_, scratch_;
  DeviceMemory segments_, chunks_, chunk_squares_, chunk_clamped_, coefficients_, gap_, flags_, report_;
  uint32_t num_segments_ = 0, num_chunks_ = 0;
  PinnedMemory staging_, blocking_staging_, reports_, flag_host_;
  PinnedMemory average_flag_host_;  // collective path: the arrived average's finiteness
  std::atomic<bool> staged_average_nonfinite_{false};  // staged path: set by the progress thread
  int nonfinite_reported_early_ = 0;
  void* caller_stream_ = nullptr;
  bool buffer_values_ = false;  // co2: BUFFER segments carry values (OuterCoefficients::anchor_weight)  // of the last boundary or reduce_gradients; legacy default before  // co2 boundaries that reported before their report folded
  kernels::Tables t_;
  CudaEvent average_ready_, pass_done_, staged_out_, ordered_, averaged_;
  std::vector<std::unique_ptr<CudaEvent>> report_ready_;
  ReportRing ring_{kReportSlots};
  size_t last_report_slot_ = 0;
  S* folding_state_ = nullptr;
  std::deque<std::shared_ptr<Request>> in_flight_;  // collective path: all-reduces not yet accounted
  bool nonfinite_pending_ = false;
};

}  // namespace
}  // namespace device

std::unique_ptr<DevicePath> make_device_path(int device_index) {
  return std::make_unique<device::CudaPath>(device_index);
}

}  // namespace co2

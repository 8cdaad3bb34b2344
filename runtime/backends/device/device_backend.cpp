// The device backend (CUDA tensors): outer state in device memory, the boundary as fused kernels
// on the caller's stream, the comm buffer averaged either by a collective transport (NCCL, in
// place on its stream) or staged through pinned host memory over the communicator (UCX,
// local). The round logic is runtime/engine/engine.cpp's; a co2 boundary is runtime/backends/device/
// selection.cpp's plan, executed phase by phase as the engine calls collect, pass and submit.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <thread>
#include <utility>
#include <vector>

#include "runtime/backends/backend.hpp"
#include "runtime/outer/boundary_pass.hpp"
#include "runtime/backends/device/cuda_api.hpp"
#include "runtime/backends/device/kernels.hpp"
#include "runtime/backends/device/selection.hpp"
#include "runtime/backends/backend_state.hpp"
#include "runtime/base/log.hpp"
#include "runtime/outer/update_plan.hpp"

namespace co2 {

bool device_backend_built() { return true; }

namespace device {
namespace {

using S = BackendState;

// Boundaries whose reports may still be on the device before the host waits for the oldest.
constexpr size_t kReportSlots = 4;

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

class DeviceBackend final : public Backend {
 public:
  DeviceBackend(S& s, int device_index) : s_(s), device_(device_index), selected_(device_index) {
    own_stream_ = std::make_unique<CudaStream>();
    for (size_t i = 0; i < kReportSlots; ++i) report_ready_.push_back(std::make_unique<CudaEvent>());
  }

  void check_memory(const void* data, size_t bytes, const std::string& what) override {
    check_device_memory(data, bytes, device_, what);
  }

  void* allocate_flat(size_t count, ParamDType dtype) override {
    make_current();
    flat_ = DeviceMemory(count * element_bytes(dtype), device_, s_.allocator, own_stream_->get());
    return flat_.as();
  }

  void commit() override {
    S& s = s_;
    const int comm_device = s.comm->collective_device();
    require(comm_device < 0 || comm_device == device_, Status::InvalidArgument,
            "the tensors are on CUDA device " + std::to_string(device_) + " but the NCCL communicator on device " +
                std::to_string(comm_device) + ": set co2_comm_config_t.device_index (default: LOCAL_RANK) to "
                "the tensors' device, or move the model there (torch.cuda.set_device(LOCAL_RANK) before building it)");
    make_current();
    std::string why;
    averaging_ = choose_averaging(Placement::Device, s.comm->collective_stream() != nullptr,
                                  s.config.wire_format != WireFormat::F32, &why);
    comm_stream_ = averaging_ == Averaging::Collective ? as_stream(s.comm->collective_stream()) : own_stream_->get();
    // Error feedback's residual stays in host memory, next to the staged deltas it corrects.
    if (s.error_feedback()) s.residual = FloatBuffer(s.state_count);
    build_tables(s);
    buffer_values_ = s.buffer_values();
    const size_t bytes = s.state_count * sizeof(float);
    comm_ = alloc(bytes);
    if (s.has_anchor()) anchor_ = alloc(bytes);
    if (s.has_anchor() && s.momentum_needed()) momentum_ = alloc(bytes);
    if (s.eager()) eager_offset_ = alloc(bytes);
    if (s.eager() && s.momentum_needed()) eager_momentum_ = alloc(bytes);
    if (averaging_ == Averaging::StagedHost) staging_ = PinnedMemory(bytes);
    reports_ = PinnedMemory(kReportSlots * sizeof(kernels::Report));
    flag_host_ = PinnedMemory(sizeof(int));
    average_flag_host_ = PinnedMemory(sizeof(int));
    result_flag_host_ = PinnedMemory(sizeof(int));
    checksum_host_ = PinnedMemory(sizeof(uint64_t));
    refresh_tables();
    count_state();

    // A re-formed elastic group's outer state follows the commit (membership_change.cpp, then
    // stage_in); otherwise rank 0's values become everyone's parameters and anchor, once the
    // framework's initialisation is finished (commit has no stream argument: see wait_for_caller).
    if (s.outer_state_follows && s.has_anchor()) {
      check(cudaMemset(comm_.as(), 0, bytes), "clear comm buffer");
      return;
    }
    wait_for_caller("commit");
    cudaStream_t st = own_stream_->get();
    pack(comm_.as<float>(), st, false);
    check(cudaStreamSynchronize(st), "cudaStreamSynchronize (commit)");
    broadcast_from_rank0(comm_.as<float>(), s.state_count);
    unpack(comm_.as<float>(), st, false);
    if (!anchor_.empty())
      check(cudaMemcpyAsync(anchor_.as(), comm_.as(), bytes, cudaMemcpyDeviceToDevice, st), "copy anchor");
    check(cudaMemsetAsync(comm_.as(), 0, bytes, st), "clear comm buffer");
    check(cudaStreamSynchronize(st), "cudaStreamSynchronize (commit)");
  }

  // The old group's reports were taken by the engine (stage_out folded them); its collectives
  // were drained.
  void begin_new_group() override {
    ring_ = ReportRing{kReportSlots};
    in_flight_.clear();
    finished_.clear();
    coefficients_probed_ = false;
    staged_average_nonfinite_ = false;
  }

  void momentum_needed() override {
    if (!momentum_.empty() || comm_.empty() || !s_.has_anchor()) return;
    make_current();
    momentum_ = alloc(s_.state_count * sizeof(float));  // starts from zero momentum
    check(cudaMemset(momentum_.as(), 0, momentum_.bytes()), "clear momentum");
    if (s_.eager() && eager_momentum_.empty()) eager_momentum_ = alloc(s_.state_count * sizeof(float));  // zeroed
    refresh_tables();
    count_state();
  }

  // --- co2: the phases of selection.cpp's plan ---
  Arrival collect_average() override {
    make_current();
    S& s = s_;
    Arrival a;
    if (s.pending) {
      a.have = true;
      a.finite = run(co2_boundary_phases(averaging_, true).collect);
      s.average_ready = false;
    } else if (s.average_ready) {  // collected by save, or restored: already in the device comm buffer
      s.average_ready = false;
      a.have = true;
      a.finite = s.ready_average_finite;
      average_ready_.make_wait(caller());
    }
    // co2 applies an average with the settings of its submit (s.prepared.settings), as the pass does.
    if (a.have && a.finite) a.finite = update_result_finite(config_of(s.prepared.settings, true, false));
    return a;
  }

  DeltasFinite boundary_pass(const BoundaryPass& plan) override {
    return pass(plan.update, /*write_delta=*/true, plan.eager);
  }

  // The gap history and statistics arrive with the boundary's report (fold_reports).
  bool reports_updates_later() const override { return true; }

  void submit_average() override {
    s_.prepared.settings = outer_settings_of(s_);  // the settings its update will be applied with
    run(co2_boundary_phases(averaging_, true).submit);
  }

  void apply_update() override { pass(/*update=*/true, /*write_delta=*/false); }

  // The fused pass with the update and without deltas, the parameters keeping their progress.
  void apply_on_arrival() override {
    make_current();
    pass_config_ = config_of(s_.prepared.settings, /*update=*/true, /*write_delta=*/false);
    pass_config_.eager = !eager_offset_.empty();
    pass_config_.keep_progress = true;
    run(co2_boundary_phases(averaging_, false).pass);
  }
  void clear_eager_state() override {
    if (eager_offset_.empty()) return;
    make_current();
    check(cudaMemsetAsync(eager_offset_.as(), 0, eager_offset_.bytes(), caller()), "clear eager offsets");
    if (!eager_momentum_.empty())
      check(cudaMemsetAsync(eager_momentum_.as(), 0, eager_momentum_.bytes(), caller()), "clear eager momentum");
  }

  // --- diloco: c = a - p (and p = a), averaged, then the update with the current settings ---
  bool average_deltas_blocking() override {
    make_current();
    S& s = s_;
    blocking_settings_ = outer_settings_of(s);
    check(kernels::boundary_pass(t_, config_of(blocking_settings_, false, true), caller()), "delta kernel");
    return average_blocking(comm_.as<float>(), s.state_count, t_.average_nonfinite, Purpose::OuterAverage) &&
           update_result_finite(config_of(blocking_settings_, true, false));
  }

  void apply_blocking_update() override {
    const kernels::Config config = config_of(blocking_settings_, true, false);
    if (!std::exchange(coefficients_probed_, false))
      check(kernels::coefficients(t_, config, caller()), "coefficients kernels");
    check(kernels::boundary_pass(t_, config, caller()), "boundary pass kernel");
    report(caller());
    fold_ring(true);  // a blocking round: its statistics are known when the step returns
  }

  // Blocking average of the parameters (buffers_only: of the BUFFER segments) across ranks.
  bool average_parameters(bool buffers_only) override {
    make_current();
    pack(comm_.as<float>(), caller(), buffers_only);
    if (!average_blocking(comm_.as<float>(), s_.state_count, blocking_flag(), Purpose::ParameterAverage))
      return false;
    unpack(comm_.as<float>(), caller(), buffers_only);
    return true;
  }

  bool average_gradients(void* const* grads, size_t) override {
    make_current();
    S& s = s_;
    float* packed;
    if (s.config.algorithm == Algorithm::Sync) {
      packed = comm_.as<float>();
    } else {
      if (gradients_.empty()) gradients_ = alloc(s.trained_count * sizeof(float));
      packed = gradients_.as<float>();
    }
    size_t offset = 0, i = 0;
    for (const Segment& seg : s.segments) {
      if (seg.role != Role::Parameter) continue;
      // Gradients have their parameter's dtype: widened here, summed in fp32, rounded back below.
      if (!grads[i])
        check(cudaMemsetAsync(packed + offset, 0, seg.count * sizeof(float), caller()), "zero gradients");
      else if (seg.dtype == ParamDType::F32)
        check(cudaMemcpyAsync(packed + offset, grads[i], seg.count * sizeof(float), cudaMemcpyDeviceToDevice,
                              caller()),
              "pack gradients");
      else
        check(kernels::widen_params(grads[i], uint32_t(seg.dtype), packed + offset, seg.count, caller()),
              "widen gradients");
      offset += seg.count;
      ++i;
    }
    if (!average_blocking(packed, s.trained_count, blocking_flag(), Purpose::GradientAverage)) return false;
    offset = 0;
    i = 0;
    for (const Segment& seg : s.segments) {
      if (seg.role != Role::Parameter) continue;
      if (grads[i] && seg.dtype == ParamDType::F32)
        check(cudaMemcpyAsync(grads[i], packed + offset, seg.count * sizeof(float), cudaMemcpyDeviceToDevice,
                              caller()),
              "unpack gradients");
      else if (grads[i])
        check(kernels::narrow_params(packed + offset, grads[i], uint32_t(seg.dtype), seg.count, caller()),
              "round gradients");
      offset += seg.count;
      ++i;
    }
    return true;
  }

  void set_parameters_to_anchor() override {
    make_current();
    unpack(anchor_.as<float>(), caller(), false);
  }

  // Only hierarchical co2 checks a node's parameters, and its CUDA engines are
  // staged_sharded_backend.cpp's: reaching this is a bug, said loudly rather than hashed untested.
  uint64_t parameters_checksum(bool) override {
    throw Error(Status::Internal,
                "parameters_checksum on the replicated device backend: hierarchical co2 on CUDA tensors runs on the "
                "staged sharded backend; please report this");
  }

  // The anchor (or, without one, the parameters) hashed on the device (state_checksum.hpp):
  // eight bytes reach the host, after the caller's stream reached this point.
  uint64_t anchor_checksum() override {
    make_current();
    const float* state = anchor_.as<float>();
    if (anchor_.empty()) {
      if (scratch_.empty()) scratch_ = alloc(s_.state_count * sizeof(float));
      pack(scratch_.as<float>(), caller(), false);
      state = scratch_.as<float>();
    }
    check(kernels::checksum(state, s_.state_count, t_.checksum, caller()), "checksum kernel");
    check(cudaMemcpyAsync(checksum_host_.as(), t_.checksum, sizeof(uint64_t), cudaMemcpyDeviceToHost, caller()),
          "copy the checksum out");
    wait_for_caller("anchor check");
    return *checksum_host_.as<uint64_t>();
  }

  void consensus_into(float* out, size_t count, bool parameters, bool average) override {
    make_current();
    const size_t bytes = count * sizeof(float);
    if (!parameters) {
      check(cudaMemcpyAsync(out, anchor_.as(), bytes, cudaMemcpyDefault, caller()), "copy anchor out");
    } else if (!average && !sixteen_bit_params_) {
      pack(out, caller(), false);
    } else {  // 16-bit parameters are widened on the device, into scratch
      if (scratch_.empty()) scratch_ = alloc(s_.state_count * sizeof(float));
      pack(scratch_.as<float>(), caller(), false);
      if (average) average_blocking(scratch_.as<float>(), count, blocking_flag(), Purpose::Consensus);
      check(cudaMemcpyAsync(out, scratch_.as(), bytes, cudaMemcpyDefault, caller()), "copy average out");
    }
    wait_for_caller("consensus");
  }

  void set_caller_stream(void* stream) override { caller_stream_ = stream; }

  // Calls without a stream argument (commit, synchronize, finalize, consensus, save) order after
  // the caller's stream of the last step or reduce_gradients — before the first one, the legacy
  // default stream, which every blocking stream's earlier work precedes. Not
  // cudaDeviceSynchronize: that also waits for other libraries' streams (a data loader's
  // copies, another communicator's collectives), which no timeout of ours could end.
  void wait_for_caller(const char* what) override {
    make_current();
    wait_for_stream(caller_stream_, what);
  }

  Finished finished(bool wait) override {
    if (comm_.empty()) return {};  // not committed (a failed commit)
    fold_ring(wait);
    Finished out;
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
      out.collectives.push_back(std::move(in_flight_.front()));
      in_flight_.pop_front();
    }
    out.boundaries = std::exchange(finished_, {});
    return out;
  }

  void drain() noexcept override {
    S& s = s_;
    // The collective first: it is bounded by the communicator's timeout (a dead peer aborts the
    // NCCL communicator, which releases the comm stream).
    if (s.pending) s.pending->wait_status();
    for (auto& r : in_flight_) r->wait_status();
    // Our streams only (another library's kernels are none of ours to wait for), bounded: a
    // device that hangs leaks the state rather than the process.
    for (void* stream : {caller_stream_, static_cast<void*>(comm_stream_), static_cast<void*>(own_stream_->get())}) {
      try {
        wait_for_stream(stream, "shutdown");
      } catch (const Error& e) {
        log::warn(std::string("engine shutdown: ") + e.what());
        return;
      }
    }
  }

  // --- checkpoints: the device state through BackendState's host buffers ---
  bool has_momentum() const override { return !momentum_.empty(); }

  void stage_out() override {
    make_current();
    S& s = s_;
    const size_t bytes = s.state_count * sizeof(float);
    cudaStream_t st = caller();
    if (!anchor_.empty()) {
      s.anchor = FloatBuffer(s.state_count);
      check(cudaMemcpyAsync(s.anchor.data(), anchor_.as(), bytes, cudaMemcpyDeviceToHost, st), "stage anchor out");
    }
    if (!momentum_.empty()) {
      s.momentum = FloatBuffer(s.state_count);
      check(cudaMemcpyAsync(s.momentum.data(), momentum_.as(), bytes, cudaMemcpyDeviceToHost, st), "stage momentum out");
    }
    if (s.average_ready) {  // collected: in the device comm buffer, the caller's stream waited for it
      s.comm_buffer = FloatBuffer(s.state_count);
      check(cudaMemcpyAsync(s.comm_buffer.data(), comm_.as(), bytes, cudaMemcpyDeviceToHost, st), "stage average out");
    }
    if (!eager_offset_.empty()) {
      s.eager_offset = FloatBuffer(s.state_count);
      check(cudaMemcpyAsync(s.eager_offset.data(), eager_offset_.as(), bytes, cudaMemcpyDeviceToHost, st),
            "stage eager offsets out");
    }
    if (!eager_momentum_.empty()) {
      s.eager_momentum = FloatBuffer(s.state_count);
      check(cudaMemcpyAsync(s.eager_momentum.data(), eager_momentum_.as(), bytes, cudaMemcpyDeviceToHost, st),
            "stage eager momentum out");
    }
    std::vector<kernels::GapState> gap(num_segments_);
    check(cudaMemcpyAsync(gap.data(), gap_.as(), gap.size() * sizeof(kernels::GapState), cudaMemcpyDeviceToHost, st),
          "stage gap history out");
    wait_for_caller("save");
    // The checkpoint's statistics (outer updates, clip figures) count every boundary so far:
    // without this, the reports still in the ring would be lost to the resumed run.
    fold_ring(/*wait=*/true);
    size_t entry = 0;
    for (size_t i = 0; i < s.segments.size(); ++i) {
      if (s.segments[i].role == Role::Excluded) continue;
      s.history[i] = GapHistory{gap[entry].last_step_norm, gap[entry].gap_sum, uint64_t(gap[entry].updates)};
      ++entry;
    }
  }

  void release_staged() override {
    s_.anchor = FloatBuffer();
    s_.momentum = FloatBuffer();
    s_.comm_buffer = FloatBuffer();
    s_.eager_offset = FloatBuffer();
    s_.eager_momentum = FloatBuffer();
  }

  void stage_in() override {
    make_current();
    S& s = s_;
    coefficients_probed_ = false;  // the loaded gap history makes them stale
    const size_t bytes = s.state_count * sizeof(float);
    cudaStream_t st = own_stream_->get();
    // A checkpoint may bring state this engine did not allocate at commit (momentum, or the eager
    // policy's offsets and momentum, taken with its settings from the blob).
    const bool momentum_missing = (!s.momentum.empty() || (s.has_anchor() && s.momentum_needed())) && momentum_.empty();
    const bool offsets_missing = s.eager() && eager_offset_.empty();
    const bool eager_momentum_missing = s.eager() && s.momentum_needed() && eager_momentum_.empty();
    if (momentum_missing) momentum_ = alloc(bytes);
    if (offsets_missing) eager_offset_ = alloc(bytes);
    if (eager_momentum_missing) eager_momentum_ = alloc(bytes);
    if (momentum_missing || offsets_missing || eager_momentum_missing) {
      refresh_tables();
      count_state();
    }
    if (!momentum_.empty()) {
      if (s.momentum.empty())
        check(cudaMemsetAsync(momentum_.as(), 0, bytes, st), "clear momentum");  // starts from zero
      else
        check(cudaMemcpyAsync(momentum_.as(), s.momentum.data(), bytes, cudaMemcpyHostToDevice, st), "stage momentum in");
    }
    if (!anchor_.empty())
      check(cudaMemcpyAsync(anchor_.as(), s.anchor.data(), bytes, cudaMemcpyHostToDevice, st), "stage anchor in");
    if (s.average_ready) {
      check(cudaMemcpyAsync(comm_.as(), s.comm_buffer.data(), bytes, cudaMemcpyHostToDevice, st), "stage average in");
      check(kernels::finite_check(comm_.as<float>(), s.state_count, t_.average_nonfinite, st), "finite check");
    }
    std::vector<kernels::GapState> gap;
    for (size_t i = 0; i < s.segments.size(); ++i)
      if (s.segments[i].role != Role::Excluded)
        gap.push_back(kernels::GapState{s.history[i].last_step_norm, s.history[i].gap_sum,
                                        (unsigned long long)s.history[i].updates});
    check(cudaMemcpyAsync(gap_.as(), gap.data(), gap.size() * sizeof(kernels::GapState), cudaMemcpyHostToDevice, st),
          "stage gap history in");
    // The parameters: the anchor, plus this rank's offset on PARAMETER segments under the eager
    // policy (assembled in s.anchor on the host and copied from there).
    const bool eager_state = !eager_offset_.empty() && s.eager_offset.size() == s.state_count;
    if (!eager_offset_.empty()) {
      if (eager_state)
        check(cudaMemcpyAsync(eager_offset_.as(), s.eager_offset.data(), bytes, cudaMemcpyHostToDevice, st),
              "stage eager offsets in");
      else
        check(cudaMemsetAsync(eager_offset_.as(), 0, bytes, st), "clear eager offsets");
    }
    if (!eager_momentum_.empty()) {
      if (s.eager_momentum.size() == s.state_count)
        check(cudaMemcpyAsync(eager_momentum_.as(), s.eager_momentum.data(), bytes, cudaMemcpyHostToDevice, st),
              "stage eager momentum in");
      else
        check(cudaMemsetAsync(eager_momentum_.as(), 0, bytes, st), "clear eager momentum");
    }
    check(cudaStreamSynchronize(st), "cudaStreamSynchronize (load)");  // s.anchor is read above
    if (eager_state)
      for (const Segment& seg : s.segments) {
        if (seg.role != Role::Parameter) continue;
        float* start = s.anchor.data() + seg.state_offset;
        const float* e = s.eager_offset.data() + seg.state_offset;
        for (size_t i = 0; i < seg.count; ++i) start[i] = round_start(start[i], e[i]);
      }
    if (!anchor_.empty() && sixteen_bit_params_) {  // rounded on the device, from device memory
      DeviceMemory start = alloc(bytes);
      check(cudaMemcpyAsync(start.as(), s.anchor.data(), bytes, cudaMemcpyHostToDevice, st), "stage start in");
      unpack(start.as<float>(), st, false);
      check(cudaStreamSynchronize(st), "cudaStreamSynchronize (load)");
    } else if (!anchor_.empty()) {
      unpack(s.anchor.data(), st, false);
    }
    check(cudaStreamSynchronize(st), "cudaStreamSynchronize (load)");
    average_ready_.record(own_stream_->get());  // collect_average's stream wait: already complete
    release_staged();
  }

 private:
  void wait_for_stream(void* stream, const char* what) {
    device::wait_for_stream(as_stream(stream), s_.comm->options().timeout, what);
  }

  // The engine's device for this thread (the caller may have switched): one cheap call.
  void make_current() const { check(cudaSetDevice(device_), "cudaSetDevice"); }

  DeviceMemory alloc(size_t bytes) { return DeviceMemory(bytes, device_, s_.allocator, own_stream_->get()); }

  cudaStream_t caller() const { return as_stream(caller_stream_); }

  // Device memory of the outer state (anchor, momentum, comm buffer).
  void count_state() {
    s_.counters.outer_state_bytes =
        comm_.bytes() + anchor_.bytes() + momentum_.bytes() + eager_offset_.bytes() + eager_momentum_.bytes();
  }

  void build_tables(S& s) {
    std::vector<size_t> counts;
    std::vector<kernels::SegmentEntry> entries;
    for (const Segment& seg : s.segments) {
      if (seg.role == Role::Excluded) continue;
      counts.push_back(seg.count);
      entries.push_back(kernels::SegmentEntry{seg.data, seg.state_offset, seg.count, 0,
                                              uint32_t(seg.role == Role::Parameter), uint32_t(seg.dtype), 0});
      sixteen_bit_params_ = sixteen_bit_params_ || seg.dtype != ParamDType::F32;
    }
    const auto chunks = make_chunks(counts, kernels::kChunkElements);
    const auto first = first_chunk_of_segments(chunks, counts.size());
    for (size_t i = 0; i < entries.size(); ++i) entries[i].first_chunk = first[i];
    num_segments_ = uint32_t(entries.size());
    num_chunks_ = uint32_t(chunks.size());
    segments_ = alloc(entries.size() * sizeof(kernels::SegmentEntry));
    chunks_ = alloc(chunks.size() * sizeof(Chunk));
    check(cudaMemcpy(segments_.as(), entries.data(), segments_.bytes(), cudaMemcpyHostToDevice), "upload segments");
    check(cudaMemcpy(chunks_.as(), chunks.data(), chunks_.bytes(), cudaMemcpyHostToDevice), "upload chunks");
    chunk_squares_ = alloc(chunks.size() * sizeof(double));
    chunk_clamped_ = alloc(chunks.size() * sizeof(unsigned int));
    coefficients_ = alloc(entries.size() * sizeof(kernels::SegmentCoefficients));
    gap_ = alloc(entries.size() * sizeof(kernels::GapState));
    flags_ = alloc(3 * sizeof(int));
    checksum_ = alloc(sizeof(unsigned long long));
    report_ = alloc(sizeof(kernels::Report));
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
    t_.checksum = checksum_.as<unsigned long long>();
    t_.eager_offset = eager_offset_.as<float>();
    t_.eager_momentum = eager_momentum_.as<float>();
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

  // fp32 views of the parameters: copies, or (16-bit parameters) widening kernels, whose `dst`
  // must then be device memory.
  void pack(float* dst, cudaStream_t st, bool buffers_only) {
    for (const Segment& seg : s_.segments) {
      if (seg.role == Role::Excluded || (buffers_only && seg.role != Role::Buffer)) continue;
      if (seg.dtype == ParamDType::F32)
        check(cudaMemcpyAsync(dst + seg.state_offset, seg.data, seg.count * sizeof(float), cudaMemcpyDefault, st),
              "pack parameters");
      else
        check(kernels::widen_params(seg.data, uint32_t(seg.dtype), dst + seg.state_offset, seg.count, st),
              "widen parameters");
    }
  }

  // The parameters <- src, rounded to 16 bits where they are (src in device memory then).
  void unpack(const float* src, cudaStream_t st, bool buffers_only) {
    for (const Segment& seg : s_.segments) {
      if (seg.role == Role::Excluded || (buffers_only && seg.role != Role::Buffer)) continue;
      if (seg.dtype == ParamDType::F32)
        check(cudaMemcpyAsync(seg.data, src + seg.state_offset, seg.count * sizeof(float), cudaMemcpyDefault, st),
              "unpack parameters");
      else
        check(kernels::narrow_params(src + seg.state_offset, seg.data, uint32_t(seg.dtype), seg.count, st),
              "round parameters");
    }
  }

  // Blocking collectives on the staged path (the initial broadcast, diloco, localsgd, sync's
  // buffers, reduce_gradients, consensus) go through one pinned buffer of at most this many
  // floats, piece by piece: pinned memory is the host's to give, and the co2 average in flight
  // already holds N floats of it.
  static constexpr size_t kBlockingStagingFloats = size_t(16) << 20;

  // `collective` on pinned copies of data[0, count), at most kBlockingStagingFloats at a time.
  template <typename Collective>
  void staged_in_pieces(float* data, size_t count, Collective&& collective) {
    const size_t piece = std::min(count, kBlockingStagingFloats);
    if (blocking_staging_.bytes() < piece * sizeof(float)) blocking_staging_ = PinnedMemory(piece * sizeof(float));
    float* pin = blocking_staging_.as<float>();
    for (size_t begin = 0; begin < count; begin += piece) {
      const size_t n = std::min(piece, count - begin), bytes = n * sizeof(float);
      check(cudaMemcpyAsync(pin, data + begin, bytes, cudaMemcpyDeviceToHost, comm_stream_), "stage out");
      check(cudaStreamSynchronize(comm_stream_), "cudaStreamSynchronize (stage out)");
      collective(pin, n);
      check(cudaMemcpyAsync(data + begin, pin, bytes, cudaMemcpyHostToDevice, comm_stream_), "stage in");
    }
    check(cudaStreamSynchronize(comm_stream_), "cudaStreamSynchronize (stage in)");
  }

  void broadcast_from_rank0(float* data, size_t count) {
    S& s = s_;
    auto broadcast = [&](float* buffer, size_t n) {
      auto request = s.comm->broadcast(buffer, n, DataType::F32, 0, s.id(Purpose::InitialBroadcast));
      if (request->wait_status() != Status::Ok) fail(s.comm->error_status(), s.comm->error_message());
    };
    if (averaging_ == Averaging::Collective)
      broadcast(data, count);  // ordered on the NCCL stream
    else
      staged_in_pieces(data, count, broadcast);
  }

  // Blocking average of device `data` after the caller's stream's work; the caller's stream then
  // waits for the result. *flag (device) = 1 if the average is not finite. Returns finiteness.
  bool average_blocking(float* data, size_t count, int* flag, Purpose purpose) {
    S& s = s_;
    cudaStream_t caller = this->caller();
    ordered_.record(caller);
    ordered_.make_wait(comm_stream_);
    s.counters.bytes_reduced += count * sizeof(float);
    auto average = [&](float* buffer, size_t n) {
      s.wait_collective(s.comm->allreduce(buffer, n, DataType::F32, ReduceOp::Avg, s.id(purpose)));
    };
    if (averaging_ == Averaging::Collective) {
      average(data, count);
    } else if (purpose == Purpose::OuterAverage && s.config.wire_format != WireFormat::F32) {
      // A compressed wire encodes the whole state at once (its int8 groups follow the segments,
      // its residual the state): staged whole, as co2's submit does.
      check(cudaMemcpyAsync(staging_.as(), data, count * sizeof(float), cudaMemcpyDeviceToHost, comm_stream_),
            "stage out");
      check(cudaStreamSynchronize(comm_stream_), "cudaStreamSynchronize (stage out)");
      const WireCompression wire = outer_wire(s, staging_.as<float>());
      s.wait_collective(s.comm->allreduce_then(staging_.as(), count, DataType::F32, ReduceOp::Avg, [] {},
                                             s.id(purpose), wire));
      check(cudaMemcpyAsync(data, staging_.as(), count * sizeof(float), cudaMemcpyHostToDevice, comm_stream_),
            "stage in");
    } else {
      staged_in_pieces(data, count, average);
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

  // The boundary reports in the ring, oldest first; without `wait`, up to the first unfinished.
  void fold_ring(bool wait) {
    while (!ring_.empty()) {
      const size_t slot = ring_.oldest();
      if (wait)
        report_ready_[slot]->synchronize();
      else if (!report_ready_[slot]->done())
        break;
      fold(reports_.as<kernels::Report>()[slot]);
      ring_.pop();
    }
  }

  void report(cudaStream_t caller) {
    if (ring_.full()) {  // the device is a whole ring of boundaries behind: wait for the oldest
      report_ready_[ring_.oldest()]->synchronize();
      fold(reports_.as<kernels::Report>()[ring_.oldest()]);
      ring_.pop();
    }
    last_report_slot_ = ring_.push();
    check(cudaMemcpyAsync(reports_.as<kernels::Report>() + last_report_slot_, t_.report, sizeof(kernels::Report),
                          cudaMemcpyDeviceToHost, caller),
          "copy boundary report");
    report_ready_[last_report_slot_]->record(caller);
  }

  // What only the device knew of a boundary: whether this rank's deltas were finite, and the
  // figures of an applied update; the engine takes them with finished().
  void fold(const kernels::Report& r) {
    finished_.push_back(FinishedBoundary{r.delta_nonfinite != 0, r.applied != 0, r.summary});
  }

  // Whether the update `config` requests, of a finite average, leaves every new anchor and
  // momentum element finite (docs/algorithm.md, "Results, not only inputs"): the coefficients,
  // then the read-only probe, which sets the average's device flag when one is not, so that the
  // pass applies nothing (an accepted update's pass reuses these coefficients). The gap history
  // is committed only by the fold of a pass that applies the update, so a refused one leaves it
  // as it was. The host waits for the caller's stream to read the answer: the boundary that
  // refuses the update is the one that returns CO2_ERR_NONFINITE, on every rank alike (they
  // compute the same bits).
  bool update_result_finite(const kernels::Config& config) {
    make_current();
    cudaStream_t st = caller();
    check(kernels::coefficients(t_, config, st), "coefficients kernels");
    check(kernels::update_result_probe(t_, config, st), "update result probe");
    check(cudaMemcpyAsync(result_flag_host_.as(), t_.average_nonfinite, sizeof(int), cudaMemcpyDeviceToHost, st),
          "copy the update result's finiteness out");
    wait_for_caller("update result probe");
    coefficients_probed_ = *result_flag_host_.as<int>() == 0;
    return coefficients_probed_;
  }

  // The fused pass on the caller's stream (the plan's pass phase). co2 applies an average with
  // the settings in effect when its deltas were submitted (s.prepared.settings, as on the host).
  DeltasFinite pass(bool update, bool write_delta, bool eager = false) {
    make_current();
    pass_config_ = config_of(s_.prepared.settings, update, write_delta);
    if (eager) {  // the eager coefficients are the current settings', as on the host
      pass_config_.eager = true;
      pass_config_.eager_coefficients =
          eager_coefficients_of(outer_settings_of(s_), s_.comm->size(), !eager_momentum_.empty());
    }
    run(co2_boundary_phases(averaging_, false).pass);
    return DeltasFinite::Later;
  }

  // Executes ops of the plan; returns the arrived average's finiteness (HostReadFinite), true
  // when the ops do not read it.
  bool run(const std::vector<Op>& ops) {
    S& s = s_;
    const size_t count = s.state_count, bytes = count * sizeof(float);
    bool average_finite = true;
    auto stream_of = [&](device::Stream st) { return st == device::Stream::Caller ? caller() : comm_stream_; };
    for (const Op& op : ops) {
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
        case OpKind::HostWaitAverage:
          wait_pending(s);  // throws when the collective failed: nothing is applied
          break;
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
          if (!std::exchange(coefficients_probed_, false))
            check(kernels::coefficients(t_, pass_config_, st), "coefficients kernels");
          break;
        case OpKind::Pass:
          check(kernels::boundary_pass(t_, pass_config_, st), "boundary pass kernel");
          break;
        case OpKind::Report:
          report(st);
          break;
        case OpKind::DeviceAllReduce:
          if (s.pending) in_flight_.push_back(std::move(s.pending));
          s.pending = s.comm->allreduce(comm_.as(), count, DataType::F32, ReduceOp::Avg, s.id(Purpose::OuterAverage));
          s.counters.bytes_reduced += bytes;
          break;
        case OpKind::SubmitHostAverage: {
          // The progress thread scans the arrived average, off the training thread, so that
          // the next boundary knows its finiteness without copying it to the device first.
          // The staged deltas are encoded by the host's wire code, with its error feedback.
          const float* average = staging_.as<float>();
          std::atomic<bool>* nonfinite = &staged_average_nonfinite_;
          const WireCompression wire = outer_wire(s, staging_.as<float>());
          s.pending = s.comm->allreduce_then(
              staging_.as(), count, DataType::F32, ReduceOp::Avg,
              [average, count, nonfinite] { nonfinite->store(!all_finite(average, count)); },
              s.id(Purpose::OuterAverage), wire);
          s.counters.bytes_reduced += bytes;
          break;
        }
      }
    }
    return average_finite;
  }

  // Selects the device before any member creates a stream or an event on it.
  struct DeviceSelected {
    explicit DeviceSelected(int index) { use_device(index); }
  };
  S& s_;
  const int device_;
  DeviceSelected selected_;
  std::unique_ptr<CudaStream> own_stream_;  // staged copies, commit work
  cudaStream_t comm_stream_ = nullptr;   // own_stream_ or the collective transport's stream
  Averaging averaging_ = Averaging::StagedHost;
  DeviceMemory flat_;
  DeviceMemory comm_, anchor_, momentum_, gradients_, scratch_;
  DeviceMemory eager_offset_, eager_momentum_;  // co2's eager policy: e and q (kernels::Tables)
  DeviceMemory segments_, chunks_, chunk_squares_, chunk_clamped_, coefficients_, gap_, flags_, report_, checksum_;
  uint32_t num_segments_ = 0, num_chunks_ = 0;
  PinnedMemory staging_, blocking_staging_, reports_, flag_host_;
  PinnedMemory average_flag_host_;  // collective path: the arrived average's finiteness
  PinnedMemory result_flag_host_;   // the update result probe's answer
  PinnedMemory checksum_host_;      // the anchor check's hash
  std::atomic<bool> staged_average_nonfinite_{false};  // staged path: set by the progress thread
  // The stream of the last step or reduce_gradients (nullptr, the legacy default, before).
  void* caller_stream_ = nullptr;
  bool buffer_values_ = false;  // co2: BUFFER segments carry values (OuterCoefficients::anchor_weight)
  bool sixteen_bit_params_ = false;  // some segment holds bf16/fp16 parameters
  OuterSettings blocking_settings_;  // diloco: the settings of the round being averaged
  kernels::Config pass_config_;      // of the pass phase being run
  // The probe computed the coefficients of the update the next pass applies: it uses them (the
  // norm clip's read of m and c is not repeated). Only a probe that accepts the update sets it.
  bool coefficients_probed_ = false;
  kernels::Tables t_;
  CudaEvent average_ready_, pass_done_, staged_out_, ordered_, averaged_;
  std::vector<std::unique_ptr<CudaEvent>> report_ready_;
  ReportRing ring_{kReportSlots};
  size_t last_report_slot_ = 0;
  std::deque<std::shared_ptr<Request>> in_flight_;  // collective path: all-reduces not yet accounted
  std::vector<FinishedBoundary> finished_;  // folded reports the engine has not taken yet
};

}  // namespace

// staged_sharded_backend.cpp: sharded outer state and hierarchical co2 over point-to-point transports.
std::unique_ptr<Backend> make_staged_sharded_backend(BackendState& s, int device_index);

}  // namespace device

std::unique_ptr<Backend> make_device_backend(BackendState& s, int device_index) {
  if (s.sharded()) return device::make_staged_sharded_backend(s, device_index);
  return std::make_unique<device::DeviceBackend>(s, device_index);
}

}  // namespace co2

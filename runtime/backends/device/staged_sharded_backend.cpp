// Sharded outer state and hierarchical co2 on CUDA tensors over a point-to-point communicator
// (UCX, local): the host's sharded backend (runtime/backends/sharded_backend.cpp: the state, the
// reduce-scatter -> verdicts -> shard update -> all-gather chain, its checkpoints) runs over a
// pinned host mirror of the parameters. Such a transport takes host memory only, so every byte of
// that chain passes through host memory anyway: the chain runs where its bytes are, and the outer
// state takes no device memory; the device's part is to bring the parameters to the
// mirror before a call that reads them and back after one that writes them. Over NCCL (a
// collective transport, host buffers staged by the transport) the chain runs unchanged: its
// all-gather is held back until the reduce-scatter's shard update ran.
// docs/architecture.md, "Sharded and hierarchical co2 on CUDA tensors".
#include <vector>

#include "runtime/backends/backend.hpp"
#include "runtime/backends/device/cuda_api.hpp"
#include "runtime/backends/backend_state.hpp"
#include "runtime/base/log.hpp"

namespace co2::device {
namespace {

using S = BackendState;

class StagedShardedBackend final : public Backend {
 public:
  StagedShardedBackend(S& s, int device_index) : s_(s), device_(device_index), selected_(device_index) {
    stream_ = std::make_unique<CudaStream>();
    sharded_ = make_sharded_backend(s);
  }

  void check_memory(const void* data, size_t bytes, const std::string& what) override {
    check_device_memory(data, bytes, device_, what);
  }

  void* allocate_flat(size_t count, ParamDType dtype) override {
    make_current();
    flat_ = DeviceMemory(count * element_bytes(dtype), device_, s_.allocator, stream_->get());
    return flat_.as();
  }

  void commit() override {
    S& s = s_;
    size_t bytes = 0;
    device_params_.clear();
    mirror_offsets_.clear();
    for (const Segment& seg : s.segments) {
      device_params_.push_back(seg.data);
      mirror_offsets_.push_back(bytes);
      if (seg.role != Role::Excluded) bytes += seg.bytes();
    }
    mirror_ = PinnedMemory(bytes);
    // Staged out after the caller's stream: the framework's initialisation precedes rank 0's broadcast.
    with_mirror(Reads::Yes, Writes::Yes, [&] { sharded_->commit(); });
  }

  void begin_new_group() override { sharded_->begin_new_group(); }
  void momentum_needed() override { sharded_->momentum_needed(); }

  Arrival collect_average() override { return sharded_->collect_average(); }
  DeltasFinite boundary_pass(const BoundaryPass& plan) override {
    DeltasFinite finite = DeltasFinite::Yes;
    with_mirror(Reads::Yes, Writes::Yes, [&] { finite = sharded_->boundary_pass(plan); });
    return finite;
  }
  void submit_average() override { sharded_->submit_average(); }
  void apply_update() override {
    with_mirror(Reads::No, Writes::Yes, [&] { sharded_->apply_update(); });
  }
  void clear_eager_state() override { sharded_->clear_eager_state(); }
  // Between boundaries (apply_step): the step's parameters come to the mirror, keep their progress
  // on top of the next anchor there, and go back before the caller's next step.
  void apply_on_arrival() override {
    with_mirror(Reads::Yes, Writes::Yes, [&] { sharded_->apply_on_arrival(); });
  }

  bool average_deltas_blocking() override {
    bool finite = false;
    with_mirror(Reads::Yes, Writes::Yes, [&] { finite = sharded_->average_deltas_blocking(); });
    return finite;
  }
  void apply_blocking_update() override {
    with_mirror(Reads::No, Writes::Yes, [&] { sharded_->apply_blocking_update(); });
  }

  bool average_parameters(bool buffers_only) override {
    bool finite = false;
    with_mirror(Reads::Yes, Writes::Yes, [&] { finite = sharded_->average_parameters(buffers_only); });
    return finite;
  }

  // Gradients are device memory of their parameter's dtype: staged through pinned memory, averaged
  // by the sharded backend (over the node's ranks under hierarchy), and copied back.
  bool average_gradients(void* const* grads, size_t num_grads) override {
    make_current();
    S& s = s_;
    std::vector<const Segment*> trained;
    size_t bytes = 0;
    for (const Segment& seg : s.segments)
      if (seg.role == Role::Parameter) {
        trained.push_back(&seg);
        bytes += seg.bytes();
      }
    require(num_grads == trained.size(), Status::Internal, "reduce_gradients: one gradient per PARAMETER segment");
    if (gradients_.bytes() < bytes) gradients_ = PinnedMemory(bytes);
    std::vector<void*> staged(num_grads, nullptr);
    wait_for_caller("reduce_gradients");
    size_t offset = 0;
    for (size_t i = 0; i < num_grads; ++i) {
      if (!grads[i]) continue;
      staged[i] = gradients_.as<char>() + offset;
      check(cudaMemcpyAsync(staged[i], grads[i], trained[i]->bytes(), cudaMemcpyDeviceToHost, stream_->get()),
            "stage gradients out");
      offset += trained[i]->bytes();
    }
    check(cudaStreamSynchronize(stream_->get()), "cudaStreamSynchronize (stage gradients out)");
    if (!sharded_->average_gradients(staged.data(), num_grads)) return false;
    for (size_t i = 0; i < num_grads; ++i)
      if (grads[i])
        check(cudaMemcpyAsync(grads[i], staged[i], trained[i]->bytes(), cudaMemcpyHostToDevice, stream_->get()),
              "stage gradients in");
    check(cudaStreamSynchronize(stream_->get()), "cudaStreamSynchronize (stage gradients in)");
    return true;
  }

  void set_parameters_to_anchor() override {
    with_mirror(Reads::No, Writes::Yes, [&] { sharded_->set_parameters_to_anchor(); });
  }
  // Right after a pass the sharded backend may hash the parameters, which the mirror then holds.
  uint64_t anchor_checksum() override {
    uint64_t sum = 0;
    with_mirror(Reads::No, Writes::No, [&] { sum = sharded_->anchor_checksum(); });
    return sum;
  }
  uint64_t parameters_checksum(bool trained_only) override {
    uint64_t sum = 0;
    with_mirror(Reads::Yes, Writes::No, [&] { sum = sharded_->parameters_checksum(trained_only); });
    return sum;
  }

  // `out` may be host or device memory: the sharded backend writes a host buffer, copied from there.
  void consensus_into(float* out, size_t count, bool parameters, bool average) override {
    FloatBuffer host(count);
    with_mirror(parameters ? Reads::Yes : Reads::No, Writes::No,
                [&] { sharded_->consensus_into(host.data(), count, parameters, average); });
    check(cudaMemcpy(out, host.data(), count * sizeof(float), cudaMemcpyDefault), "copy the consensus out");
  }

  void set_caller_stream(void* stream) override { caller_stream_ = stream; }
  void wait_for_caller(const char* what) override {
    make_current();
    wait_for_stream(static_cast<cudaStream_t>(caller_stream_), s_.comm->options().timeout, what);
  }
  Finished finished(bool wait) override { return sharded_->finished(wait); }
  void drain() noexcept override {
    sharded_->drain();
    try {
      wait_for_stream(stream_->get(), s_.comm->options().timeout, "shutdown");
    } catch (const Error& e) {
      log::warn(std::string("engine shutdown: ") + e.what());
    }
  }

  // --- checkpoints: the sharded backend's, which hold no parameters except load_shard's ---
  bool has_momentum() const override { return sharded_->has_momentum(); }
  void stage_out() override { sharded_->stage_out(); }
  // Both ways: after a membership change it sets the parameters to the assembled anchor.
  void stage_in() override {
    with_mirror(Reads::Yes, Writes::Yes, [&] { sharded_->stage_in(); });
  }
  // A lost shard's anchor is read from the parameters.
  void assemble_outer_state(const std::vector<int>& holders) override {
    with_mirror(Reads::Yes, Writes::No, [&] { sharded_->assemble_outer_state(holders); });
  }
  void release_staged() override { sharded_->release_staged(); }
  const float* saved_part(SavedPart part, size_t segment) override { return sharded_->saved_part(part, segment); }
  bool shard_view(ShardView* view) const override { return sharded_->shard_view(view); }
  void load_shard(LoadedShard&& in) override {
    with_mirror(Reads::No, Writes::Yes, [&] { sharded_->load_shard(std::move(in)); });
  }

 private:
  enum class Reads { No, Yes };
  enum class Writes { No, Yes };

  // f() with every PARAMETER and BUFFER segment's data pointing into the mirror (the progress
  // thread's hooks read other fields of the segments only): the device's parameters copied in
  // first when f reads them (after the caller's stream reached this call), copied back after when
  // f writes them. The host waits for each copy: the mirror is reused by the next call, which may
  // come with another stream.
  template <typename F>
  void with_mirror(Reads reads, Writes writes, F&& f) {
    make_current();
    S& s = s_;
    require(device_params_.size() == s.segments.size(), Status::InvalidState,
            "the sharded state of CUDA tensors exists from commit on (co2_engine_commit first)");
    if (reads == Reads::Yes) {
      wait_for_caller("stage parameters out");
      copy_parameters(cudaMemcpyDeviceToHost);
    }
    struct Restore {
      S& s;
      const std::vector<void*>& device;
      ~Restore() {
        for (size_t i = 0; i < s.segments.size(); ++i) s.segments[i].data = device[i];
      }
    } restore{s, device_params_};
    for (size_t i = 0; i < s.segments.size(); ++i)
      if (s.segments[i].role != Role::Excluded) s.segments[i].data = mirror_.as<char>() + mirror_offsets_[i];
    f();
    if (writes == Writes::Yes) copy_parameters(cudaMemcpyHostToDevice);
  }

  void copy_parameters(cudaMemcpyKind kind) {
    const S& s = s_;
    const bool out = kind == cudaMemcpyDeviceToHost;
    for (size_t i = 0; i < s.segments.size(); ++i) {
      if (s.segments[i].role == Role::Excluded) continue;
      void* mirror = mirror_.as<char>() + mirror_offsets_[i];
      check(cudaMemcpyAsync(out ? mirror : device_params_[i], out ? device_params_[i] : mirror, s.segments[i].bytes(),
                            kind, stream_->get()),
            out ? "stage parameters out" : "stage parameters in");
    }
    check(cudaStreamSynchronize(stream_->get()), out ? "cudaStreamSynchronize (stage parameters out)"
                                                     : "cudaStreamSynchronize (stage parameters in)");
  }

  void make_current() const { check(cudaSetDevice(device_), "cudaSetDevice"); }

  // Selects the device before any member creates a stream on it.
  struct DeviceSelected {
    explicit DeviceSelected(int index) { use_device(index); }
  };
  S& s_;
  const int device_;
  DeviceSelected selected_;
  std::unique_ptr<CudaStream> stream_;  // the staging copies, ordered after the caller's stream by the host
  std::unique_ptr<Backend> sharded_;
  DeviceMemory flat_;
  PinnedMemory mirror_;      // the PARAMETER and BUFFER segments, as stored, back to back
  PinnedMemory gradients_;   // reduce_gradients' staging
  std::vector<void*> device_params_;    // per segment: the framework's device pointer
  std::vector<size_t> mirror_offsets_;  // per segment: its bytes in mirror_
  void* caller_stream_ = nullptr;       // the last step's or reduce_gradients' (nullptr: legacy default)
};

}  // namespace

std::unique_ptr<Backend> make_staged_sharded_backend(BackendState& s, int device_index) {
  return std::make_unique<StagedShardedBackend>(s, device_index);
}

}  // namespace co2::device

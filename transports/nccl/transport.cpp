#include "transports/nccl/transport.hpp"

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

namespace co2::transport::nccl {
namespace {

std::string nccl_text(ncclResult_t r) { return std::string(ncclGetErrorString(r)) + " (" + std::to_string(int(r)) + ")"; }

ncclDataType_t nccl_type(DataType e) {
  switch (e) {
    case DataType::F32: return ncclFloat32;
    case DataType::F64: return ncclFloat64;
    case DataType::I32: return ncclInt32;
    case DataType::I64: return ncclInt64;
  }
  return ncclFloat32;
}

size_t element_bytes(DataType e) { return e == DataType::F32 || e == DataType::I32 ? 4 : 8; }

ncclRedOp_t nccl_op(ReduceOp r) {
  switch (r) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Avg: return ncclAvg;
    case ReduceOp::Min: return ncclMin;
    case ReduceOp::Max: return ncclMax;
  }
  return ncclSum;
}

// An error NCCL reports asynchronously: a remote error means a peer went away.
Outcome outcome_of(ncclResult_t r) { return r == ncclRemoteError || r == ncclSystemError ? Outcome::PeerLost : Outcome::Failed; }

bool is_device_memory(const void* p) {
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, p) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged;
}

class NcclCollective final : public Collective {
 public:
  NcclCollective(ncclComm_t comm, cudaStream_t stream, int rank, int size, int device,
                 std::chrono::milliseconds timeout)
      : comm_(comm), stream_(stream), rank_(rank), size_(size), device_(device), timeout_(timeout) {}

  ~NcclCollective() override {
    cudaSetDevice(device_);
    // Collectives still in flight at destruction may never be matched by the peers: abort.
    const bool in_flight = !ops_.empty();
    for (auto& [handle, op] : ops_) release(op);
    std::lock_guard<std::mutex> lock(comm_mutex_);
    if (comm_) {
      if (in_flight || !healthy() || !finalize_and_destroy()) ncclCommAbort(comm_);  // peers may be gone
      comm_ = nullptr;
    }
    if (stream_) cudaStreamDestroy(stream_);
    for (const Staging& staging : pool_) {
      cudaFree(staging.device);
      cudaFreeHost(staging.pinned);
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void* stream() const override { return stream_; }
  int device() const override { return device_; }

  Handle post_allreduce(const void* send, void* recv, size_t count, DataType element, ReduceOp op) override {
    const size_t bytes = count * element_bytes(element);
    Op o = stage(send, recv, bytes, bytes);
    return enqueue(std::move(o), [&](const void* s, void* r) {
      return ncclAllReduce(s, r, count, nccl_type(element), nccl_op(op), comm_, stream_);
    });
  }

  Handle post_broadcast(void* buffer, size_t count, DataType element, int root) override {
    const size_t bytes = count * element_bytes(element);
    Op o = stage(buffer, buffer, bytes, bytes);
    return enqueue(std::move(o), [&](const void* s, void* r) {
      return ncclBroadcast(s, r, count, nccl_type(element), root, comm_, stream_);
    });
  }

  Handle post_allgather(const void* send, void* recv, size_t count_per_rank, DataType element) override {
    const size_t bytes = count_per_rank * element_bytes(element);
    Op o = stage(send, recv, bytes, bytes * size_t(size_), /*send_offset=*/bytes * size_t(rank_));
    return enqueue(std::move(o), [&](const void* s, void* r) {
      return ncclAllGather(s, r, count_per_rank, nccl_type(element), comm_, stream_);
    });
  }

  // NCCL's reduce-scatter and all-gather take equal blocks of count / size: used in place when
  // count divides evenly (shard_range is then exactly those blocks). Otherwise each shard is
  // its own ncclReduce to its owner (ncclBroadcast from it), all in one NCCL group, so that
  // nothing is padded or allocated and the layout stays shard_range's.
  Handle post_reduce_scatter(void* buffer, size_t count, DataType element, ReduceOp op) override {
    const size_t bytes = count * element_bytes(element);
    Op o = stage(buffer, buffer, bytes, bytes);
    return enqueue(std::move(o), [&](const void* s, void* r) {
      const size_t shard = shard_size(count, size_);
      if (shard * size_t(size_) == count)
        return ncclReduceScatter(s, byte_offset(r, shard * size_t(rank_), element), shard,
                                 nccl_type(element), nccl_op(op), comm_, stream_);
      return per_shard(count, element, r, [&](void* range, size_t n, int owner) {
        return ncclReduce(range, range, n, nccl_type(element), nccl_op(op), owner, comm_, stream_);
      });
    });
  }

  Handle post_allgather_shards(void* buffer, size_t count, DataType element) override {
    const size_t bytes = count * element_bytes(element);
    Op o = stage(buffer, buffer, bytes, bytes);
    return enqueue(std::move(o), [&](const void* /*s*/, void* r) {
      const size_t shard = shard_size(count, size_);
      if (shard * size_t(size_) == count)
        return ncclAllGather(byte_offset(r, shard * size_t(rank_), element), r, shard,
                             nccl_type(element), comm_, stream_);
      return per_shard(count, element, r, [&](void* range, size_t n, int owner) {
        return ncclBroadcast(range, range, n, nccl_type(element), owner, comm_, stream_);
      });
    });
  }

  Outcome test(Handle handle) override {
    auto it = ops_.find(handle);
    if (it == ops_.end()) return Outcome::Failed;
    Op& op = it->second;
    Outcome outcome = op.failed;
    if (outcome == Outcome::Pending) {
      if (aborted_.load()) {
        outcome = Outcome::Aborted;
      } else {
        cudaSetDevice(device_);
        const cudaError_t e = cudaEventQuery(op.done);
        if (e == cudaSuccess) {
          if (op.host_recv) std::memcpy(op.host_recv, op.pinned_recv, op.recv_bytes);
          outcome = Outcome::Done;
        } else if (e != cudaErrorNotReady) {
          set_error(std::string("CUDA error while waiting for an NCCL collective: ") + cudaGetErrorString(e));
          outcome = Outcome::Failed;
        } else {
          std::lock_guard<std::mutex> lock(comm_mutex_);
          ncclResult_t async = ncclSuccess;
          if (comm_ && ncclCommGetAsyncError(comm_, &async) == ncclSuccess && async != ncclSuccess &&
              async != ncclInProgress) {
            set_error("NCCL reported " + nccl_text(async) + ": " + ncclGetLastError(comm_));
            outcome = outcome_of(async);
          }
        }
      }
    }
    if (outcome != Outcome::Pending) {
      release(op);
      ops_.erase(it);
    }
    return outcome;
  }

  void abort(const std::string& reason) override {
    if (aborted_.exchange(true)) return;
    set_error("aborted: " + reason);
    std::lock_guard<std::mutex> lock(comm_mutex_);
    if (comm_) {
      cudaSetDevice(device_);
      ncclCommAbort(comm_);  // releases the stream's pending collectives; peers see a remote error
      comm_ = nullptr;
    }
  }

  std::string error_message() const override {
    std::lock_guard<std::mutex> lock(error_mutex_);
    return error_;
  }

 private:
  // Host buffers are staged through device scratch and pinned memory kept for reuse, in
  // power-of-two sizes: every collective is preceded by a small all-gather of descriptors
  // (runtime/comm/collective_comm.hpp), and cudaMalloc / cudaFree / cudaHostAlloc per collective
  // synchronise the device, stalling the poller behind the training's kernels.
  static constexpr size_t kSmallestStageBytes = size_t(64) << 10;
  struct Staging {
    void* device = nullptr;
    void* pinned = nullptr;
    size_t bytes = 0;
  };

  struct Op {
    cudaEvent_t done = nullptr;
    Staging staging;                // taken from pool_, returned on release
    void* scratch = nullptr;        // device copy of host buffers
    void* pinned_recv = nullptr;    // host result lands here first
    void* host_recv = nullptr;      // ... and is copied here on completion
    size_t recv_bytes = 0;
    const void* send = nullptr;     // what NCCL reads
    void* recv = nullptr;           // what NCCL writes
    Outcome failed = Outcome::Pending;  // set when posting failed
  };

  // Device buffers are used in place; host buffers go through device scratch (and pinned memory
  // for the result, so that nothing blocks the host).
  // A staged send lands at `send_offset` of the scratch buffer: an all-gather reads its own
  // block from there in place (NCCL's in-place all-gather has send == recv + rank * count; any
  // other overlap of send and recv is undefined).
  Op stage(const void* send, void* recv, size_t send_bytes, size_t recv_bytes, size_t send_offset = 0) {
    cudaSetDevice(device_);
    Op op;
    op.send = send;
    op.recv = recv;
    op.recv_bytes = recv_bytes;
    if (is_device_memory(recv) && is_device_memory(send)) return op;
    if (!take_staging(recv_bytes, op.staging)) {
      set_error("out of device or pinned memory staging a host buffer for NCCL");
      op.failed = Outcome::Failed;
      return op;
    }
    op.scratch = op.staging.device;
    op.pinned_recv = op.staging.pinned;
    // An in-place allgather's send aliases its block of recv: copy only send's bytes.
    char* scratch = static_cast<char*>(op.scratch);
    cudaMemcpyAsync(scratch + send_offset, send, send_bytes, cudaMemcpyHostToDevice, stream_);
    op.send = scratch + send_offset;
    op.recv = op.scratch;
    op.host_recv = recv;
    return op;
  }

  template <typename Call>
  Handle enqueue(Op op, Call&& call) {
    const Handle handle = next_handle_++;
    if (op.failed == Outcome::Pending && aborted_.load()) op.failed = Outcome::Aborted;
    if (op.failed == Outcome::Pending) {
      std::unique_lock<std::mutex> lock(comm_mutex_);
      ncclResult_t r = comm_ ? call(op.send, op.recv) : ncclInvalidUsage;
      // A non-blocking communicator may still be connecting: the call is enqueued once the
      // communicator's state leaves ncclInProgress. The lock is released between polls so that
      // abort() (the communicator's timeout, co2_comm_abort) can end the wait.
      const auto deadline = std::chrono::steady_clock::now() + timeout_;
      while (r == ncclInProgress) {
        if (std::chrono::steady_clock::now() > deadline) {
          set_error("NCCL could not start a collective within " + std::to_string(timeout_.count()) +
                    " ms (its peers did not connect)");
          op.failed = Outcome::Failed;
          break;
        }
        lock.unlock();
        std::this_thread::sleep_for(std::chrono::microseconds(100));
        lock.lock();
        if (!comm_ || aborted_.load()) {
          op.failed = Outcome::Aborted;
          break;
        }
        if (ncclCommGetAsyncError(comm_, &r) != ncclSuccess) r = ncclInternalError;
      }
      if (op.failed == Outcome::Pending && r != ncclSuccess) {
        set_error("NCCL collective failed to start: " + nccl_text(r));
        op.failed = outcome_of(r);
      }
    }
    if (op.failed == Outcome::Pending) {
      if (op.host_recv) cudaMemcpyAsync(op.pinned_recv, op.scratch, op.recv_bytes, cudaMemcpyDeviceToHost, stream_);
      cudaEventCreateWithFlags(&op.done, cudaEventDisableTiming);
      cudaEventRecord(op.done, stream_);
    }
    ops_.emplace(handle, op);
    return handle;
  }

  static void* byte_offset(void* base, size_t elements, DataType element) {
    return static_cast<char*>(base) + elements * element_bytes(element);
  }

  // `call(range, count, owner)` for every non-empty shard of `buffer`, as one NCCL group. The
  // group is ended even when a call failed (NCCL requires it); the first error is returned.
  template <typename Call>
  ncclResult_t per_shard(size_t count, DataType element, void* buffer, Call&& call) {
    ncclResult_t first = ncclGroupStart();
    if (first != ncclSuccess) return first;
    for (int owner = 0; owner < size_; ++owner) {
      const ShardRange range = shard_range(count, size_, owner);
      if (range.count() == 0) continue;
      // A communicator still connecting answers ncclInProgress: the call is queued all the same.
      const ncclResult_t r = call(byte_offset(buffer, range.begin, element), range.count(), owner);
      if (r != ncclSuccess && r != ncclInProgress) {
        first = r;
        break;
      }
    }
    const ncclResult_t ended = ncclGroupEnd();
    return first != ncclSuccess ? first : ended;
  }

  void release(Op& op) {
    if (op.done) cudaEventDestroy(op.done);
    if (op.staging.bytes) pool_.push_back(op.staging);
    op = Op{};
  }

  // The smallest idle staging pair that holds `bytes`, or a new one of the next power of two.
  bool take_staging(size_t bytes, Staging& out) {
    auto best = pool_.end();
    for (auto it = pool_.begin(); it != pool_.end(); ++it)
      if (it->bytes >= bytes && (best == pool_.end() || it->bytes < best->bytes)) best = it;
    if (best != pool_.end()) {
      out = *best;
      pool_.erase(best);
      return true;
    }
    Staging fresh;
    fresh.bytes = kSmallestStageBytes;
    while (fresh.bytes < bytes) fresh.bytes *= 2;
    if (cudaMalloc(&fresh.device, fresh.bytes) != cudaSuccess ||
        cudaHostAlloc(&fresh.pinned, fresh.bytes, cudaHostAllocDefault) != cudaSuccess) {
      cudaGetLastError();
      if (fresh.device) cudaFree(fresh.device);
      return false;
    }
    out = fresh;
    return true;
  }

  bool healthy() const {
    std::lock_guard<std::mutex> lock(error_mutex_);
    return error_.empty() && !aborted_.load();
  }

  // A clean shutdown: NCCL flushes what is enqueued and releases its peers' resources in order
  // (ncclCommAbort is for faults: it may leave a peer's finalize waiting). Bounded by the
  // timeout; false when it did not finish, and the caller aborts instead.
  bool finalize_and_destroy() {
    ncclResult_t r = ncclCommFinalize(comm_);
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    while (r == ncclInProgress && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      if (ncclCommGetAsyncError(comm_, &r) != ncclSuccess) r = ncclInternalError;
    }
    if (r != ncclSuccess) return false;
    return ncclCommDestroy(comm_) == ncclSuccess;
  }

  void set_error(const std::string& message) {
    std::lock_guard<std::mutex> lock(error_mutex_);
    if (error_.empty()) error_ = message;
  }

  ncclComm_t comm_;
  cudaStream_t stream_;
  const int rank_, size_, device_;
  const std::chrono::milliseconds timeout_;  // bounds the wait for a collective to start
  std::mutex comm_mutex_;
  std::atomic<bool> aborted_{false};
  mutable std::mutex error_mutex_;
  std::string error_;
  std::unordered_map<Handle, Op> ops_;
  Handle next_handle_ = 1;
  std::vector<Staging> pool_;  // idle staging pairs, see kSmallestStageBytes
};

}  // namespace

int usable_devices() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count > 0 ? count : 0;
}

std::unique_ptr<Collective> connect(Rendezvous& store, const std::string& key, int rank, int size, int device,
                                    std::chrono::milliseconds timeout) {
  const int count = usable_devices();
  if (count == 0) throw RendezvousError("the NCCL transport needs a usable CUDA device (cudaGetDeviceCount found none)");
  if (device < 0 && cudaGetDevice(&device) != cudaSuccess) throw RendezvousError("cudaGetDevice failed");
  if (device < 0 || device >= count)
    throw RendezvousError("CUDA device " + std::to_string(device) + " does not exist (" + std::to_string(count) + " found)");
  if (cudaSetDevice(device) != cudaSuccess) throw RendezvousError("cudaSetDevice failed");

  ncclUniqueId id;
  const std::string id_key = "nccl/" + key + "/id";
  if (rank == 0) {
    const ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) throw RendezvousError("ncclGetUniqueId: " + nccl_text(r));
    store.set(id_key, std::string(id.internal, sizeof id.internal));
  } else {
    const std::string bytes = store.get(id_key, timeout);
    if (bytes.size() != sizeof id.internal) throw RendezvousError("the NCCL unique id in the store has the wrong size");
    std::memcpy(id.internal, bytes.data(), sizeof id.internal);
  }

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // so that a missing peer is a timeout, not a hang
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&comm, size, id, rank, &config);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (r == ncclInProgress) {
    if (std::chrono::steady_clock::now() > deadline) {
      ncclCommAbort(comm);
      throw RendezvousError("NCCL group '" + key + "' did not form within " + std::to_string(timeout.count()) +
                            " ms (a rank never joined, or two ranks share one GPU)");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (ncclCommGetAsyncError(comm, &r) != ncclSuccess) r = ncclInternalError;
  }
  if (r != ncclSuccess) {
    if (comm) ncclCommAbort(comm);
    throw RendezvousError("ncclCommInitRank failed: " + nccl_text(r) +
                          " (NCCL refuses two ranks on one GPU: run one rank per GPU)");
  }
  cudaStream_t stream = nullptr;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
    ncclCommAbort(comm);
    throw RendezvousError("cudaStreamCreate failed for the NCCL transport");
  }
  return std::make_unique<NcclCollective>(comm, stream, rank, size, device, timeout);
}

}  // namespace co2::transport::nccl

// A collective-kind transport (the NCCL seam) for W ranks that are threads of one process, on host
// memory, for unit tests: every rank's k-th collective is paired with the others' k-th, and the
// last rank to post it runs it for all of them (sums in rank order, so every rank gets the same
// bits). Like NCCL it compares nothing (the communicator's descriptor check does), and a rank's
// abort fails every rank's collectives not run yet (a peer's ncclCommAbort is a remote error to
// the others).
// Posting::WaitsUntilRun: a post returns only once the collective ran, for engines on the host
// executor: NCCL orders what a rank launches after a collective behind it on the stream, and the
// host executor's kernels run at launch, so a collective still pending at return would race the
// kernels after it. A rank that stops posting then leaves the others waiting in their post (no
// no-progress timeout can fire): a test makes a rank go away by aborting it. ReturnsAtOnce: for
// tests that submit every rank's collectives from one thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/base/status.hpp"
#include "runtime/comm/comm.hpp"
#include "transports/collective.hpp"

namespace co2test {

class CollectiveGroupFake {
 public:
  enum class Posting { ReturnsAtOnce, WaitsUntilRun };
  explicit CollectiveGroupFake(int size, Posting posting = Posting::ReturnsAtOnce) : size_(size), posting_(posting) {}
  int size() const { return size_; }

  // One rank's transport; the group outlives it.
  std::unique_ptr<co2::transport::Collective> rank(int r);

  enum class Kind { AllReduce, Broadcast, AllGather, ReduceScatter, AllGatherShards };
  struct Call {
    Kind kind = Kind::AllReduce;
    const void* send = nullptr;
    void* recv = nullptr;
    size_t count = 0;
    co2::DataType element = co2::DataType::F32;
    co2::ReduceOp op = co2::ReduceOp::Sum;
    int root = 0;
  };

  // Rank r's k-th call; the last of the ranks to make its k-th runs it for all (WaitsUntilRun:
  // each returns once it ran or the group failed).
  void post(int r, uint64_t k, const Call& call) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (failed_) return;
    Pending& pending = pending_[k];
    if (pending.calls.empty()) pending.calls.resize(size_t(size_));
    pending.calls[size_t(r)] = call;
    if (++pending.posted == size_) {
      run(pending.calls);
      pending.done = true;
      ran_.notify_all();
    }
    if (posting_ == Posting::WaitsUntilRun) ran_.wait(lock, [&] { return pending.done || failed_; });
  }
  bool done(uint64_t k) {
    std::lock_guard<std::mutex> lock(mutex_);
    return pending_[k].done;
  }
  // A rank aborted: every collective not run yet fails, on every rank.
  void fail() {
    std::lock_guard<std::mutex> lock(mutex_);
    failed_ = true;
    ran_.notify_all();
  }
  bool failed() {
    std::lock_guard<std::mutex> lock(mutex_);
    return failed_;
  }

 private:
  struct Pending {
    std::vector<Call> calls;
    int posted = 0;
    bool done = false;
  };

  static size_t bytes_of(co2::DataType element) {
    return element == co2::DataType::F32 || element == co2::DataType::I32 ? 4 : 8;
  }

  template <typename T>
  static void reduce(const std::vector<Call>& calls, size_t begin, size_t end, char* out) {
    const co2::ReduceOp op = calls.front().op;
    for (size_t i = begin; i < end; ++i) {
      T acc = static_cast<const T*>(calls.front().send)[i];
      for (size_t r = 1; r < calls.size(); ++r) {
        const T x = static_cast<const T*>(calls[r].send)[i];
        if (op == co2::ReduceOp::Min) acc = x < acc ? x : acc;
        else if (op == co2::ReduceOp::Max) acc = x > acc ? x : acc;
        else acc += x;
      }
      if (op == co2::ReduceOp::Avg) acc /= T(calls.size());
      std::memcpy(out + (i - begin) * sizeof(T), &acc, sizeof(T));
    }
  }

  // The reduction of [begin, end) of every rank's send into the recv of each rank in `into`.
  void reduce_into(const std::vector<Call>& calls, size_t begin, size_t end, const std::vector<int>& into) {
    if (begin >= end) return;
    const size_t element = bytes_of(calls.front().element);
    std::vector<char> result((end - begin) * element);
    switch (calls.front().element) {
      case co2::DataType::F32: reduce<float>(calls, begin, end, result.data()); break;
      case co2::DataType::F64: reduce<double>(calls, begin, end, result.data()); break;
      case co2::DataType::I32: reduce<int32_t>(calls, begin, end, result.data()); break;
      case co2::DataType::I64: reduce<int64_t>(calls, begin, end, result.data()); break;
    }
    for (int r : into)
      std::memcpy(static_cast<char*>(calls[size_t(r)].recv) + begin * element, result.data(), result.size());
  }

  void run(const std::vector<Call>& calls) {
    const Call& first = calls.front();
    const size_t element = bytes_of(first.element);
    std::vector<int> everyone;
    for (int r = 0; r < size_; ++r) everyone.push_back(r);
    switch (first.kind) {
      case Kind::AllReduce:
        reduce_into(calls, 0, first.count, everyone);
        break;
      case Kind::ReduceScatter:
        for (int r = 0; r < size_; ++r) {
          const co2::transport::ShardRange shard = co2::transport::shard_range(first.count, size_, r);
          reduce_into(calls, shard.begin, shard.end, {r});
        }
        break;
      case Kind::Broadcast:
        for (int r = 0; r < size_; ++r)
          if (r != first.root) std::memcpy(calls[size_t(r)].recv, calls[size_t(first.root)].recv, first.count * element);
        break;
      case Kind::AllGather: {
        std::vector<char> gathered(size_t(size_) * first.count * element);
        for (int r = 0; r < size_; ++r)
          std::memcpy(gathered.data() + size_t(r) * first.count * element, calls[size_t(r)].send, first.count * element);
        for (const Call& call : calls) std::memcpy(call.recv, gathered.data(), gathered.size());
        break;
      }
      case Kind::AllGatherShards:
        for (int owner = 0; owner < size_; ++owner) {
          const co2::transport::ShardRange shard = co2::transport::shard_range(first.count, size_, owner);
          const char* from = static_cast<const char*>(calls[size_t(owner)].recv) + shard.begin * element;
          for (int r = 0; r < size_; ++r)
            if (r != owner) std::memcpy(static_cast<char*>(calls[size_t(r)].recv) + shard.begin * element, from,
                                        shard.count() * element);
        }
        break;
    }
  }

  const int size_;
  const Posting posting_;
  std::mutex mutex_;
  std::condition_variable ran_;
  bool failed_ = false;
  std::map<uint64_t, Pending> pending_;
};

class CollectiveGroupRank final : public co2::transport::Collective {
 public:
  CollectiveGroupRank(CollectiveGroupFake* group, int rank) : group_(group), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }
  void* stream() const override { return const_cast<int*>(&stream_tag_); }

  co2::transport::Handle post_allreduce(const void* send, void* recv, size_t count, co2::DataType element,
                                        co2::ReduceOp op) override {
    return post({CollectiveGroupFake::Kind::AllReduce, send, recv, count, element, op, 0});
  }
  co2::transport::Handle post_broadcast(void* buffer, size_t count, co2::DataType element, int root) override {
    return post({CollectiveGroupFake::Kind::Broadcast, buffer, buffer, count, element, co2::ReduceOp::Sum, root});
  }
  co2::transport::Handle post_allgather(const void* send, void* recv, size_t count, co2::DataType element) override {
    return post({CollectiveGroupFake::Kind::AllGather, send, recv, count, element, co2::ReduceOp::Sum, 0});
  }
  co2::transport::Handle post_reduce_scatter(void* buffer, size_t count, co2::DataType element,
                                             co2::ReduceOp op) override {
    return post({CollectiveGroupFake::Kind::ReduceScatter, buffer, buffer, count, element, op, 0});
  }
  co2::transport::Handle post_allgather_shards(void* buffer, size_t count, co2::DataType element) override {
    return post({CollectiveGroupFake::Kind::AllGatherShards, buffer, buffer, count, element, co2::ReduceOp::Sum, 0});
  }
  co2::transport::Outcome test(co2::transport::Handle handle) override {
    if (aborted_) return co2::transport::Outcome::Aborted;
    if (group_->done(uint64_t(handle))) return co2::transport::Outcome::Done;
    return group_->failed() ? co2::transport::Outcome::PeerLost : co2::transport::Outcome::Pending;
  }
  void abort(const std::string&) override {
    aborted_ = true;
    group_->fail();
  }
  std::string error_message() const override { return aborted_ ? "aborted" : group_->failed() ? "a peer aborted" : ""; }

 private:
  co2::transport::Handle post(const CollectiveGroupFake::Call& call) {
    const uint64_t k = next_++;
    group_->post(rank_, k, call);
    return co2::transport::Handle(k);
  }
  CollectiveGroupFake* group_;
  const int rank_;
  int stream_tag_ = 0;
  uint64_t next_ = 1;
  std::atomic<bool> aborted_{false};
};

inline std::unique_ptr<co2::transport::Collective> CollectiveGroupFake::rank(int r) {
  return std::make_unique<CollectiveGroupRank>(this, r);
}

// The memberships of an elastic group whose ranks are threads over in-process collective
// transports (the NCCL seam): each change of membership is a new group of the agreed size, as
// the group layer forms a new NCCL communicator (runtime/group/group.cpp, group_connector).
struct CollectiveGenerations {
  std::mutex mutex;
  std::map<uint64_t, std::unique_ptr<CollectiveGroupFake>> groups;
  std::atomic<int64_t> join_requests{0};
  std::atomic<int> lost{-1};  // the rank (of the current group) the survivors leave out
  CollectiveGroupFake::Posting posting = CollectiveGroupFake::Posting::ReturnsAtOnce;

  std::unique_ptr<co2::transport::Collective> rank_of(uint64_t generation, int size, int rank) {
    std::lock_guard<std::mutex> lock(mutex);
    auto& group = groups[generation];
    if (!group) group = std::make_unique<CollectiveGroupFake>(size, posting);
    if (group->size() != size) co2::fail(co2::Status::Internal, "generation " + std::to_string(generation) + " formed at two sizes");
    return group->rank(rank);
  }
};

class CollectiveMembershipFake final : public co2::MembershipChanges {
 public:
  CollectiveMembershipFake(std::shared_ptr<CollectiveGenerations> generations, int rank, int size, uint64_t generation = 0,
                 int64_t admitted = 0)
      : generations_(std::move(generations)), rank_(rank), size_(size), generation_(generation), admitted_(admitted) {}

  co2::GroupTransport survivors(const std::string&) override {
    const int lost = generations_->lost.load();
    if (lost == rank_) co2::fail(co2::Status::PeerLost, "left out");
    previous_.clear();
    for (int r = 0; r < size_; ++r)
      if (r != lost) previous_.push_back(r);
    rank_ = int(std::find(previous_.begin(), previous_.end(), rank_) - previous_.begin());
    size_ = int(previous_.size());
    return generations_->rank_of(++generation_, size_, rank_);
  }
  std::vector<int> previous_ranks() const override { return previous_; }
  int64_t join_requests() override { return generations_->join_requests.load(); }
  int64_t admitted() const override { return admitted_; }
  co2::GroupTransport admit(int64_t join_requests) override {
    size_ += int(join_requests - admitted_);
    admitted_ = join_requests;
    return generations_->rank_of(++generation_, size_, rank_);
  }
  co2::GroupTransport release(int leaving) override {
    ++generation_;
    if (leaving == rank_) return {};
    if (rank_ > leaving) --rank_;
    --size_;
    return generations_->rank_of(generation_, size_, rank_);
  }

 private:
  std::shared_ptr<CollectiveGenerations> generations_;
  int rank_, size_;
  uint64_t generation_;
  int64_t admitted_;
  std::vector<int> previous_;
};

}  // namespace co2test

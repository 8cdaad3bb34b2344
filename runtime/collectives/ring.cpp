// RingCollective: runs a RingSchedule, one descriptor exchange and then the chunks' steps,
// as a non-blocking state machine the progress thread advances.
#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "runtime/collectives/ring.hpp"
#include "runtime/collectives/scratch_pool.hpp"

namespace co2::collectives {

namespace {

using transport::Handle;
using transport::Outcome;
using transport::PointToPoint;

bool is_failure(Outcome outcome) { return outcome != Outcome::Pending && outcome != Outcome::Done; }

class RingCollective final : public Collective {
 public:
  RingCollective(PointToPoint& transport, const Descriptor& descriptor,
                 std::unique_ptr<RingSchedule> schedule, const Tuning& tuning)
      : Collective(descriptor),
        transport_(transport),
        schedule_(std::move(schedule)),
        rank_(transport.rank()),
        ranks_(transport.size()),
        next_(ring_index(rank_ + 1, ranks_)),
        previous_(ring_index(rank_ - 1, ranks_)),
        stage_receives_(transport.receives_may_land_late()),
        descriptor_out_(encode(descriptor)),
        chunks_left_(schedule_->chunk_count()) {
    const size_t slots = std::min(std::max<size_t>(1, tuning.max_chunks_in_flight), chunks_left_);
    const size_t scratch_bytes = schedule_->scratch_bytes();
    if (scratch_bytes > 0 && slots > 0) scratch_ = lease_scratch(slots * scratch_bytes);
    slots_.resize(slots);
    for (size_t i = 0; i < slots; ++i)
      slots_[i].scratch = scratch_.data() ? scratch_.data() + i * scratch_bytes : nullptr;
  }

  bool advance() override;
  bool release_transfers() override;

 private:
  struct Slot {
    bool busy = false;
    size_t chunk = 0;
    int step = 0;
    std::optional<Handle> send;
    std::optional<Handle> recv;
    std::byte* scratch = nullptr;
    // With a transport whose receives may land late: the step's receive lands in `staging`
    // (owned here) and is copied to `recv_target` once it completed.
    ScratchLease staging;
    std::byte* recv_target = nullptr;
    size_t recv_bytes = 0;
  };

  // Tests `handle` if posted; forgets it once the transport released it. Not posted = Done.
  Outcome poll(std::optional<Handle>& handle, bool& progressed);
  void check_descriptor();
  bool advance_chunks();
  void start_chunk(Slot& slot, size_t chunk);
  void post_step(Slot& slot);
  void fail_transfer(Outcome outcome, const std::string& what);

  PointToPoint& transport_;
  std::unique_ptr<RingSchedule> schedule_;
  const int rank_;
  const int ranks_;
  const int next_;
  const int previous_;

  const bool stage_receives_;
  bool exchange_posted_ = false;
  bool data_started_ = false;
  const DescriptorWire descriptor_out_;
  DescriptorWire descriptor_in_{};
  std::optional<Handle> descriptor_send_;
  std::optional<Handle> descriptor_recv_;

  ScratchLease scratch_;
  std::vector<Slot> slots_;
  size_t next_chunk_ = 0;
  size_t chunks_left_;
};

Outcome RingCollective::poll(std::optional<Handle>& handle, bool& progressed) {
  if (!handle) return Outcome::Done;
  const Outcome outcome = transport_.test(*handle);
  if (outcome == Outcome::Pending) return outcome;
  handle.reset();
  if (outcome == Outcome::Done) progressed = true;
  return outcome;
}

void RingCollective::fail_transfer(Outcome outcome, const std::string& what) {
  std::string message = descriptor().to_string() + " on rank " + std::to_string(rank_) + ": " + what;
  if (outcome == Outcome::SizeMismatch)
    message = kMismatchPrefix + message + " (the peer issued a different collective)";
  const std::string detail = transport_.error_message();
  // A rank that is not next to the mismatch learns of it through the abort that the ranks
  // which compared the descriptors sent: it reports the mismatch (naming both identities, in
  // the detail) rather than a bare abort.
  Status status = status_of(outcome);
  if (outcome == Outcome::Aborted && detail.find(kMismatchPrefix) != std::string::npos)
    status = Status::CollectiveMismatch;
  mark_failed(status, message + ": " + detail);
}

void RingCollective::check_descriptor() {
  const std::optional<Descriptor> theirs = decode(descriptor_in_);
  if (theirs && *theirs == descriptor()) return;
  mark_failed(Status::CollectiveMismatch,
              mismatch_message(rank_, descriptor(),
                               "its ring predecessor rank " + std::to_string(previous_), theirs));
}

bool RingCollective::advance() {
  if (finished() || failed()) return false;
  if (ranks_ == 1) {
    schedule_->start();
    mark_finished();
    return true;
  }

  bool progressed = false;
  if (!exchange_posted_) {
    exchange_posted_ = true;
    const uint64_t tag = descriptor_tag(descriptor().sequence);
    descriptor_recv_ = transport_.post_recv(previous_, tag, descriptor_in_.data(), kDescriptorBytes);
    descriptor_send_ = transport_.post_send(next_, tag, descriptor_out_.data(), kDescriptorBytes);
  }
  if (descriptor_recv_) {
    const Outcome outcome = poll(descriptor_recv_, progressed);
    if (outcome == Outcome::Done) {
      check_descriptor();
      if (failed()) return progressed;
      schedule_->start();
      data_started_ = true;
    } else if (is_failure(outcome)) {
      fail_transfer(outcome, "receiving the descriptor from rank " + std::to_string(previous_));
      return progressed;
    }
  }
  const Outcome sent = poll(descriptor_send_, progressed);
  if (is_failure(sent)) {
    fail_transfer(sent, "sending the descriptor to rank " + std::to_string(next_));
    return progressed;
  }

  if (data_started_) progressed |= advance_chunks();
  if (!failed() && data_started_ && chunks_left_ == 0 && !descriptor_send_) mark_finished();
  return progressed;
}

bool RingCollective::advance_chunks() {
  bool progressed = false;
  for (Slot& slot : slots_) {
    if (!slot.busy && next_chunk_ < schedule_->chunk_count()) start_chunk(slot, next_chunk_++);
    while (slot.busy) {
      const Outcome sent = poll(slot.send, progressed);
      const Outcome received = poll(slot.recv, progressed);
      const auto where = [&] {
        return " (chunk " + std::to_string(slot.chunk) + ", step " + std::to_string(slot.step) + ")";
      };
      if (is_failure(sent)) {
        fail_transfer(sent, "sending to rank " + std::to_string(next_) + where());
        return progressed;
      }
      if (is_failure(received)) {
        fail_transfer(received, "receiving from rank " + std::to_string(previous_) + where());
        return progressed;
      }
      if (slot.send || slot.recv) break;  // still in flight

      if (slot.recv_target) {
        std::memcpy(slot.recv_target, slot.staging.data(), slot.recv_bytes);
        slot.recv_target = nullptr;
      }
      schedule_->finish_step(slot.chunk, slot.step, slot.scratch);
      if (++slot.step < schedule_->steps_per_chunk()) {
        post_step(slot);
        continue;
      }
      --chunks_left_;
      slot.busy = false;
      if (next_chunk_ < schedule_->chunk_count()) start_chunk(slot, next_chunk_++);
    }
  }
  return progressed;
}

void RingCollective::start_chunk(Slot& slot, size_t chunk) {
  slot.busy = true;
  slot.chunk = chunk;
  slot.step = 0;
  post_step(slot);
}

void RingCollective::post_step(Slot& slot) {
  const StepTransfers io = schedule_->transfers(slot.chunk, slot.step, slot.scratch);
  const uint64_t tag =
      data_tag(descriptor().sequence, io.tag_step, slot.chunk, descriptor().control_lane());
  std::byte* recv = io.recv;
  const std::less_equal<const std::byte*> not_after;
  const bool into_scratch = slot.scratch != nullptr && not_after(slot.scratch, io.recv) &&
                            !not_after(slot.scratch + schedule_->scratch_bytes(), io.recv);
  const bool into_callers_memory = io.recv_bytes > 0 && !into_scratch;
  if (io.has_recv && stage_receives_ && into_callers_memory) {
    if (slot.staging.size() < io.recv_bytes) slot.staging = lease_scratch(io.recv_bytes);
    slot.recv_target = io.recv;
    slot.recv_bytes = io.recv_bytes;
    recv = slot.staging.data();
  }
  if (io.has_recv) slot.recv = transport_.post_recv(previous_, tag, recv, io.recv_bytes);
  if (io.has_send) slot.send = transport_.post_send(next_, tag, io.send, io.send_bytes);
}

bool RingCollective::release_transfers() {
  bool ignored = false;
  bool all_released = true;
  auto release = [&](std::optional<Handle>& handle) {
    poll(handle, ignored);
    all_released = all_released && !handle;
  };
  release(descriptor_send_);
  release(descriptor_recv_);
  for (Slot& slot : slots_) {
    release(slot.send);
    release(slot.recv);
  }
  return all_released;
}

}  // namespace

std::unique_ptr<Collective> run_ring(PointToPoint& transport, const Descriptor& descriptor,
                                     std::unique_ptr<RingSchedule> schedule, const Tuning& tuning) {
  return std::make_unique<RingCollective>(transport, descriptor, std::move(schedule), tuning);
}

}  // namespace co2::collectives

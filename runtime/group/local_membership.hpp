// Elastic membership of a group whose ranks are threads of one process (the local transport):
// a rank may leave (co2_engine_leave), and a thread may join the running group; the members go
// on over a local transport of their own after each change. A lost rank is not survived: threads
// of one process do not die alone, and a rank that aborts its communicator ends the group as
// without elasticity (docs/capi.md, "Elastic membership").
//
// Joining: a formed elastic group keeps a door in this process, found by the group's name. A
// thread that asks co2_comm_create for an elastic local group whose door is open asks to join
// there (its rank and world size arguments are not used); the members agree on the request
// count at a boundary as over UCX, rank 0 decides which requests it admits and with which
// ranks, and the members and the joiners meet under the next generation's name.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/comm/comm.hpp"
#include "transports/local/transport.hpp"

namespace co2 {

struct LocalDoor;  // local_membership.cpp

class LocalMembership final : public MembershipChanges {
 public:
  // A member of the group `group`, formed at `size` ranks: opens the group's door (one per
  // formed group, shared by its members).
  LocalMembership(std::string group, int rank, int size, std::chrono::milliseconds timeout,
                  transport::local::LinkModel link);
  ~LocalMembership() override;

  // Whether a running elastic local group named `group` has its door open in this process.
  static bool door_open(const std::string& group);
  // A thread that asks to join the running group `group`: waits (up to twice options.timeout:
  // the members admit joiners at a boundary) until rank 0 admits it. Throws Error(Rendezvous)
  // when no running group admits it in that time or the group ended meanwhile.
  static std::pair<std::shared_ptr<LocalMembership>, std::unique_ptr<transport::PointToPoint>> join(
      const std::string& group, const CommOptions& options, transport::local::LinkModel link);

  GroupTransport survivors(const std::string& cause) override;
  std::vector<int> previous_ranks() const override { return {}; }  // no loss is survived
  int64_t join_requests() override;
  int64_t admitted() const override { return admitted_; }
  GroupTransport admit(int64_t join_requests) override;
  GroupTransport release(int leaving) override;

 private:
  LocalMembership(std::string group, std::shared_ptr<LocalDoor> door, std::chrono::milliseconds timeout,
                  transport::local::LinkModel link);
  // The transport of generation generation_ as rank_ of size_.
  std::unique_ptr<transport::PointToPoint> connect() const;

  const std::string group_;
  const std::shared_ptr<LocalDoor> door_;
  int rank_ = 0;
  int size_ = 0;
  const std::chrono::milliseconds timeout_;
  const transport::local::LinkModel link_;
  uint64_t generation_ = 0;
  int64_t admitted_ = 0;  // join requests admitted so far, the same on every member
};

}  // namespace co2

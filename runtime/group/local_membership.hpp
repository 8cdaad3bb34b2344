// Elastic membership of a group whose ranks are threads of one process (the local transport):
// a rank may leave (co2_engine_leave), and the others go on over a local transport of their own.
// A lost rank is not survived: threads of one process do not die alone, and a rank that aborts
// its communicator ends the group as without elasticity (docs/capi.md, "Elastic membership").
#pragma once

#include <chrono>
#include <string>

#include "runtime/comm/comm.hpp"
#include "transports/local/transport.hpp"

namespace co2 {

class LocalMembership final : public MembershipChanges {
 public:
  LocalMembership(std::string group, int rank, int size, std::chrono::milliseconds timeout,
                  transport::local::LinkModel link)
      : group_(std::move(group)), rank_(rank), size_(size), timeout_(timeout), link_(link) {}

  std::unique_ptr<transport::PointToPoint> survivors(const std::string& cause) override;
  int64_t join_requests() override { return 0; }
  int64_t admitted() const override { return 0; }
  std::unique_ptr<transport::PointToPoint> admit(int64_t join_requests) override;
  std::unique_ptr<transport::PointToPoint> release(int leaving) override;

 private:
  const std::string group_;
  int rank_;
  int size_;
  const std::chrono::milliseconds timeout_;
  const transport::local::LinkModel link_;
  uint64_t generation_ = 0;
};

}  // namespace co2

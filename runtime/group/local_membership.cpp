#include "runtime/group/local_membership.hpp"

#include "runtime/base/log.hpp"
#include "runtime/base/status.hpp"

namespace co2 {

std::unique_ptr<transport::PointToPoint> LocalMembership::survivors(const std::string& cause) {
  fail(Status::PeerLost, "the group lost a rank (" + cause + "): a group of threads (the local transport) survives "
                         "a rank that leaves with co2_engine_leave, not a lost one; over UCX every loss is survived");
}

std::unique_ptr<transport::PointToPoint> LocalMembership::admit(int64_t) {
  fail(Status::Internal, "membership: a local group has no door, so nobody asks to join it");
}

std::unique_ptr<transport::PointToPoint> LocalMembership::release(int leaving) {
  require(leaving >= 0 && leaving < size_, Status::Internal, "membership: release() of a rank out of range");
  ++generation_;
  if (leaving == rank_) return nullptr;
  if (rank_ > leaving) --rank_;
  --size_;
  // Every other member joins the next generation's group in this process, under a name of its own.
  auto transport = transport::local::join(group_ + "/leave/" + std::to_string(generation_), rank_, size_, timeout_, link_);
  log::info("membership: rank " + std::to_string(leaving) + " left the local group; " + std::to_string(size_) +
            " ranks, this one is rank " + std::to_string(rank_));
  return transport;
}

}  // namespace co2

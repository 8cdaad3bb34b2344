// The `local` transport: the ranks of a group are threads of one process. Messages are copied
// directly from the sender's buffer into the receiver's. A test-only link model can slow it
// down so that tests can prove that computation overlaps communication.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "transports/transport.hpp"

namespace co2::transport::local {

// Most ranks in one local group: each rank is a thread of this process, and the collectives
// above handle at most 2048 ranks (runtime/collectives/collectives.hpp). A larger size is refused
// (RendezvousError here, InvalidArgument from co2_comm_create).
constexpr int kMaxRanks = 2048;

struct LinkModel {
  // Each link has two queues, one per lane (transport::kControlLaneTag): a control message
  // waits only behind control messages, as over a transport with a separate channel for them.
  // Each directed link (sender -> receiver) carries one message at a time at this rate;
  // 0 = unlimited. Read from CO2_LOCAL_TEST_BANDWIDTH (bytes/s) when not set explicitly.
  double bytes_per_second = 0.0;
  // Added to every message. CO2_LOCAL_TEST_LATENCY_US.
  std::chrono::microseconds latency{0};

  static LinkModel from_environment();
};

// Joins (creating on first arrival) the group `group_name` as `rank` of `size`. Blocks until all
// `size` ranks have joined or `timeout` passes (RendezvousError). A group name is free again once
// every member of the group has been destroyed.
std::unique_ptr<PointToPoint> join(const std::string& group_name, int rank, int size,
                                   std::chrono::milliseconds timeout, const LinkModel& link);

}  // namespace co2::transport::local

// What the opaque C handles are. Internal: only capi/ and white-box tests include this.
#pragma once

#include <cstdint>
#include <memory>

#include "runtime/comm/comm.hpp"
#include "runtime/engine/engine.hpp"

struct co2_comm {
  std::shared_ptr<co2::Communicator> comm;
  // co2_comm_config_t.node_id this rank's communicator was made with (CO2_NODE_ID_AUTO = -1):
  // co2_comm_split_nodes' default; sub-communicators inherit it, their ranks being on the same nodes.
  int32_t node_id = -1;
};

struct co2_engine {
  std::unique_ptr<co2::Engine> engine;
};

struct co2_request {
  std::shared_ptr<co2::Request> request;
  std::shared_ptr<co2::Communicator> comm;  // keeps the progress thread alive while pending
};

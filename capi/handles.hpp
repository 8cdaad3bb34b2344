// What the opaque C handles are. Internal: only capi/ and white-box tests include this.
#pragma once

#include <memory>

#include "runtime/comm.hpp"
#include "runtime/engine.hpp"

struct co2_comm {
  std::shared_ptr<co2::Communicator> comm;
};

struct co2_engine {
  std::unique_ptr<co2::Engine> engine;
};

struct co2_request {
  std::shared_ptr<co2::Request> request;
  std::shared_ptr<co2::Communicator> comm;  // keeps the progress thread alive while pending
};

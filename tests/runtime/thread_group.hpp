// Ranks as threads of one test: a group's transports joined at once (each join blocks until all
// ranks arrived, so each runs on its own thread) and wrapped in Communicators.
#pragma once

#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "runtime/comm/comm.hpp"

namespace co2::test {

// join(rank) -> std::unique_ptr<transport::PointToPoint>; a failure on any rank is thrown here.
template <typename Join>
std::vector<std::unique_ptr<Communicator>> form_thread_group(int size, const Join& join, const CommOptions& options) {
  std::vector<std::unique_ptr<transport::PointToPoint>> transports(static_cast<size_t>(size));
  std::vector<std::string> errors(static_cast<size_t>(size));
  std::vector<std::thread> joiners;
  for (int rank = 0; rank < size; ++rank)
    joiners.emplace_back([&, rank] {
      try {
        transports[size_t(rank)] = join(rank);
      } catch (const std::exception& error) {
        errors[size_t(rank)] = error.what();
      }
    });
  for (auto& joiner : joiners) joiner.join();
  for (const std::string& error : errors)
    if (!error.empty()) throw std::runtime_error("forming the group failed: " + error);
  std::vector<std::unique_ptr<Communicator>> group;
  for (auto& transport : transports) group.push_back(std::make_unique<Communicator>(std::move(transport), options));
  return group;
}

// How a request ended within `wait`: its status and message, or not finished.
struct Outcome {
  Status status = Status::Ok;
  std::string message;
  bool finished = false;
};

inline Outcome outcome_of(const std::shared_ptr<Request>& request, std::chrono::milliseconds wait) {
  Outcome outcome;
  try {
    outcome.finished = request->wait_for(wait);
  } catch (const Error& error) {
    outcome.finished = true;
    outcome.status = error.status();
    outcome.message = error.what();
  }
  return outcome;
}

}  // namespace co2::test

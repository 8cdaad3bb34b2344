// Status codes of the runtime and the exception that carries them up to the C shims.
// Values equal the public co2_status_t values (capi static_asserts this), so the runtime does
// not depend on the public header.
#pragma once

#include <stdexcept>
#include <string>

namespace co2 {

enum class Status : int {
  Ok = 0,
  InvalidArgument = 1,
  InvalidState = 2,
  Unsupported = 3,
  InvalidConfig = 4,
  UnknownEnum = 5,
  DuplicateTensor = 6,
  OutOfMemory = 7,
  NonFinite = 20,
  LayoutMismatch = 21,
  AnchorMismatch = 22,
  CheckpointCorrupt = 23,
  CheckpointMismatch = 24,
  Callback = 25,
  Timeout = 40,
  MembershipChanged = 50,
  Left = 51,
  PeerLost = 100,
  PeerTimeout = 101,
  CollectiveMismatch = 102,
  Aborted = 103,
  Transport = 104,
  Rendezvous = 105,
  Internal = 199,
};

// Thrown inside the library; every C shim catches it and turns it into a status + message.
class Error : public std::runtime_error {
 public:
  Error(Status status, const std::string& message) : std::runtime_error(message), status_(status) {}
  Status status() const { return status_; }

 private:
  Status status_;
};

[[noreturn]] inline void fail(Status status, const std::string& message) { throw Error(status, message); }

inline void require(bool condition, Status status, const std::string& message) {
  if (!condition) fail(status, message);
}

}  // namespace co2

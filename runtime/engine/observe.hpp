// What an engine tells about its rounds besides their results (docs/observability.md): the
// overlap statistics of the collectives it waited for, the tau advisor's inputs agreed across
// ranks, the per-round log line (CO2_LOG_LEVEL) and the timeline (CO2_TRACE, runtime/base/trace.hpp).
// engine.cpp and the device path only call in here.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>

#include "runtime/comm/comm.hpp"
#include "runtime/engine/engine.hpp"

namespace co2 {

// The tau advisor's inputs of every rank are combined by an all-reduce on the control lane,
// submitted at each boundary and adopted this many boundaries later (or at finalize /
// synchronize), so that the training thread never waits for it: by then every rank has long
// passed the boundary that submitted it.
constexpr size_t kAgreementLag = 2;
// In an elastic group the agreement also carries join and leave requests, which are answered
// sooner with one boundary's lag. Waiting there costs the training thread nothing in practice:
// at boundary t+1 a rank waits for round t's average anyway, which needs every rank to have
// passed boundary t, where it submitted the agreement on the control lane before its average.
constexpr size_t kElasticAgreementLag = 1;
// At CO2_LOG_LEVEL=info the round line is written at most once per this interval (every round
// at debug), so that short rounds do not flood stderr.
constexpr std::chrono::milliseconds kRoundLogInterval{1000};

struct Observer {
  struct Agreement {
    // step ns, -all-reduce ns, 1 if not measured yet, join requests at an elastic group's door,
    // 1 + the highest rank that asked to leave (0: none) (Max)
    int64_t values[5] = {0, 0, 0, 0, 0};
    std::shared_ptr<Request> request;
  };
  std::deque<std::unique_ptr<Agreement>> agreements;  // in flight, oldest first
  uint64_t agreed_step_ns = 0;       // the slowest rank's step
  uint64_t agreed_allreduce_ns = 0;  // the shortest all-reduce over ranks
  uint32_t agreed_tau = 0;
  int64_t agreed_join_requests = 0;  // elastic: join requests every rank knows of (runtime/engine/membership_change.cpp)
  int64_t agreed_leaver = 0;         // elastic: 1 + the rank the group lets go at this boundary (0: none)

  Clock::time_point last_boundary{};
  bool boundary_seen = false;
  Clock::time_point last_line{};
  bool line_written = false;
  uint64_t rounds_since_line = 0;
};

// A collective the training thread waited for from wait_start to wait_end (equal: not waited
// for, e.g. one that completed on the device path's stream): last_collective_ns, the trace's
// wait and collective events, the debug line.
void observe_collective(Engine::State& s, const Request& request, Clock::time_point wait_start,
                        Clock::time_point wait_end);
// A small collective outside the statistics (anchor check): the trace only.
void observe_control_collective(Engine::State& s, const Request& request);
// Before the advisor learns that the caller entered the engine at `entered`: the caller's step
// (since it left the engine) on the trace. Call only with a trace.
void trace_caller_step(Engine::State& s, Clock::time_point entered);
// At the end of every boundary of co2_engine_step, on every rank (also when the boundary
// applied nothing): the round time, the advisor agreement, the round's log line.
void observe_round(Engine::State& s);
// Adopts every agreement in flight (collective: finalize, synchronize). Never throws: after a
// failed collective the advice stays as it was and the caller's next call reports the error.
void settle_agreements(Engine::State& s) noexcept;
// After a membership change, on every rank: drops the agreements still in flight in the old
// group (their executor is gone; a rank that met the failure before a boundary's adoption holds
// one that another rank already adopted) and the leave it agreed on, so that the new group's
// agreements pair up from empty. Join and leave requests are asked again at the next boundary.
void forget_agreements(Engine::State& s) noexcept;
// At engine destruction: waits for what is in flight (bounded by the communicator's timeout)
// and writes the trace.
void finish_observing(Engine::State& s) noexcept;
// The statistics as co2_engine_get_stats reports them (after the backend folded its reports).
EngineStats observed_stats(const Engine::State& s);
// observed_stats to the metrics endpoint (call only with s.metrics): at engine creation, every
// boundary and the end of finalize / synchronize.
void publish_metrics(const Engine::State& s);
// The derived fields of `out` (hidden fractions, the agreed advice, this rank's own inputs) and
// the backend's counters.
void fill_observed_stats(const Engine::State& s, EngineStats& out);

// The finalize / synchronize end: agreements settled and, for finalize, the summary line (info)
// and the trace written, however the call ends.
class RoundsSettled {
 public:
  RoundsSettled(Engine::State& s, bool finalizing) : s_(s), finalizing_(finalizing) {}
  ~RoundsSettled();
  RoundsSettled(const RoundsSettled&) = delete;
  RoundsSettled& operator=(const RoundsSettled&) = delete;

 private:
  Engine::State& s_;
  const bool finalizing_;
};

}  // namespace co2

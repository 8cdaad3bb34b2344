// The engine's timeline (CO2_TRACE): complete events ("ph": "X" of the Trace Event Format) for
// the caller's steps, boundaries, waits, passes and collectives, kept in a bounded ring and
// written as JSON that Perfetto and chrome://tracing open (docs/observability.md).
//
// An engine holds a Trace only when CO2_TRACE is set, so without it every hook is one test of a
// null pointer. Events are recorded from the training thread and from the communicator's
// progress thread (the prepare pass), hence the mutex; names are static strings, so recording
// copies no text.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace co2 {

class Trace {
 public:
  using Clock = std::chrono::steady_clock;
  // Events kept when CO2_TRACE_MAX_EVENTS is unset: the newest this many (48 bytes each).
  static constexpr size_t kDefaultMaxEvents = 200000;

  // Where the events of one rank are drawn (the "tid" of an event).
  enum class Lane : int {
    Training = 1,  // the thread that calls the engine: steps, boundaries, waits, passes
    // The communicator's progress thread: collectives whose data moves on the bulk lane (the
    // round's all-reduce), with the work it does on a result (the prepare pass) inside them...
    BulkLane = 2,
    ControlLane = 3,  // ... and the small collectives of the control lane
  };

  // From CO2_TRACE / CO2_TRACE_MAX_EVENTS: nullptr when CO2_TRACE is unset or empty. `engine`
  // is the engine's owner id on its communicator (1 for the first): later engines of one rank
  // get their own file. A path that cannot be written is reported (warn) here, and no trace
  // is kept.
  static std::unique_ptr<Trace> from_environment(int rank, uint32_t engine);

  // The file of one rank: ".rank<R>" goes before the extension of the last path component
  // ("run/trace.json" -> "run/trace.rank0.json"), or at the end when it has none; engines after
  // the first of a rank add ".engine<N>" after it.
  static std::string file_for(const std::string& path, int rank, uint32_t engine);

  Trace(std::string file, int rank, size_t max_events);

  // One complete event [from, to] on `lane`, with one numeric argument when arg_name is set.
  void span(Lane lane, const char* name, Clock::time_point from, Clock::time_point to,
            const char* arg_name = nullptr, uint64_t arg = 0);

  // Writes every kept event (oldest first) to the file, replacing it. Returns false and warns
  // when it cannot be written.
  bool write() const;

  const std::string& file() const { return file_; }
  size_t kept() const;
  uint64_t dropped() const;

 private:
  struct Event {
    const char* name;
    const char* arg_name;
    int64_t start_ns;  // steady clock since its epoch (boot on Linux: comparable across ranks)
    int64_t duration_ns;
    uint64_t arg;
    Lane lane;
  };

  const std::string file_;
  const int rank_;
  const size_t max_events_;
  mutable std::mutex mutex_;
  std::vector<Event> ring_;  // grows to max_events_, then wraps at next_
  size_t next_ = 0;
  uint64_t dropped_ = 0;
};

// Records [start, end of scope) on the training lane when there is a trace; otherwise nothing.
class TraceSpan {
 public:
  TraceSpan(Trace* trace, const char* name, const char* arg_name = nullptr, uint64_t arg = 0)
      : trace_(trace), name_(name), arg_name_(arg_name), arg_(arg) {
    if (trace_) start_ = Trace::Clock::now();
  }
  ~TraceSpan() {
    if (trace_) trace_->span(Trace::Lane::Training, name_, start_, Trace::Clock::now(), arg_name_, arg_);
  }
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;

 private:
  Trace* const trace_;
  const char* const name_;
  const char* const arg_name_;
  const uint64_t arg_;
  Trace::Clock::time_point start_{};
};

}  // namespace co2

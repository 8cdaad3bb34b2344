#include "runtime/engine/observe.hpp"

#include <algorithm>
#include <cstdio>
#include <iterator>
#include <string>

#include "runtime/engine/engine_state.hpp"
#include "runtime/base/log.hpp"

namespace co2 {

namespace {

uint64_t ns_between(Clock::time_point from, Clock::time_point to) {
  return to > from ? uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(to - from).count()) : 0;
}

// 1 - waited / collective, in [0, 1]; 0 before anything was measured.
double hidden(uint64_t waited_ns, uint64_t collective_ns) {
  if (collective_ns == 0) return 0.0;
  return std::clamp(1.0 - double(waited_ns) / double(collective_ns), 0.0, 1.0);
}

// Trace names are static strings: one per purpose.
const char* wait_name(Purpose purpose) {
  switch (purpose) {
    case Purpose::User: return "wait user";
    case Purpose::OuterAverage: return "wait outer-average";
    case Purpose::ParameterAverage: return "wait parameter-average";
    case Purpose::Consensus: return "wait consensus";
    case Purpose::AnchorCheck: return "wait anchor-check";
    case Purpose::LayoutHash: return "wait layout-hash";
    case Purpose::InitialBroadcast: return "wait initial-broadcast";
    case Purpose::GradientAverage: return "wait gradient-average";
    case Purpose::Split: return "wait split";
    case Purpose::AdvisorAgreement: return "wait advisor-agreement";
    case Purpose::Membership: return "wait membership";
  }
  return "wait";
}

void trace_collective(Engine::State& s, const Request& request) {
  s.trace->span(request.control_lane() ? Trace::Lane::ControlLane : Trace::Lane::BulkLane,
                purpose_name(request.purpose()), request.submitted_at(), request.completed_at(), "bytes",
                request.bytes());
}

std::string ms(uint64_t ns) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f ms", double(ns) / 1e6);
  return text;
}

std::string percent(double fraction) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f%%", 100.0 * fraction);
  return text;
}

std::string rank_prefix(const Engine::State& s) {
  std::string prefix = "rank " + std::to_string(s.comm->rank());
  if (s.owner > 1) prefix += " engine " + std::to_string(s.owner);
  return prefix;
}

void adopt(Engine::State& s, const Observer::Agreement& a) {
  Observer& o = s.observer;
  o.agreed_join_requests = std::max(o.agreed_join_requests, a.values[3]);
  o.agreed_leaver = std::max(o.agreed_leaver, a.values[4]);
  if (a.values[2] != 0) {  // some rank has not measured both yet
    o.agreed_step_ns = o.agreed_allreduce_ns = 0;
    o.agreed_tau = 0;
    return;
  }
  o.agreed_step_ns = uint64_t(a.values[0]);
  o.agreed_allreduce_ns = uint64_t(-a.values[1]);
  o.agreed_tau = TauAdvisor::advise(o.agreed_step_ns, o.agreed_allreduce_ns);
  if (log::enabled(log::Level::Debug))
    log::debug(rank_prefix(s) + ": the ranks agreed on step " + ms(o.agreed_step_ns) + " (slowest rank), all-reduce " +
               ms(o.agreed_allreduce_ns) + " (shortest), advised tau " + std::to_string(o.agreed_tau));
}

// Waits for the oldest agreement in flight and adopts it; throws the collective's error.
void adopt_oldest(Engine::State& s) {
  std::unique_ptr<Observer::Agreement> a = std::move(s.observer.agreements.front());
  s.observer.agreements.pop_front();
  if (a->request->wait_status() != Status::Ok) fail(s.comm->error_status(), s.comm->error_message());
  if (s.trace) trace_collective(s, *a->request);
  adopt(s, *a);
}

void submit_agreement(Engine::State& s) {
  auto a = std::make_unique<Observer::Agreement>();
  // One Max all-reduce carries them all: the slowest step, the shortest all-reduce (negated),
  // whether any rank lacks a measurement, and an elastic group's join and leave requests. The
  // all-reduce seen by the rank that arrives last at a boundary is the transfer itself; on the
  // others it includes their wait for that rank, which a longer tau would not hide.
  const bool measured = s.advisor.measured();
  a->values[0] = measured ? int64_t(s.advisor.step_ns()) : 0;
  a->values[1] = measured ? -int64_t(s.advisor.allreduce_ns()) : 0;
  a->values[2] = measured ? 0 : 1;
  // The door's count travels with the advice, so every rank learns it at the same boundary.
  a->values[3] = s.comm->join_requests();
  a->values[4] = s.leave_requested ? s.comm->rank() + 1 : 0;
  a->request = s.comm->allreduce(a->values, std::size(a->values), DataType::I64, ReduceOp::Max,
                                 s.id(Purpose::AdvisorAgreement));
  s.observer.agreements.push_back(std::move(a));
}

std::string advice(const Observer& o) {
  return "advised tau " + (o.agreed_tau ? std::to_string(o.agreed_tau) : std::string("-"));
}

// "rank 0 round 12 step 144: boundary wait 0.31 ms, all-reduce 12.10 ms, hidden 97.4% (run
// 96.0%), round 40.20 ms, advised tau 3": the last collective waited for, and the run so far.
// At info: from the first round that waited for one, then at most one line per
// kRoundLogInterval; at debug: every round.
void log_round(Engine::State& s, Clock::time_point now) {
  Observer& o = s.observer;
  const EngineStats& st = s.stats;
  ++o.rounds_since_line;
  const bool debug = log::enabled(log::Level::Debug);
  if (!debug && (!log::enabled(log::Level::Info) || st.last_collective_ns == 0 ||
                 (o.line_written && now - o.last_line < kRoundLogInterval)))
    return;
  std::string line = rank_prefix(s) + " round " + std::to_string(st.rounds) + " step " + std::to_string(st.steps) + ":";
  if (st.last_collective_ns > 0)
    line += " boundary wait " + ms(st.last_boundary_wait_ns) + ", all-reduce " + ms(st.last_collective_ns) +
            ", hidden " + percent(hidden(st.last_boundary_wait_ns, st.last_collective_ns)) + " (run " +
            percent(hidden(st.boundary_wait_ns, st.collective_ns)) + ")";
  else
    line += " no all-reduce waited for yet";
  if (st.last_round_ns > 0) line += ", round " + ms(st.last_round_ns);
  line += ", " + advice(o);
  if (o.line_written && o.rounds_since_line > 1)
    line += " (" + std::to_string(o.rounds_since_line) + " rounds since the last line)";
  log::write(debug ? log::Level::Debug : log::Level::Info, line);
  o.line_written = true;
  o.last_line = now;
  o.rounds_since_line = 0;
}

// At finalize, at info: the whole run in one line.
void log_summary(Engine::State& s) {
  if (!log::enabled(log::Level::Info)) return;
  const EngineStats& st = s.stats;
  log::info(rank_prefix(s) + " finalized after " + std::to_string(st.rounds) + " rounds, " +
            std::to_string(st.steps) + " steps: waited " + ms(st.boundary_wait_ns) + " for " +
            ms(st.collective_ns) + " of collectives, hidden " + percent(hidden(st.boundary_wait_ns, st.collective_ns)) +
            ", " + advice(s.observer));
}

}  // namespace

void observe_collective(Engine::State& s, const Request& request, Clock::time_point wait_start,
                        Clock::time_point wait_end) {
  const uint64_t collective = ns_between(request.submitted_at(), request.completed_at());
  s.stats.last_collective_ns = collective;
  if (wait_end <= wait_start) s.stats.last_boundary_wait_ns = 0;
  if (s.trace) {
    trace_collective(s, request);
    if (wait_end > wait_start) s.trace->span(Trace::Lane::Training, wait_name(request.purpose()), wait_start, wait_end);
  }
  if (log::enabled(log::Level::Debug))
    log::debug(rank_prefix(s) + ": " + purpose_name(request.purpose()) + " of " + std::to_string(request.bytes()) +
               " bytes: " + ms(collective) + " submit to completion, waited " +
               ms(ns_between(wait_start, wait_end)));
}

void observe_control_collective(Engine::State& s, const Request& request) {
  if (s.trace) trace_collective(s, request);
}

void trace_caller_step(Engine::State& s, Clock::time_point entered) {
  Clock::time_point left;
  if (s.advisor.outside_since(&left)) s.trace->span(Trace::Lane::Training, "step", left, entered, "step", s.stats.steps + 1);
}

void observe_round(Engine::State& s) {
  const Clock::time_point now = Clock::now();
  Observer& o = s.observer;
  if (o.boundary_seen) s.stats.last_round_ns = ns_between(o.last_boundary, now);
  o.last_boundary = now;
  o.boundary_seen = true;
  submit_agreement(s);
  const size_t lag = s.comm->elastic() ? kElasticAgreementLag : kAgreementLag;
  while (o.agreements.size() > lag) adopt_oldest(s);
  log_round(s, now);
  if (s.metrics) publish_metrics(s);
}

void settle_agreements(Engine::State& s) noexcept {
  try {
    while (!s.observer.agreements.empty()) adopt_oldest(s);
  } catch (...) {
    // The communicator failed: what is left in flight completes with its error.
    for (auto& a : s.observer.agreements) a->request->wait_status();
    s.observer.agreements.clear();
  }
}

void forget_agreements(Engine::State& s) noexcept {
  s.observer.agreements.clear();
  s.observer.agreed_leaver = 0;
}

void finish_observing(Engine::State& s) noexcept {
  for (auto& a : s.observer.agreements) a->request->wait_status();
  s.observer.agreements.clear();
  try {
    if (s.trace) s.trace->write();
  } catch (...) {  // out of memory while gathering the events: no trace rather than no exit
  }
}

void fill_observed_stats(const Engine::State& s, EngineStats& out) {
  out.bytes_reduced = s.counters.bytes_reduced;
  out.wire_bytes_last_round = s.counters.wire_bytes_last_round;
  out.wire_bytes_total = s.counters.wire_bytes_total;
  out.outer_state_bytes = s.counters.outer_state_bytes;
  out.rank_step_time_ns = s.advisor.step_ns();
  out.rank_allreduce_time_ns = s.advisor.allreduce_ns();
  out.step_time_ns = s.observer.agreed_step_ns;
  out.allreduce_time_ns = s.observer.agreed_allreduce_ns;
  out.advised_tau = s.observer.agreed_tau;
  out.hidden_fraction = hidden(out.boundary_wait_ns, out.collective_ns);
  out.last_hidden_fraction = hidden(out.last_boundary_wait_ns, out.last_collective_ns);
}

EngineStats observed_stats(const Engine::State& s) {
  EngineStats out = s.stats;
  fill_observed_stats(s, out);
  return out;
}

void publish_metrics(const Engine::State& s) { s.metrics->series().publish(observed_stats(s), s.config.tau); }

RoundsSettled::~RoundsSettled() {
  settle_agreements(s_);
  if (s_.metrics) publish_metrics(s_);
  if (!finalizing_) return;
  try {
    log_summary(s_);
    if (s_.trace) s_.trace->write();
  } catch (...) {  // out of memory while formatting or gathering the events: nothing to report
  }
}

}  // namespace co2

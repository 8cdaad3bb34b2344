#include "runtime/engine/arrival.hpp"

#include <algorithm>

#include "runtime/engine/observe.hpp"

namespace co2 {

namespace {

// Waits for the exchange in flight, if any, and returns the latest arrival step of all ranks.
int64_t finish_exchange(Engine::State& s) {
  ArrivalAgreement& g = s.arrival;
  if (!g.exchange) return g.value;
  auto request = std::move(g.exchange);
  g.exchange.reset();
  if (request->wait_status() != Status::Ok) fail(s.comm->error_status(), s.comm->error_message());
  observe_control_collective(s, *request);
  return g.value;
}

// One step after the latest rank saw the average: by then every rank has seen it.
uint32_t step_after(int64_t latest) { return uint32_t(std::min<int64_t>(latest + 1, kArrivedAtBoundary)); }

void announce(Engine::State& s, uint32_t step) {
  ArrivalAgreement& g = s.arrival;
  finish_exchange(s);  // the previous average's: every rank announced it before taking it
  g.value = step;
  g.exchange = s.comm->allreduce(&g.value, 1, DataType::I64, ReduceOp::Max, s.id(Purpose::ArrivalStep));
  g.announced = true;
  g.announced_step = step;
}

}  // namespace

bool applies_on_arrival(const Engine::State& s) {
  return s.config.apply_step != kApplyAtBoundary && s.config.algorithm == Algorithm::Co2;
}

void begin_arrival_round(Engine::State& s) {
  ArrivalAgreement& g = s.arrival;
  g.announced = false;
  g.announced_step = 0;
  g.apply_at = s.config.apply_step > 0 ? uint32_t(s.config.apply_step) : 0;
}

bool arrival_step_due(Engine::State& s) {
  ArrivalAgreement& g = s.arrival;
  const uint32_t step = s.steps_in_round;
  if (s.config.apply_step == kApplyOnArrival) {
    // finished() is one atomic load: a step that finds nothing new costs no more.
    if (!g.announced && (!s.pending || s.pending->finished())) announce(s, step);
    // From the step after its own announcement on, a rank must know whether this is the step.
    if (g.announced && g.apply_at == 0 && step > g.announced_step) g.apply_at = step_after(finish_exchange(s));
  }
  return g.apply_at == step;
}

void settle_arrival(Engine::State& s, uint32_t step, bool agree) {
  if (s.config.apply_step != kApplyOnArrival || s.config.algorithm != Algorithm::Co2) return;
  ArrivalAgreement& g = s.arrival;
  if (!g.announced) announce(s, step);
  if (agree && g.apply_at == 0) g.apply_at = step_after(finish_exchange(s));
  if (agree) finish_exchange(s);
}

void drain_arrival(Engine::State& s) noexcept {
  if (s.arrival.exchange) s.arrival.exchange->wait_status();
}

}  // namespace co2

// The Prometheus endpoint (CO2_METRICS_PORT; docs/observability.md, "Metrics"): every engine of
// a process publishes its statistics as one series per metric, labelled by its rank, on the
// process's one HTTP endpoint, which Prometheus scrapes at /metrics. Opt-in: without
// CO2_METRICS_PORT an engine holds no Metrics and every hook is one test of a null pointer.
//
// The statistics are written by the training thread and read by the endpoint's threads, so an
// engine publishes a copy (under a mutex) at every boundary and at finalize / synchronize, and
// its step count (an atomic) at every step.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "runtime/engine/engine.hpp"

namespace co2 {

// Where the endpoint listens: CO2_METRICS_PORT = "[host:]port"; the process listens on
// port + its launcher's local rank, so that the ranks of one host get one port each (port 0:
// any free port, which the info log line names).
struct MetricsAddress {
  std::string host = "0.0.0.0";  // every IPv4 address unless the variable names one (IPv4 only)
  int port = 0;
  std::string text() const { return host + ":" + std::to_string(port); }
};

// Parses the value of CO2_METRICS_PORT; throws Error(InvalidArgument) naming the variable, the
// value and what to write instead.
MetricsAddress parse_metrics_address(const std::string& value, int local_rank);

// What one engine last published.
struct MetricsSnapshot {
  EngineStats stats;  // as co2_engine_get_stats reports them (observed_stats)
  uint32_t tau = 0;   // the configured tau (the round in progress may still run the old one)
};

enum class MetricKind { Counter, Gauge };

// One metric of the exposition: its name by Prometheus conventions (base units, _total for
// counters) and how to read it from a snapshot. The one list of what is exported.
struct MetricDefinition {
  const char* name;
  MetricKind kind;
  const char* help;
  double (*value)(const MetricsSnapshot&);
};
const std::vector<MetricDefinition>& metric_definitions();

// One engine's series: its labels and what it last published. Shared between the engine and
// the endpoint, which reads it from its own threads.
class MetricsSeries {
 public:
  using Labels = std::vector<std::pair<std::string, std::string>>;
  MetricsSeries(int rank, uint32_t engine);

  void publish(const EngineStats& stats, uint32_t tau);        // training thread
  void count_step(uint64_t steps) { steps_.store(steps, std::memory_order_relaxed); }
  MetricsSnapshot snapshot() const;                            // any thread
  const Labels& labels() const { return labels_; }

 private:
  const Labels labels_;
  mutable std::mutex mutex_;
  MetricsSnapshot published_;
  std::atomic<uint64_t> steps_{0};
};

// An engine's membership of the process's endpoint: its series leaves the endpoint when this
// is destroyed.
class Metrics {
 public:
  // nullptr when CO2_METRICS_PORT is unset or empty. Otherwise starts the process's endpoint
  // at the first call (later engines join it) and adds this engine's series. Throws
  // Error(InvalidArgument) for a malformed value or a port that cannot be listened on, and
  // Error(Unsupported) in a build without prometheus-cpp.
  static std::unique_ptr<Metrics> from_environment(int rank, uint32_t engine);

  explicit Metrics(std::shared_ptr<MetricsSeries> series) : series_(std::move(series)) {}
  ~Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  MetricsSeries& series() { return *series_; }

 private:
  std::shared_ptr<MetricsSeries> series_;
};

// The process's endpoint, implemented over prometheus-cpp (runtime/engine/metrics_prometheus.cpp) or,
// in builds without it, refusing (runtime/engine/metrics_unavailable.cpp).
namespace metrics_endpoint {
// Starts the endpoint at `address` unless it runs already, then adds `series`. Returns the
// address it listens on (the bound port when `address.port` is 0). `variable` is the setting
// as the user wrote it, for messages.
MetricsAddress add(const std::shared_ptr<MetricsSeries>& series, const MetricsAddress& address,
                   const std::string& variable);
void remove(const MetricsSeries* series) noexcept;
}  // namespace metrics_endpoint

}  // namespace co2

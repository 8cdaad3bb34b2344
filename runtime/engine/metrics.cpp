#include "runtime/engine/metrics.hpp"

#include <arpa/inet.h>

#include <cstdlib>

#include "runtime/base/status.hpp"
#include "rendezvous/launch_environment.hpp"

namespace co2 {

namespace {

constexpr const char* kVariable = "CO2_METRICS_PORT";
constexpr int kMaxPort = 65535;

double seconds(uint64_t ns) { return double(ns) / 1e9; }

[[noreturn]] void bad_value(const std::string& value, const std::string& why) {
  fail(Status::InvalidArgument, std::string(kVariable) + "=" + value + ": " + why +
                                    "; write a port (9400) or an address and a port (127.0.0.1:9400), "
                                    "or unset it to run without the metrics endpoint");
}

bool ipv4_address(const std::string& host) {
  unsigned char buffer[4];
  return inet_pton(AF_INET, host.c_str(), buffer) == 1;
}

}  // namespace

MetricsAddress parse_metrics_address(const std::string& value, int local_rank) {
  MetricsAddress address;
  std::string port = value;
  const size_t colon = value.find_last_of(':');
  if (colon != std::string::npos) {
    address.host = value.substr(0, colon);
    port = value.substr(colon + 1);
    // Debian's civetweb listens on IPv4 only: an IPv6 address would fail later, less clearly.
    if (!ipv4_address(address.host))
      bad_value(value, "'" + address.host + "' is not a numeric IPv4 address (no host names; IPv6 is not supported)");
  }
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos)
    bad_value(value, "'" + port + "' is not a port number (0 to " + std::to_string(kMaxPort) + ")");
  const int base = std::atoi(port.c_str());
  if (base > kMaxPort) bad_value(value, "port " + port + " is above " + std::to_string(kMaxPort));
  // Port 0 asks the system for any free port, which is different for every process anyway.
  address.port = base == 0 ? 0 : base + local_rank;
  if (address.port > kMaxPort)
    bad_value(value, "port " + port + " + local rank " + std::to_string(local_rank) + " is above " +
                         std::to_string(kMaxPort) + " (each rank of a host listens on the port plus its local rank)");
  return address;
}

const std::vector<MetricDefinition>& metric_definitions() {
  using K = MetricKind;
  using S = MetricsSnapshot;
  static const std::vector<MetricDefinition> definitions = {
      {"co2_steps_total", K::Counter, "Training steps counted by the engine (co2_engine_step calls).",
       [](const S& s) { return double(s.stats.steps); }},
      {"co2_rounds_total", K::Counter, "Round boundaries (every tau steps).",
       [](const S& s) { return double(s.stats.rounds); }},
      {"co2_outer_updates_total", K::Counter, "Outer updates applied to the anchor.",
       [](const S& s) { return double(s.stats.outer_updates); }},
      {"co2_boundary_wait_seconds_total", K::Counter,
       "Time the training thread waited for collectives (the part of them that the steps did not hide).",
       [](const S& s) { return seconds(s.stats.boundary_wait_ns); }},
      {"co2_collective_seconds_total", K::Counter,
       "Submit-to-completion time of the collectives the training thread waited for (round all-reduces, "
       "blocking averages, gradient averages).",
       [](const S& s) { return seconds(s.stats.collective_ns); }},
      {"co2_reduced_bytes_total", K::Counter, "Bytes of fp32 state this rank put into averages (before the wire format).",
       [](const S& s) { return double(s.stats.bytes_reduced); }},
      {"co2_wire_sent_bytes_total", K::Counter, "Bytes this rank sent on the wire for the outer all-reduce.",
       [](const S& s) { return double(s.stats.wire_bytes_total); }},
      {"co2_nonfinite_rounds_total", K::Counter,
       "Boundaries that applied nothing because the arriving average held NaN or Inf.",
       [](const S& s) { return double(s.stats.nonfinite_rounds); }},
      {"co2_nonfinite_local_total", K::Counter, "Rounds whose local delta on this rank held NaN or Inf.",
       [](const S& s) { return double(s.stats.nonfinite_local); }},
      {"co2_anchor_checks_total", K::Counter, "Anchor checksum comparisons across the ranks (all passed).",
       [](const S& s) { return double(s.stats.anchor_checks); }},
      {"co2_hidden_ratio", K::Gauge,
       "Share of the collectives' time during which the training thread did not wait, over the run (1 = fully hidden).",
       [](const S& s) { return s.stats.hidden_fraction; }},
      {"co2_last_hidden_ratio", K::Gauge, "The same for the last collective waited for.",
       [](const S& s) { return s.stats.last_hidden_fraction; }},
      {"co2_last_boundary_wait_seconds", K::Gauge, "How long the training thread waited for the last collective.",
       [](const S& s) { return seconds(s.stats.last_boundary_wait_ns); }},
      {"co2_last_collective_seconds", K::Gauge, "Submit to completion of the last collective waited for.",
       [](const S& s) { return seconds(s.stats.last_collective_ns); }},
      {"co2_last_round_seconds", K::Gauge, "Wall time between the last two boundaries.",
       [](const S& s) { return seconds(s.stats.last_round_ns); }},
      {"co2_tau", K::Gauge, "Local steps per round (as configured; a change takes effect at the next boundary).",
       [](const S& s) { return double(s.tau); }},
      {"co2_advised_tau", K::Gauge,
       "The smallest tau that would hide the all-reduce, agreed by the ranks (0 until measured).",
       [](const S& s) { return double(s.stats.advised_tau); }},
      {"co2_step_seconds", K::Gauge, "Mean step time of the slowest rank (the advisor's input, agreed).",
       [](const S& s) { return seconds(s.stats.step_time_ns); }},
      {"co2_allreduce_seconds", K::Gauge, "Shortest mean all-reduce time over the ranks (the advisor's input, agreed).",
       [](const S& s) { return seconds(s.stats.allreduce_time_ns); }},
      {"co2_rank_step_seconds", K::Gauge, "This rank's own mean step time.",
       [](const S& s) { return seconds(s.stats.rank_step_time_ns); }},
      {"co2_rank_allreduce_seconds", K::Gauge, "This rank's own mean all-reduce time.",
       [](const S& s) { return seconds(s.stats.rank_allreduce_time_ns); }},
      {"co2_world_size", K::Gauge, "Ranks of the engine's communicator.",
       [](const S& s) { return double(s.stats.world_size); }},
      {"co2_outer_momentum", K::Gauge, "The outer momentum beta in use (resolved from the participants when automatic).",
       [](const S& s) { return s.stats.resolved_outer_momentum; }},
      {"co2_outer_state_bytes", K::Gauge, "Bytes of outer state this rank's engine holds.",
       [](const S& s) { return double(s.stats.outer_state_bytes); }},
  };
  return definitions;
}

MetricsSeries::MetricsSeries(int rank, uint32_t engine)
    : labels_(engine > 1 ? Labels{{"rank", std::to_string(rank)}, {"engine", std::to_string(engine)}}
                         : Labels{{"rank", std::to_string(rank)}}) {}

void MetricsSeries::publish(const EngineStats& stats, uint32_t tau) {
  std::lock_guard<std::mutex> lock(mutex_);
  published_.stats = stats;
  published_.tau = tau;
  steps_.store(stats.steps, std::memory_order_relaxed);
}

MetricsSnapshot MetricsSeries::snapshot() const {
  MetricsSnapshot out;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    out = published_;
  }
  // The step count moves between boundaries; never behind the published statistics.
  const uint64_t steps = steps_.load(std::memory_order_relaxed);
  if (steps > out.stats.steps) out.stats.steps = steps;
  return out;
}

std::unique_ptr<Metrics> Metrics::from_environment(int rank, uint32_t engine) {
  const char* text = std::getenv(kVariable);
  if (!text || !*text) return nullptr;
  const int local_rank = store::read_launch_environment().local_rank;
  const MetricsAddress wanted = parse_metrics_address(text, local_rank);
  auto series = std::make_shared<MetricsSeries>(rank, engine);
  metrics_endpoint::add(series, wanted, std::string(kVariable) + "=" + text + ", local rank " +
                                            std::to_string(local_rank));
  return std::make_unique<Metrics>(std::move(series));
}

Metrics::~Metrics() { metrics_endpoint::remove(series_.get()); }

}  // namespace co2

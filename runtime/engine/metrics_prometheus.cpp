// The process's metrics endpoint over prometheus-cpp's Exposer (civetweb): one HTTP server per
// process, serving the series of every engine that joined it at /metrics.
#include <prometheus/collectable.h>
#include <prometheus/exposer.h>
#include <prometheus/metric_family.h>

#include <algorithm>
#include <exception>

#include "runtime/base/log.hpp"
#include "runtime/engine/metrics.hpp"
#include "runtime/base/status.hpp"

namespace co2::metrics_endpoint {

namespace {

// Scrapes run on the Exposer's threads: the list of series is copied under the mutex, and each
// series hands out a copy of what its engine published.
class Collector : public prometheus::Collectable {
 public:
  std::vector<prometheus::MetricFamily> Collect() const override {
    std::vector<std::shared_ptr<MetricsSeries>> series;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      series = series_;
    }
    std::vector<MetricsSnapshot> snapshots;
    snapshots.reserve(series.size());
    for (const auto& one : series) snapshots.push_back(one->snapshot());
    std::vector<prometheus::MetricFamily> families;
    for (const MetricDefinition& definition : metric_definitions()) {
      prometheus::MetricFamily family;
      family.name = definition.name;
      family.help = definition.help;
      family.type = definition.kind == MetricKind::Counter ? prometheus::MetricType::Counter
                                                           : prometheus::MetricType::Gauge;
      for (size_t i = 0; i < series.size(); ++i) {
        prometheus::ClientMetric metric;
        for (const auto& [name, value] : series[i]->labels()) metric.label.push_back({name, value});
        const double value = definition.value(snapshots[i]);
        if (definition.kind == MetricKind::Counter)
          metric.counter.value = value;
        else
          metric.gauge.value = value;
        family.metric.push_back(std::move(metric));
      }
      families.push_back(std::move(family));
    }
    return families;
  }

  void add(std::shared_ptr<MetricsSeries> series) {
    std::lock_guard<std::mutex> lock(mutex_);
    series_.push_back(std::move(series));
  }

  void remove(const MetricsSeries* series) {
    std::lock_guard<std::mutex> lock(mutex_);
    series_.erase(std::remove_if(series_.begin(), series_.end(),
                                 [series](const std::shared_ptr<MetricsSeries>& s) { return s.get() == series; }),
                  series_.end());
  }

 private:
  mutable std::mutex mutex_;
  std::vector<std::shared_ptr<MetricsSeries>> series_;
};

struct Endpoint {
  std::mutex mutex;
  std::shared_ptr<Collector> collector = std::make_shared<Collector>();
  std::unique_ptr<prometheus::Exposer> exposer;
  MetricsAddress bound;
  bool told_ignored = false;
};

// Never destroyed, so that an engine destroyed during static destruction can still leave it;
// the HTTP server itself stops at exit (ServerStop), before the process tears down what a
// scrape in progress might touch.
Endpoint& endpoint() {
  static Endpoint* the = new Endpoint;
  return *the;
}

struct ServerStop {
  ~ServerStop() {
    Endpoint& e = endpoint();
    std::lock_guard<std::mutex> lock(e.mutex);
    e.exposer.reset();
  }
};

}  // namespace

MetricsAddress add(const std::shared_ptr<MetricsSeries>& series, const MetricsAddress& address,
                   const std::string& variable) {
  static ServerStop stop_at_exit;
  Endpoint& e = endpoint();
  std::lock_guard<std::mutex> lock(e.mutex);
  if (!e.exposer) {
    try {
      e.exposer = std::make_unique<prometheus::Exposer>(address.text(), /*num_threads=*/2);
    } catch (const std::exception&) {  // civetweb says only "null context ... binding to port"
      fail(Status::InvalidArgument,
           variable + ": cannot listen on " + address.text() +
               " (the port is in use, e.g. by another job's rank, or the address is not one of this "
               "host): set CO2_METRICS_PORT to a free port (0: any free port, named in the info log), "
               "or unset it to run without the metrics endpoint");
    }
    const std::vector<int> ports = e.exposer->GetListeningPorts();
    e.bound = address;
    if (!ports.empty()) e.bound.port = ports.front();
    e.exposer->RegisterCollectable(e.collector);
    log::info("metrics for Prometheus at http://" + e.bound.text() + "/metrics (" + variable + ")");
  } else if (address.port != 0 && (address.port != e.bound.port || address.host != e.bound.host) &&
             !e.told_ignored) {
    e.told_ignored = true;
    log::warn(variable + ": this process already serves its metrics at http://" + e.bound.text() +
              "/metrics (set by its first engine); later engines join that endpoint");
  }
  e.collector->add(series);
  return e.bound;
}

void remove(const MetricsSeries* series) noexcept {
  Endpoint& e = endpoint();
  std::lock_guard<std::mutex> lock(e.mutex);
  e.collector->remove(series);
}

}  // namespace co2::metrics_endpoint

// The metrics endpoint in builds without prometheus-cpp (meson option `metrics`): asking for it
// is an error rather than a run that silently exports nothing.
#include "runtime/engine/metrics.hpp"
#include "runtime/base/status.hpp"

namespace co2::metrics_endpoint {

MetricsAddress add(const std::shared_ptr<MetricsSeries>&, const MetricsAddress&, const std::string& variable) {
  fail(Status::Unsupported, variable +
                                ": this libco2 was built without the Prometheus endpoint (prometheus-cpp was "
                                "not found): install prometheus-cpp-dev (Debian) and rebuild, or unset "
                                "CO2_METRICS_PORT");
}

void remove(const MetricsSeries*) noexcept {}

}  // namespace co2::metrics_endpoint

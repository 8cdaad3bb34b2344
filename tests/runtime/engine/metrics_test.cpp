// The metrics endpoint inside one process (runtime/engine/metrics.hpp): CO2_METRICS_PORT's parsing,
// and a real HTTP scrape of the process's endpoint as series come and go (several ranks of one
// process, a rank's second engine). The multi-process run is tests/capi/multiprocess/metrics_test.py.
#include "runtime/engine/metrics.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "runtime/base/status.hpp"

namespace co2 {
namespace {

// GET /metrics over a plain socket: the whole response, headers included.
std::string scrape(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  EXPECT_GE(fd, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(uint16_t(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  const std::string request = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  EXPECT_EQ(::send(fd, request.data(), request.size(), MSG_NOSIGNAL), ssize_t(request.size()));
  std::string response;
  char buffer[4096];
  for (ssize_t n; (n = ::recv(fd, buffer, sizeof buffer, 0)) > 0;) response.append(buffer, size_t(n));
  ::close(fd);
  return response;
}

Status status_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const Error& e) {
    return e.status();
  }
  return Status::Ok;
}

std::string message_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(MetricsAddress, PortPlusLocalRank) {
  EXPECT_EQ(parse_metrics_address("9400", 0).text(), "0.0.0.0:9400");
  EXPECT_EQ(parse_metrics_address("9400", 3).text(), "0.0.0.0:9403");
  EXPECT_EQ(parse_metrics_address("127.0.0.1:9400", 1).text(), "127.0.0.1:9401");
  EXPECT_EQ(parse_metrics_address("0", 5).port, 0);  // any free port, whatever the local rank
}

TEST(MetricsAddress, BadValuesNameTheVariableAndTheFix) {
  for (const char* value : {"", "abc", "-1", "94OO", "65536", "123456", "localhost:9400", ":9400", "1.2.3:9400",
                            "[::1]:9400"}) {
    SCOPED_TRACE(value);
    EXPECT_EQ(status_of([&] { parse_metrics_address(value, 0); }), Status::InvalidArgument);
    const std::string message = message_of([&] { parse_metrics_address(value, 0); });
    EXPECT_NE(message.find(std::string("CO2_METRICS_PORT=") + value + ":"), std::string::npos) << message;
    EXPECT_NE(message.find("unset it"), std::string::npos) << message;
  }
  EXPECT_NE(message_of([] { parse_metrics_address("65534", 2); }).find("port 65534 + local rank 2 is above 65535"),
            std::string::npos);
}

TEST(MetricsEndpoint, ServesEverySeriesOfTheProcessUntilItLeaves) {
  auto rank0 = std::make_shared<MetricsSeries>(0, 1);
  auto rank1 = std::make_shared<MetricsSeries>(1, 1);
  auto second = std::make_shared<MetricsSeries>(0, 2);  // rank 0's second engine
  MetricsAddress any;
  any.host = "127.0.0.1";
  const MetricsAddress bound = metrics_endpoint::add(rank0, any, "test");
  ASSERT_GT(bound.port, 0);
  // Later series join the running endpoint, whatever they ask for.
  EXPECT_EQ(metrics_endpoint::add(rank1, any, "test").port, bound.port);
  EXPECT_EQ(metrics_endpoint::add(second, any, "test").port, bound.port);

  EngineStats stats;
  stats.steps = 36;
  stats.rounds = 12;
  stats.boundary_wait_ns = 1500000000;
  stats.world_size = 2;
  rank1->publish(stats, 3);
  rank0->count_step(5);  // between boundaries only the step count moves

  std::string text = scrape(bound.port);
  EXPECT_NE(text.find("200 OK"), std::string::npos) << text;
  EXPECT_NE(text.find("# TYPE co2_steps_total counter"), std::string::npos) << text;
  EXPECT_NE(text.find("# TYPE co2_hidden_ratio gauge"), std::string::npos) << text;
  EXPECT_NE(text.find("co2_steps_total{rank=\"1\"} 36\n"), std::string::npos) << text;
  EXPECT_NE(text.find("co2_rounds_total{rank=\"1\"} 12\n"), std::string::npos) << text;
  EXPECT_NE(text.find("co2_boundary_wait_seconds_total{rank=\"1\"} 1.5\n"), std::string::npos) << text;
  EXPECT_NE(text.find("co2_tau{rank=\"1\"} 3\n"), std::string::npos) << text;
  EXPECT_NE(text.find("co2_steps_total{rank=\"0\"} 5\n"), std::string::npos) << text;
  EXPECT_NE(text.find("co2_steps_total{rank=\"0\",engine=\"2\"} 0\n"), std::string::npos) << text;
  for (const MetricDefinition& definition : metric_definitions())
    EXPECT_NE(text.find(std::string("# HELP ") + definition.name + " "), std::string::npos) << definition.name;

  metrics_endpoint::remove(rank1.get());
  metrics_endpoint::remove(second.get());
  text = scrape(bound.port);
  EXPECT_EQ(text.find("rank=\"1\""), std::string::npos) << text;
  EXPECT_EQ(text.find("engine=\"2\""), std::string::npos) << text;
  EXPECT_NE(text.find("co2_steps_total{rank=\"0\"} 5\n"), std::string::npos) << text;
  metrics_endpoint::remove(rank0.get());
}

}  // namespace
}  // namespace co2

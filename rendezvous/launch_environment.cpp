#include "rendezvous/launch_environment.hpp"

#include <ifaddrs.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <cstdlib>
#include <optional>

#include "runtime/base/status.hpp"

namespace co2::store {
namespace {

// Ports derived from a job id fall in [kDerivedPortBase, kDerivedPortBase + kDerivedPortSpan):
// below Linux's default ephemeral range (32768-60999), so no outgoing connection holds them.
constexpr uint32_t kDerivedPortBase = 10000;
constexpr uint32_t kDerivedPortSpan = 20000;

std::optional<std::string> variable(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

[[noreturn]] void malformed(const std::string& name, const std::string& value, const std::string& why) {
  fail(Status::InvalidArgument, "environment variable " + name + "='" + value + "' " + why);
}

long long parse_integer(const std::string& name, const std::string& value, long long low, long long high) {
  errno = 0;
  char* end = nullptr;
  const long long parsed = value.empty() ? 0 : std::strtoll(value.c_str(), &end, 10);
  if (value.empty() || errno != 0 || end != value.c_str() + value.size() || value[0] == ' ' || value[0] == '+')
    malformed(name, value, "is not an integer");
  if (parsed < low || parsed > high)
    malformed(name, value, "is out of range [" + std::to_string(low) + ", " + std::to_string(high) + "]");
  return parsed;
}

int integer_variable(const char* name, long long low, long long high) {
  const auto value = variable(name);
  if (!value) fail(Status::InvalidArgument, std::string("environment variable ") + name + " is not set");
  return int(parse_integer(name, *value, low, high));
}

constexpr long long kMaxRanks = 1 << 24;

uint16_t derived_port(const std::string& job_id) {
  uint32_t hash = 2166136261u;  // FNV-1a: any stable spread of the id will do
  for (unsigned char c : job_id) hash = (hash ^ c) * 16777619u;
  return uint16_t(kDerivedPortBase + hash % kDerivedPortSpan);
}

// The number of tasks on node `node` from Slurm's compressed list, e.g. "2(x3),1".
int slurm_tasks_on_node(const std::string& name, const std::string& list, int node) {
  size_t position = 0;
  int first_node = 0;
  while (position < list.size()) {
    const size_t comma = list.find(',', position);
    const std::string entry = list.substr(position, comma == std::string::npos ? std::string::npos : comma - position);
    position = comma == std::string::npos ? list.size() : comma + 1;
    const size_t open = entry.find("(x");
    long long tasks, repeat = 1;
    if (open == std::string::npos) {
      tasks = parse_integer(name, entry, 1, kMaxRanks);
    } else {
      if (entry.back() != ')') malformed(name, list, "is not a Slurm tasks-per-node list");
      tasks = parse_integer(name, entry.substr(0, open), 1, kMaxRanks);
      repeat = parse_integer(name, entry.substr(open + 2, entry.size() - open - 3), 1, kMaxRanks);
    }
    if (node < first_node + repeat) return int(tasks);
    first_node += int(repeat);
  }
  malformed(name, list, "lists no node " + std::to_string(node));
}

// The first host of a Slurm node list such as "gpu[03-05,9],login1" ("gpu03").
std::string slurm_first_host(const std::string& list) {
  int depth = 0;
  size_t end = 0;
  for (; end < list.size(); ++end) {
    if (list[end] == '[') ++depth;
    if (list[end] == ']') --depth;
    if (list[end] == ',' && depth == 0) break;
  }
  std::string host = list.substr(0, end);
  for (size_t open; (open = host.find('[')) != std::string::npos;) {
    const size_t close = host.find(']', open);
    if (close == std::string::npos) return "";
    const std::string ranges = host.substr(open + 1, close - open - 1);
    const std::string first = ranges.substr(0, ranges.find_first_of(",-"));
    host = host.substr(0, open) + first + host.substr(close + 1);
  }
  return host;
}

void check_consistent(const LaunchEnvironment& environment, const std::string& names) {
  if (environment.rank >= environment.world_size)
    fail(Status::InvalidArgument, "launch environment (" + names + "): rank " + std::to_string(environment.rank) +
                                      " is not below the world size " + std::to_string(environment.world_size));
  if (environment.local_rank >= environment.local_world_size)
    fail(Status::InvalidArgument, "launch environment (" + names + "): local rank " +
                                      std::to_string(environment.local_rank) + " is not below the local world size " +
                                      std::to_string(environment.local_world_size));
  if (environment.local_world_size > environment.world_size)
    fail(Status::InvalidArgument, "launch environment (" + names + "): local world size " +
                                      std::to_string(environment.local_world_size) + " exceeds the world size " +
                                      std::to_string(environment.world_size));
}

bool is_loopback(const sockaddr* address) {
  if (address->sa_family == AF_INET)
    return (ntohl(reinterpret_cast<const sockaddr_in*>(address)->sin_addr.s_addr) >> 24) == 127;
  if (address->sa_family == AF_INET6) {
    const in6_addr& ip = reinterpret_cast<const sockaddr_in6*>(address)->sin6_addr;
    return IN6_IS_ADDR_LOOPBACK(&ip) ||
           (IN6_IS_ADDR_V4MAPPED(&ip) && ip.s6_addr[12] == 127);
  }
  return false;
}

bool same_ip(const sockaddr* a, const sockaddr* b) {
  if (a->sa_family != b->sa_family) return false;
  if (a->sa_family == AF_INET)
    return reinterpret_cast<const sockaddr_in*>(a)->sin_addr.s_addr == reinterpret_cast<const sockaddr_in*>(b)->sin_addr.s_addr;
  if (a->sa_family == AF_INET6)
    return std::memcmp(&reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr, &reinterpret_cast<const sockaddr_in6*>(b)->sin6_addr,
                       sizeof(in6_addr)) == 0;
  return false;
}

// Whether `address` belongs to this host: loopback (all of 127/8 on Linux) or an interface's.
bool is_local(const sockaddr* address, const ifaddrs* interfaces) {
  if (is_loopback(address)) return true;
  for (const ifaddrs* entry = interfaces; entry; entry = entry->ifa_next)
    if (entry->ifa_addr && same_ip(entry->ifa_addr, address)) return true;
  return false;
}

}  // namespace

std::string choose_store_bind(const LaunchEnvironment& environment, std::string& why) {
  why.clear();
  if (!environment.store_bind.empty()) return environment.store_bind == "*" ? "" : environment.store_bind;
  const std::string& host = environment.master_addr;
  if (host.empty()) return "";
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* addresses = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &addresses) != 0) {
    why = "MASTER_ADDR=" + host + " does not resolve on rank 0's host: the store listens on every address "
          "(set CO2_STORE_BIND to choose one)";
    return "";
  }
  ifaddrs* interfaces = nullptr;
  if (::getifaddrs(&interfaces) != 0) interfaces = nullptr;
  bool any_local = false, all_loopback = true;
  for (const addrinfo* address = addresses; address; address = address->ai_next) {
    any_local = any_local || is_local(address->ai_addr, interfaces);
    all_loopback = all_loopback && is_loopback(address->ai_addr);
  }
  if (interfaces) ::freeifaddrs(interfaces);
  ::freeaddrinfo(addresses);
  if (!any_local) {
    why = "MASTER_ADDR=" + host + " is not an address of rank 0's host: the store listens on every address "
          "(set CO2_STORE_BIND to choose one)";
    return "";
  }
  if (all_loopback && environment.local_world_size < environment.world_size) {
    why = "MASTER_ADDR=" + host + " is a loopback address on rank 0's host, but the ranks span several hosts: "
          "the store listens on every address (set CO2_STORE_BIND to choose one, or MASTER_ADDR to an address "
          "the other hosts reach)";
    return "";
  }
  return host;
}

std::string port_in_use_message(const LaunchEnvironment& launched) {
  const std::string variable = launched.master_port_variable.empty() ? "the port" : launched.master_port_variable;
  const std::string port = variable + "=" + std::to_string(launched.master_port);
  if (launched.under_torchrun && launched.master_port_variable == "MASTER_PORT")
    return port + " is taken by torchrun's agent, which serves torch's own store there: give co2's store a free "
           "port of its own with CO2_MASTER_PORT, or form the group with co2_comm_create_with_id from an id "
           "passed through torch's store (co2.Communicator() in Python does this by itself under torchrun)";
  return port + " is already in use on rank 0's host (another program holds it, or a co2 run that is still "
         "alive, or a second process given RANK=0): set " +
         (launched.master_port_variable.empty() ? std::string("CO2_MASTER_PORT") : variable) +
         " to a free port on every rank, or stop what holds it (ss -ltnp shows who)";
}

LaunchEnvironment read_launch_environment() {
  LaunchEnvironment environment;
  std::optional<std::string> job_id;  // for a derived port
  std::string names;

  if (variable("RANK") || variable("WORLD_SIZE")) {
    environment.source = "torchrun/co2run";
    names = "RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE";
    environment.world_size = integer_variable("WORLD_SIZE", 1, kMaxRanks);
    environment.rank = integer_variable("RANK", 0, kMaxRanks);
    if (variable("LOCAL_RANK") || variable("LOCAL_WORLD_SIZE")) {
      environment.local_world_size = integer_variable("LOCAL_WORLD_SIZE", 1, kMaxRanks);
      environment.local_rank = integer_variable("LOCAL_RANK", 0, kMaxRanks);
    } else {  // no local variables: every rank on this host
      environment.local_world_size = environment.world_size;
      environment.local_rank = environment.rank;
    }
  } else if (variable("OMPI_COMM_WORLD_RANK") || variable("OMPI_COMM_WORLD_SIZE")) {
    environment.source = "openmpi";
    names = "OMPI_COMM_WORLD_*";
    environment.world_size = integer_variable("OMPI_COMM_WORLD_SIZE", 1, kMaxRanks);
    environment.rank = integer_variable("OMPI_COMM_WORLD_RANK", 0, kMaxRanks);
    environment.local_world_size = integer_variable("OMPI_COMM_WORLD_LOCAL_SIZE", 1, kMaxRanks);
    environment.local_rank = integer_variable("OMPI_COMM_WORLD_LOCAL_RANK", 0, kMaxRanks);
    job_id = variable("OMPI_MCA_ess_base_jobid");
  } else if (variable("SLURM_PROCID") && variable("SLURM_STEP_ID")) {
    environment.source = "slurm";
    names = "SLURM_*";
    environment.world_size =
        integer_variable(variable("SLURM_STEP_NUM_TASKS") ? "SLURM_STEP_NUM_TASKS" : "SLURM_NTASKS", 1, kMaxRanks);
    environment.rank = integer_variable("SLURM_PROCID", 0, kMaxRanks);
    environment.local_rank = integer_variable("SLURM_LOCALID", 0, kMaxRanks);
    const char* per_node = variable("SLURM_STEP_TASKS_PER_NODE") ? "SLURM_STEP_TASKS_PER_NODE" : "SLURM_TASKS_PER_NODE";
    const auto list = variable(per_node);
    if (!list)
      fail(Status::InvalidArgument, "environment variables SLURM_STEP_TASKS_PER_NODE and SLURM_TASKS_PER_NODE are not set");
    environment.local_world_size = slurm_tasks_on_node(per_node, *list, integer_variable("SLURM_NODEID", 0, kMaxRanks));
    job_id = variable("SLURM_JOB_ID");
    if (!variable("MASTER_ADDR") && environment.local_world_size < environment.world_size) {
      const char* nodelist = variable("SLURM_STEP_NODELIST") ? "SLURM_STEP_NODELIST" : "SLURM_JOB_NODELIST";
      if (const auto hosts = variable(nodelist)) {
        environment.master_addr = slurm_first_host(*hosts);
        if (environment.master_addr.empty()) malformed(nodelist, *hosts, "is not a Slurm node list");
      }
    }
  } else {
    return environment;  // not launched by anything we know
  }
  environment.present = true;
  environment.under_torchrun = variable("TORCHELASTIC_RUN_ID").has_value();
  if (const auto served = variable("CO2_LAUNCHER_SERVES_STORE")) {
    if (*served != "0" && *served != "1") malformed("CO2_LAUNCHER_SERVES_STORE", *served, "is not 0 or 1");
    environment.launcher_serves_store = *served == "1";
  }
  check_consistent(environment, names);

  if (const auto address = variable("MASTER_ADDR")) {
    if (address->empty()) malformed("MASTER_ADDR", *address, "is empty");
    environment.master_addr = *address;
  } else if (environment.master_addr.empty() && environment.local_world_size == environment.world_size) {
    environment.master_addr = "127.0.0.1";
  }

  if (const auto bind = variable("CO2_STORE_BIND")) {
    if (bind->empty()) malformed("CO2_STORE_BIND", *bind, "is empty (use '*' for every address)");
    environment.store_bind = *bind;
  }

  if (const auto port = variable("CO2_MASTER_PORT")) {
    environment.master_port = uint16_t(parse_integer("CO2_MASTER_PORT", *port, 1, 65535));
    environment.master_port_variable = "CO2_MASTER_PORT";
  } else if (const auto master_port = variable("MASTER_PORT")) {
    environment.master_port = uint16_t(parse_integer("MASTER_PORT", *master_port, 1, 65535));
    environment.master_port_variable = "MASTER_PORT";
  } else if (job_id && !job_id->empty()) {
    environment.master_port = derived_port(*job_id);
  }
  return environment;
}

NodeName read_node_name() {
  NodeName name;
  const auto by_host = [&name](const std::string& why) {
    char host[HOST_NAME_MAX + 1] = {};
    if (::gethostname(host, sizeof host - 1) != 0)
      fail(Status::Internal, std::string("gethostname failed: ") + std::strerror(errno));
    name.host = host;
    name.source = "host name (" + why + ")";
    return name;
  };
  if (variable("RANK") || variable("WORLD_SIZE")) {
    if (variable("GROUP_RANK")) {
      name.id = integer_variable("GROUP_RANK", 0, kMaxRanks);
      name.source = "GROUP_RANK";
      return name;
    }
    if (variable("RANK") && variable("LOCAL_RANK") && variable("LOCAL_WORLD_SIZE")) {
      const int rank = integer_variable("RANK", 0, kMaxRanks);
      const int local_rank = integer_variable("LOCAL_RANK", 0, kMaxRanks);
      const int local_world_size = integer_variable("LOCAL_WORLD_SIZE", 1, kMaxRanks);
      if (rank >= local_rank && (rank - local_rank) % local_world_size == 0) {
        name.id = (rank - local_rank) / local_world_size;
        name.source = "(RANK - LOCAL_RANK) / LOCAL_WORLD_SIZE";
        return name;
      }
      return by_host("RANK - LOCAL_RANK is not a multiple of LOCAL_WORLD_SIZE");
    }
    return by_host("the launcher sets neither GROUP_RANK nor LOCAL_RANK and LOCAL_WORLD_SIZE");
  }
  if (variable("OMPI_COMM_WORLD_RANK") || variable("OMPI_COMM_WORLD_SIZE"))
    return by_host("Open MPI exports no node index");
  if (variable("SLURM_PROCID") && variable("SLURM_STEP_ID")) {
    name.id = integer_variable("SLURM_NODEID", 0, kMaxRanks);
    name.source = "SLURM_NODEID";
    return name;
  }
  return by_host("no launcher");
}

}  // namespace co2::store

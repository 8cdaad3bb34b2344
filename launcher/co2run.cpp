// co2run: starts the ranks of a co2 job on this machine (one node's, or every node's as simulated
// nodes) with the environment co2 reads (torchrun's names), prefixes their output with the rank,
// forwards signals, and stops them all when one fails. It does not link the runtime: it is a
// process supervisor, and under --elastic also the server of co2's rendezvous store (the
// group's door must outlive every rank, rank 0 included).
#include <pthread.h>
#include <signal.h>
#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "launcher/command_line.hpp"
#include "launcher/master_port.hpp"
#include "launcher/supervisor.hpp"
#include "rendezvous/launch_environment.hpp"
#include "rendezvous/tcp_store.hpp"

extern char** environ;

namespace co2::launcher {
namespace {

// Bytes of randomness in a token co2run makes up (hex-encoded in CO2_AUTH_TOKEN).
constexpr size_t kTokenBytes = 16;

std::string random_token() {
  unsigned char bytes[kTokenBytes];
  size_t filled = 0;
  while (filled < sizeof(bytes)) {
    const ssize_t got = ::getrandom(bytes + filled, sizeof(bytes) - filled, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return "";
    filled += size_t(got);
  }
  static const char digits[] = "0123456789abcdef";
  std::string token;
  for (unsigned char byte : bytes) {
    token += digits[byte >> 4];
    token += digits[byte & 15];
  }
  return token;
}

// co2-probe beside this co2run (the build tree and an installation both put them together);
// "" when it is not there.
std::string probe_beside_us() {
  char self[4096];
  const ssize_t length = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (length <= 0) return "";
  std::string path(self, size_t(length));
  path = path.substr(0, path.rfind('/') + 1) + "co2-probe";
  return ::access(path.c_str(), X_OK) == 0 ? path : "";
}

// The store rank 0 would have served, with the bind rank 0 would have chosen (rendezvous/
// launch_environment.hpp); null after saying why it cannot be served.
std::unique_ptr<store::TcpStoreServer> serve_store(const std::string& master_addr, int master_port,
                                                   const std::string& token, int world_size, const Options& options) {
  store::LaunchEnvironment rank_zero;
  rank_zero.present = true;
  rank_zero.world_size = world_size;
  rank_zero.local_world_size = options.nproc_per_node;
  rank_zero.master_addr = master_addr;
  rank_zero.master_port = uint16_t(master_port);
  rank_zero.master_port_variable = "MASTER_PORT";
  rank_zero.source = "co2run";
  if (const char* bind = std::getenv("CO2_STORE_BIND")) rank_zero.store_bind = bind;
  else if (options.all_nodes_here() && options.nnodes > 1) rank_zero.store_bind = master_addr;  // as the ranks get it
  std::string why;
  const std::string bind = store::choose_store_bind(rank_zero, why);
  if (!why.empty()) std::fprintf(stderr, "co2run: warning: %s\n", why.c_str());
  // The server's thread takes every signal blocked: the supervisor reads SIGCHLD and the
  // forwarded signals from a signalfd, which only sees signals that no thread accepts.
  sigset_t every_signal, before;
  sigfillset(&every_signal);
  pthread_sigmask(SIG_SETMASK, &every_signal, &before);
  struct RestoreMask {
    sigset_t& mask;
    ~RestoreMask() { pthread_sigmask(SIG_SETMASK, &mask, nullptr); }
  } restore{before};
  try {
    return store::TcpStoreServer::start(bind, uint16_t(master_port), token);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "co2run: error: --elastic serves the group's store at port %d, and it cannot: %s\n",
                 master_port, e.what());
    return nullptr;
  }
}

int main_or_status(int argc, char** argv) {
  Options options;
  try {
    options = parse_command_line(argc, argv);
  } catch (const UsageError& error) {
    std::fprintf(stderr, "co2run: error: %s\nrun 'co2run --help' for the options\n", error.what());
    return 2;
  }
  if (options.help) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (options.probe) {
    const std::string probe = probe_beside_us();
    if (probe.empty()) {
      std::fprintf(stderr, "co2run: error: --probe runs co2-probe from co2run's directory, and it is not there "
                           "(install both, or run co2-probe under your launcher)\n");
      return 1;
    }
    options.program.insert(options.program.begin(), probe);
  }

  // On one machine co2run may choose the port and the token: nobody else has to agree on them.
  const bool one_machine = options.all_nodes_here();
  const std::string master_addr = options.master_addr.empty() ? "127.0.0.1" : options.master_addr;
  const int master_port = options.master_port != 0 ? options.master_port : pick_master_port();
  if (master_port == 0) {
    std::fprintf(stderr, "co2run: error: cannot find a free port (%s); give --master-port\n", std::strerror(errno));
    return 1;
  }
  const char* user_token = std::getenv("CO2_AUTH_TOKEN");
  std::string token = user_token ? user_token : "";
  if (token.empty() && one_machine) {
    token = random_token();
    if (token.empty()) {
      std::fprintf(stderr, "co2run: error: cannot make a random CO2_AUTH_TOKEN (%s)\n", std::strerror(errno));
      return 1;
    }
  }
  if (token.empty())
    std::fprintf(stderr,
                 "co2run: warning: CO2_AUTH_TOKEN is not set: the store at %s:%d will accept any client; "
                 "export the same secret on every node\n",
                 master_addr.c_str(), master_port);

  // Our variables replace any the caller had (co2run inside another launcher's job).
  const std::set<std::string> ours = {"RANK",        "WORLD_SIZE",       "LOCAL_RANK",  "LOCAL_WORLD_SIZE",
                                      "GROUP_RANK",  "GROUP_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                                      "CO2_AUTH_TOKEN", "CO2_ELASTIC_MIN_RANKS", "CO2_LAUNCHER_SERVES_STORE"};
  std::vector<std::string> inherited;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const char* equals = std::strchr(*entry, '=');
    if (equals == nullptr || ours.count(std::string(*entry, size_t(equals - *entry))) == 0) inherited.push_back(*entry);
  }
  // Simulated nodes share this host: LOCAL_WORLD_SIZE < WORLD_SIZE would otherwise make rank 0's
  // store listen on every address (co2 takes a loopback MASTER_ADDR with ranks on several hosts
  // for Debian's 127.0.1.1 host name), though every rank connects over loopback here.
  if (one_machine && options.nnodes > 1 && std::getenv("CO2_STORE_BIND") == nullptr)
    inherited.push_back("CO2_STORE_BIND=" + master_addr);
  std::vector<RankLaunch> ranks;
  const int world_size = options.nproc_per_node * options.nnodes;
  if (options.elastic_min_ranks > world_size) {
    std::fprintf(stderr, "co2run: error: --elastic %d is more ranks than the job has (%d)\n", options.elastic_min_ranks,
                 world_size);
    return 2;
  }
  // An elastic group's store is its door, where restarted ranks ask to join: served here (on the
  // host of MASTER_ADDR) for the whole job rather than by rank 0, whose loss would close it.
  std::unique_ptr<store::TcpStoreServer> store_server;
  if (options.elastic_min_ranks > 0) {
    inherited.push_back("CO2_ELASTIC_MIN_RANKS=" + std::to_string(options.elastic_min_ranks));
    inherited.push_back("CO2_LAUNCHER_SERVES_STORE=1");
    if (one_machine || options.node_rank == 0) {
      store_server = serve_store(master_addr, master_port, token, world_size, options);
      if (!store_server) return 1;
    }
  }
  const int first_node = one_machine ? 0 : options.node_rank;
  const int last_node = one_machine ? options.nnodes - 1 : options.node_rank;
  for (int node = first_node; node <= last_node; ++node) {
    for (int local_rank = 0; local_rank < options.nproc_per_node; ++local_rank) {
      RankLaunch rank;
      rank.rank = node * options.nproc_per_node + local_rank;
      rank.environment = inherited;
      rank.environment.push_back("RANK=" + std::to_string(rank.rank));
      rank.environment.push_back("WORLD_SIZE=" + std::to_string(world_size));
      rank.environment.push_back("LOCAL_RANK=" + std::to_string(local_rank));
      rank.environment.push_back("LOCAL_WORLD_SIZE=" + std::to_string(options.nproc_per_node));
      rank.environment.push_back("GROUP_RANK=" + std::to_string(node));
      rank.environment.push_back("GROUP_WORLD_SIZE=" + std::to_string(options.nnodes));
      rank.environment.push_back("MASTER_ADDR=" + master_addr);
      rank.environment.push_back("MASTER_PORT=" + std::to_string(master_port));
      if (!token.empty()) rank.environment.push_back("CO2_AUTH_TOKEN=" + token);
      ranks.push_back(std::move(rank));
    }
  }
  return run_ranks(options.program, ranks, options.grace_period,
                   Elasticity{options.elastic_min_ranks > 0, options.max_restarts});
}

}  // namespace
}  // namespace co2::launcher

int main(int argc, char** argv) { return co2::launcher::main_or_status(argc, argv); }

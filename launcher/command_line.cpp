#include "launcher/command_line.hpp"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include <getopt.h>

namespace co2::launcher {

const char kUsage[] =
    "usage: co2run [OPTIONS] PROGRAM [ARGS...]\n"
    "\n"
    "Starts PROGRAM once per rank with the environment co2 (and torchrun-style programs) read:\n"
    "RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK (the node), GROUP_WORLD_SIZE,\n"
    "MASTER_ADDR, MASTER_PORT, CO2_AUTH_TOKEN. Each output line is prefixed with '[rank N] '\n"
    "(stdout and stderr kept apart). SIGINT, SIGTERM and SIGHUP are forwarded to every rank. When\n"
    "a rank exits non-zero or is killed, the others get SIGTERM, then SIGKILL after the grace\n"
    "period, and co2run exits non-zero naming the rank.\n"
    "\n"
    "options:\n"
    "  --nproc-per-node N   ranks per node (default 1)\n"
    "  --nnodes M           nodes in the job (default 1); node K holds ranks K*N .. K*N+N-1\n"
    "  --node-rank K        start only node K's ranks, 0..M-1 (one co2run per machine); without\n"
    "                       it, co2run starts all M*N ranks here as M simulated nodes\n"
    "  --master-addr A      host of rank 0, where the rendezvous store listens\n"
    "                       (default 127.0.0.1 on one machine; required with --node-rank\n"
    "                       when --nnodes > 1)\n"
    "  --master-port P      port of the rendezvous store (default: a free port on one machine;\n"
    "                       required with --node-rank when --nnodes > 1)\n"
    "  --grace-period S     seconds between SIGTERM and SIGKILL when stopping ranks (default 10)\n"
    "  --elastic K          an elastic group: a rank that fails does not stop the others, which\n"
    "                       go on without it while K ranks remain (CO2_ELASTIC_MIN_RANKS=K for\n"
    "                       the ranks); co2run exits 0 when a rank of its own finished with 0\n"
    "  --max-restarts R     with --elastic: start a failed rank again, R times in all (default 0);\n"
    "                       the new process joins the running group\n"
    "  --probe ARGS...      run co2-probe (installed beside co2run) as PROGRAM: it times the outer\n"
    "                       all-reduce per wire format across the ranks and prints the tau and\n"
    "                       format that hide it behind a training step; co2run --probe --help\n"
    "  -h, --help           this text\n"
    "\n"
    "On one machine co2run makes up a random CO2_AUTH_TOKEN unless one is set; across machines,\n"
    "export the same CO2_AUTH_TOKEN on every one. CO2_MASTER_PORT, when set, is passed on and\n"
    "overrides MASTER_PORT for co2's store. Ranks read stdin from /dev/null. co2's\n"
    "co2_comm_split_nodes takes the node from GROUP_RANK. See docs/launching.md.\n"
    "\n"
    "examples: co2run --nproc-per-node 4 ./train --steps 1000\n"
    "          co2run --nnodes 2 --nproc-per-node 2 ./train    (2 simulated nodes of 2 ranks)\n"
    "          co2run --nnodes 2 --nproc-per-node 8 --node-rank 0 --master-addr host0 \\\n"
    "                 --master-port 29500 ./train               (on host0; --node-rank 1 on host1)\n"
    "          co2run --nproc-per-node 4 --probe --params 124M --step-ms 150\n";

namespace {

long long parse_integer(const std::string& flag, const std::string& text, long long low, long long high) {
  errno = 0;
  char* end = nullptr;
  const long long value = text.empty() ? 0 : std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || errno != 0 || end != text.c_str() + text.size())
    throw UsageError(flag + " wants an integer, not '" + text + "'");
  if (value < low || value > high)
    throw UsageError(flag + " " + text + " is out of range [" + std::to_string(low) + ", " + std::to_string(high) + "]");
  return value;
}

std::chrono::milliseconds parse_seconds(const std::string& flag, const std::string& text) {
  errno = 0;
  char* end = nullptr;
  const double seconds = text.empty() ? 0 : std::strtod(text.c_str(), &end);
  if (text.empty() || errno != 0 || end != text.c_str() + text.size() || !std::isfinite(seconds) || seconds < 0 ||
      seconds > 86400)
    throw UsageError(flag + " wants seconds between 0 and 86400, not '" + text + "'");
  return std::chrono::milliseconds(static_cast<long long>(std::llround(seconds * 1000)));
}

enum OptionId {
  kNprocPerNode = 1000,
  kNnodes,
  kNodeRank,
  kMasterAddr,
  kMasterPort,
  kGracePeriod,
  kElastic,
  kMaxRestarts,
  kProbe,
  kHelp
};

// Both spellings of each option: co2run's and torchrun's (underscores).
const option kLongOptions[] = {
    {"nproc-per-node", required_argument, nullptr, kNprocPerNode},
    {"nproc_per_node", required_argument, nullptr, kNprocPerNode},
    {"nnodes", required_argument, nullptr, kNnodes},
    {"node-rank", required_argument, nullptr, kNodeRank},
    {"node_rank", required_argument, nullptr, kNodeRank},
    {"master-addr", required_argument, nullptr, kMasterAddr},
    {"master_addr", required_argument, nullptr, kMasterAddr},
    {"master-port", required_argument, nullptr, kMasterPort},
    {"master_port", required_argument, nullptr, kMasterPort},
    {"grace-period", required_argument, nullptr, kGracePeriod},
    {"grace_period", required_argument, nullptr, kGracePeriod},
    {"elastic", required_argument, nullptr, kElastic},
    {"max-restarts", required_argument, nullptr, kMaxRestarts},
    {"max_restarts", required_argument, nullptr, kMaxRestarts},
    {"probe", no_argument, nullptr, kProbe},
    {"help", no_argument, nullptr, kHelp},
    {nullptr, 0, nullptr, 0}};

// The name messages use for an option (co2run's spelling).
std::string flag_name(int id) {
  for (const option& entry : kLongOptions)
    if (entry.name != nullptr && entry.val == id) return std::string("--") + entry.name;
  return "-h";
}

// "--n" starts --nproc-per-node, --nnodes and --node-rank: getopt_long refuses it.
bool starts_several_options(const std::string& argument) {
  if (argument.rfind("--", 0) != 0) return false;
  const std::string prefix = argument.substr(2, argument.find('=') == std::string::npos ? std::string::npos
                                                                                         : argument.find('=') - 2);
  int ids = 0, last = -1;
  for (const option& entry : kLongOptions)
    if (entry.name != nullptr && std::string(entry.name).rfind(prefix, 0) == 0 && entry.val != last) {
      ++ids;
      last = entry.val;
    }
  return ids > 1;
}

}  // namespace

Options parse_command_line(int argc, char** argv) {
  Options options;
  constexpr long long kMaxRanks = 1 << 20;
  // '+': options end at the first argument that is not one (PROGRAM's own options are its own);
  // ':': a missing value is reported as ':' rather than printed by getopt.
  optind = 0;  // start afresh (GNU): the parser may run more than once in a process
  opterr = 0;
  for (;;) {
    int index = -1;
    const int id = getopt_long(argc, argv, "+:h", kLongOptions, &index);
    if (id == -1) break;
    const std::string seen = argv[optind - 1] != nullptr ? argv[optind - 1] : "";
    if (id == '?') {
      if (starts_several_options(seen)) throw UsageError("ambiguous option '" + seen + "' (say more of its name)");
      throw UsageError("unknown option '" + seen + "'");
    }
    if (id == ':') throw UsageError(flag_name(optopt) + " needs a value");
    if (id == 'h' || id == kHelp) {
      options.help = true;
      return options;
    }
    if (id == kProbe) {  // the rest of the line is co2-probe's
      options.probe = true;
      break;
    }
    const std::string flag = flag_name(id);
    const std::string value = optarg != nullptr ? optarg : "";
    switch (id) {
      case kNprocPerNode: options.nproc_per_node = int(parse_integer(flag, value, 1, kMaxRanks)); break;
      case kNnodes: options.nnodes = int(parse_integer(flag, value, 1, kMaxRanks)); break;
      case kNodeRank: options.node_rank = int(parse_integer(flag, value, 0, kMaxRanks)); break;
      case kMasterPort: options.master_port = int(parse_integer(flag, value, 1, 65535)); break;
      case kGracePeriod: options.grace_period = parse_seconds(flag, value); break;
      case kElastic: options.elastic_min_ranks = int(parse_integer(flag, value, 1, kMaxRanks)); break;
      case kMaxRestarts: options.max_restarts = int(parse_integer(flag, value, 0, 1 << 20)); break;
      case kMasterAddr:
        if (value.empty()) throw UsageError("--master-addr is empty");
        options.master_addr = value;
        break;
    }
  }
  int i = optind;
  for (; i < argc; ++i) options.program.push_back(argv[i]);

  if (options.program.empty() && !options.probe) throw UsageError("no PROGRAM to run");
  if (options.node_rank >= options.nnodes)
    throw UsageError("--node-rank " + std::to_string(options.node_rank) + " is not below --nnodes " +
                     std::to_string(options.nnodes));
  if (options.max_restarts > 0 && options.elastic_min_ranks == 0)
    throw UsageError("--max-restarts needs --elastic (without it a failed rank stops every rank)");
  if (static_cast<long long>(options.nproc_per_node) * options.nnodes > kMaxRanks)
    throw UsageError("more than " + std::to_string(kMaxRanks) + " ranks");
  if (!options.all_nodes_here() && (options.master_addr.empty() || options.master_port == 0))
    throw UsageError("with --nnodes > 1 and --node-rank, give --master-addr and --master-port (the same on every "
                     "machine); without --node-rank every node runs on this machine");
  return options;
}

}  // namespace co2::launcher

// co2run's command line.
#pragma once

#include <chrono>
#include <stdexcept>
#include <string>
#include <vector>

namespace co2::launcher {

// How long ranks get between SIGTERM and SIGKILL once co2run stops them.
constexpr std::chrono::milliseconds kDefaultGracePeriod{10000};

struct Options {
  // Whether this co2run starts every rank of the job (one machine), rather than one node's.
  bool all_nodes_here() const { return node_rank < 0 || nnodes == 1; }

  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = -1;  // -1 = not given: every node's ranks run on this machine
  std::string master_addr;  // "" = not given
  int master_port = 0;      // 0 = not given
  std::chrono::milliseconds grace_period = kDefaultGracePeriod;
  int elastic_min_ranks = 0;  // --elastic K: 0 = a failed rank stops the others
  int max_restarts = 0;       // --max-restarts R (with --elastic): failed ranks started again
  bool help = false;
  bool probe = false;                // --probe: PROGRAM is co2-probe, `program` holds its arguments
  std::vector<std::string> program;  // PROGRAM ARGS...
};

// A command line co2run cannot run; the message says what is wrong.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Parses argv with getopt_long (both --name VALUE and --name=VALUE, an unambiguous prefix of a
// name; torchrun's underscore spellings too). Options end at the first argument that is not
// one, or after "--".
Options parse_command_line(int argc, char** argv);

extern const char kUsage[];

}  // namespace co2::launcher

// Runs the ranks of one node: starts them, relays their output line by line with a rank prefix,
// forwards SIGINT/SIGTERM/SIGHUP, and stops all of them when one fails.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace co2::launcher {

// After every rank has exited, how long co2run still relays output from processes the ranks
// left behind (holding the same pipes) before it stops listening.
constexpr std::chrono::milliseconds kOutputDrainTimeout{2000};

struct RankLaunch {
  int rank = 0;                          // the global rank, for the "[rank N] " prefix
  std::vector<std::string> environment;  // the whole environment, "NAME=value"
};

// Runs `program` (argv; found on PATH like a shell would) once per entry of `ranks`, each in
// its own process group with stdin from /dev/null. Returns co2run's exit status: 0 when every
// rank exited 0; the failed rank's exit code (or 128 + its signal) when one failed first, after
// printing which rank failed and how; 128 + the signal when co2run itself was interrupted
// (before any rank failed). With `elastic.enabled` a failed rank does not stop the others (they
// re-form without it) and is started again, with the same environment plus CO2_RESTART_COUNT
// (1 for its first restart), up to `elastic.max_restarts` times in all (it joins the running
// group); then 0 when any rank process exited 0, else the first failure's code. Rank 0 is never
// started again, nor any rank after rank 0 has exited: its store is the group's door.
struct Elasticity {
  bool enabled = false;
  int max_restarts = 0;
};
int run_ranks(const std::vector<std::string>& program, const std::vector<RankLaunch>& ranks,
              std::chrono::milliseconds grace_period, Elasticity elastic);

}  // namespace co2::launcher

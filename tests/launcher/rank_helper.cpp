// The PROGRAM co2run starts in its tests. Its first argument picks what a rank does:
//   env                 print the launch variables (stdout) and one line on stderr; exit 0
//   node-env            print the node variables (RANK, LOCAL_*, GROUP_*, CO2_STORE_BIND); exit 0
//   fail RANK CODE      rank RANK exits with CODE; the others say "ready" and sleep
//   signal RANK SIG     rank RANK kills itself with signal SIG; the others say "ready" and sleep
//   trap-term           say "ready"; on SIGTERM or SIGINT say "got SIG..." and exit 0
//   ignore-term         ignore SIGTERM, say "ready", sleep (co2run must SIGKILL it)
//   stdin               say whether stdin is at its end
//   lines N             N numbered lines on stdout and on stderr, then a line without newline
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

// Long enough that only co2run stopping it ends the sleep (a test's deadline is far shorter).
constexpr unsigned kSleepSeconds = 600;

int rank() {
  const char* value = std::getenv("RANK");
  return value ? std::atoi(value) : -1;
}

std::string variable(const char* name) {
  const char* value = std::getenv(name);
  return value ? value : "<unset>";
}

void ready_then_sleep() {
  std::printf("ready\n");
  std::fflush(stdout);
  ::sleep(kSleepSeconds);
}

void on_stop_signal(int signal) {
  const char* message = signal == SIGTERM ? "got SIGTERM\n" : "got SIGINT\n";
  (void)!::write(1, message, std::strlen(message));
  ::_exit(0);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "env") {
    std::printf("RANK=%s WORLD_SIZE=%s LOCAL_RANK=%s LOCAL_WORLD_SIZE=%s MASTER_ADDR=%s MASTER_PORT=%s CO2_AUTH_TOKEN=%s\n",
                variable("RANK").c_str(), variable("WORLD_SIZE").c_str(), variable("LOCAL_RANK").c_str(),
                variable("LOCAL_WORLD_SIZE").c_str(), variable("MASTER_ADDR").c_str(), variable("MASTER_PORT").c_str(),
                variable("CO2_AUTH_TOKEN").c_str());
    std::fprintf(stderr, "to-stderr\n");
    return 0;
  }
  if (mode == "node-env") {
    std::printf("RANK=%s LOCAL_RANK=%s LOCAL_WORLD_SIZE=%s GROUP_RANK=%s GROUP_WORLD_SIZE=%s WORLD_SIZE=%s "
                "CO2_STORE_BIND=%s\n",
                variable("RANK").c_str(), variable("LOCAL_RANK").c_str(), variable("LOCAL_WORLD_SIZE").c_str(),
                variable("GROUP_RANK").c_str(), variable("GROUP_WORLD_SIZE").c_str(), variable("WORLD_SIZE").c_str(),
                variable("CO2_STORE_BIND").c_str());
    return 0;
  }
  if (mode == "fail" && argc == 4) {
    if (rank() == std::atoi(argv[2])) return std::atoi(argv[3]);
    ready_then_sleep();
    return 0;
  }
  if (mode == "signal" && argc == 4) {
    if (rank() == std::atoi(argv[2])) {
      ::signal(std::atoi(argv[3]), SIG_DFL);
      ::raise(std::atoi(argv[3]));
    }
    ready_then_sleep();
    return 0;
  }
  if (mode == "trap-term") {
    ::signal(SIGTERM, on_stop_signal);
    ::signal(SIGINT, on_stop_signal);
    ready_then_sleep();
    return 1;  // not stopped by a signal
  }
  if (mode == "ignore-term") {
    ::signal(SIGTERM, SIG_IGN);
    ready_then_sleep();
    return 0;
  }
  if (mode == "stdin") {
    char byte;
    std::printf(::read(0, &byte, 1) == 0 ? "stdin at its end\n" : "stdin has data\n");
    return 0;
  }
  if (mode == "lines" && argc == 3) {
    const int count = std::atoi(argv[2]);
    const std::string padding(200, 'x');
    for (int i = 0; i < count; ++i) {
      std::printf("rank %d line %d %s\n", rank(), i, padding.c_str());
      std::fprintf(stderr, "rank %d error %d\n", rank(), i);
    }
    std::printf("rank %d no newline", rank());
    return 0;
  }
  std::fprintf(stderr, "rank_helper: unknown mode\n");
  return 2;
}

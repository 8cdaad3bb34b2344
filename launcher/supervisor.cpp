#include "launcher/supervisor.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <optional>

#include "launcher/line_prefixer.hpp"

namespace co2::launcher {
namespace {

using Clock = std::chrono::steady_clock;

const int kForwardedSignals[] = {SIGINT, SIGTERM, SIGHUP};

struct Child {
  int rank = 0;
  pid_t pid = -1;
  bool running = false;
  int status = 0;
  int pipes[2] = {-1, -1};  // its stdout, its stderr (read ends)
  std::unique_ptr<LinePrefixer> relays[2];
};

std::string signal_name(int signal) {
  const char* abbreviation = ::sigabbrev_np(signal);
  return abbreviation ? std::string("SIG") + abbreviation : "signal " + std::to_string(signal);
}

void say(const std::string& message) {
  const std::string line = "co2run: " + message + "\n";
  write_all(2, line.data(), line.size());
}

std::string how_it_ended(int status) {
  if (WIFSIGNALED(status))
    return "was killed by signal " + std::to_string(WTERMSIG(status)) + " (" + signal_name(WTERMSIG(status)) + ")" +
           (WCOREDUMP(status) ? ", core dumped" : "");
  return "exited with code " + std::to_string(WEXITSTATUS(status));
}

bool failed(int status) { return !WIFEXITED(status) || WEXITSTATUS(status) != 0; }

int exit_code_for(int status) { return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status); }

std::string ranks_phrase(int count) { return std::to_string(count) + (count == 1 ? " rank" : " ranks"); }

class Supervisor {
 public:
  Supervisor(const std::vector<std::string>& program, const std::vector<RankLaunch>& ranks,
             std::chrono::milliseconds grace_period, Elasticity elastic)
      : program_(program), ranks_(ranks), grace_period_(grace_period), elastic_(elastic) {}

  int run() {
    sigset_t handled;
    ::sigemptyset(&handled);
    for (int signal : kForwardedSignals) ::sigaddset(&handled, signal);
    ::sigaddset(&handled, SIGCHLD);
    ::sigprocmask(SIG_BLOCK, &handled, &original_mask_);
    signals_ = ::signalfd(-1, &handled, SFD_CLOEXEC | SFD_NONBLOCK);
    if (signals_ < 0) {
      say(std::string("signalfd: ") + std::strerror(errno));
      return 1;
    }
    ::signal(SIGPIPE, SIG_IGN);  // a reader of our output that went away must not kill us

    for (const auto& rank : ranks_) {
      if (!start(rank)) {
        stop_all(SIGTERM);
        kill_deadline_ = Clock::now() + grace_period_;
        start_failed_ = true;
        break;
      }
    }
    supervise();
    ::close(signals_);

    if (start_failed_) return 1;
    // A failure seen before an interrupt is what the user needs to hear about; failures after
    // it are the forwarded signal's doing.
    if (first_failure_ == nullptr && interrupted_by_ != 0) return 128 + interrupted_by_;
    if (elastic_.enabled && first_failure_ == nullptr && lost_ > 0)
      say(std::string(lost_ == 1 ? "1 rank process" : std::to_string(lost_) + " rank processes") + " of " +
          std::to_string(children_.size()) + " failed (" + std::to_string(restarts_) +
          " started again); the group went on and " + ranks_phrase(finished_well()) + " finished with exit code 0");
    if (first_failure_ != nullptr) {
      std::string message = "rank " + std::to_string(first_failure_->rank) + " (pid " +
                            std::to_string(first_failure_->pid) + ") " + how_it_ended(first_failure_->status) + "; " +
                            (running_at_failure_ == 0 ? "no other rank was running"
                                                      : "stopped the other " + ranks_phrase(running_at_failure_));
      if (killed_after_grace_ > 0) {
        char seconds[32];
        std::snprintf(seconds, sizeof(seconds), "%g", double(grace_period_.count()) / 1000.0);
        message += " (" + ranks_phrase(killed_after_grace_) + " needed SIGKILL after the " + seconds +
                   " s grace period)";
      }
      say(message);
      const int code = exit_code_for(first_failure_->status);
      return code == 0 ? 1 : code;
    }
    return 0;
  }

 private:
  bool start(const RankLaunch& rank) {
    auto child = std::make_unique<Child>();
    child->rank = rank.rank;
    int out[2], err[2];
    if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) {
      say(std::string("cannot create pipes: ") + std::strerror(errno));
      return false;
    }
    // Everything the child needs is prepared before fork(): after it, only async-signal-safe calls.
    std::vector<char*> arguments, variables;
    for (const auto& argument : program_) arguments.push_back(const_cast<char*>(argument.c_str()));
    arguments.push_back(nullptr);
    for (const auto& variable : rank.environment) variables.push_back(const_cast<char*>(variable.c_str()));
    variables.push_back(nullptr);
    const std::string cannot_run = "co2run: cannot run '" + program_.front() + "': ";
    const pid_t parent = ::getpid();

    const pid_t pid = ::fork();
    if (pid < 0) {
      say(std::string("fork: ") + std::strerror(errno));
      ::close(out[0]), ::close(out[1]), ::close(err[0]), ::close(err[1]);
      return false;
    }
    if (pid == 0) {
      // Its own process group: a terminal's Ctrl-C reaches co2run alone, which forwards it once.
      ::setpgid(0, 0);
      // Ranks do not outlive a co2run that was killed outright.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(1);
      const int null_input = ::open("/dev/null", O_RDONLY);
      if (null_input >= 0) ::dup2(null_input, 0);
      ::dup2(out[1], 1);
      ::dup2(err[1], 2);
      ::signal(SIGPIPE, SIG_DFL);
      ::sigprocmask(SIG_SETMASK, &original_mask_, nullptr);
      ::execvpe(arguments[0], arguments.data(), variables.data());
      const int error = errno;
      const char* reason = std::strerror(error);
      (void)!::write(2, cannot_run.data(), cannot_run.size());
      (void)!::write(2, reason, std::strlen(reason));
      (void)!::write(2, "\n", 1);
      ::_exit(error == ENOENT ? 127 : 126);
    }
    ::setpgid(pid, pid);  // also here: whichever runs first, the group exists before any signal
    ::close(out[1]);
    ::close(err[1]);
    child->pid = pid;
    child->running = true;
    child->pipes[0] = out[0];
    child->pipes[1] = err[0];
    const std::string prefix = "[rank " + std::to_string(rank.rank) + "] ";
    child->relays[0] = std::make_unique<LinePrefixer>(prefix, 1);
    child->relays[1] = std::make_unique<LinePrefixer>(prefix, 2);
    children_.push_back(std::move(child));
    return true;
  }

  int running_count() const {
    int count = 0;
    for (const auto& child : children_) count += child->running ? 1 : 0;
    return count;
  }

  // Signals the process group of every rank still running.
  void stop_all(int signal) {
    for (const auto& child : children_)
      if (child->running) ::kill(-child->pid, signal);
  }

  void supervise() {
    std::vector<pollfd> polled;
    std::vector<std::pair<Child*, int>> sources;
    std::optional<Clock::time_point> drain_deadline;
    for (;;) {
      const bool running = running_count() > 0;
      if (!running && !drain_deadline) drain_deadline = Clock::now() + kOutputDrainTimeout;
      polled.clear();
      sources.clear();
      polled.push_back({signals_, POLLIN, 0});
      for (const auto& child : children_)
        for (int stream = 0; stream < 2; ++stream)
          if (child->pipes[stream] >= 0) {
            polled.push_back({child->pipes[stream], POLLIN, 0});
            sources.emplace_back(child.get(), stream);
          }
      if (!running && (sources.empty() || Clock::now() >= *drain_deadline)) break;

      int timeout_ms = -1;
      const auto next = !running ? drain_deadline : (kill_deadline_ ? kill_deadline_ : std::nullopt);
      if (next) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*next - Clock::now()).count();
        timeout_ms = int(std::max<long long>(0, std::min<long long>(left + 1, 1 << 30)));
      }
      const int ready = ::poll(polled.data(), polled.size(), timeout_ms);
      if (ready < 0 && errno != EINTR) {
        say(std::string("poll: ") + std::strerror(errno));
        stop_all(SIGKILL);
        break;
      }
      for (size_t i = 1; i < polled.size(); ++i)
        if (polled[i].revents != 0) relay(*sources[i - 1].first, sources[i - 1].second);
      if (polled[0].revents != 0) handle_signals();
      if (kill_deadline_ && Clock::now() >= *kill_deadline_) {
        killed_after_grace_ = running_count();
        stop_all(SIGKILL);
        kill_deadline_.reset();
      }
    }
    for (const auto& child : children_)
      for (int stream = 0; stream < 2; ++stream)
        if (child->pipes[stream] >= 0) {
          child->relays[stream]->finish();
          ::close(child->pipes[stream]);
          child->pipes[stream] = -1;
        }
  }

  void relay(Child& child, int stream) {
    char chunk[65536];
    const ssize_t got = ::read(child.pipes[stream], chunk, sizeof(chunk));
    if (got > 0) {
      child.relays[stream]->feed(chunk, size_t(got));
      return;
    }
    if (got < 0 && (errno == EINTR || errno == EAGAIN)) return;
    child.relays[stream]->finish();
    ::close(child.pipes[stream]);
    child.pipes[stream] = -1;
  }

  void handle_signals() {
    signalfd_siginfo info;
    while (::read(signals_, &info, sizeof(info)) == ssize_t(sizeof(info))) {
      const int signal = int(info.ssi_signo);
      if (signal == SIGCHLD) {
        reap();
        continue;
      }
      const int running = running_count();
      stop_all(signal);
      if (interrupted_by_ == 0) {
        interrupted_by_ = signal;
        say("received " + signal_name(signal) + "; forwarded it to " +
            (running == 0 ? "no rank (none was running)" : "the " + ranks_phrase(running) + " running"));
        if (!kill_deadline_) kill_deadline_ = Clock::now() + grace_period_;
      }
    }
  }

  // Whether a failed rank is started again; if not and there is a reason worth saying,
  // `why_not` ends the sentence that reports the failure.
  bool restartable(std::string& why_not) const {
    if (restarts_ >= elastic_.max_restarts) {
      if (elastic_.max_restarts > 0)
        why_not = "; not started again: the " + std::to_string(elastic_.max_restarts) +
                  " restarts of --max-restarts are used up";
      return false;
    }
    // The group's door (where a new process asks to join) is the store co2run serves, so rank 0
    // is started again like any rank; but a rank 0 that finished (exit code 0) means the group is
    // finishing, and a new process would wait at the door for a group that no longer admits.
    if (rank_zero_finished()) {
      why_not = "; not started again: rank 0 finished, so the group is finishing";
      return false;
    }
    return true;
  }

  // Whether the process of rank 0 (on this node, if rank 0 runs here) exited with code 0.
  bool rank_zero_finished() const {
    for (const auto& child : children_)
      if (child->rank == 0 && !child->running && !failed(child->status)) return true;
    return false;  // or rank 0 runs on another node: a restarted rank finds out at the door itself
  }

  int finished_well() const {
    int count = 0;
    for (const auto& child : children_) count += !child->running && !failed(child->status);
    return count;
  }

  void reap() {
    std::vector<int> restart;  // ranks to start again once the loop over children_ is done
    for (;;) {
      int status = 0;
      const pid_t pid = ::waitpid(-1, &status, WNOHANG);
      if (pid <= 0) break;
      for (const auto& child : children_) {
        if (child->pid != pid || !child->running) continue;
        child->running = false;
        child->status = status;
        if (failed(status) && elastic_.enabled && interrupted_by_ == 0 && !start_failed_) {
          if (!first_lost_) first_lost_ = child.get();
          ++lost_;
          std::string why_not;
          const bool again = restartable(why_not);
          if (again) {
            ++restarts_;
            restart.push_back(child->rank);
          }
          say("rank " + std::to_string(child->rank) + " (pid " + std::to_string(child->pid) + ") " +
              how_it_ended(status) + "; --elastic: the other ranks go on without it" +
              (again ? "; starting it again (restart " + std::to_string(restarts_) + " of " +
                           std::to_string(elastic_.max_restarts) + "): it joins the running group"
                     : why_not));
          continue;
        }
        if (failed(status) && first_failure_ == nullptr && interrupted_by_ == 0 && !start_failed_) {
          first_failure_ = child.get();
          running_at_failure_ = running_count();
          stop_all(SIGTERM);
          if (running_at_failure_ > 0) kill_deadline_ = Clock::now() + grace_period_;
        }
      }
    }
    for (int rank : restart) {
      // Rank 0 may have finished in this same pass, after the failure was counted.
      if (rank_zero_finished()) {
        say("rank " + std::to_string(rank) + " not started again after all: rank 0 finished, so the group is "
            "finishing (a new process has no group to join)");
        continue;
      }
      for (const auto& launch : ranks_) {
        if (launch.rank != rank) continue;
        RankLaunch again = launch;
        again.environment.push_back("CO2_RESTART_COUNT=" + std::to_string(++started_again_[rank]));
        if (!start(again)) say("cannot start rank " + std::to_string(rank) + " again");
      }
    }
    // Elastic ranks end together: when none finished well, the first loss is the failure.
    if (elastic_.enabled && first_lost_ && first_failure_ == nullptr && running_count() == 0 && finished_well() == 0)
      first_failure_ = first_lost_;
  }

  const std::vector<std::string>& program_;
  const std::vector<RankLaunch>& ranks_;
  const std::chrono::milliseconds grace_period_;
  const Elasticity elastic_;
  int lost_ = 0;               // elastic: rank processes that failed while the others went on
  int restarts_ = 0;
  std::map<int, int> started_again_;  // rank -> how often it was started again (CO2_RESTART_COUNT)
  Child* first_lost_ = nullptr;
  sigset_t original_mask_;
  int signals_ = -1;
  std::vector<std::unique_ptr<Child>> children_;
  std::optional<Clock::time_point> kill_deadline_;
  int interrupted_by_ = 0;
  bool start_failed_ = false;
  Child* first_failure_ = nullptr;
  int running_at_failure_ = 0;
  int killed_after_grace_ = 0;
};

}  // namespace

int run_ranks(const std::vector<std::string>& program, const std::vector<RankLaunch>& ranks,
              std::chrono::milliseconds grace_period, Elasticity elastic) {
  return Supervisor(program, ranks, grace_period, elastic).run();
}

}  // namespace co2::launcher

// Real child processes for tests: spawn with an edited environment, capture stdout and stderr
// apart, wait with a generous deadline (a child still running then is killed and reported as hung).
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

extern char** environ;

namespace co2::testing {

class Subprocess {
 public:
  using Clock = std::chrono::steady_clock;

  // `environment`: variables to set (a value) or remove (std::nullopt) on top of ours.
  Subprocess(const std::vector<std::string>& argv,
             const std::map<std::string, std::optional<std::string>>& environment = {}) {
    std::map<std::string, std::string> merged;
    for (char** entry = environ; *entry != nullptr; ++entry) {
      const char* equals = std::strchr(*entry, '=');
      if (equals != nullptr) merged[std::string(*entry, size_t(equals - *entry))] = equals + 1;
    }
    for (const auto& [name, value] : environment) {
      if (value) merged[name] = *value;
      else merged.erase(name);
    }
    std::vector<std::string> environment_strings;
    for (const auto& [name, value] : merged) environment_strings.push_back(name + "=" + value);
    // Everything the child needs is built before fork(): only async-signal-safe calls after it.
    std::vector<char*> arguments, variables;
    for (const auto& argument : argv) arguments.push_back(const_cast<char*>(argument.c_str()));
    arguments.push_back(nullptr);
    for (const auto& variable : environment_strings) variables.push_back(const_cast<char*>(variable.c_str()));
    variables.push_back(nullptr);

    int out[2], err[2];
    if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) return;
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(out[1], 1);
      ::dup2(err[1], 2);
      ::execve(arguments[0], arguments.data(), variables.data());
      ::_exit(127);
    }
    ::close(out[1]);
    ::close(err[1]);
    out_fd_ = out[0];
    err_fd_ = err[0];
  }

  ~Subprocess() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      int status;
      ::waitpid(pid_, &status, 0);
    }
    if (out_fd_ >= 0) ::close(out_fd_);
    if (err_fd_ >= 0) ::close(err_fd_);
  }

  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  pid_t pid() const { return pid_; }
  bool started() const { return pid_ > 0; }

  // Reads output until stdout contains `needle` `count` times; false if the timeout passes or
  // the output ends first.
  bool wait_for_stdout(const std::string& needle, int count, std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    for (;;) {
      if (occurrences(out_, needle) >= count) return true;
      if (!pump(deadline)) return occurrences(out_, needle) >= count;
    }
  }

  // Reads everything and reaps the child. False when it had not finished within `timeout`
  // (it is then killed).
  bool finish(std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    while (pump(deadline)) {
    }
    for (;;) {
      const pid_t done = ::waitpid(pid_, &status_, WNOHANG);
      if (done == pid_) {
        reaped_ = true;
        return !hung_;
      }
      if (Clock::now() >= deadline) {
        hung_ = true;
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &status_, 0);
        reaped_ = true;
        return false;
      }
      ::usleep(10000);
    }
  }

  const std::string& out() const { return out_; }
  const std::string& err() const { return err_; }
  int status() const { return status_; }
  bool exited_with(int code) const { return WIFEXITED(status_) && WEXITSTATUS(status_) == code; }
  // For failure messages.
  std::string describe() const {
    std::string what = WIFEXITED(status_)     ? "exit code " + std::to_string(WEXITSTATUS(status_))
                       : WIFSIGNALED(status_) ? "signal " + std::to_string(WTERMSIG(status_))
                                              : "status " + std::to_string(status_);
    return what + (hung_ ? " (HUNG: killed)" : "") + "\n--- stdout ---\n" + out_ + "--- stderr ---\n" + err_;
  }

  static int occurrences(const std::string& text, const std::string& needle) {
    int count = 0;
    for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + needle.size())) ++count;
    return count;
  }

 private:
  // Reads what is available; false once both pipes are at their end or the deadline passed.
  bool pump(Clock::time_point deadline) {
    pollfd polled[2];
    int count = 0;
    if (out_fd_ >= 0) polled[count++] = {out_fd_, POLLIN, 0};
    if (err_fd_ >= 0) polled[count++] = {err_fd_, POLLIN, 0};
    if (count == 0) return false;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    if (::poll(polled, nfds_t(count), int(left)) <= 0) return true;  // timeout: checked next call
    for (int i = 0; i < count; ++i) {
      if (polled[i].revents == 0) continue;
      char chunk[4096];
      const ssize_t got = ::read(polled[i].fd, chunk, sizeof(chunk));
      int& fd = polled[i].fd == out_fd_ ? out_fd_ : err_fd_;
      std::string& text = polled[i].fd == out_fd_ ? out_ : err_;
      if (got > 0) {
        text.append(chunk, size_t(got));
      } else {
        ::close(fd);
        fd = -1;
      }
    }
    return true;
  }

  pid_t pid_ = -1;
  int out_fd_ = -1, err_fd_ = -1;
  int status_ = 0;
  bool reaped_ = false, hung_ = false;
  std::string out_, err_;
};

}  // namespace co2::testing

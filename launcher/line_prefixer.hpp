// Turns a child's output stream into whole lines, each prefixed (e.g. "[rank 3] "), written to
// one of co2run's own streams.
#pragma once

#include <cstddef>
#include <string>

namespace co2::launcher {

// A line longer than this is written in pieces, each one prefixed.
constexpr size_t kMaxLineBytes = 65536;

class LinePrefixer {
 public:
  LinePrefixer(std::string prefix, int out_fd) : prefix_(std::move(prefix)), out_fd_(out_fd) {}

  // Writes every complete line in `data` (and whatever was pending before it).
  void feed(const char* data, size_t size);

  // The stream ended: writes a last line that had no newline, adding one.
  void finish();

 private:
  void emit(const char* text, size_t size);

  std::string prefix_;
  int out_fd_;
  std::string pending_;  // the start of a line whose newline has not come yet
};

// Writes everything (retrying short writes); gives up silently when the reader has gone.
void write_all(int fd, const char* data, size_t size);

}  // namespace co2::launcher

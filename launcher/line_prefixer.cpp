#include "launcher/line_prefixer.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace co2::launcher {

void write_all(int fd, const char* data, size_t size) {
  while (size > 0) {
    const ssize_t written = ::write(fd, data, size);
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) return;  // EPIPE (SIGPIPE is ignored) or a closed descriptor: nobody reads
    data += written;
    size -= size_t(written);
  }
}

void LinePrefixer::feed(const char* data, size_t size) {
  while (size > 0) {
    const char* newline = static_cast<const char*>(std::memchr(data, '\n', size));
    const size_t take = newline ? size_t(newline - data) + 1 : size;
    pending_.append(data, take);
    data += take;
    size -= take;
    if (newline) {
      emit(pending_.data(), pending_.size() - 1);
      pending_.clear();
    } else if (pending_.size() >= kMaxLineBytes) {
      emit(pending_.data(), pending_.size());
      pending_.clear();
    }
  }
}

void LinePrefixer::finish() {
  if (!pending_.empty()) emit(pending_.data(), pending_.size());
  pending_.clear();
}

void LinePrefixer::emit(const char* text, size_t size) {
  // One write per line: lines of different ranks never interleave mid-line.
  std::string line;
  line.reserve(prefix_.size() + size + 1);
  line += prefix_;
  line.append(text, size);
  line += '\n';
  write_all(out_fd_, line.data(), line.size());
}

}  // namespace co2::launcher

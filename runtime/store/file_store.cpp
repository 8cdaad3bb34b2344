#include <algorithm>
// A store in a directory that every rank can see (a shared filesystem, or /tmp on one host).
// One file per key: set writes a temporary file and renames it into place, so a reader sees a
// whole value or none; add serialises through an flock()ed lock file.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "runtime/store/store.hpp"

namespace co2::store {
namespace {

// How often a blocked get() looks for its key again.
constexpr auto kFilePollInterval = std::chrono::milliseconds(5);

std::string hex_key(const std::string& key) {
  // Keys are arbitrary bytes; file names are not.
  static const char digits[] = "0123456789abcdef";
  std::string out = "k-";
  for (unsigned char c : key) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

[[noreturn]] void store_failure(const std::string& what) {
  throw transport::RendezvousError("file store: " + what + ": " + std::strerror(errno));
}

class FileStore final : public Store {
 public:
  explicit FileStore(std::string directory) : directory_(std::move(directory)) {
    if (::mkdir(directory_.c_str(), 0700) != 0 && errno != EEXIST) store_failure("cannot create " + directory_);
  }

  void set(const std::string& key, const std::string& value) override {
    const std::string path = path_of(key);
    const std::string temporary = path + ".tmp" + std::to_string(::getpid()) + "-" + std::to_string(random_());
    {
      std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
      out.write(value.data(), std::streamsize(value.size()));
      if (!out.flush()) store_failure("cannot write " + temporary);
    }
    if (std::rename(temporary.c_str(), path.c_str()) != 0) store_failure("cannot rename into " + path);
  }

  std::string get(const std::string& key, std::chrono::milliseconds timeout) override {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    std::string value;
    while (!try_read(path_of(key), value)) {
      if (std::chrono::steady_clock::now() >= deadline)
        throw transport::RendezvousError("file store: key '" + key + "' did not appear in " + directory_ +
                                         " within " + std::to_string(timeout.count()) + " ms");
      std::this_thread::sleep_for(kFilePollInterval);
    }
    return value;
  }

  int64_t add(const std::string& key, int64_t delta) override {
    const std::string lock_path = directory_ + "/lock";
    const int fd = ::open(lock_path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) store_failure("cannot open " + lock_path);
    if (::flock(fd, LOCK_EX) != 0) {
      ::close(fd);
      store_failure("cannot lock " + lock_path);
    }
    int64_t result = delta;
    try {
      std::string current;
      if (try_read(path_of(key), current)) result += std::stoll(current);
      set(key, std::to_string(result));
    } catch (...) {
      ::close(fd);  // releases the lock
      throw;
    }
    ::close(fd);
    return result;
  }

  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (const auto& key : keys) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      get(key, std::max(left, std::chrono::milliseconds(0)));
    }
  }

 private:
  std::string path_of(const std::string& key) const { return directory_ + "/" + hex_key(key); }

  static bool try_read(const std::string& path, std::string& value) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return false;
    std::ostringstream contents;
    contents << in.rdbuf();
    value = contents.str();
    return true;
  }

  const std::string directory_;
  std::mt19937_64 random_{std::random_device{}()};
};

}  // namespace

std::shared_ptr<Store> open_file_store(const std::string& directory) { return std::make_shared<FileStore>(directory); }

}  // namespace co2::store

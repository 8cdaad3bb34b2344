// A store in a directory that every rank can see (a shared filesystem, or /tmp on one host).
// One file per key: set writes a temporary file and renames it into place, so a reader sees a
// whole value or none; add serialises through an flock()ed lock file.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "runtime/store/deadline.hpp"
#include "runtime/store/store.hpp"
#include "runtime/store/stored_integer.hpp"

namespace co2::store {
namespace {

// How often a blocked get() looks for its key again.
constexpr auto kFilePollInterval = std::chrono::milliseconds(5);

// Hex digits per path component: file names are limited to 255 bytes (NAME_MAX).
constexpr size_t kHexDigitsPerComponent = 200;

// Keys are arbitrary bytes; file names are not. A key becomes "k-" + its bytes in hex; a long
// key is split into directories of kHexDigitsPerComponent digits, named with a ".d" suffix so
// that a directory never has the name of a shorter key's file.
std::string relative_path(const std::string& key) {
  static const char digits[] = "0123456789abcdef";
  std::string hex;
  for (unsigned char c : key) {
    hex += digits[c >> 4];
    hex += digits[c & 15];
  }
  std::string path = "k-";
  size_t start = 0;
  for (; hex.size() - start > kHexDigitsPerComponent; start += kHexDigitsPerComponent)
    path += hex.substr(start, kHexDigitsPerComponent) + ".d/";
  return path + hex.substr(start);
}

[[noreturn]] void store_failure(const std::string& what) {
  throw transport::RendezvousError("file store: " + what + ": " + std::strerror(errno));
}

class FileStore final : public Store {
 public:
  explicit FileStore(std::string directory) : directory_(std::move(directory)) {
    if (directory_.empty()) throw transport::RendezvousError("file store: no directory given");
    make_parent_directories(directory_ + "/", 1);
  }

  void set(const std::string& key, const std::string& value) override {
    const std::string path = path_of(key);
    make_parent_directories(path, directory_.size() + 1);
    const std::string temporary = path + ".tmp" + std::to_string(::getpid()) + "-" + std::to_string(nonce_) + "-" +
                                  std::to_string(sequence_.fetch_add(1));
    {
      std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
      out.write(value.data(), std::streamsize(value.size()));
      if (!out.flush()) store_failure("cannot write " + temporary);
    }
    if (std::rename(temporary.c_str(), path.c_str()) != 0) store_failure("cannot rename into " + path);
  }

  std::string get(const std::string& key, std::chrono::milliseconds timeout) override {
    const auto deadline = deadline_after(timeout);
    std::string value;
    while (!try_read(path_of(key), value)) {
      if (Clock::now() >= deadline)
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
    int64_t result;
    try {
      std::string current;
      const bool present = try_read(path_of(key), current);
      result = add_to_stored_integer("file store", key, present ? &current : nullptr, delta);
      set(key, std::to_string(result));
    } catch (...) {
      ::close(fd);  // releases the lock
      throw;
    }
    ::close(fd);
    return result;
  }

  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    const auto deadline = deadline_after(timeout);
    for (const auto& key : keys)
      get(key, std::max(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()),
                        std::chrono::milliseconds(0)));
  }

 private:
  std::string path_of(const std::string& key) const { return directory_ + "/" + relative_path(key); }

  // mkdir -p of everything above `path`: the store's directory, the ".d" directories of a long key.
  // Looks for slashes from `from` on.
  void make_parent_directories(const std::string& path, size_t from) const {
    for (size_t slash = from; (slash = path.find('/', slash)) != std::string::npos; ++slash) {
      const std::string parent = path.substr(0, slash);
      if (::mkdir(parent.c_str(), 0700) != 0 && errno != EEXIST) store_failure("cannot create " + parent);
    }
  }

  static bool try_read(const std::string& path, std::string& value) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return false;
    std::ostringstream contents;
    contents << in.rdbuf();
    value = contents.str();
    return true;
  }

  const std::string directory_;
  // Temporary file names: unique across processes (pid), stores (nonce) and threads (sequence).
  const uint64_t nonce_ = std::random_device{}();
  std::atomic<uint64_t> sequence_{0};
};

}  // namespace

std::shared_ptr<Store> open_file_store(const std::string& directory) { return std::make_shared<FileStore>(directory); }

}  // namespace co2::store

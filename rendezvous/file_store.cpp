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

#include "rendezvous/deadline.hpp"
#include "rendezvous/store.hpp"
#include "rendezvous/stored_integer.hpp"

namespace co2::store {
namespace {

// How often a blocked get() looks for its key again.
constexpr auto kFilePollInterval = std::chrono::milliseconds(5);

// Keys are arbitrary bytes; file names are not. A key becomes "k-" + its bytes in hex. File names
// are limited to 255 bytes, so a key longer than kLongestHexKey bytes becomes "h-" + a 128-bit
// hash of it instead, and its file starts with the key itself (a u32 length, then the bytes) so
// that a read can tell a collision from its own key.
constexpr size_t kLongestHexKey = 100;

bool is_long(const std::string& key) { return key.size() > kLongestHexKey; }

std::string hex(const void* data, size_t size) {
  static const char digits[] = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < size; ++i) {
    const unsigned char c = static_cast<const unsigned char*>(data)[i];
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

std::string file_name(const std::string& key) {
  if (!is_long(key)) return "k-" + hex(key.data(), key.size());
  uint64_t hashes[2] = {14695981039346656037ull, 0x9e3779b97f4a7c15ull};  // FNV-1a, two seeds
  for (unsigned char c : key)
    for (auto& hash : hashes) hash = (hash ^ c) * 1099511628211ull;
  return "h-" + hex(hashes, sizeof(hashes));
}

std::string key_header(const std::string& key) {
  if (!is_long(key)) return "";
  std::string header(4, '\0');
  for (int i = 0; i < 4; ++i) header[size_t(i)] = char((key.size() >> (8 * i)) & 0xff);
  return header + key;
}

[[noreturn]] void store_failure(const std::string& what) {
  throw transport::RendezvousError("file store: " + what + ": " + std::strerror(errno));
}

class FileStore final : public Store {
 public:
  explicit FileStore(std::string directory) : directory_(std::move(directory)) {
    if (directory_.empty()) throw transport::RendezvousError("file store: no directory given");
    make_directories(directory_ + "/");
  }

  void set(const std::string& key, const std::string& value) override {
    const std::string path = path_of(key);
    const std::string header = key_header(key);
    const std::string temporary = path + ".tmp" + std::to_string(::getpid()) + "-" + std::to_string(nonce_) + "-" +
                                  std::to_string(sequence_.fetch_add(1));
    {
      std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
      out.write(header.data(), std::streamsize(header.size()));
      out.write(value.data(), std::streamsize(value.size()));
      if (!out.flush()) store_failure("cannot write " + temporary);
    }
    if (std::rename(temporary.c_str(), path.c_str()) != 0) store_failure("cannot rename into " + path);
  }

  std::string get(const std::string& key, std::chrono::milliseconds timeout) override {
    const auto deadline = deadline_after(timeout);
    std::string value;
    while (!try_read(key, value)) {
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
      const bool present = try_read(key, current);
      result = add_to_stored_integer("file store", key, present ? &current : nullptr, delta);
      set(key, std::to_string(result));
    } catch (...) {
      ::close(fd);  // releases the lock
      throw;
    }
    ::close(fd);
    return result;
  }

 private:
  std::string path_of(const std::string& key) const { return directory_ + "/" + file_name(key); }

  // mkdir -p of everything above `path`.
  static void make_directories(const std::string& path) {
    for (size_t slash = 1; (slash = path.find('/', slash)) != std::string::npos; ++slash) {
      const std::string parent = path.substr(0, slash);
      if (::mkdir(parent.c_str(), 0700) != 0 && errno != EEXIST) store_failure("cannot create " + parent);
    }
  }

  // The value under `key`, if its file exists.
  bool try_read(const std::string& key, std::string& value) const {
    std::ifstream in(path_of(key), std::ios::binary);
    if (!in) return false;
    std::ostringstream contents;
    contents << in.rdbuf();
    value = contents.str();
    const std::string header = key_header(key);
    if (value.compare(0, header.size(), header) != 0)
      throw transport::RendezvousError("file store: two keys share the file " + path_of(key) + " (a hash collision)");
    value.erase(0, header.size());
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

// The TCP store's wire protocol, shared by its server and its client.
//
// Every message is a frame: a 4-byte little-endian payload length, then the payload. A payload
// starts with one byte (an Op for requests, a Reply for answers) followed by fields: integers are
// little-endian, strings are a u32 length then that many bytes. The first request of a
// connection must be Hello (magic, version, auth token); the server answers every request with
// exactly one reply, in order. Anything that does not parse exactly (unknown op, a length that
// runs past the frame, trailing bytes, a frame or field over its limit) closes that connection.
//
//   Hello  u32 magic, u32 version, str token      -> Ok | Error (refused; connection closed)
//   Set    str key, str value                     -> Ok
//   Get    str key, u64 timeout_ms                -> Ok str value | Timeout str message
//   Add    str key, i64 delta                     -> Ok i64 new value | Error str message
//   Wait   u32 n, n x str key, u64 timeout_ms     -> Ok | Timeout str message
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace co2::store::wire {

constexpr uint32_t kMagic = 0x53324f43;  // "CO2S" on the wire
constexpr uint32_t kVersion = 1;

constexpr size_t kFrameHeaderBytes = 4;
constexpr size_t kMaxKeyBytes = 4096;
constexpr size_t kMaxValueBytes = size_t(16) << 20;
constexpr size_t kMaxTokenBytes = 1024;
constexpr size_t kMaxWaitKeys = 4096;
// Room for the op byte, the length fields and the integers around the largest key and value.
constexpr size_t kMaxFrameBytes = kMaxValueBytes + kMaxKeyBytes + 64;
// Before a connection has authenticated it may send only a small Hello: a stranger cannot make
// the server buffer megabytes.
constexpr size_t kMaxHelloFrameBytes = kMaxTokenBytes + 64;

enum class Op : uint8_t { Hello = 1, Set = 2, Get = 3, Add = 4, Wait = 5 };
enum class Reply : uint8_t { Ok = 0, Error = 1, Timeout = 2 };

// Builds one frame.
class Writer {
 public:
  Writer() : bytes_(kFrameHeaderBytes, '\0') {}

  Writer& u8(uint8_t value) {
    bytes_.push_back(char(value));
    return *this;
  }
  Writer& u32(uint32_t value) { return little_endian(value, 4); }
  Writer& u64(uint64_t value) { return little_endian(value, 8); }
  Writer& i64(int64_t value) { return little_endian(uint64_t(value), 8); }
  Writer& str(const std::string& value) {
    u32(uint32_t(value.size()));
    bytes_ += value;
    return *this;
  }

  // The finished frame: the length header filled in.
  std::string frame() {
    const uint32_t payload = uint32_t(bytes_.size() - kFrameHeaderBytes);
    for (size_t i = 0; i < 4; ++i) bytes_[i] = char((payload >> (8 * i)) & 0xff);
    return bytes_;
  }

 private:
  Writer& little_endian(uint64_t value, int bytes) {
    for (int i = 0; i < bytes; ++i) bytes_.push_back(char((value >> (8 * i)) & 0xff));
    return *this;
  }

  std::string bytes_;
};

inline uint32_t read_u32(const char* bytes) {
  uint32_t value = 0;
  for (int i = 0; i < 4; ++i) value |= uint32_t(uint8_t(bytes[i])) << (8 * i);
  return value;
}

// Parses one payload. Every read checks the bytes that are left; the first failure makes the
// reader fail for good, so a caller checks ok() once at the end (after finished()).
class Reader {
 public:
  Reader(const char* data, size_t size) : data_(data), left_(size) {}

  uint8_t u8() {
    uint8_t value = 0;
    if (take(1)) value = uint8_t(data_[-1]);
    return value;
  }
  uint32_t u32() { return uint32_t(little_endian(4)); }
  uint64_t u64() { return little_endian(8); }
  int64_t i64() { return int64_t(little_endian(8)); }
  // A string of at most `max_bytes`; a longer one fails the reader.
  std::string str(size_t max_bytes) {
    const uint32_t size = u32();
    if (!ok_ || size > max_bytes || size > left_) {
      ok_ = false;
      return {};
    }
    std::string value(data_, size);
    take(size);
    return value;
  }

  bool ok() const { return ok_; }
  // True when everything parsed and nothing is left over.
  bool finished() const { return ok_ && left_ == 0; }

 private:
  bool take(size_t bytes) {
    if (!ok_ || bytes > left_) {
      ok_ = false;
      return false;
    }
    data_ += bytes;
    left_ -= bytes;
    return true;
  }
  uint64_t little_endian(int bytes) {
    const char* start = data_;
    if (!take(size_t(bytes))) return 0;
    uint64_t value = 0;
    for (int i = 0; i < bytes; ++i) value |= uint64_t(uint8_t(start[i])) << (8 * i);
    return value;
  }

  const char* data_;
  size_t left_;
  bool ok_ = true;
};

}  // namespace co2::store::wire

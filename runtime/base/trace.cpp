#include "runtime/base/trace.hpp"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "runtime/base/log.hpp"

namespace co2 {

namespace {

constexpr size_t kMaxEventsLimit = 100000000;  // ~5 GB of events: beyond it a typo, not a wish

size_t max_events_from_environment() {
  const char* text = std::getenv("CO2_TRACE_MAX_EVENTS");
  if (!text || !*text) return Trace::kDefaultMaxEvents;
  char* end = nullptr;
  errno = 0;
  const unsigned long long value = std::strtoull(text, &end, 10);
  if (errno == 0 && *end == '\0' && text[0] != '-' && value >= 1 && value <= kMaxEventsLimit)
    return size_t(value);
  log::warn(std::string("CO2_TRACE_MAX_EVENTS=") + text + " is not an integer in [1, " +
            std::to_string(kMaxEventsLimit) + "]; keeping the newest " +
            std::to_string(Trace::kDefaultMaxEvents) + " events");
  return Trace::kDefaultMaxEvents;
}

const char* lane_name(Trace::Lane lane) {
  switch (lane) {
    case Trace::Lane::Training: return "training";
    case Trace::Lane::BulkLane: return "progress: bulk lane";
    case Trace::Lane::ControlLane: return "progress: control lane";
  }
  return "?";
}

}  // namespace

std::string Trace::file_for(const std::string& path, int rank, uint32_t engine) {
  std::string tag = ".rank" + std::to_string(rank);
  if (engine > 1) tag += ".engine" + std::to_string(engine);
  const size_t slash = path.find_last_of('/');
  const size_t name_start = slash == std::string::npos ? 0 : slash + 1;
  const size_t dot = path.find_last_of('.');
  // A dot that starts the name (".trace") is not an extension.
  if (dot == std::string::npos || dot <= name_start) return path + tag;
  return path.substr(0, dot) + tag + path.substr(dot);
}

std::unique_ptr<Trace> Trace::from_environment(int rank, uint32_t engine) {
  const char* path = std::getenv("CO2_TRACE");
  if (!path || !*path) return nullptr;
  auto trace = std::make_unique<Trace>(file_for(path, rank, engine), rank, max_events_from_environment());
  // An empty, valid trace now: a bad path is reported at once, not when the run ends.
  if (!trace->write()) return nullptr;
  return trace;
}

Trace::Trace(std::string file, int rank, size_t max_events)
    : file_(std::move(file)), rank_(rank), max_events_(max_events < 1 ? 1 : max_events) {}

void Trace::span(Lane lane, const char* name, Clock::time_point from, Clock::time_point to,
                 const char* arg_name, uint64_t arg) {
  const int64_t start = std::chrono::duration_cast<std::chrono::nanoseconds>(from.time_since_epoch()).count();
  const int64_t end = std::chrono::duration_cast<std::chrono::nanoseconds>(to.time_since_epoch()).count();
  const Event event{name, arg_name, start, end > start ? end - start : 0, arg, lane};
  std::lock_guard<std::mutex> lock(mutex_);
  if (ring_.size() < max_events_) {
    ring_.push_back(event);
    return;
  }
  ring_[next_] = event;
  next_ = (next_ + 1) % max_events_;
  ++dropped_;
}

size_t Trace::kept() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return ring_.size();
}

uint64_t Trace::dropped() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return dropped_;
}

bool Trace::write() const {
  std::vector<Event> events;
  uint64_t dropped;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    events.reserve(ring_.size());
    events.insert(events.end(), ring_.begin() + std::ptrdiff_t(next_), ring_.end());
    events.insert(events.end(), ring_.begin(), ring_.begin() + std::ptrdiff_t(next_));
    dropped = dropped_;
  }
  // Written beside the file and renamed over it, so a reader never sees half a trace.
  const std::string temporary = file_ + ".tmp";
  std::FILE* out = std::fopen(temporary.c_str(), "w");
  if (!out) {
    log::warn("CO2_TRACE: cannot write " + temporary + ": " + std::strerror(errno) + "; no trace is kept");
    return false;
  }
  std::fprintf(out, "{\"traceEvents\":[\n");
  std::fprintf(out, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{\"name\":\"co2 rank %d\"}}",
               rank_, rank_);
  for (Lane lane : {Lane::Training, Lane::BulkLane, Lane::ControlLane})
    std::fprintf(out, ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":\"%s\"}}",
                 rank_, int(lane), lane_name(lane));
  for (const Event& e : events) {
    std::fprintf(out, ",\n{\"name\":\"%s\",\"cat\":\"co2\",\"ph\":\"X\",\"ts\":%lld.%03lld,\"dur\":%lld.%03lld,"
                 "\"pid\":%d,\"tid\":%d",
                 e.name, (long long)(e.start_ns / 1000), (long long)(e.start_ns % 1000),
                 (long long)(e.duration_ns / 1000), (long long)(e.duration_ns % 1000), rank_, int(e.lane));
    if (e.arg_name)
      std::fprintf(out, ",\"args\":{\"%s\":%llu}}", e.arg_name, (unsigned long long)e.arg);
    else
      std::fprintf(out, "}");
  }
  std::fprintf(out, "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{\"rank\":%d,\"kept_events\":%zu,"
               "\"dropped_events\":%llu,\"max_events\":%zu}}\n",
               rank_, events.size(), (unsigned long long)dropped, max_events_);
  const bool written = std::ferror(out) == 0;
  if (std::fclose(out) != 0 || !written || std::rename(temporary.c_str(), file_.c_str()) != 0) {
    log::warn("CO2_TRACE: writing " + file_ + " failed: " + std::strerror(errno));
    std::remove(temporary.c_str());
    return false;
  }
  return true;
}

}  // namespace co2

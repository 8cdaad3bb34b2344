#include "runtime/base/log.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace co2::log {
namespace {

const char* name_of(Level level) {
  switch (level) {
    case Level::Error: return "error";
    case Level::Warn: return "warn";
    case Level::Info: return "info";
    case Level::Debug: return "debug";
  }
  return "?";
}

Level read_threshold() {
  const char* text = std::getenv("CO2_LOG_LEVEL");
  if (!text || !*text) return Level::Warn;
  for (Level level : {Level::Error, Level::Warn, Level::Info, Level::Debug})
    if (std::strcmp(text, name_of(level)) == 0) return level;
  std::fprintf(stderr, "co2 warn: CO2_LOG_LEVEL=%s is not one of error, warn, info, debug; using warn\n", text);
  return Level::Warn;
}

}  // namespace

Level threshold() {
  static const Level level = read_threshold();
  return level;
}

bool enabled(Level level) { return int(level) <= int(threshold()); }

void write(Level level, const std::string& message) {
  if (!enabled(level)) return;
  // One fprintf per line so that lines of concurrent ranks do not interleave mid-line.
  std::fprintf(stderr, "co2 %s: %s\n", name_of(level), message.c_str());
}

}  // namespace co2::log

// Diagnostics on stderr, filtered by CO2_LOG_LEVEL (error | warn | info | debug; default warn).
// For events a user may want to see (which transport was chosen and why), never for the hot path.
#pragma once

#include <string>

namespace co2::log {

enum class Level : int { Error = 0, Warn = 1, Info = 2, Debug = 3 };

// The level in force: CO2_LOG_LEVEL, read once; an unknown value means warn (and says so once).
Level threshold();

bool enabled(Level level);

// Writes "co2 <level>: <message>" as one line when `level` is enabled.
void write(Level level, const std::string& message);

inline void error(const std::string& message) { write(Level::Error, message); }
inline void warn(const std::string& message) { write(Level::Warn, message); }
inline void info(const std::string& message) { write(Level::Info, message); }
inline void debug(const std::string& message) { write(Level::Debug, message); }

}  // namespace co2::log

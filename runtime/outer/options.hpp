// The kinds of staleness penalty and outer-momentum clip an outer update takes: co2_penalty_t and
// co2_clip_t of the C ABI, with the same numbers (the engine's configuration holds them).
#pragma once

namespace co2 {

enum class Penalty : int { None = 0, Constant = 1, Gap = 2 };
enum class Clip : int { None = 0, Value = 1, Norm = 2 };

}  // namespace co2

// What the multi-process workers (split_worker.cpp, split_nodes_worker.cpp,
// hierarchical_worker.cpp) share: a status check that
// makes the caller return 1 with the reason, value checks that count failures, and a one-value
// all-reduce.
#pragma once

#include <cstdint>
#include <cstdio>

#include "co2/co2.h"

namespace {

int failures = 0;

#define CHECK_OK(call)                                                                             \
  do {                                                                                             \
    const co2_status_t s_ = (call);                                                                \
    if (s_ != CO2_OK) {                                                                            \
      std::fprintf(stderr, "%s -> %s: %s\n", #call, co2_status_string(s_), co2_last_error_message()); \
      return 1;                                                                                    \
    }                                                                                              \
  } while (0)

inline void expect(bool ok, const char* what, long got, long want) {
  if (ok) return;
  std::fprintf(stderr, "mismatch: %s: got %ld, want %ld\n", what, got, want);
  ++failures;
}

inline int reduce_over(co2_comm_t comm, int64_t* value, co2_reduce_op_t op) {
  co2_request_t request = nullptr;
  CHECK_OK(co2_allreduce(comm, value, 1, CO2_DTYPE_INT64, op, nullptr, &request));
  CHECK_OK(co2_request_wait(request, 60000));
  co2_request_free(request);
  return 0;
}

inline int sum_over(co2_comm_t comm, int64_t* value) { return reduce_over(comm, value, CO2_REDUCE_SUM); }

}  // namespace

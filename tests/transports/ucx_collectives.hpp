// The collective workload that the UCX process tests and the local-transport reference both
// run, so that their results can be compared byte for byte: all-reduce (every op and dtype, sizes
// that are multiples of nothing, from 1 element to several chunks), broadcast and all-gather,
// reduce_scatter + allgather_shards (fp32, and bf16 with its residual).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "runtime/comm/comm.hpp"

namespace co2::test {

// Small chunks, so that the larger sizes below span many chunks and several segments in flight.
constexpr size_t kWorkloadChunkBytes = 4096;

inline std::vector<size_t> workload_sizes() { return {1, 7, 1000, 4099, 100003}; }

// Deterministic input of `rank` for case `index`: floats in [-1, 1) with varied exponents (so
// that the summation order shows in the bits), integers of both signs.
inline std::vector<char> workload_input(DataType dtype, size_t count, int rank, int index) {
  std::mt19937_64 random(uint64_t(index) * 1000003u + uint64_t(rank) * 7919u + 17u);
  std::uniform_real_distribution<double> unit(-1.0, 1.0);
  std::uniform_int_distribution<int> exponent(-20, 20);
  std::vector<char> bytes(count * dtype_size(dtype));
  for (size_t i = 0; i < count; ++i) {
    const double value = std::ldexp(unit(random), exponent(random));
    switch (dtype) {
      case DataType::F32: { const float v = float(value); std::memcpy(&bytes[i * 4], &v, 4); break; }
      case DataType::F64: std::memcpy(&bytes[i * 8], &value, 8); break;
      case DataType::I32: { const int32_t v = int32_t(random() % 2000001) - 1000000; std::memcpy(&bytes[i * 4], &v, 4); break; }
      case DataType::I64: { const int64_t v = int64_t(random() % 2000000001) - 1000000000; std::memcpy(&bytes[i * 8], &v, 8); break; }
    }
  }
  return bytes;
}

// Runs the workload on `comm`; returns every result buffer, in order. Throws co2::Error.
inline std::vector<std::vector<char>> run_workload(Communicator& comm) {
  const int rank = comm.rank();
  const int size = comm.size();
  std::vector<std::vector<char>> results;
  int index = 0;
  const auto wait = [](const std::shared_ptr<Request>& request) { request->wait_for(std::chrono::milliseconds(-1)); };
  for (DataType dtype : {DataType::F32, DataType::F64, DataType::I32, DataType::I64}) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Min, ReduceOp::Max}) {
      for (size_t count : workload_sizes()) {
        std::vector<char> buffer = workload_input(dtype, count, rank, index++);
        wait(comm.allreduce(buffer.data(), count, dtype, op));
        results.push_back(std::move(buffer));
      }
    }
  }
  for (size_t count : workload_sizes()) {
    const int root = int(count % size_t(size));
    std::vector<char> buffer = rank == root ? workload_input(DataType::F64, count, rank, index)
                                            : std::vector<char>(count * 8, 0);
    ++index;
    wait(comm.broadcast(buffer.data(), count, DataType::F64, root));
    results.push_back(std::move(buffer));

    std::vector<char> mine = workload_input(DataType::I32, count, rank, index++);
    std::vector<char> all(mine.size() * size_t(size));
    wait(comm.allgather(mine.data(), all.data(), count, DataType::I32));
    results.push_back(std::move(all));

    for (WireFormat format : {WireFormat::F32, WireFormat::BF16}) {
      std::vector<char> sharded = workload_input(DataType::F32, count, rank, index++);
      std::vector<char> residual(format == WireFormat::F32 ? 0 : count * sizeof(float));
      float* residual_floats = residual.empty() ? nullptr : reinterpret_cast<float*>(residual.data());
      wait(comm.reduce_scatter(sharded.data(), count, DataType::F32, ReduceOp::Avg, {}, {format, residual_floats, {}}));
      wait(comm.allgather_shards(sharded.data(), count, DataType::F32));
      results.push_back(std::move(sharded));
      // Residuals are per rank: gathered, so that every rank's result is the same.
      std::vector<char> residuals(residual.size() * size_t(size));
      wait(comm.allgather(residual.data(), residuals.data(), residual.size() / sizeof(float), DataType::F32));
      results.push_back(std::move(residuals));
    }
  }
  return results;
}

}  // namespace co2::test

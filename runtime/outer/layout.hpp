// The parameter layout: where the trained tensors live and how the engine addresses them.
// Every registered tensor and every declared range of flat storage becomes one Segment; the
// outer state stores the PARAMETER and BUFFER segments back to back in registration order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace co2 {

enum class Role : int { Parameter = 0, Buffer = 1, Excluded = 2 };
// Parameter dtypes (the outer state is always fp32). Values equal co2_dtype_t.
enum class ParamDType : int { F32 = 0, BF16 = 1, F16 = 2 };

inline size_t element_bytes(ParamDType t) { return t == ParamDType::F32 ? 4 : 2; }
enum class DeviceKind : int { Host = 0, Cuda = 1 };

struct StorageDesc {
  int dtype = 0;         // co2_dtype_t value, validated
  int device = 0;        // co2_device_kind_t value, validated
  int device_index = 0;
};

struct TensorDesc {
  std::string name;
  void* data = nullptr;
  size_t count = 0;
  StorageDesc storage;
  int role = 0;  // co2_tensor_role_t value, validated
};

struct SegmentDesc {
  std::string name;
  size_t offset = 0;
  size_t count = 0;
  int role = 0;
};

struct Segment {
  std::string name;
  void* data = nullptr;  // the framework's parameters, `dtype` elements
  size_t count = 0;
  Role role = Role::Parameter;
  size_t state_offset = 0;  // into anchor / momentum / comm buffer (PARAMETER and BUFFER only)
  ParamDType dtype = ParamDType::F32;
  size_t bytes() const { return count * element_bytes(dtype); }
};

}  // namespace co2

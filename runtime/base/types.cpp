#include "runtime/base/types.hpp"

#include <string>

#include "runtime/base/status.hpp"

namespace co2 {

size_t dtype_size(DataType dtype) {
  switch (dtype) {
    case DataType::F32: return 4;
    case DataType::F64: return 8;
    case DataType::I32: return 4;
    case DataType::I64: return 8;
  }
  fail(Status::UnknownEnum, "unknown data type " + std::to_string(int(dtype)));
}

const char* purpose_name(Purpose purpose) {
  switch (purpose) {
    case Purpose::User: return "user";
    case Purpose::OuterAverage: return "outer-average";
    case Purpose::ParameterAverage: return "parameter-average";
    case Purpose::Consensus: return "consensus";
    case Purpose::AnchorCheck: return "anchor-check";
    case Purpose::LayoutHash: return "layout-hash";
    case Purpose::InitialBroadcast: return "initial-broadcast";
    case Purpose::GradientAverage: return "gradient-average";
    case Purpose::Split: return "split";
    case Purpose::AdvisorAgreement: return "advisor-agreement";
    case Purpose::Membership: return "membership";
  }
  return "purpose?";
}

bool is_control_purpose(Purpose purpose) {
  return purpose == Purpose::AnchorCheck || purpose == Purpose::LayoutHash || purpose == Purpose::Split ||
         purpose == Purpose::AdvisorAgreement;
}

}  // namespace co2

// What every collective shares: its descriptor (comparison, text, wire encoding), its tags,
// the status of a transport outcome, the checks before it starts.
#include <cstring>
#include <string>

#include "runtime/collectives/collectives.hpp"
#include "runtime/collectives/ring.hpp"

namespace co2::collectives {

namespace {

using transport::Outcome;
using transport::PointToPoint;

constexpr uint32_t kDescriptorMagic = 0x44324f43;  // "CO2D"
constexpr uint8_t kDescriptorVersion = 2;

void put_le(DescriptorWire& wire, size_t offset, uint64_t value, size_t bytes) {
  for (size_t i = 0; i < bytes; ++i) wire[offset + i] = std::byte((value >> (8 * i)) & 0xff);
}

uint64_t get_le(const DescriptorWire& wire, size_t offset, size_t bytes) {
  uint64_t value = 0;
  for (size_t i = 0; i < bytes; ++i) value |= uint64_t(wire[offset + i]) << (8 * i);
  return value;
}

}  // namespace

DescriptorWire encode(const Descriptor& descriptor) {
  DescriptorWire wire{};
  put_le(wire, 0, kDescriptorMagic, 4);
  put_le(wire, 4, kDescriptorVersion, 1);
  put_le(wire, 5, uint64_t(descriptor.kind), 1);
  put_le(wire, 6, uint64_t(descriptor.op), 1);
  put_le(wire, 7, uint64_t(descriptor.dtype), 1);
  put_le(wire, 8, descriptor.sequence, 8);
  put_le(wire, 16, descriptor.count, 8);
  put_le(wire, 24, uint32_t(descriptor.root), 4);
  put_le(wire, 28, descriptor.owner, 4);
  put_le(wire, 32, descriptor.purpose_sequence, 8);
  put_le(wire, 40, uint64_t(descriptor.purpose), 1);
  put_le(wire, 41, uint64_t(descriptor.wire), 1);  // 0 (fp32) where older builds left zeros
  return wire;
}

std::optional<Descriptor> decode(const DescriptorWire& wire) {
  if (get_le(wire, 0, 4) != kDescriptorMagic || get_le(wire, 4, 1) != kDescriptorVersion)
    return std::nullopt;
  Descriptor descriptor;
  descriptor.kind = Kind(get_le(wire, 5, 1));
  descriptor.op = ReduceOp(get_le(wire, 6, 1));
  descriptor.dtype = DataType(get_le(wire, 7, 1));
  descriptor.sequence = get_le(wire, 8, 8);
  descriptor.count = get_le(wire, 16, 8);
  descriptor.root = int32_t(uint32_t(get_le(wire, 24, 4)));
  descriptor.owner = uint32_t(get_le(wire, 28, 4));
  descriptor.purpose_sequence = get_le(wire, 32, 8);
  descriptor.purpose = Purpose(get_le(wire, 40, 1));
  descriptor.wire = WireFormat(get_le(wire, 41, 1));
  return descriptor;
}

std::string chain_stopped_message(const std::string& collective, const std::string& cause) {
  static const std::string kStopped = " was not started: the collective it follows failed: ";
  const size_t nested = cause.find(kStopped);
  return collective + kStopped + (nested == std::string::npos ? cause : cause.substr(nested + kStopped.size()));
}

std::string mismatch_message(int rank, const Descriptor& ours, const std::string& who,
                             const std::optional<Descriptor>& theirs) {
  return kMismatchPrefix + std::string("rank ") + std::to_string(rank) + " issued " +
         ours.to_string() + " but " + who +
         (theirs ? " issued " + theirs->to_string() : std::string(" sent a malformed descriptor"));
}

namespace {

std::string kind_name(Kind kind) {
  switch (kind) {
    case Kind::AllReduce: return "allreduce";
    case Kind::Broadcast: return "broadcast";
    case Kind::AllGather: return "allgather";
    case Kind::ReduceScatter: return "reduce_scatter";
    case Kind::AllGatherShards: return "allgather_shards";
  }
  return "kind " + std::to_string(int(kind));
}

std::string op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Min: return "min";
    case ReduceOp::Max: return "max";
  }
  return "op " + std::to_string(int(op));
}

std::string dtype_name(DataType dtype) {
  switch (dtype) {
    case DataType::F32: return "f32";
    case DataType::F64: return "f64";
    case DataType::I32: return "i32";
    case DataType::I64: return "i64";
  }
  return "dtype " + std::to_string(int(dtype));
}

}  // namespace

Descriptor normalised(Descriptor descriptor, Kind kind) {
  descriptor.kind = kind;
  if (kind != Kind::AllReduce && kind != Kind::ReduceScatter) descriptor.op = ReduceOp::Sum;
  if (kind != Kind::Broadcast) descriptor.root = 0;
  return descriptor;
}

void check_common(const PointToPoint& transport, const Descriptor& descriptor,
                  size_t total_elements_factor) {
  require(transport.size() <= kMaxRanks, Status::Unsupported,
          "collectives support at most " + std::to_string(kMaxRanks) + " ranks, not " +
              std::to_string(transport.size()));
  const size_t element_bytes = dtype_size(descriptor.dtype);
  require(descriptor.count <= SIZE_MAX / element_bytes / total_elements_factor,
          Status::InvalidArgument,
          descriptor.to_string() + ": the buffer size overflows size_t");
}

bool Descriptor::operator==(const Descriptor& other) const {
  return sequence == other.sequence && owner == other.owner && purpose == other.purpose &&
         purpose_sequence == other.purpose_sequence && kind == other.kind && op == other.op &&
         dtype == other.dtype && count == other.count && root == other.root && wire == other.wire;
}

bool Descriptor::control_lane() const {
  if (is_control_purpose(purpose)) return true;
  const size_t element_bytes = dtype_size(dtype);
  return count <= kControlLaneBytes / element_bytes;
}

std::string Descriptor::to_string() const {
  std::string text = "#" + std::to_string(sequence) + " " + purpose_name(purpose) + " #" +
                     std::to_string(purpose_sequence) + " of owner " + std::to_string(owner) +
                     ": " + kind_name(kind) + "(";
  if (kind == Kind::AllReduce || kind == Kind::ReduceScatter) text += op_name(op) + ", ";
  text += dtype_name(dtype) + ", count " + std::to_string(count);
  if (wire != WireFormat::F32) text += std::string(", wire ") + wire_format_name(wire);
  if (kind == Kind::Broadcast) text += ", root " + std::to_string(root);
  return text + ")";
}

namespace {
constexpr unsigned kChunkBits = 19;
constexpr unsigned kStepBits = 12;
constexpr unsigned kSequenceBits = transport::kTagBits - 1 - kStepBits - kChunkBits;
static_assert(transport::kControlLaneTag >> (kSequenceBits + kStepBits + kChunkBits) == 1,
              "the lane bit sits above the sequence");
static_assert(kSequenceBits >= 16, "sequence numbers must not wrap among collectives in flight");
constexpr uint64_t kDescriptorStep = (uint64_t(1) << kStepBits) - 1;
static_assert(2 * (kMaxRanks - 1) < kDescriptorStep, "data steps must not reach the descriptor's");

uint64_t make_tag(uint64_t sequence, uint64_t step, uint64_t chunk) {
  const uint64_t sequence_field = sequence & ((uint64_t(1) << kSequenceBits) - 1);
  const uint64_t step_field = step & kDescriptorStep;
  const uint64_t chunk_field = chunk & ((uint64_t(1) << kChunkBits) - 1);
  return (sequence_field << (kStepBits + kChunkBits)) | (step_field << kChunkBits) | chunk_field;
}
}  // namespace

uint64_t data_tag(uint64_t sequence, uint32_t step, uint64_t chunk, bool control_lane) {
  // Schedules use fewer than kDescriptorStep steps (kMaxRanks is checked at construction).
  return make_tag(sequence, step, chunk) | (control_lane ? transport::kControlLaneTag : 0);
}

uint64_t descriptor_tag(uint64_t sequence) {
  return make_tag(sequence, kDescriptorStep, 0) | transport::kControlLaneTag;
}

Status status_of(transport::Outcome outcome) {
  switch (outcome) {
    case Outcome::Pending:
    case Outcome::Done: return Status::Ok;
    case Outcome::PeerLost: return Status::PeerLost;
    case Outcome::SizeMismatch: return Status::CollectiveMismatch;
    case Outcome::Aborted: return Status::Aborted;
    case Outcome::Failed: return Status::Transport;
  }
  return Status::Internal;
}

void Collective::mark_failed(Status status, std::string message) {
  state_ = State::Failed;
  status_ = status;
  message_ = std::move(message);
}

}  // namespace co2::collectives

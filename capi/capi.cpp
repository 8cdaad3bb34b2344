// The extern "C" shims: validate arguments, translate structs, call the runtime, and turn every
// exception into a status plus a thread-local message. Nothing else lives here.
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "capi/abi_v1.h"
#include "capi/handles.hpp"
#include "co2/co2.h"
#include "runtime/comm/comm.hpp"
#include "runtime/backends/device/raw_memory.hpp"
#include "runtime/backends/device/selection.hpp"
#include "runtime/engine/engine.hpp"
#include "runtime/base/status.hpp"
#include "runtime/group/group.hpp"
#include "transports/transport.hpp"

#define CO2_EXPORT extern "C" __attribute__((visibility("default")))

using co2::Status;

static_assert(CO2_OK == int(Status::Ok) && CO2_ERR_INVALID_ARGUMENT == int(Status::InvalidArgument) &&
                  CO2_ERR_INVALID_STATE == int(Status::InvalidState) &&
                  CO2_ERR_UNSUPPORTED == int(Status::Unsupported) &&
                  CO2_ERR_INVALID_CONFIG == int(Status::InvalidConfig) &&
                  CO2_ERR_UNKNOWN_ENUM == int(Status::UnknownEnum) &&
                  CO2_ERR_DUPLICATE_TENSOR == int(Status::DuplicateTensor) &&
                  CO2_ERR_OUT_OF_MEMORY == int(Status::OutOfMemory) &&
                  CO2_ERR_NONFINITE == int(Status::NonFinite) &&
                  CO2_ERR_LAYOUT_MISMATCH == int(Status::LayoutMismatch) &&
                  CO2_ERR_ANCHOR_MISMATCH == int(Status::AnchorMismatch) &&
                  CO2_ERR_CHECKPOINT_CORRUPT == int(Status::CheckpointCorrupt) &&
                  CO2_ERR_CHECKPOINT_MISMATCH == int(Status::CheckpointMismatch) &&
                  CO2_ERR_CALLBACK == int(Status::Callback) && CO2_ERR_TIMEOUT == int(Status::Timeout) &&
                  CO2_MEMBERSHIP_CHANGED == int(Status::MembershipChanged) && CO2_LEFT == int(Status::Left) &&
                  CO2_ERR_PEER_LOST == int(Status::PeerLost) &&
                  CO2_ERR_PEER_TIMEOUT == int(Status::PeerTimeout) &&
                  CO2_ERR_COLLECTIVE_MISMATCH == int(Status::CollectiveMismatch) &&
                  CO2_ERR_ABORTED == int(Status::Aborted) && CO2_ERR_TRANSPORT == int(Status::Transport) &&
                  CO2_ERR_RENDEZVOUS == int(Status::Rendezvous) && CO2_ERR_INTERNAL == int(Status::Internal),
              "runtime and public status codes must agree");
static_assert(CO2_ALGO_CO2 == int(co2::Algorithm::Co2) && CO2_ALGO_SYNC == int(co2::Algorithm::Sync) &&
                  CO2_ALGO_LOCALSGD == int(co2::Algorithm::LocalSgd) &&
                  CO2_ALGO_DILOCO == int(co2::Algorithm::Diloco),
              "algorithm values must agree");
static_assert(CO2_PARAM_ANCHOR_CHECK_INTERVAL == int(co2::Param::AnchorCheckInterval), "param keys must agree");
static_assert(CO2_ROLE_EXCLUDED == int(co2::Role::Excluded), "roles must agree");
static_assert(CO2_WIRE_FP32 == int(co2::WireFormat::F32) && CO2_WIRE_BF16 == int(co2::WireFormat::BF16) &&
                  CO2_WIRE_INT8 == int(co2::WireFormat::Int8) && CO2_WIRE_FP4 == int(co2::WireFormat::Fp4),
              "wire formats must agree");
static_assert(CO2_TRANSPORT_AUTO == int(co2::TransportKind::Auto) && CO2_TRANSPORT_LOCAL == int(co2::TransportKind::Local) &&
                  CO2_TRANSPORT_UCX == int(co2::TransportKind::Ucx) && CO2_TRANSPORT_NCCL == int(co2::TransportKind::Nccl),
              "transport kinds must agree");

namespace {

thread_local std::string last_error;

co2_status_t failed(co2_status_t status, const std::string& message) {
  last_error = message;
  return status;
}

// Runs `body`, mapping every exception to a status. No exception crosses the ABI.
template <typename Body>
co2_status_t guarded(Body&& body) noexcept {
  try {
    body();
    return CO2_OK;
  } catch (const co2::Error& e) {
    return failed(co2_status_t(e.status()), e.what());
  } catch (const co2::transport::RendezvousError& e) {
    return failed(CO2_ERR_RENDEZVOUS, e.what());
  } catch (const std::bad_alloc&) {
    return failed(CO2_ERR_OUT_OF_MEMORY, "out of memory");
  } catch (const std::exception& e) {
    return failed(CO2_ERR_INTERNAL, std::string("internal error: ") + e.what());
  } catch (...) {
    return failed(CO2_ERR_INTERNAL, "internal error: unknown exception");
  }
}

void require_arg(bool ok, const char* message) { co2::require(ok, Status::InvalidArgument, message); }

// The v1 size of each size-first struct (capi/abi_v1.h): the least a caller may pass.
template <typename T> struct V1Size;
template <> struct V1Size<co2_comm_config_t> { static constexpr size_t value = CO2_COMM_CONFIG_V1_SIZE; };
template <> struct V1Size<co2_engine_config_t> { static constexpr size_t value = CO2_ENGINE_CONFIG_V1_SIZE; };
template <> struct V1Size<co2_tensor_t> { static constexpr size_t value = CO2_TENSOR_V1_SIZE; };
template <> struct V1Size<co2_segment_t> { static constexpr size_t value = CO2_SEGMENT_V1_SIZE; };
template <> struct V1Size<co2_allocator_t> { static constexpr size_t value = CO2_ALLOCATOR_V1_SIZE; };
template <> struct V1Size<co2_engine_stats_t> { static constexpr size_t value = CO2_ENGINE_STATS_V1_SIZE; };

// A caller's struct: at least its v1 size, else InvalidConfig naming both sizes. Returns how
// many bytes the library may read or write of it: min(caller's size, ours).
template <typename T>
size_t usable_size(size_t caller_size, const char* what) {
  static_assert(V1Size<T>::value <= sizeof(T), "structs only grow");
  co2::require(caller_size >= V1Size<T>::value, Status::InvalidConfig,
               std::string(what) + ".size is " + std::to_string(caller_size) + ", below its first published size " +
                   std::to_string(V1Size<T>::value) + " (this library's is " + std::to_string(sizeof(T)) +
                   "): initialise it with its INIT macro or init function");
  return caller_size < sizeof(T) ? caller_size : sizeof(T);
}

// Copies min(user->size, sizeof(T)) bytes of a size-first struct over the defaults: fields a
// caller built against an older header does not have keep their INIT values.
template <typename T>
T read_sized(const T* user, const T& defaults, const char* what) {
  T out = defaults;
  if (!user) return out;
  std::memcpy(&out, user, usable_size<T>(user->size, what));
  return out;
}

// A reserved field must hold 0: only then can a later version give it a meaning.
void require_reserved_zero(int64_t value, const char* what, const char* field) {
  co2::require(value == 0, Status::InvalidConfig,
               std::string(what) + "." + field + " is " + std::to_string(value) +
                   ": reserved fields must be 0 (initialise the struct with its INIT macro or init function)");
}
void require_reserved_zero(const co2_comm_config_t& c, const char* what) {
  require_reserved_zero(c.reserved0, what, "reserved0");
  require_reserved_zero(c.reserved1, what, "reserved1");
  require_reserved_zero(c.reserved2, what, "reserved2");
  require_reserved_zero(c.reserved3, what, "reserved3");
  require_reserved_zero(c.reserved4, what, "reserved4");
}
void require_reserved_zero(const co2_engine_config_t& c, const char* what) {
  require_reserved_zero(c.reserved0, what, "reserved0");
  require_reserved_zero(c.reserved1, what, "reserved1");
  require_reserved_zero(c.reserved2, what, "reserved2");
}

// version: the CO2_ABI_VERSION of the caller's header, 1 (1.0) up to this library's. A newer
// header's struct may carry settings this library does not know and would ignore.
template <typename T>
T read_config(const T* user, const T& defaults, const char* what) {
  T out = read_sized(user, defaults, what);
  co2::require(out.version >= 1 && out.version <= CO2_ABI_VERSION, Status::InvalidConfig,
               std::string(what) + ".version is " + std::to_string(out.version) +
                   (out.version == 0 ? ": initialise it with its INIT macro"
                                     : ", newer than this library's ABI version " + std::to_string(CO2_ABI_VERSION) +
                                           ": the program was built against a newer co2.h than the libco2 it runs "
                                           "with; run it with that library (or rebuild it against this header)"));
  require_reserved_zero(out, what);
  out.size = sizeof(T);
  return out;
}

co2::DataType collective_dtype(co2_dtype_t dtype) {
  switch (dtype) {
    case CO2_DTYPE_FP32: return co2::DataType::F32;
    case CO2_DTYPE_FP64: return co2::DataType::F64;
    case CO2_DTYPE_INT32: return co2::DataType::I32;
    case CO2_DTYPE_INT64: return co2::DataType::I64;
    case CO2_DTYPE_BF16:
    case CO2_DTYPE_FP16: co2::fail(Status::Unsupported, "bf16/fp16 collectives are not supported yet");
    default: co2::fail(Status::UnknownEnum, "unknown dtype " + std::to_string(dtype));
  }
}

co2::ReduceOp reduce_op(co2_reduce_op_t op) {
  switch (op) {
    case CO2_REDUCE_SUM: return co2::ReduceOp::Sum;
    case CO2_REDUCE_AVG: return co2::ReduceOp::Avg;
    case CO2_REDUCE_MIN: return co2::ReduceOp::Min;
    case CO2_REDUCE_MAX: return co2::ReduceOp::Max;
    default: co2::fail(Status::UnknownEnum, "unknown reduce op " + std::to_string(op));
  }
}

// Count 0 is a collective without data (NCCL and MPI accept it): it still pairs across ranks,
// and its buffer may be NULL. A CUDA buffer needs a collective-kind transport, whose stream then
// waits for the caller's: the collective must not read the buffer before its producer wrote it.
void prepare_raw_buffer(co2_comm_t comm, const void* buffer, size_t count, void* stream) {
  require_arg(comm != nullptr, "communicator is NULL");
  require_arg(buffer != nullptr || count == 0, "buffer is NULL");
  if (count == 0) return;
  void* collective_stream = comm->comm->collective_stream();
  const bool cuda_buffer = co2::is_cuda_memory(buffer);
  const std::string why = co2::device::raw_collective_refusal(cuda_buffer, collective_stream != nullptr);
  co2::require(why.empty(), Status::InvalidArgument, why);
  if (cuda_buffer) co2::stream_waits_for(collective_stream, stream);
}

co2_comm_config_t default_comm_config() {
  co2_comm_config_t c = CO2_COMM_CONFIG_INIT;
  return c;
}

// The group request `config` describes, validated.
co2::GroupRequest group_request(const co2_comm_config_t& config) {
  switch (config.transport) {
    case CO2_TRANSPORT_AUTO:
    case CO2_TRANSPORT_LOCAL:
    case CO2_TRANSPORT_UCX:
    case CO2_TRANSPORT_NCCL:
      break;
    default:
      co2::fail(Status::UnknownEnum, "unknown transport " + std::to_string(config.transport));
  }
  require_arg(config.timeout_ms >= 1, "timeout_ms must be >= 1 (CO2_DEFAULT_TIMEOUT_MS is the default)");
  require_arg(config.chunk_bytes >= 8, "chunk_bytes must be >= 8");
  require_arg(config.device_index >= CO2_DEVICE_INDEX_AUTO,
              "device_index must be a CUDA device index or CO2_DEVICE_INDEX_AUTO (-1)");
  require_arg(config.node_id >= CO2_NODE_ID_AUTO, "node_id must be >= 0, or CO2_NODE_ID_AUTO (-1)");
  require_arg(config.connections_per_peer <= CO2_MAX_CONNECTIONS,
              "connections_per_peer must be in 1..16, or CO2_CONNECTIONS_AUTO (0)");
  require_arg(config.elastic_min_ranks >= 0, "elastic_min_ranks must be >= 0 (0: a lost rank fails the group)");
  co2::GroupRequest request;
  request.transport = co2::TransportKind(config.transport);
  request.options.timeout = std::chrono::milliseconds(config.timeout_ms);
  request.options.chunk_bytes = size_t(config.chunk_bytes);
  request.device_index = config.device_index;
  request.options.connections_per_peer = int(config.connections_per_peer);
  request.options.elastic_min_ranks = config.elastic_min_ranks;
  return request;
}

// A handle for `comm` (which carries the node id for co2_comm_split_nodes).
std::unique_ptr<co2_comm> wrap_comm(std::shared_ptr<co2::Communicator> comm, int32_t node_id) {
  auto handle = std::make_unique<co2_comm>();
  handle->comm = std::move(comm);
  handle->node_id = node_id;
  return handle;
}

// Forms the group `config` describes; `unique_id` is "" for co2_comm_create.
co2_comm_t create_comm(const co2_comm_config_t& config, const std::string& group_name, const std::string& unique_id,
                       bool rank_is_default) {
  co2::GroupRequest request = group_request(config);
  require_arg(config.world_size >= 1, "world_size must be >= 1");
  co2::require(config.rank >= 0 && config.rank < config.world_size, Status::InvalidArgument,
               "rank " + std::to_string(config.rank) + " is outside [0, " + std::to_string(config.world_size) + ")");
  request.rank = config.rank;
  request.world_size = config.world_size;
  request.rank_is_default = rank_is_default;
  request.group_name = group_name;
  request.unique_id = unique_id;
  return wrap_comm(co2::form_group(request), config.node_id).release();
}

// What co2_comm_split and co2_comm_split_nodes form their groups with, and the node id their
// communicators carry: `config`'s when given (node_id AUTO there keeps the parent's).
co2::GroupRequest split_request(co2_comm_t parent, const co2_comm_config_t* config, int32_t& node_id) {
  node_id = parent->node_id;
  co2::GroupRequest request;
  if (!config) {
    request.options = parent->comm->options();
    return request;
  }
  const co2_comm_config_t c = read_config(config, default_comm_config(), "co2_comm_config_t");
  request = group_request(c);
  if (c.node_id != CO2_NODE_ID_AUTO) node_id = c.node_id;
  return request;
}

co2_engine_config_t default_engine_config() {
  co2_engine_config_t c = CO2_ENGINE_CONFIG_INIT;
  return c;
}

co2::StorageDesc storage(co2_dtype_t dtype, co2_device_kind_t device, int32_t index) {
  co2::StorageDesc d;
  d.dtype = dtype;
  d.device = device;
  d.device_index = index;
  return d;
}

co2::Engine& engine_of(co2_engine_t engine) {
  require_arg(engine != nullptr, "engine is NULL");
  return *engine->engine;
}

const char* status_text(co2_status_t status) {
  switch (status) {
    case CO2_OK: return "success";
    case CO2_ERR_INVALID_ARGUMENT: return "invalid argument: a NULL pointer, a zero or mismatched size, or a value out of range; see co2_last_error_message()";
    case CO2_ERR_INVALID_STATE: return "invalid state: the call is not allowed now (for example step before commit, or register after commit)";
    case CO2_ERR_UNSUPPORTED: return "unsupported: this build or version cannot do this (for example a transport or device this build lacks); see co2_last_error_message()";
    case CO2_ERR_INVALID_CONFIG: return "invalid config: initialise config structs with their INIT macro or init function";
    case CO2_ERR_UNKNOWN_ENUM: return "unknown enum value: the library is older than the header you compiled against, or the value is garbage";
    case CO2_ERR_DUPLICATE_TENSOR: return "duplicate tensor: the same name or memory was registered twice (register tied weights once)";
    case CO2_ERR_OUT_OF_MEMORY: return "out of memory";
    case CO2_ERR_NONFINITE: return "non-finite values: an average contained NaN or Inf and nothing was applied on any rank; lower the learning rate or skip the data";
    case CO2_ERR_LAYOUT_MISMATCH: return "layout mismatch: ranks registered different tensors or created their engines with different settings; register the same tensors in the same order and use the same engine config on every rank";
    case CO2_ERR_ANCHOR_MISMATCH: return "anchor mismatch: ranks no longer hold the same anchor; restore from a checkpoint";
    case CO2_ERR_CHECKPOINT_CORRUPT: return "corrupt checkpoint: truncated, bad magic or CRC mismatch; the engine is unchanged";
    case CO2_ERR_CHECKPOINT_MISMATCH: return "checkpoint mismatch: saved from another layout, algorithm or format version; the engine is unchanged";
    case CO2_ERR_CALLBACK: return "a user callback reported failure";
    case CO2_MEMBERSHIP_CHANGED: return "membership changed: the elastic group lost a rank and re-formed; read co2_comm_rank/co2_comm_size and the engine's step count, re-shard the data and go on";
    case CO2_LEFT: return "left: this rank left its elastic group as it asked (co2_engine_leave); its parameters are the group's anchor; destroy the engine and the communicator";
    case CO2_ERR_TIMEOUT: return "timed out: the wait expired and the operation is still pending; wait again or abort";
    case CO2_ERR_PEER_LOST: return "peer lost: another rank disappeared; destroy the communicator and restart the group";
    case CO2_ERR_PEER_TIMEOUT: return "peer timeout: no progress for the communicator's timeout (a peer stalled or died); destroy the communicator";
    case CO2_ERR_COLLECTIVE_MISMATCH: return "collective mismatch: ranks issued different collectives in the same order position; fix the call order";
    case CO2_ERR_ABORTED: return "aborted: co2_comm_abort was called on this or another rank; destroy the communicator";
    case CO2_ERR_TRANSPORT: return "transport failure; see co2_last_error_message()";
    case CO2_ERR_RENDEZVOUS: return "rendezvous failed: the group could not be formed (a rank never joined, or sizes disagree)";
    case CO2_ERR_INTERNAL: return "internal error in co2: please report it with co2_last_error_message()";
    default: return "unknown status code";
  }
}

}  // namespace

CO2_EXPORT const char* co2_status_string(co2_status_t status) { return status_text(status); }

CO2_EXPORT const char* co2_last_error_message(void) { return last_error.c_str(); }

CO2_EXPORT co2_status_t co2_get_version(int* major, int* minor, int* patch) {
  return guarded([&] {
    require_arg(major && minor && patch, "version outputs must not be NULL");
    *major = CO2_VERSION_MAJOR;
    *minor = CO2_VERSION_MINOR;
    *patch = CO2_VERSION_PATCH;
  });
}

// --- communicator -------------------------------------------------------------------------

// The init functions write a whole struct into the caller's memory, so each must write the
// layout the caller was built with: a binary built against an older co2.h has a smaller struct.
// Their symbols are versioned (capi/libco2.map, docs/capi.md "The size rule"): a binary linked
// before 1.2 is bound to co2_*_init@CO2_1 and gets 1.1's layout (its size in `size`, the fields
// after it untouched); binaries linked since get the current one (@@CO2_1.2). When a struct
// grows again, its current function moves to a new version node and the one it replaces stays.
namespace {

// The 1.1 sizes (x86_64 / LP64), the last layouts bound to CO2_1.
constexpr size_t kCommConfig11Size = offsetof(co2_comm_config_t, connections_per_peer);
constexpr size_t kEngineConfig11Size = offsetof(co2_engine_config_t, apply_step);
constexpr size_t kEngineStats11Size = offsetof(co2_engine_stats_t, arrival_updates);
constexpr uint32_t kAbiVersion11 = 2;

// The first `bytes` of `value`, with its size and version saying so, into `out`.
template <typename Struct>
void write_prefix(Struct* out, Struct value, size_t bytes, uint32_t version) {
  value.size = bytes;
  value.version = version;
  std::memcpy(out, &value, bytes);
}

}  // namespace

#define CO2_VERSIONED(name, node) extern "C" __attribute__((visibility("default"), symver(#name "@" node)))

CO2_VERSIONED(co2_comm_config_init, "@CO2_1.2") co2_status_t versioned_comm_config_init_1_2(co2_comm_config_t* config) {
  return guarded([&] {
    require_arg(config != nullptr, "config is NULL");
    *config = default_comm_config();
  });
}

CO2_VERSIONED(co2_comm_config_init, "CO2_1") co2_status_t versioned_comm_config_init_1_1(co2_comm_config_t* config) {
  return guarded([&] {
    require_arg(config != nullptr, "config is NULL");
    write_prefix(config, default_comm_config(), kCommConfig11Size, kAbiVersion11);
  });
}

CO2_EXPORT co2_status_t co2_get_unique_id(co2_unique_id_t* out_id) {
  return guarded([&] {
    require_arg(out_id != nullptr, "out_id is NULL");
    const std::string text = co2::make_unique_id();
    co2::require(text.size() < CO2_UNIQUE_ID_BYTES, Status::InvalidArgument,
                 "the id '" + text + "' does not fit in co2_unique_id_t: set CO2_MASTER_ADDR to a shorter address");
    co2_unique_id_t id;
    std::memset(&id, 0, sizeof id);
    std::memcpy(id.internal, text.data(), text.size());
    *out_id = id;
  });
}

CO2_EXPORT co2_status_t co2_comm_create(const co2_comm_config_t* config, co2_comm_t* out_comm) {
  return guarded([&] {
    require_arg(out_comm != nullptr, "out_comm is NULL");
    const co2_comm_config_t c = read_config(config, default_comm_config(), "co2_comm_config_t");
    const std::string group = c.group_name ? c.group_name : "default";
    require_arg(!group.empty(), "group_name is empty");
    *out_comm = create_comm(c, group, "", config == nullptr || (c.rank == 0 && c.world_size == 1));
  });
}

CO2_EXPORT co2_status_t co2_comm_create_with_id(const co2_comm_config_t* config, const co2_unique_id_t* id,
                                                int32_t rank, int32_t world_size, co2_comm_t* out_comm) {
  return guarded([&] {
    require_arg(out_comm != nullptr, "out_comm is NULL");
    require_arg(id != nullptr, "id is NULL");
    co2_comm_config_t c = read_config(config, default_comm_config(), "co2_comm_config_t");
    const size_t length = strnlen(id->internal, CO2_UNIQUE_ID_BYTES);
    co2::require(length > 0 && length < CO2_UNIQUE_ID_BYTES && std::strncmp(id->internal, "co2-id-", 7) == 0,
                 Status::InvalidArgument, "id was not produced by co2_get_unique_id");
    c.rank = rank;
    c.world_size = world_size;
    *out_comm = create_comm(c, "", std::string(id->internal, length), false);
  });
}

CO2_EXPORT co2_status_t co2_comm_split(co2_comm_t parent, int32_t color, int32_t key, const co2_comm_config_t* config,
                                       co2_comm_t* out_comm) {
  return guarded([&] {
    require_arg(parent != nullptr, "parent communicator is NULL");
    require_arg(out_comm != nullptr, "out_comm is NULL");
    require_arg(color >= CO2_SPLIT_NONE, "color must be >= 0, or CO2_SPLIT_NONE to join no group");
    int32_t node_id = CO2_NODE_ID_AUTO;
    const co2::GroupRequest request = split_request(parent, config, node_id);
    auto comm = co2::split_group(*parent->comm, color, key, request);
    *out_comm = comm ? wrap_comm(std::move(comm), node_id).release() : nullptr;
  });
}

CO2_EXPORT co2_status_t co2_comm_split_nodes(co2_comm_t parent, const co2_comm_config_t* config,
                                             co2_comm_t* intra_node, co2_comm_t* inter_node) {
  return guarded([&] {
    require_arg(parent != nullptr, "parent communicator is NULL");
    require_arg(intra_node != nullptr && inter_node != nullptr, "intra_node or inter_node is NULL");
    int32_t node_id = CO2_NODE_ID_AUTO;
    const co2::GroupRequest request = split_request(parent, config, node_id);
    auto [intra, inter] = co2::split_nodes(*parent->comm, node_id, request);
    // Both handles exist before either is handed out: a failure leaves the outputs untouched.
    auto intra_handle = wrap_comm(std::move(intra), node_id);
    auto inter_handle = wrap_comm(std::move(inter), node_id);
    *intra_node = intra_handle.release();
    *inter_node = inter_handle.release();
  });
}

CO2_EXPORT co2_status_t co2_comm_rank(co2_comm_t comm, int32_t* out_rank) {
  return guarded([&] {
    require_arg(comm && out_rank, "communicator or output is NULL");
    *out_rank = comm->comm->rank();
  });
}

CO2_EXPORT co2_status_t co2_comm_size(co2_comm_t comm, int32_t* out_size) {
  return guarded([&] {
    require_arg(comm && out_size, "communicator or output is NULL");
    *out_size = comm->comm->size();
  });
}

CO2_EXPORT co2_status_t co2_comm_abort(co2_comm_t comm) {
  return guarded([&] {
    require_arg(comm != nullptr, "communicator is NULL");
    comm->comm->abort();
  });
}

CO2_EXPORT co2_status_t co2_comm_destroy(co2_comm_t comm) {
  return guarded([&] { delete comm; });
}

// --- raw collectives ----------------------------------------------------------------------

CO2_EXPORT co2_status_t co2_allreduce(co2_comm_t comm, void* buffer, size_t count, co2_dtype_t dtype,
                                      co2_reduce_op_t op, void* stream, co2_request_t* out_request) {
  return guarded([&] {
    prepare_raw_buffer(comm, buffer, count, stream);
    require_arg(out_request != nullptr, "out_request is NULL");
    const co2::DataType type = collective_dtype(dtype);
    const co2::ReduceOp reduce = reduce_op(op);
    auto handle = std::make_unique<co2_request>();
    handle->comm = comm->comm;
    handle->request = comm->comm->allreduce(buffer, count, type, reduce);
    *out_request = handle.release();
  });
}

CO2_EXPORT co2_status_t co2_broadcast(co2_comm_t comm, void* buffer, size_t count, co2_dtype_t dtype,
                                      int32_t root, void* stream, co2_request_t* out_request) {
  return guarded([&] {
    prepare_raw_buffer(comm, buffer, count, stream);
    require_arg(out_request != nullptr, "out_request is NULL");
    co2::require(root >= 0 && root < comm->comm->size(), Status::InvalidArgument,
                 "root " + std::to_string(root) + " is not a rank of this communicator");
    const co2::DataType type = collective_dtype(dtype);
    auto handle = std::make_unique<co2_request>();
    handle->comm = comm->comm;
    handle->request = comm->comm->broadcast(buffer, count, type, root);
    *out_request = handle.release();
  });
}

CO2_EXPORT co2_status_t co2_request_test(co2_request_t request, int* out_done) {
  return guarded([&] {
    require_arg(request && out_done, "request or output is NULL");
    *out_done = request->request->test() ? 1 : 0;
  });
}

CO2_EXPORT co2_status_t co2_request_wait(co2_request_t request, int64_t timeout_ms) {
  return guarded([&] {
    require_arg(request != nullptr, "request is NULL");
    if (!request->request->wait_for(std::chrono::milliseconds(timeout_ms)))
      co2::fail(Status::Timeout, "the request did not complete within " + std::to_string(timeout_ms) + " ms");
  });
}

CO2_EXPORT co2_status_t co2_request_free(co2_request_t request) {
  return guarded([&] {
    if (!request) return;
    request->request->wait_status();
    delete request;
  });
}

// --- engine -------------------------------------------------------------------------------

CO2_VERSIONED(co2_engine_config_init, "@CO2_1.2") co2_status_t versioned_engine_config_init_1_2(co2_engine_config_t* config) {
  return guarded([&] {
    require_arg(config != nullptr, "config is NULL");
    *config = default_engine_config();
  });
}

CO2_VERSIONED(co2_engine_config_init, "CO2_1") co2_status_t versioned_engine_config_init_1_1(co2_engine_config_t* config) {
  return guarded([&] {
    require_arg(config != nullptr, "config is NULL");
    write_prefix(config, default_engine_config(), kEngineConfig11Size, kAbiVersion11);
  });
}

CO2_EXPORT co2_status_t co2_tensor_init(co2_tensor_t* tensor) {
  return guarded([&] {
    require_arg(tensor != nullptr, "tensor is NULL");
    *tensor = co2_tensor_t CO2_TENSOR_INIT;
  });
}

CO2_EXPORT co2_status_t co2_segment_init(co2_segment_t* segment) {
  return guarded([&] {
    require_arg(segment != nullptr, "segment is NULL");
    *segment = co2_segment_t CO2_SEGMENT_INIT;
  });
}

CO2_VERSIONED(co2_engine_stats_init, "@CO2_1.2") co2_status_t versioned_engine_stats_init_1_2(co2_engine_stats_t* stats) {
  return guarded([&] {
    require_arg(stats != nullptr, "stats is NULL");
    *stats = co2_engine_stats_t CO2_ENGINE_STATS_INIT;
  });
}

CO2_VERSIONED(co2_engine_stats_init, "CO2_1") co2_status_t versioned_engine_stats_init_1_1(co2_engine_stats_t* stats) {
  return guarded([&] {
    require_arg(stats != nullptr, "stats is NULL");
    write_prefix(stats, co2_engine_stats_t CO2_ENGINE_STATS_INIT, kEngineStats11Size, kAbiVersion11);
  });
}

CO2_EXPORT co2_status_t co2_engine_create(co2_comm_t comm, const co2_engine_config_t* config,
                                          co2_engine_t* out_engine) {
  return guarded([&] {
    require_arg(comm != nullptr, "communicator is NULL");
    require_arg(out_engine != nullptr, "out_engine is NULL");
    const co2_engine_config_t c = read_config(config, default_engine_config(), "co2_engine_config_t");
    if (c.state_dtype == CO2_DTYPE_BF16 || c.state_dtype == CO2_DTYPE_FP16)
      co2::fail(Status::Unsupported, "the outer state is fp32 (a low-precision anchor swallows small updates)");
    co2::require(c.state_dtype == CO2_DTYPE_FP32, c.state_dtype >= 0 && c.state_dtype <= 5 ? Status::InvalidArgument : Status::UnknownEnum,
                 "state_dtype must be CO2_DTYPE_FP32");
    co2::EngineConfig e;
    e.algorithm = co2::Algorithm(c.algorithm);
    e.tau = c.tau;
    e.warmup_sync_rounds = c.warmup_sync_rounds;
    e.outer_lr = c.outer_lr;
    e.outer_momentum = c.outer_momentum;
    require_arg(c.nesterov == 0 || c.nesterov == 1, "nesterov must be 0 or 1");
    e.nesterov = c.nesterov != 0;
    e.penalty = co2::Penalty(c.penalty);
    e.penalty_constant = c.penalty_constant;
    e.clip = co2::Clip(c.clip);
    e.clip_threshold = c.clip_threshold;
    e.anchor_check_interval = c.anchor_check_interval;
    e.inner_lr = c.inner_lr;
    require_arg(c.eager >= CO2_EAGER_AUTO && c.eager <= 1, "eager must be 0, 1 or CO2_EAGER_AUTO (-1)");
    e.eager = co2::Eager(c.eager);
    e.wire_format = co2::wire_format_of(c.wire_format);
    require_arg(c.error_feedback == 0 || c.error_feedback == 1, "error_feedback must be 0 or 1");
    e.error_feedback = c.error_feedback != 0;
    require_arg(c.shard_outer_state == 0 || c.shard_outer_state == 1, "shard_outer_state must be 0 or 1");
    e.shard_outer_state = c.shard_outer_state != 0;
    require_arg(c.hierarchy == CO2_HIERARCHY_FLAT || c.hierarchy == CO2_HIERARCHY_NODES,
                "hierarchy must be CO2_HIERARCHY_FLAT (0) or CO2_HIERARCHY_NODES (1)");
    e.hierarchy = co2::Hierarchy(c.hierarchy);
    e.apply_step = c.apply_step;
    e.node_id = comm->node_id;  // the communicator's (CO2_NODE_ID_AUTO: the launcher's environment)
    auto handle = std::make_unique<co2_engine>();
    handle->engine = std::make_unique<co2::Engine>(comm->comm, e);
    *out_engine = handle.release();
  });
}

CO2_EXPORT co2_status_t co2_engine_destroy(co2_engine_t engine) {
  return guarded([&] { delete engine; });
}

CO2_EXPORT co2_status_t co2_engine_register_tensor(co2_engine_t engine, const co2_tensor_t* tensor) {
  return guarded([&] {
    co2::Engine& e = engine_of(engine);
    require_arg(tensor != nullptr, "tensor is NULL");
    const co2_tensor_t t = read_sized(tensor, co2_tensor_t CO2_TENSOR_INIT, "co2_tensor_t");
    require_arg(t.name != nullptr, "tensor name is NULL");
    co2::TensorDesc d;
    d.name = t.name;
    d.data = t.data;
    d.count = t.count;
    d.storage = storage(t.dtype, t.device, t.device_index);
    d.role = t.role;
    e.register_tensor(d);
  });
}

CO2_EXPORT co2_status_t co2_engine_alloc_flat(co2_engine_t engine, size_t count, co2_dtype_t dtype,
                                              co2_device_kind_t device, int32_t device_index, void** out_data) {
  return guarded([&] {
    co2::Engine& e = engine_of(engine);
    require_arg(out_data != nullptr, "out_data is NULL");
    *out_data = e.alloc_flat(count, storage(dtype, device, device_index));
  });
}

CO2_EXPORT co2_status_t co2_engine_adopt_flat(co2_engine_t engine, void* data, size_t count, co2_dtype_t dtype,
                                              co2_device_kind_t device, int32_t device_index) {
  return guarded([&] { engine_of(engine).adopt_flat(data, count, storage(dtype, device, device_index)); });
}

CO2_EXPORT co2_status_t co2_engine_add_segment(co2_engine_t engine, const co2_segment_t* segment) {
  return guarded([&] {
    co2::Engine& e = engine_of(engine);
    require_arg(segment != nullptr, "segment is NULL");
    const co2_segment_t s = read_sized(segment, co2_segment_t CO2_SEGMENT_INIT, "co2_segment_t");
    require_reserved_zero(s.reserved0, "co2_segment_t", "reserved0");
    require_arg(s.name != nullptr, "segment name is NULL");
    co2::SegmentDesc d;
    d.name = s.name;
    d.offset = s.offset;
    d.count = s.count;
    d.role = s.role;
    e.add_segment(d);
  });
}

CO2_EXPORT co2_status_t co2_engine_set_allocator(co2_engine_t engine, const co2_allocator_t* allocator) {
  return guarded([&] {
    co2::Engine& e = engine_of(engine);
    co2::DeviceAllocator a;
    if (allocator) {
      const co2_allocator_t c = read_sized(allocator, co2_allocator_t CO2_ALLOCATOR_INIT, "co2_allocator_t");
      a.user = c.user;
      a.allocate = c.allocate;
      a.release = c.release;
    }
    e.set_device_allocator(a);
  });
}

CO2_EXPORT co2_status_t co2_engine_commit(co2_engine_t engine) {
  return guarded([&] { engine_of(engine).commit(); });
}

CO2_EXPORT co2_status_t co2_engine_step(co2_engine_t engine, void* stream, int* out_boundary) {
  return guarded([&] {
    const bool boundary = engine_of(engine).step(stream);
    if (out_boundary) *out_boundary = boundary ? 1 : 0;
  });
}

CO2_EXPORT co2_status_t co2_engine_reduce_gradients(co2_engine_t engine, void* const* grads, size_t num_grads,
                                                    void* stream) {
  return guarded([&] { engine_of(engine).reduce_gradients(grads, num_grads, stream); });
}

CO2_EXPORT co2_status_t co2_engine_synchronize(co2_engine_t engine) {
  return guarded([&] { engine_of(engine).synchronize(); });
}

CO2_EXPORT co2_status_t co2_engine_finalize(co2_engine_t engine) {
  return guarded([&] { engine_of(engine).finalize(); });
}

CO2_EXPORT co2_status_t co2_engine_leave(co2_engine_t engine) {
  return guarded([&] { engine_of(engine).leave(); });
}

CO2_EXPORT co2_status_t co2_engine_consensus(co2_engine_t engine, co2_consensus_t kind, float* out, size_t count) {
  return guarded([&] {
    co2::Engine& e = engine_of(engine);
    co2::require(kind == CO2_CONSENSUS_ANCHOR || kind == CO2_CONSENSUS_LOCAL_AVERAGE, Status::UnknownEnum,
                 "unknown consensus kind " + std::to_string(kind));
    e.consensus(co2::ConsensusKind(kind), out, count);
  });
}

CO2_EXPORT co2_status_t co2_engine_num_elements(co2_engine_t engine, size_t* out_count) {
  return guarded([&] {
    co2::Engine& e = engine_of(engine);
    require_arg(out_count != nullptr, "out_count is NULL");
    *out_count = e.num_elements();
  });
}

CO2_EXPORT co2_status_t co2_engine_set_param(co2_engine_t engine, co2_param_t key, double value) {
  return guarded([&] {
    co2::Engine& e = engine_of(engine);
    co2::require(key >= CO2_PARAM_OUTER_LR && key <= CO2_PARAM_ANCHOR_CHECK_INTERVAL, Status::UnknownEnum,
                 "unknown parameter key " + std::to_string(key));
    e.set_param(co2::Param(key), value);
  });
}

CO2_EXPORT co2_status_t co2_engine_get_param(co2_engine_t engine, co2_param_t key, double* out_value) {
  return guarded([&] {
    co2::Engine& e = engine_of(engine);
    require_arg(out_value != nullptr, "out_value is NULL");
    co2::require(key >= CO2_PARAM_OUTER_LR && key <= CO2_PARAM_ANCHOR_CHECK_INTERVAL, Status::UnknownEnum,
                 "unknown parameter key " + std::to_string(key));
    *out_value = e.get_param(co2::Param(key));
  });
}

CO2_EXPORT co2_status_t co2_engine_get_stats(co2_engine_t engine, co2_engine_stats_t* out_stats) {
  return guarded([&] {
    co2::Engine& e = engine_of(engine);
    require_arg(out_stats != nullptr, "out_stats is NULL");
    const size_t writable = usable_size<co2_engine_stats_t>(out_stats->size, "co2_engine_stats_t");
    const co2::EngineStats s = e.stats();
    co2_engine_stats_t out;
    std::memset(&out, 0, sizeof out);
    out.version = CO2_ABI_VERSION;
    out.world_size = s.world_size;
    out.steps = s.steps;
    out.rounds = s.rounds;
    out.outer_updates = s.outer_updates;
    out.bytes_reduced = s.bytes_reduced;
    out.collective_ns = s.collective_ns;
    out.boundary_wait_ns = s.boundary_wait_ns;
    out.last_boundary_wait_ns = s.last_boundary_wait_ns;
    out.nonfinite_rounds = s.nonfinite_rounds;
    out.nonfinite_local = s.nonfinite_local;
    out.anchor_checks = s.anchor_checks;
    out.resolved_outer_momentum = s.resolved_outer_momentum;
    out.last_penalty_min = s.last_penalty_min;
    out.last_penalty_max = s.last_penalty_max;
    out.last_clip_scale_min = s.last_clip_scale_min;
    out.last_clip_fraction = s.last_clip_fraction;
    out.step_time_ns = s.step_time_ns;
    out.allreduce_time_ns = s.allreduce_time_ns;
    out.advised_tau = s.advised_tau;
    out.last_collective_ns = s.last_collective_ns;
    out.last_round_ns = s.last_round_ns;
    out.hidden_fraction = s.hidden_fraction;
    out.last_hidden_fraction = s.last_hidden_fraction;
    out.rank_step_time_ns = s.rank_step_time_ns;
    out.rank_allreduce_time_ns = s.rank_allreduce_time_ns;
    out.wire_bytes_last_round = s.wire_bytes_last_round;
    out.wire_bytes_total = s.wire_bytes_total;
    out.outer_state_bytes = s.outer_state_bytes;
    out.arrival_updates = s.arrival_updates;
    out.last_apply_step = s.last_apply_step;
    out.size = writable;  // a caller with an older header receives its own layout, no more
    std::memcpy(out_stats, &out, writable);
  });
}

// --- checkpoint ---------------------------------------------------------------------------

namespace {
// The C callback as the engine's writer; none (a rank that only takes part) stays empty.
co2::WriteFn write_fn_of(co2_write_fn write, void* user) {
  if (!write) return {};
  return [write, user](const void* data, size_t length) { return write(user, data, length) == 0; };
}
}  // namespace

CO2_EXPORT co2_status_t co2_engine_save(co2_engine_t engine, co2_write_fn write, void* user) {
  return guarded([&] {
    engine_of(engine).save(write_fn_of(write, user));
  });
}

CO2_EXPORT co2_status_t co2_engine_state_size(co2_engine_t engine, size_t* out_bytes) {
  return guarded([&] {
    co2::Engine& e = engine_of(engine);
    require_arg(out_bytes != nullptr, "out_bytes is NULL");
    *out_bytes = e.state_size();
  });
}

CO2_EXPORT co2_status_t co2_engine_save_portable(co2_engine_t engine, co2_write_fn write, void* user) {
  return guarded([&] {
    engine_of(engine).save_portable(write_fn_of(write, user));
  });
}

CO2_EXPORT co2_status_t co2_engine_portable_state_size(co2_engine_t engine, size_t* out_bytes) {
  return guarded([&] {
    co2::Engine& e = engine_of(engine);
    require_arg(out_bytes != nullptr, "out_bytes is NULL");
    *out_bytes = e.portable_state_size();
  });
}

CO2_EXPORT co2_status_t co2_engine_load(co2_engine_t engine, co2_read_fn read, void* user) {
  return guarded([&] {
    co2::Engine& e = engine_of(engine);
    // A NULL read reaches the engine as an empty callback: a sharded engine's ranks then fail
    // together at the load's verdict instead of leaving the others waiting for this one.
    co2::ReadFn source;
    if (read) source = [read, user](void* data, size_t length) { return read(user, data, length) == 0; };
    e.load(source);
  });
}

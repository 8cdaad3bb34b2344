# Generated from capi/include/co2/co2.h by bindings/julia/generate.py (libclang); do not edit.
# Regenerate: /usr/bin/python3 bindings/julia/generate.py   (CI checks it is current)

# ---- macros (values evaluated by clang) ----
const CO2_VERSION_MAJOR = Cint(1)
const CO2_VERSION_MINOR = Cint(2)
const CO2_VERSION_PATCH = Cint(0)
const CO2_ABI_VERSION = Cint(3)
const CO2_DEFAULT_TIMEOUT_MS = Cuint(300000)
const CO2_DEFAULT_CHUNK_BYTES = Culong(1048576)
const CO2_DEVICE_INDEX_AUTO = Cint(-1)
const CO2_NODE_ID_AUTO = Cint(-1)
const CO2_CONNECTIONS_AUTO = Cuint(0)
const CO2_MAX_CONNECTIONS = Cuint(16)
const CO2_UNIQUE_ID_BYTES = Cint(128)
const CO2_SPLIT_NONE = Cint(-1)
const CO2_DEFAULT_TAU = Cuint(12)
const CO2_DEFAULT_OUTER_LR = Cdouble(1.0)
const CO2_OUTER_MOMENTUM_AUTO = Cdouble(-1.0)
const CO2_DEFAULT_CLIP_THRESHOLD = Cdouble(1.0)
const CO2_DEFAULT_ANCHOR_CHECK_INTERVAL = Cuint(100)
const CO2_EAGER_AUTO = Cint(-1)
const CO2_DEFAULT_EAGER = Cint(-1)
const CO2_DEFAULT_ERROR_FEEDBACK = Cint(1)
const CO2_APPLY_AT_BOUNDARY = Cint(0)
const CO2_APPLY_ON_ARRIVAL = Cint(-1)
const CO2_DEFAULT_APPLY_STEP = Cint(0)
const CO2_HIERARCHY_FLAT = Cint(0)
const CO2_HIERARCHY_NODES = Cint(1)

const co2_status_t = Int32

const CO2_OK = Cint(0)
const CO2_ERR_INVALID_ARGUMENT = Cint(1)
const CO2_ERR_INVALID_STATE = Cint(2)
const CO2_ERR_UNSUPPORTED = Cint(3)
const CO2_ERR_INVALID_CONFIG = Cint(4)
const CO2_ERR_UNKNOWN_ENUM = Cint(5)
const CO2_ERR_DUPLICATE_TENSOR = Cint(6)
const CO2_ERR_OUT_OF_MEMORY = Cint(7)
const CO2_ERR_NONFINITE = Cint(20)
const CO2_ERR_LAYOUT_MISMATCH = Cint(21)
const CO2_ERR_ANCHOR_MISMATCH = Cint(22)
const CO2_ERR_CHECKPOINT_CORRUPT = Cint(23)
const CO2_ERR_CHECKPOINT_MISMATCH = Cint(24)
const CO2_ERR_CALLBACK = Cint(25)
const CO2_ERR_TIMEOUT = Cint(40)
const CO2_MEMBERSHIP_CHANGED = Cint(50)
const CO2_LEFT = Cint(51)
const CO2_ERR_PEER_LOST = Cint(100)
const CO2_ERR_PEER_TIMEOUT = Cint(101)
const CO2_ERR_COLLECTIVE_MISMATCH = Cint(102)
const CO2_ERR_ABORTED = Cint(103)
const CO2_ERR_TRANSPORT = Cint(104)
const CO2_ERR_RENDEZVOUS = Cint(105)
const CO2_ERR_INTERNAL = Cint(199)

const _co2_status_string_ptr = Ref{Ptr{Cvoid}}(C_NULL)
function co2_status_string(status)
    ccall(_co2_status_string_ptr[], Ptr{Cchar}, (co2_status_t,), status)
end

const _co2_last_error_message_ptr = Ref{Ptr{Cvoid}}(C_NULL)
function co2_last_error_message()
    ccall(_co2_last_error_message_ptr[], Ptr{Cchar}, ())
end

const _co2_get_version_ptr = Ref{Ptr{Cvoid}}(C_NULL)
function co2_get_version(major, minor, patch)
    ccall(_co2_get_version_ptr[], co2_status_t, (Ptr{Cint}, Ptr{Cint}, Ptr{Cint}), major, minor, patch)
end

const co2_dtype_t = Int32

const CO2_DTYPE_FP32 = Cint(0)
const CO2_DTYPE_BF16 = Cint(1)
const CO2_DTYPE_FP16 = Cint(2)
const CO2_DTYPE_FP64 = Cint(3)
const CO2_DTYPE_INT32 = Cint(4)
const CO2_DTYPE_INT64 = Cint(5)

const co2_device_kind_t = Int32

const CO2_DEVICE_HOST = Cint(0)
const CO2_DEVICE_CUDA = Cint(1)

const co2_reduce_op_t = Int32

const CO2_REDUCE_SUM = Cint(0)
const CO2_REDUCE_AVG = Cint(1)
const CO2_REDUCE_MIN = Cint(2)
const CO2_REDUCE_MAX = Cint(3)

const co2_transport_kind_t = Int32

const CO2_TRANSPORT_AUTO = Cint(0)
const CO2_TRANSPORT_LOCAL = Cint(1)
const CO2_TRANSPORT_UCX = Cint(2)
const CO2_TRANSPORT_NCCL = Cint(3)

const co2_algorithm_t = Int32

const CO2_ALGO_CO2 = Cint(0)
const CO2_ALGO_SYNC = Cint(1)
const CO2_ALGO_LOCALSGD = Cint(2)
const CO2_ALGO_DILOCO = Cint(3)

const co2_penalty_t = Int32

const CO2_PENALTY_NONE = Cint(0)
const CO2_PENALTY_CONSTANT = Cint(1)
const CO2_PENALTY_GAP = Cint(2)

const co2_clip_t = Int32

const CO2_CLIP_NONE = Cint(0)
const CO2_CLIP_VALUE = Cint(1)
const CO2_CLIP_NORM = Cint(2)

const co2_tensor_role_t = Int32

const CO2_ROLE_PARAMETER = Cint(0)
const CO2_ROLE_BUFFER = Cint(1)
const CO2_ROLE_EXCLUDED = Cint(2)

const co2_param_t = Int32

const CO2_PARAM_OUTER_LR = Cint(0)
const CO2_PARAM_OUTER_MOMENTUM = Cint(1)
const CO2_PARAM_TAU = Cint(2)
const CO2_PARAM_CLIP_THRESHOLD = Cint(3)
const CO2_PARAM_PENALTY_CONSTANT = Cint(4)
const CO2_PARAM_INNER_LR = Cint(5)
const CO2_PARAM_ANCHOR_CHECK_INTERVAL = Cint(6)

const co2_consensus_t = Int32

const CO2_CONSENSUS_ANCHOR = Cint(0)
const CO2_CONSENSUS_LOCAL_AVERAGE = Cint(1)

const co2_wire_format_t = Int32

const CO2_WIRE_FP32 = Cint(0)
const CO2_WIRE_BF16 = Cint(1)
const CO2_WIRE_INT8 = Cint(2)
const CO2_WIRE_FP4 = Cint(3)

mutable struct co2_comm end  # opaque handle target
const co2_comm_t = Ptr{co2_comm}

mutable struct co2_engine end  # opaque handle target
const co2_engine_t = Ptr{co2_engine}

mutable struct co2_request end  # opaque handle target
const co2_request_t = Ptr{co2_request}

mutable struct co2_comm_config_t
    size::Csize_t
    version::UInt32
    transport::co2_transport_kind_t
    rank::Int32
    world_size::Int32
    group_name::Ptr{Cchar}
    timeout_ms::UInt32
    reserved0::UInt32
    chunk_bytes::UInt64
    device_index::Int32
    reserved1::UInt32
    node_id::Int32
    reserved2::UInt32
    connections_per_peer::UInt32
    reserved3::UInt32
    elastic_min_ranks::Int32
    reserved4::UInt32
end

const _co2_comm_config_init_ptr = Ref{Ptr{Cvoid}}(C_NULL)
function co2_comm_config_init(config)
    ccall(_co2_comm_config_init_ptr[], co2_status_t, (Ptr{co2_comm_config_t},), config)
end

struct co2_unique_id_t
    internal::NTuple{128, Cchar}
end

const _co2_get_unique_id_ptr = Ref{Ptr{Cvoid}}(C_NULL)
function co2_get_unique_id(out_id)
    ccall(_co2_get_unique_id_ptr[], co2_status_t, (Ptr{co2_unique_id_t},), out_id)
end

const _co2_comm_create_ptr = Ref{Ptr{Cvoid}}(C_NULL)
function co2_comm_create(config, out_comm)
    ccall(_co2_comm_create_ptr[], co2_status_t, (Ptr{co2_comm_config_t}, Ptr{co2_comm_t}), config, out_comm)
end

const _co2_comm_create_with_id_ptr = Ref{Ptr{Cvoid}}(C_NULL)
function co2_comm_create_with_id(config, id, rank, world_size, out_comm)
    ccall(_co2_comm_create_with_id_ptr[], co2_status_t, (Ptr{co2_comm_config_t}, Ptr{co2_unique_id_t}, Int32, Int32, Ptr{co2_comm_t}), config, id, rank, world_size, out_comm)
end

const _co2_comm_split_ptr = Ref{Ptr{Cvoid}}(C_NULL)
function co2_comm_split(parent, color, key, config, out_comm)
    ccall(_co2_comm_split_ptr[], co2_status_t, (co2_comm_t, Int32, Int32, Ptr{co2_comm_config_t}, Ptr{co2_comm_t}), parent, color, key, config, out_comm)
end

const _co2_comm_split_nodes_ptr = Ref{Ptr{Cvoid}}(C_NULL)
function co2_comm_split_nodes(parent, config, intra_node, inter_node)
    ccall(_co2_comm_split_nodes_ptr[], co2_status_t, (co2_comm_t, Ptr{co2_comm_config_t}, Ptr{co2_comm_t}, Ptr{co2_comm_t}), parent, config, intra_node, inter_node)
end

const _co2_comm_rank_ptr = Ref{Ptr{Cvoid}}(C_NULL)
function co2_comm_rank(comm, out_rank)
    ccall(_co2_comm_rank_ptr[], co2_status_t, (co2_comm_t, Ptr{Int32}), comm, out_rank)
end

const _co2_comm_size_ptr = Ref{Ptr{Cvoid}}(C_NULL)
function co2_comm_size(comm, out_size)
    ccall(_co2_comm_size_ptr[], co2_status_t, (co2_comm_t, Ptr{Int32}), comm, out_size)
end

const _co2_comm_abort_ptr = Ref{Ptr{Cvoid}}(C_NULL)
function co2_comm_abort(comm)
    ccall(_co2_comm_abort_ptr[], co2_status_t, (co2_comm_t,), comm)
end

const _co2_comm_destroy_ptr = Ref{Ptr{Cvoid}}(C_NULL)
function co2_comm_destroy(comm)
    ccall(_co2_comm_destroy_ptr[], co2_status_t, (co2_comm_t,), comm)
end

const _co2_allreduce_ptr = Ref{Ptr{Cvoid}}(C_NULL)
function co2_allreduce(comm, buffer, count, dtype, op, stream, out_request)
    ccall(_co2_allreduce_ptr[], co2_status_t, (co2_comm_t, Ptr{Cvoid}, Csize_t, co2_dtype_t, co2_reduce_op_t, Ptr{Cvoid}, Ptr{co2_request_t}), comm, buffer, count, dtype, op, stream, out_request)
end

const _co2_broadcast_ptr = Ref{Ptr{Cvoid}}(C_NULL)
function co2_broadcast(comm, buffer, count, dtype, root, stream, out_request)
    ccall(_co2_broadcast_ptr[], co2_status_t, (co2_comm_t, Ptr{Cvoid}, Csize_t, co2_dtype_t, Int32, Ptr{Cvoid}, Ptr{co2_request_t}), comm, buffer, count, dtype, root, stream, out_request)
end

const _co2_request_test_ptr = Ref{Ptr{Cvoid}}(C_NULL)
function co2_request_test(request, out_done)
    ccall(_co2_request_test_ptr[], co2_status_t, (co2_request_t, Ptr{Cint}), request, out_done)
end

const _co2_request_wait_ptr = Ref{Ptr{Cvoid}}(C_NULL)
function co2_request_wait(request, timeout_ms)
    ccall(_co2_request_wait_ptr[], co2_status_t, (co2_request_t, Int64), request, timeout_ms)
end

const _co2_request_free_ptr = Ref{Ptr{Cvoid}}(C_NULL)
function co2_request_free(request)
    ccall(_co2_request_free_ptr[], co2_status_t, (co2_request_t,), request)
end

mutable struct co2_engine_config_t
    size::Csize_t
    version::UInt32
    algorithm::co2_algorithm_t
    tau::UInt32
    warmup_sync_rounds::UInt32
    outer_lr::Cdouble
    outer_momentum::Cdouble
    nesterov::Int32
    penalty::co2_penalty_t
    penalty_constant::Cdouble
    clip::co2_clip_t
    anchor_check_interval::UInt32
    clip_threshold::Cdouble
    inner_lr::Cdouble
    state_dtype::co2_dtype_t
    reserved0::Int32
    eager::Int32
    reserved1::Int32
    wire_format::co2_wire_format_t
    error_feedback::Int32
    shard_outer_state::Int32
    hierarchy::Int32
    apply_step::Int32
    reserved2::Int32
end

const _co2_engine_config_init_ptr = Ref{Ptr{Cvoid}}(C_NULL)
function co2_engine_config_init(config)
    ccall(_co2_engine_config_init_ptr[], co2_status_t, (Ptr{co2_engine_config_t},), config)
end

mutable struct co2_tensor_t
    size::Csize_t
    name::Ptr{Cchar}
    data::Ptr{Cvoid}
    count::Csize_t
    dtype::co2_dtype_t
    device::co2_device_kind_t
    device_index::Int32
    role::co2_tensor_role_t
end

const _co2_tensor_init_ptr = Ref{Ptr{Cvoid}}(C_NULL)
function co2_tensor_init(tensor)
    ccall(_co2_tensor_init_ptr[], co2_status_t, (Ptr{co2_tensor_t},), tensor)
end

mutable struct co2_segment_t
    size::Csize_t
    name::Ptr{Cchar}
    offset::Csize_t
    count::Csize_t
    role::co2_tensor_role_t
    reserved0::Int32
end

const _co2_segment_init_ptr = Ref{Ptr{Cvoid}}(C_NULL)
function co2_segment_init(segment)
    ccall(_co2_segment_init_ptr[], co2_status_t, (Ptr{co2_segment_t},), segment)
end

const _co2_engine_create_ptr = Ref{Ptr{Cvoid}}(C_NULL)
function co2_engine_create(comm, config, out_engine)
    ccall(_co2_engine_create_ptr[], co2_status_t, (co2_comm_t, Ptr{co2_engine_config_t}, Ptr{co2_engine_t}), comm, config, out_engine)
end

const _co2_engine_destroy_ptr = Ref{Ptr{Cvoid}}(C_NULL)
function co2_engine_destroy(engine)
    ccall(_co2_engine_destroy_ptr[], co2_status_t, (co2_engine_t,), engine)
end

const _co2_engine_register_tensor_ptr = Ref{Ptr{Cvoid}}(C_NULL)
function co2_engine_register_tensor(engine, tensor)
    ccall(_co2_engine_register_tensor_ptr[], co2_status_t, (co2_engine_t, Ptr{co2_tensor_t}), engine, tensor)
end

const _co2_engine_alloc_flat_ptr = Ref{Ptr{Cvoid}}(C_NULL)
function co2_engine_alloc_flat(engine, count, dtype, device, device_index, out_data)
    ccall(_co2_engine_alloc_flat_ptr[], co2_status_t, (co2_engine_t, Csize_t, co2_dtype_t, co2_device_kind_t, Int32, Ptr{Ptr{Cvoid}}), engine, count, dtype, device, device_index, out_data)
end

const _co2_engine_adopt_flat_ptr = Ref{Ptr{Cvoid}}(C_NULL)
function co2_engine_adopt_flat(engine, data, count, dtype, device, device_index)
    ccall(_co2_engine_adopt_flat_ptr[], co2_status_t, (co2_engine_t, Ptr{Cvoid}, Csize_t, co2_dtype_t, co2_device_kind_t, Int32), engine, data, count, dtype, device, device_index)
end

const _co2_engine_add_segment_ptr = Ref{Ptr{Cvoid}}(C_NULL)
function co2_engine_add_segment(engine, segment)
    ccall(_co2_engine_add_segment_ptr[], co2_status_t, (co2_engine_t, Ptr{co2_segment_t}), engine, segment)
end

mutable struct co2_allocator_t
    size::Csize_t
    user::Ptr{Cvoid}
    allocate::Ptr{Cvoid}
    release::Ptr{Cvoid}
end

const _co2_engine_set_allocator_ptr = Ref{Ptr{Cvoid}}(C_NULL)
function co2_engine_set_allocator(engine, allocator)
    ccall(_co2_engine_set_allocator_ptr[], co2_status_t, (co2_engine_t, Ptr{co2_allocator_t}), engine, allocator)
end

const _co2_engine_commit_ptr = Ref{Ptr{Cvoid}}(C_NULL)
function co2_engine_commit(engine)
    ccall(_co2_engine_commit_ptr[], co2_status_t, (co2_engine_t,), engine)
end

const _co2_engine_step_ptr = Ref{Ptr{Cvoid}}(C_NULL)
function co2_engine_step(engine, stream, out_boundary)
    ccall(_co2_engine_step_ptr[], co2_status_t, (co2_engine_t, Ptr{Cvoid}, Ptr{Cint}), engine, stream, out_boundary)
end

const _co2_engine_reduce_gradients_ptr = Ref{Ptr{Cvoid}}(C_NULL)
function co2_engine_reduce_gradients(engine, grads, num_grads, stream)
    ccall(_co2_engine_reduce_gradients_ptr[], co2_status_t, (co2_engine_t, Ptr{Ptr{Cvoid}}, Csize_t, Ptr{Cvoid}), engine, grads, num_grads, stream)
end

const _co2_engine_synchronize_ptr = Ref{Ptr{Cvoid}}(C_NULL)
function co2_engine_synchronize(engine)
    ccall(_co2_engine_synchronize_ptr[], co2_status_t, (co2_engine_t,), engine)
end

const _co2_engine_finalize_ptr = Ref{Ptr{Cvoid}}(C_NULL)
function co2_engine_finalize(engine)
    ccall(_co2_engine_finalize_ptr[], co2_status_t, (co2_engine_t,), engine)
end

const _co2_engine_leave_ptr = Ref{Ptr{Cvoid}}(C_NULL)
function co2_engine_leave(engine)
    ccall(_co2_engine_leave_ptr[], co2_status_t, (co2_engine_t,), engine)
end

const _co2_engine_consensus_ptr = Ref{Ptr{Cvoid}}(C_NULL)
function co2_engine_consensus(engine, kind, out, count)
    ccall(_co2_engine_consensus_ptr[], co2_status_t, (co2_engine_t, co2_consensus_t, Ptr{Cfloat}, Csize_t), engine, kind, out, count)
end

const _co2_engine_num_elements_ptr = Ref{Ptr{Cvoid}}(C_NULL)
function co2_engine_num_elements(engine, out_count)
    ccall(_co2_engine_num_elements_ptr[], co2_status_t, (co2_engine_t, Ptr{Csize_t}), engine, out_count)
end

const _co2_engine_set_param_ptr = Ref{Ptr{Cvoid}}(C_NULL)
function co2_engine_set_param(engine, key, value)
    ccall(_co2_engine_set_param_ptr[], co2_status_t, (co2_engine_t, co2_param_t, Cdouble), engine, key, value)
end

const _co2_engine_get_param_ptr = Ref{Ptr{Cvoid}}(C_NULL)
function co2_engine_get_param(engine, key, out_value)
    ccall(_co2_engine_get_param_ptr[], co2_status_t, (co2_engine_t, co2_param_t, Ptr{Cdouble}), engine, key, out_value)
end

mutable struct co2_engine_stats_t
    size::Csize_t
    version::UInt32
    world_size::Int32
    steps::UInt64
    rounds::UInt64
    outer_updates::UInt64
    bytes_reduced::UInt64
    collective_ns::UInt64
    boundary_wait_ns::UInt64
    last_boundary_wait_ns::UInt64
    nonfinite_rounds::UInt64
    nonfinite_local::UInt64
    anchor_checks::UInt64
    resolved_outer_momentum::Cdouble
    last_penalty_min::Cdouble
    last_penalty_max::Cdouble
    last_clip_scale_min::Cdouble
    last_clip_fraction::Cdouble
    step_time_ns::UInt64
    allreduce_time_ns::UInt64
    advised_tau::UInt32
    reserved0::UInt32
    last_collective_ns::UInt64
    last_round_ns::UInt64
    hidden_fraction::Cdouble
    last_hidden_fraction::Cdouble
    rank_step_time_ns::UInt64
    rank_allreduce_time_ns::UInt64
    wire_bytes_last_round::UInt64
    wire_bytes_total::UInt64
    outer_state_bytes::UInt64
    arrival_updates::UInt64
    last_apply_step::UInt32
    reserved1::UInt32
end

const _co2_engine_stats_init_ptr = Ref{Ptr{Cvoid}}(C_NULL)
function co2_engine_stats_init(stats)
    ccall(_co2_engine_stats_init_ptr[], co2_status_t, (Ptr{co2_engine_stats_t},), stats)
end

const _co2_engine_get_stats_ptr = Ref{Ptr{Cvoid}}(C_NULL)
function co2_engine_get_stats(engine, out_stats)
    ccall(_co2_engine_get_stats_ptr[], co2_status_t, (co2_engine_t, Ptr{co2_engine_stats_t}), engine, out_stats)
end

const co2_write_fn = Ptr{Cvoid}  # Cint (*)(Ptr{Cvoid}, Ptr{Cvoid}, Csize_t)

const co2_read_fn = Ptr{Cvoid}  # Cint (*)(Ptr{Cvoid}, Ptr{Cvoid}, Csize_t)

const _co2_engine_save_ptr = Ref{Ptr{Cvoid}}(C_NULL)
function co2_engine_save(engine, write, user)
    ccall(_co2_engine_save_ptr[], co2_status_t, (co2_engine_t, co2_write_fn, Ptr{Cvoid}), engine, write, user)
end

const _co2_engine_state_size_ptr = Ref{Ptr{Cvoid}}(C_NULL)
function co2_engine_state_size(engine, out_bytes)
    ccall(_co2_engine_state_size_ptr[], co2_status_t, (co2_engine_t, Ptr{Csize_t}), engine, out_bytes)
end

const _co2_engine_save_portable_ptr = Ref{Ptr{Cvoid}}(C_NULL)
function co2_engine_save_portable(engine, write, user)
    ccall(_co2_engine_save_portable_ptr[], co2_status_t, (co2_engine_t, co2_write_fn, Ptr{Cvoid}), engine, write, user)
end

const _co2_engine_portable_state_size_ptr = Ref{Ptr{Cvoid}}(C_NULL)
function co2_engine_portable_state_size(engine, out_bytes)
    ccall(_co2_engine_portable_state_size_ptr[], co2_status_t, (co2_engine_t, Ptr{Csize_t}), engine, out_bytes)
end

const _co2_engine_load_ptr = Ref{Ptr{Cvoid}}(C_NULL)
function co2_engine_load(engine, read, user)
    ccall(_co2_engine_load_ptr[], co2_status_t, (co2_engine_t, co2_read_fn, Ptr{Cvoid}), engine, read, user)
end

# ---- defaults of the *_INIT macros (evaluated by clang, field by field) ----
CO2_COMM_CONFIG_INIT() = co2_comm_config_t(
    Csize_t(80),
    UInt32(3),
    co2_transport_kind_t(0),
    Int32(0),
    Int32(1),
    Ptr{Cchar}(C_NULL),
    UInt32(300000),
    UInt32(0),
    UInt64(1048576),
    Int32(-1),
    UInt32(0),
    Int32(-1),
    UInt32(0),
    UInt32(0),
    UInt32(0),
    Int32(0),
    UInt32(0),
)
CO2_ENGINE_CONFIG_INIT() = co2_engine_config_t(
    Csize_t(120),
    UInt32(3),
    co2_algorithm_t(0),
    UInt32(12),
    UInt32(0),
    Cdouble(1.0),
    Cdouble(-1.0),
    Int32(0),
    co2_penalty_t(0),
    Cdouble(1.0),
    co2_clip_t(0),
    UInt32(100),
    Cdouble(1.0),
    Cdouble(0.0),
    co2_dtype_t(0),
    Int32(0),
    Int32(-1),
    Int32(0),
    co2_wire_format_t(0),
    Int32(1),
    Int32(0),
    Int32(0),
    Int32(0),
    Int32(0),
)
CO2_TENSOR_INIT() = co2_tensor_t(
    Csize_t(48),
    Ptr{Cchar}(C_NULL),
    Ptr{Cvoid}(C_NULL),
    Csize_t(0),
    co2_dtype_t(0),
    co2_device_kind_t(0),
    Int32(0),
    co2_tensor_role_t(0),
)
CO2_SEGMENT_INIT() = co2_segment_t(
    Csize_t(40),
    Ptr{Cchar}(C_NULL),
    Csize_t(0),
    Csize_t(0),
    co2_tensor_role_t(0),
    Int32(0),
)
CO2_ALLOCATOR_INIT() = co2_allocator_t(
    Csize_t(32),
    Ptr{Cvoid}(C_NULL),
    Ptr{Cvoid}(C_NULL),
    Ptr{Cvoid}(C_NULL),
)
CO2_ENGINE_STATS_INIT() = co2_engine_stats_t(
    Csize_t(248),
    UInt32(3),
    Int32(0),
    UInt64(0),
    UInt64(0),
    UInt64(0),
    UInt64(0),
    UInt64(0),
    UInt64(0),
    UInt64(0),
    UInt64(0),
    UInt64(0),
    UInt64(0),
    Cdouble(0.0),
    Cdouble(1.0),
    Cdouble(1.0),
    Cdouble(1.0),
    Cdouble(0.0),
    UInt64(0),
    UInt64(0),
    UInt32(0),
    UInt32(0),
    UInt64(0),
    UInt64(0),
    Cdouble(0.0),
    Cdouble(0.0),
    UInt64(0),
    UInt64(0),
    UInt64(0),
    UInt64(0),
    UInt64(0),
    UInt64(0),
    UInt32(0),
    UInt32(0),
)

# ---- struct layouts as clang computed them for the generating target (bytes) ----
const GENERATED_ON_WORD_SIZE = 64
const LAYOUT = (
    co2_comm_config_t = (size = 80, align = 8, offsets = (size = 0, version = 8, transport = 12, rank = 16, world_size = 20, group_name = 24, timeout_ms = 32, reserved0 = 36, chunk_bytes = 40, device_index = 48, reserved1 = 52, node_id = 56, reserved2 = 60, connections_per_peer = 64, reserved3 = 68, elastic_min_ranks = 72, reserved4 = 76,)),
    co2_unique_id_t = (size = 128, align = 1, offsets = (internal = 0,)),
    co2_engine_config_t = (size = 120, align = 8, offsets = (size = 0, version = 8, algorithm = 12, tau = 16, warmup_sync_rounds = 20, outer_lr = 24, outer_momentum = 32, nesterov = 40, penalty = 44, penalty_constant = 48, clip = 56, anchor_check_interval = 60, clip_threshold = 64, inner_lr = 72, state_dtype = 80, reserved0 = 84, eager = 88, reserved1 = 92, wire_format = 96, error_feedback = 100, shard_outer_state = 104, hierarchy = 108, apply_step = 112, reserved2 = 116,)),
    co2_tensor_t = (size = 48, align = 8, offsets = (size = 0, name = 8, data = 16, count = 24, dtype = 32, device = 36, device_index = 40, role = 44,)),
    co2_segment_t = (size = 40, align = 8, offsets = (size = 0, name = 8, offset = 16, count = 24, role = 32, reserved0 = 36,)),
    co2_allocator_t = (size = 32, align = 8, offsets = (size = 0, user = 8, allocate = 16, release = 24,)),
    co2_engine_stats_t = (size = 248, align = 8, offsets = (size = 0, version = 8, world_size = 12, steps = 16, rounds = 24, outer_updates = 32, bytes_reduced = 40, collective_ns = 48, boundary_wait_ns = 56, last_boundary_wait_ns = 64, nonfinite_rounds = 72, nonfinite_local = 80, anchor_checks = 88, resolved_outer_momentum = 96, last_penalty_min = 104, last_penalty_max = 112, last_clip_scale_min = 120, last_clip_fraction = 128, step_time_ns = 136, allreduce_time_ns = 144, advised_tau = 152, reserved0 = 156, last_collective_ns = 160, last_round_ns = 168, hidden_fraction = 176, last_hidden_fraction = 184, rank_step_time_ns = 192, rank_allreduce_time_ns = 200, wire_bytes_last_round = 208, wire_bytes_total = 216, outer_state_bytes = 224, arrival_updates = 232, last_apply_step = 240, reserved1 = 244,)),
)

# ---- symbol binding: CO2.jl's __init__ calls this with the dlopen'ed libco2 ----
const FUNCTION_NAMES = (
    :co2_status_string,
    :co2_last_error_message,
    :co2_get_version,
    :co2_comm_config_init,
    :co2_get_unique_id,
    :co2_comm_create,
    :co2_comm_create_with_id,
    :co2_comm_split,
    :co2_comm_split_nodes,
    :co2_comm_rank,
    :co2_comm_size,
    :co2_comm_abort,
    :co2_comm_destroy,
    :co2_allreduce,
    :co2_broadcast,
    :co2_request_test,
    :co2_request_wait,
    :co2_request_free,
    :co2_engine_config_init,
    :co2_tensor_init,
    :co2_segment_init,
    :co2_engine_create,
    :co2_engine_destroy,
    :co2_engine_register_tensor,
    :co2_engine_alloc_flat,
    :co2_engine_adopt_flat,
    :co2_engine_add_segment,
    :co2_engine_set_allocator,
    :co2_engine_commit,
    :co2_engine_step,
    :co2_engine_reduce_gradients,
    :co2_engine_synchronize,
    :co2_engine_finalize,
    :co2_engine_leave,
    :co2_engine_consensus,
    :co2_engine_num_elements,
    :co2_engine_set_param,
    :co2_engine_get_param,
    :co2_engine_stats_init,
    :co2_engine_get_stats,
    :co2_engine_save,
    :co2_engine_state_size,
    :co2_engine_save_portable,
    :co2_engine_portable_state_size,
    :co2_engine_load,
)

function bind_symbols!(handle::Ptr{Cvoid})
    _co2_status_string_ptr[] = Libdl.dlsym(handle, :co2_status_string)
    _co2_last_error_message_ptr[] = Libdl.dlsym(handle, :co2_last_error_message)
    _co2_get_version_ptr[] = Libdl.dlsym(handle, :co2_get_version)
    _co2_comm_config_init_ptr[] = Libdl.dlsym(handle, :co2_comm_config_init)
    _co2_get_unique_id_ptr[] = Libdl.dlsym(handle, :co2_get_unique_id)
    _co2_comm_create_ptr[] = Libdl.dlsym(handle, :co2_comm_create)
    _co2_comm_create_with_id_ptr[] = Libdl.dlsym(handle, :co2_comm_create_with_id)
    _co2_comm_split_ptr[] = Libdl.dlsym(handle, :co2_comm_split)
    _co2_comm_split_nodes_ptr[] = Libdl.dlsym(handle, :co2_comm_split_nodes)
    _co2_comm_rank_ptr[] = Libdl.dlsym(handle, :co2_comm_rank)
    _co2_comm_size_ptr[] = Libdl.dlsym(handle, :co2_comm_size)
    _co2_comm_abort_ptr[] = Libdl.dlsym(handle, :co2_comm_abort)
    _co2_comm_destroy_ptr[] = Libdl.dlsym(handle, :co2_comm_destroy)
    _co2_allreduce_ptr[] = Libdl.dlsym(handle, :co2_allreduce)
    _co2_broadcast_ptr[] = Libdl.dlsym(handle, :co2_broadcast)
    _co2_request_test_ptr[] = Libdl.dlsym(handle, :co2_request_test)
    _co2_request_wait_ptr[] = Libdl.dlsym(handle, :co2_request_wait)
    _co2_request_free_ptr[] = Libdl.dlsym(handle, :co2_request_free)
    _co2_engine_config_init_ptr[] = Libdl.dlsym(handle, :co2_engine_config_init)
    _co2_tensor_init_ptr[] = Libdl.dlsym(handle, :co2_tensor_init)
    _co2_segment_init_ptr[] = Libdl.dlsym(handle, :co2_segment_init)
    _co2_engine_create_ptr[] = Libdl.dlsym(handle, :co2_engine_create)
    _co2_engine_destroy_ptr[] = Libdl.dlsym(handle, :co2_engine_destroy)
    _co2_engine_register_tensor_ptr[] = Libdl.dlsym(handle, :co2_engine_register_tensor)
    _co2_engine_alloc_flat_ptr[] = Libdl.dlsym(handle, :co2_engine_alloc_flat)
    _co2_engine_adopt_flat_ptr[] = Libdl.dlsym(handle, :co2_engine_adopt_flat)
    _co2_engine_add_segment_ptr[] = Libdl.dlsym(handle, :co2_engine_add_segment)
    _co2_engine_set_allocator_ptr[] = Libdl.dlsym(handle, :co2_engine_set_allocator)
    _co2_engine_commit_ptr[] = Libdl.dlsym(handle, :co2_engine_commit)
    _co2_engine_step_ptr[] = Libdl.dlsym(handle, :co2_engine_step)
    _co2_engine_reduce_gradients_ptr[] = Libdl.dlsym(handle, :co2_engine_reduce_gradients)
    _co2_engine_synchronize_ptr[] = Libdl.dlsym(handle, :co2_engine_synchronize)
    _co2_engine_finalize_ptr[] = Libdl.dlsym(handle, :co2_engine_finalize)
    _co2_engine_leave_ptr[] = Libdl.dlsym(handle, :co2_engine_leave)
    _co2_engine_consensus_ptr[] = Libdl.dlsym(handle, :co2_engine_consensus)
    _co2_engine_num_elements_ptr[] = Libdl.dlsym(handle, :co2_engine_num_elements)
    _co2_engine_set_param_ptr[] = Libdl.dlsym(handle, :co2_engine_set_param)
    _co2_engine_get_param_ptr[] = Libdl.dlsym(handle, :co2_engine_get_param)
    _co2_engine_stats_init_ptr[] = Libdl.dlsym(handle, :co2_engine_stats_init)
    _co2_engine_get_stats_ptr[] = Libdl.dlsym(handle, :co2_engine_get_stats)
    _co2_engine_save_ptr[] = Libdl.dlsym(handle, :co2_engine_save)
    _co2_engine_state_size_ptr[] = Libdl.dlsym(handle, :co2_engine_state_size)
    _co2_engine_save_portable_ptr[] = Libdl.dlsym(handle, :co2_engine_save_portable)
    _co2_engine_portable_state_size_ptr[] = Libdl.dlsym(handle, :co2_engine_portable_state_size)
    _co2_engine_load_ptr[] = Libdl.dlsym(handle, :co2_engine_load)
    return nothing
end

"""
    CO2

Julia interface to libco2 (`co2.h`): communication-efficient data-parallel training (CO2: τ
local steps, then an outer update whose all-reduce overlaps the next τ steps).

The low-level declarations (`co2_*` functions, structs, constants) are in `generated.jl`, made
from the C header by `bindings/julia/generate.py` with libclang. This file adds the Julia layer:
a `mutable struct` per handle with a finalizer, `CO2Error` exceptions from statuses, and tensors
as `Vector{Float32}` or raw pointers.

NOT RUN: no Julia exists on the machines this was written on; see README.md.
"""
module CO2

using Libdl

include("generated.jl")

export CO2Error, Communicator, Engine, Request, split_nodes, membership_changed, left_group
export allreduce!, broadcast!, register_tensor!, alloc_flat!, adopt_flat!, add_segment!,
       commit!, step!, reduce_gradients!, synchronize!, finalize!, leave!, consensus!, consensus,
       num_elements, set_param!, get_param, stats, save, load!, state_size

# ---------------------------------------------------------------------------------------------
# Finding libco2
# ---------------------------------------------------------------------------------------------

const _libco2 = Ref{Ptr{Cvoid}}(C_NULL)
const _write_callback = Ref{Ptr{Cvoid}}(C_NULL)
const _read_callback = Ref{Ptr{Cvoid}}(C_NULL)

"""
    find_libco2() -> String

The libco2 to load: `ENV["CO2_LIBRARY"]` (a full path) if set; else `libco2.so.1` in
`ENV["CO2_LIB_DIR"]` (e.g. the meson build directory); else the system's search path
(`LD_LIBRARY_PATH`, ld.so.cache, `/usr/local/lib` after `meson install`).
"""
function find_libco2()
    path = get(ENV, "CO2_LIBRARY", "")
    isempty(path) || return path
    dirs = String[]
    dir = get(ENV, "CO2_LIB_DIR", "")
    isempty(dir) || push!(dirs, dir)
    found = Libdl.find_library(["libco2.so.1", "libco2"], dirs)
    isempty(found) && error("libco2 not found: set CO2_LIBRARY to its path or CO2_LIB_DIR to " *
                            "its directory (the meson build directory), or install it")
    return found
end

function __init__()
    handle = Libdl.dlopen(find_libco2())
    _libco2[] = handle
    bind_symbols!(handle)
    _write_callback[] = @cfunction(_write_trampoline, Cint, (Ptr{Cvoid}, Ptr{Cvoid}, Csize_t))
    _read_callback[] = @cfunction(_read_trampoline, Cint, (Ptr{Cvoid}, Ptr{Cvoid}, Csize_t))
    return nothing
end

# ---------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------

"""
    CO2Error(status, message)

A failed co2 call: `status` is the C `co2_status_t` (compare with the `CO2_ERR_*` constants),
`message` what `co2_last_error_message()` said.

`status == CO2_MEMBERSHIP_CHANGED` (50, C API 1.2; see [`membership_changed`](@ref)) is not a
failure of the group: an elastic communicator (`elastic_min_ranks >= 1`) lost a rank and
re-formed without it. The call did not complete; the engine goes on in the new group from the
agreed state (every survivor's parameters are the agreed anchor). Re-read `CO2.rank(comm)` and
`size(comm)` (they changed), re-shard the data if it is sharded by rank, and keep training
(call `step!` again; a `finalize!` that threw it did not finalize). docs/capi.md, "Elastic
membership". Statuses 100-199 are communicator failures: close it and its engines.
"""
struct CO2Error <: Exception
    status::Int32
    message::String
end

"""
    membership_changed(e::CO2Error) -> Bool

True for `CO2_MEMBERSHIP_CHANGED`: an elastic group re-formed after losing a rank; re-read
`CO2.rank(comm)` / `size(comm)` and keep training (see [`CO2Error`](@ref)).
"""
membership_changed(e::CO2Error) = e.status == CO2_MEMBERSHIP_CHANGED

"""
    left_group(e::CO2Error) -> Bool

True for `CO2_LEFT` (C API 1.2): this rank left its elastic group as it asked ([`leave!`](@ref));
its parameters are the group's anchor; the engine takes no more steps.
"""
left_group(e::CO2Error) = e.status == CO2_LEFT

function Base.showerror(io::IO, e::CO2Error)
    print(io, "CO2Error: ", unsafe_string(co2_status_string(e.status)), " (status ", e.status, ")")
    isempty(e.message) || print(io, ": ", e.message)
end

# The message is thread-local in C and valid until the next co2 call on that thread: it is read
# right after the failing call, before any yield point could move the task to another thread.
@inline function check(status::Integer)
    status == CO2_OK && return nothing
    throw(CO2Error(Int32(status), unsafe_string(co2_last_error_message())))
end

# A blocking call (a collective) waits for other ranks. Julia's garbage collector stops every
# thread, so a thread blocked in C would stall the others' collections, and with in-process
# ranks on Julia threads, deadlock (the GIL problem of docs/capi.md, Threading). Blocking calls
# therefore run in a GC-safe region (jl_gc_safe_enter/leave, exported by libjulia since 1.9).
# Inside it, `call` must touch no Julia object: every argument is converted to a raw value
# before, and the status is checked (which allocates the message) after.
@inline function blocking(call)
    state = ccall(:jl_gc_safe_enter, Int8, ())
    status = call()
    ccall(:jl_gc_safe_leave, Cvoid, (Int8,), state)
    return status
end

_raw(c) = Base.unsafe_convert(typeof(c) === Communicator ? co2_comm_t : co2_engine_t, c)

const _TRANSPORTS = Dict(:auto => CO2_TRANSPORT_AUTO, :local => CO2_TRANSPORT_LOCAL,
                         :ucx => CO2_TRANSPORT_UCX, :nccl => CO2_TRANSPORT_NCCL)
const _ALGORITHMS = Dict(:co2 => CO2_ALGO_CO2, :sync => CO2_ALGO_SYNC,
                         :localsgd => CO2_ALGO_LOCALSGD, :diloco => CO2_ALGO_DILOCO)
const _PENALTIES = Dict(:none => CO2_PENALTY_NONE, :constant => CO2_PENALTY_CONSTANT,
                        :gap => CO2_PENALTY_GAP)
const _CLIPS = Dict(:none => CO2_CLIP_NONE, :value => CO2_CLIP_VALUE, :norm => CO2_CLIP_NORM)
const _WIRE_FORMATS = Dict(:fp32 => CO2_WIRE_FP32, :bf16 => CO2_WIRE_BF16, :int8 => CO2_WIRE_INT8,
                     :fp4 => CO2_WIRE_FP4)
const _ROLES = Dict(:parameter => CO2_ROLE_PARAMETER, :buffer => CO2_ROLE_BUFFER,
                    :excluded => CO2_ROLE_EXCLUDED)
const _OPS = Dict(:sum => CO2_REDUCE_SUM, :avg => CO2_REDUCE_AVG, :min => CO2_REDUCE_MIN,
                  :max => CO2_REDUCE_MAX)
const _PARAMS = Dict(:outer_lr => CO2_PARAM_OUTER_LR, :outer_momentum => CO2_PARAM_OUTER_MOMENTUM,
                     :tau => CO2_PARAM_TAU, :clip_threshold => CO2_PARAM_CLIP_THRESHOLD,
                     :penalty_constant => CO2_PARAM_PENALTY_CONSTANT,
                     :inner_lr => CO2_PARAM_INNER_LR,
                     :anchor_check_interval => CO2_PARAM_ANCHOR_CHECK_INTERVAL)
const _CONSENSUS = Dict(:anchor => CO2_CONSENSUS_ANCHOR, :local_average => CO2_CONSENSUS_LOCAL_AVERAGE)
const _APPLY_STEPS = Dict(:boundary => CO2_APPLY_AT_BOUNDARY, :arrival => CO2_APPLY_ON_ARRIVAL)

_lookup(table, key, what) = haskey(table, key) ? table[key] :
    throw(ArgumentError("unknown $what $(repr(key)); one of $(join(sort(collect(keys(table))), ", "))"))

_apply_step(when::Symbol) = _lookup(_APPLY_STEPS, when, "apply_step")
_apply_step(k::Integer) = k >= 1 ? Int32(k) :
    throw(ArgumentError("apply_step must be :boundary, :arrival or a step k >= 1, got $k"))

_dtype(::Type{Float32}) = CO2_DTYPE_FP32
_dtype(::Type{Float64}) = CO2_DTYPE_FP64
_dtype(::Type{Int32}) = CO2_DTYPE_INT32
_dtype(::Type{Int64}) = CO2_DTYPE_INT64

# ---------------------------------------------------------------------------------------------
# Communicator
# ---------------------------------------------------------------------------------------------

"""
    Communicator(; transport=:auto, rank=0, world_size=1, group_name=nothing,
                 timeout_ms=CO2_DEFAULT_TIMEOUT_MS, chunk_bytes=CO2_DEFAULT_CHUNK_BYTES,
                 node_id=nothing, connections_per_peer=nothing, elastic_min_ranks=0)

Joins rank `rank` of a group of `world_size` ranks; blocks until all joined (collective). With
`transport=:local`, ranks are threads of this process and `group_name` keys the group. Freed by
its finalizer or, deterministically, by `close`. `connections_per_peer` (UCX, 1..16; `nothing`:
`CO2_UCX_CONNECTIONS` where set, else 1) stripes each peer's messages over that many TCP
connections, for links that cap each flow. `elastic_min_ranks` (C API 1.2): 0, the default, a
lost rank fails the group (`CO2_ERR_PEER_LOST`); k >= 1 (UCX only; every rank the same k), the
survivors re-form while at least k ranks remain and the engine call that met the loss throws a
`CO2Error` with status `CO2_MEMBERSHIP_CHANGED`: re-read `CO2.rank(c)` / `size(c)` and keep
training. Values are checked by the library (`CO2_ERR_INVALID_ARGUMENT` for k < 0 or above
`world_size`, `CO2_ERR_UNSUPPORTED` for k >= 1 on the local transport).
"""
mutable struct Communicator
    handle::co2_comm_t

    function Communicator(; transport::Symbol=:auto, rank::Integer=0, world_size::Integer=1,
                          group_name::Union{Nothing,AbstractString}=nothing,
                          timeout_ms::Integer=CO2_DEFAULT_TIMEOUT_MS,
                          chunk_bytes::Integer=CO2_DEFAULT_CHUNK_BYTES,
                          node_id::Union{Nothing,Integer}=nothing,
                          connections_per_peer::Union{Nothing,Integer}=nothing,
                          elastic_min_ranks::Integer=0)
        config = Ref(CO2_COMM_CONFIG_INIT())
        check(co2_comm_config_init(config))
        c = config[]
        c.transport = _lookup(_TRANSPORTS, transport, "transport")
        c.rank = rank
        c.world_size = world_size
        c.timeout_ms = timeout_ms
        c.chunk_bytes = chunk_bytes
        c.node_id = node_id === nothing ? CO2_NODE_ID_AUTO : node_id
        c.connections_per_peer = connections_per_peer === nothing ? CO2_CONNECTIONS_AUTO : connections_per_peer
        c.elastic_min_ranks = elastic_min_ranks
        name = group_name === nothing ? nothing : Base.cconvert(Cstring, String(group_name))
        out = Ref{co2_comm_t}(C_NULL)
        GC.@preserve name config out begin
            c.group_name = name === nothing ? C_NULL : Ptr{Cchar}(pointer(name))
            pconfig = Base.unsafe_convert(Ptr{co2_comm_config_t}, config)
            pout = Base.unsafe_convert(Ptr{co2_comm_t}, out)
            check(blocking(() -> co2_comm_create(pconfig, pout)))
        end
        return Communicator(out[])
    end

    # A handle the library made (co2_comm_create, co2_comm_split); owned from here on.
    function Communicator(handle::co2_comm_t)
        comm = new(handle)
        finalizer(close, comm)
        return comm
    end
end

"""
    split(c::Communicator, color, key=rank(c)) -> Union{Communicator,Nothing}

Collective over `c`: the ranks passing the same `color` (an integer >= 0) form a new
communicator, ranked by (`key`, rank in `c`); `color === nothing` joins none and returns
`nothing`. The new groups use `c`'s kind of transport, timeout and chunk size. E.g. the ranks of
a node, `split(world, node, local_rank)`, and one local rank across nodes,
`split(world, local_rank, node)`.
"""
function Base.split(c::Communicator, color::Union{Integer,Nothing}, key::Integer=rank(c))
    out = Ref{co2_comm_t}(C_NULL)
    raw_color = color === nothing ? CO2_SPLIT_NONE : Int32(color)
    GC.@preserve c out begin
        pout = Base.unsafe_convert(Ptr{co2_comm_t}, out)
        handle = Base.unsafe_convert(co2_comm_t, c)
        check(blocking(() -> co2_comm_split(handle, raw_color, Int32(key), C_NULL, pout)))
    end
    return out[] == C_NULL ? nothing : Communicator(out[])
end

"""
    split_nodes(c::Communicator; node_id=nothing) -> (intra, inter)

Collective over `c`, for hierarchical training: `intra` holds the ranks of this rank's node,
ranked by rank in `c` (its rank is the local index); `inter` the ranks with this local index on
every node, ranked by node (its rank is the node index; nodes are numbered by their lowest
rank). The node: `node_id` if given, else the `node_id` `c` was created with, else the
launcher's (`GROUP_RANK` under co2run / torchrun, `SLURM_NODEID` under srun), else the host
name. Nodes of different sizes throw a `CO2Error` (`CO2_ERR_INVALID_ARGUMENT`) on every rank.
"""
function split_nodes(c::Communicator; node_id::Union{Nothing,Integer}=nothing)
    intra = Ref{co2_comm_t}(C_NULL)
    inter = Ref{co2_comm_t}(C_NULL)
    config = Ref(CO2_COMM_CONFIG_INIT())
    check(co2_comm_config_init(config))
    config[].node_id = node_id === nothing ? CO2_NODE_ID_AUTO : node_id
    GC.@preserve c intra inter config begin
        handle = Base.unsafe_convert(co2_comm_t, c)
        # No node_id: NULL, so that the new groups keep c's timeout and chunk size.
        pconfig = node_id === nothing ? Ptr{co2_comm_config_t}(C_NULL) :
                  Base.unsafe_convert(Ptr{co2_comm_config_t}, config)
        pintra = Base.unsafe_convert(Ptr{co2_comm_t}, intra)
        pinter = Base.unsafe_convert(Ptr{co2_comm_t}, inter)
        check(blocking(() -> co2_comm_split_nodes(handle, pconfig, pintra, pinter)))
    end
    return (Communicator(intra[]), Communicator(inter[]))
end

Base.unsafe_convert(::Type{co2_comm_t}, c::Communicator) =
    c.handle == C_NULL ? throw(ArgumentError("the communicator was closed")) : c.handle

"""Destroys the handle now (idempotent); engines created on it keep the group alive."""
function Base.close(c::Communicator)
    if c.handle != C_NULL
        co2_comm_destroy(c.handle)
        c.handle = C_NULL
    end
    return nothing
end

function rank(c::Communicator)
    out = Ref{Int32}(-1)
    check(co2_comm_rank(c, out))
    return Int(out[])
end

function Base.size(c::Communicator)
    out = Ref{Int32}(-1)
    check(co2_comm_size(c, out))
    return Int(out[])
end

"""Fails every pending and future operation of the group with CO2_ERR_ABORTED (any thread)."""
abort(c::Communicator) = check(co2_comm_abort(c))

"""
    Request

An asynchronous raw collective. It keeps its buffer referenced until freed; the finalizer (or
`wait`) frees it, waiting for completion first.
"""
mutable struct Request
    handle::co2_request_t
    buffer::Any  # rooted: the collective writes into it until it completes
    function Request(handle, buffer)
        r = new(handle, buffer)
        finalizer(_free!, r)
        return r
    end
end

function _free!(r::Request)
    if r.handle != C_NULL
        co2_request_free(r.handle)
        r.handle = C_NULL
        r.buffer = nothing
    end
    return nothing
end

"""`true` once complete; throws the collective's failure."""
function Base.isready(r::Request)
    done = Ref{Cint}(0)
    check(co2_request_test(r.handle, done))
    return done[] != 0
end

"""Waits (`timeout_ms < 0`: until completion) and returns the buffer; CO2_ERR_TIMEOUT leaves it pending."""
function Base.wait(r::Request; timeout_ms::Integer=-1)
    r.handle == C_NULL && throw(ArgumentError("the request was freed"))
    h = r.handle
    check(blocking(() -> co2_request_wait(h, timeout_ms)))
    buffer = r.buffer
    _free!(r)
    return buffer
end

"""
    allreduce!(comm, x::Vector{T}; op=:sum, async=false)   T ∈ Float32, Float64, Int32, Int64

In-place all-reduce (collective); with `async=true` returns a `Request` to `wait` on.
"""
function allreduce!(c::Communicator, x::Vector{T}; op::Symbol=:sum, async::Bool=false) where {T}
    out = Ref{co2_request_t}(C_NULL)
    GC.@preserve x check(co2_allreduce(c, pointer(x), length(x), _dtype(T), _lookup(_OPS, op, "op"),
                                       C_NULL, out))
    request = Request(out[], x)
    return async ? request : wait(request)
end

"""In-place broadcast from `root` (collective); `async` as for `allreduce!`."""
function broadcast!(c::Communicator, x::Vector{T}, root::Integer; async::Bool=false) where {T}
    out = Ref{co2_request_t}(C_NULL)
    GC.@preserve x check(co2_broadcast(c, pointer(x), length(x), _dtype(T), root, C_NULL, out))
    request = Request(out[], x)
    return async ? request : wait(request)
end

# ---------------------------------------------------------------------------------------------
# Engine
# ---------------------------------------------------------------------------------------------

"""
    Engine(comm; algorithm=:co2, tau=CO2_DEFAULT_TAU, warmup_sync_rounds=0, outer_lr=1.0,
           outer_momentum=nothing, nesterov=false, penalty=:none, penalty_constant=1.0,
           clip=:none, clip_threshold=1.0, anchor_check_interval=100, inner_lr=0.0,
           eager=nothing, wire_format=:fp32, error_feedback=true, shard_outer_state=false,
           hierarchical=false, apply_step=:boundary)

One rank's engine. Defaults are the C ones (`co2_engine_config_init`); `outer_momentum=nothing`
resolves β from the world size; `eager=nothing` is automatic (eager on host arrays);
`wire_format` (:fp32, :bf16, :int8, :fp4) is how the outer all-reduce of co2 and diloco travels, with
`error_feedback` adding what its encodings dropped to the next delta; `shard_outer_state=true`
keeps on each rank only its shard of the anchor and outer momentum (docs/capi.md; the engine
refuses what sharding does not implement yet); `hierarchical=true` runs sync inside a node and
co2 across nodes (the nodes of `split_nodes`; average every step's gradients inside the node);
`apply_step` is when co2 applies a round's average: `:boundary` (at the next boundary),
`:arrival` (one step after it is due, by the ranks' agreed step and all-reduce times) or a step `k >= 1`
of the round (waiting there for it); each rank keeps its progress since the boundary
(docs/capi.md).
The engine roots every array registered with it, so the
garbage collector cannot free memory the engine still uses.
"""
mutable struct Engine
    handle::co2_engine_t
    comm::Communicator
    roots::Vector{Any}
    trained_counts::Vector{Int}  # counts of PARAMETER tensors/segments, in registration order
    flat::Union{Nothing,Vector{Float32}}

    function Engine(comm::Communicator; algorithm::Symbol=:co2, tau::Integer=CO2_DEFAULT_TAU,
                    warmup_sync_rounds::Integer=0, outer_lr::Real=CO2_DEFAULT_OUTER_LR,
                    outer_momentum::Union{Nothing,Real}=nothing, nesterov::Bool=false,
                    penalty::Symbol=:none, penalty_constant::Real=1.0, clip::Symbol=:none,
                    clip_threshold::Real=CO2_DEFAULT_CLIP_THRESHOLD,
                    anchor_check_interval::Integer=CO2_DEFAULT_ANCHOR_CHECK_INTERVAL,
                    inner_lr::Real=0.0, eager::Union{Nothing,Bool}=nothing,
                    wire_format::Symbol=:fp32, error_feedback::Bool=true,
                    shard_outer_state::Bool=false, hierarchical::Bool=false,
                    apply_step::Union{Symbol,Integer}=:boundary)
        config = Ref(CO2_ENGINE_CONFIG_INIT())
        check(co2_engine_config_init(config))
        c = config[]
        c.algorithm = _lookup(_ALGORITHMS, algorithm, "algorithm")
        c.tau = tau
        c.warmup_sync_rounds = warmup_sync_rounds
        c.outer_lr = outer_lr
        c.outer_momentum = outer_momentum === nothing ? CO2_OUTER_MOMENTUM_AUTO : outer_momentum
        c.nesterov = nesterov
        c.eager = eager === nothing ? CO2_EAGER_AUTO : eager
        c.wire_format = _lookup(_WIRE_FORMATS, wire_format, "wire_format")
        c.error_feedback = error_feedback
        c.shard_outer_state = shard_outer_state
        c.hierarchy = hierarchical ? CO2_HIERARCHY_NODES : CO2_HIERARCHY_FLAT
        c.apply_step = _apply_step(apply_step)
        c.penalty = _lookup(_PENALTIES, penalty, "penalty")
        c.penalty_constant = penalty_constant
        c.clip = _lookup(_CLIPS, clip, "clip")
        c.clip_threshold = clip_threshold
        c.anchor_check_interval = anchor_check_interval
        c.inner_lr = inner_lr
        out = Ref{co2_engine_t}(C_NULL)
        check(co2_engine_create(comm, config, out))
        engine = new(out[], comm, Any[], Int[], nothing)
        finalizer(close, engine)
        return engine
    end
end

Base.unsafe_convert(::Type{co2_engine_t}, e::Engine) =
    e.handle == C_NULL ? throw(ArgumentError("the engine was closed")) : e.handle

"""Destroys the engine now (waits for an all-reduce in flight); idempotent. Views returned by
`alloc_flat!` dangle afterwards."""
function Base.close(e::Engine)
    if e.handle != C_NULL
        co2_engine_destroy(e.handle)
        e.handle = C_NULL
        e.flat = nothing
        empty!(e.roots)
    end
    return nothing
end

"""
    register_tensor!(engine, name, x::Vector{Float32}; role=:parameter)
    register_tensor!(engine, name, ptr::Ptr{Float32}, count; role=:parameter, root=nothing)

Registers framework memory (before `commit!`). The engine reads and writes it at `step!` and
other calls; a Vector is rooted by the engine; with a raw pointer the caller keeps the memory
alive (pass `root` to have the engine root its owner).
"""
function register_tensor!(e::Engine, name::AbstractString, x::Vector{Float32}; role::Symbol=:parameter)
    register_tensor!(e, name, pointer(x), length(x); role=role, root=x)
end

function register_tensor!(e::Engine, name::AbstractString, ptr::Ptr{Float32}, count::Integer;
                          role::Symbol=:parameter, root=nothing)
    tensor = Ref(CO2_TENSOR_INIT())
    t = tensor[]
    cname = Base.cconvert(Cstring, String(name))
    r = _lookup(_ROLES, role, "role")
    GC.@preserve cname root begin
        t.name = Ptr{Cchar}(pointer(cname))
        t.data = Ptr{Cvoid}(ptr)
        t.count = count
        t.role = r
        check(co2_engine_register_tensor(e, tensor))
    end
    root === nothing || push!(e.roots, root)
    r == CO2_ROLE_PARAMETER && push!(e.trained_counts, Int(count))
    return nothing
end

"""Runtime-owned flat storage of `count` zeroed Float32s; returns a view valid until `close`."""
function alloc_flat!(e::Engine, count::Integer)
    out = Ref{Ptr{Cvoid}}(C_NULL)
    check(co2_engine_alloc_flat(e, count, CO2_DTYPE_FP32, CO2_DEVICE_HOST, 0, out))
    e.flat = unsafe_wrap(Array, Ptr{Float32}(out[]), Int(count); own=false)
    return e.flat
end

"""Adopts `x` as the flat storage (rooted by the engine)."""
function adopt_flat!(e::Engine, x::Vector{Float32})
    GC.@preserve x check(co2_engine_adopt_flat(e, pointer(x), length(x), CO2_DTYPE_FP32, CO2_DEVICE_HOST, 0))
    push!(e.roots, x)
    e.flat = x
    return x
end

"""Declares elements `offset+1 : offset+count` (Julia indices; `offset` is 0-based as in C)."""
function add_segment!(e::Engine, name::AbstractString, offset::Integer, count::Integer; role::Symbol=:parameter)
    segment = Ref(CO2_SEGMENT_INIT())
    s = segment[]
    cname = Base.cconvert(Cstring, String(name))
    r = _lookup(_ROLES, role, "role")
    GC.@preserve cname begin
        s.name = Ptr{Cchar}(pointer(cname))
        s.offset = offset
        s.count = count
        s.role = r
        check(co2_engine_add_segment(e, segment))
    end
    r == CO2_ROLE_PARAMETER && push!(e.trained_counts, Int(count))
    return nothing
end

"""Collective: freezes the layout, checks it and every engine setting that changes the math
across ranks, copies rank 0's values everywhere."""
function commit!(e::Engine)
    h = _raw(e)
    check(blocking(() -> co2_engine_commit(h)))
end

"""After every inner optimizer step; `true` when this call was a round boundary."""
function step!(e::Engine)
    h = _raw(e)
    boundary = Ref{Cint}(0)
    GC.@preserve boundary begin
        p = Base.unsafe_convert(Ptr{Cint}, boundary)
        check(blocking(() -> co2_engine_step(h, C_NULL, p)))
    end
    return boundary[] != 0
end

"""Collective: averages gradients in place; one Vector per PARAMETER tensor, in order."""
function reduce_gradients!(e::Engine, grads::Vector{Vector{Float32}})
    length(grads) == length(e.trained_counts) ||
        throw(CO2Error(CO2_ERR_INVALID_ARGUMENT, "$(length(grads)) gradients for $(length(e.trained_counts)) trained tensors"))
    for (i, (g, n)) in enumerate(zip(grads, e.trained_counts))
        length(g) == n || throw(CO2Error(CO2_ERR_INVALID_ARGUMENT, "gradient $i has $(length(g)) elements, its tensor $n"))
    end
    h = _raw(e)
    pointers = Ptr{Cvoid}[pointer(g) for g in grads]
    GC.@preserve grads pointers begin
        p, n = pointer(pointers), length(pointers)
        check(blocking(() -> co2_engine_reduce_gradients(h, p, n, C_NULL)))
    end
    return grads
end

function synchronize!(e::Engine)
    h = _raw(e)
    check(blocking(() -> co2_engine_synchronize(h)))
end

"""Elastic groups: asks to leave without ending the group. Returns at once; keep calling `step!`:
the step at which the group lets this rank go throws a `CO2Error` with status `CO2_LEFT` here
(see [`left_group`](@ref); parameters = the anchor, every step's work kept) and
`CO2_MEMBERSHIP_CHANGED` on the others. docs/capi.md, "Leaving"."""
function leave!(e::Engine)
    h = _raw(e)
    check(co2_engine_leave(h))
end

"""Collective end of training: `synchronize!` (the pending average and the partial round's
steps are applied; no step's work is lost); parameters = anchor. (Not `Base.finalize`, which
runs finalizers.)"""
function finalize!(e::Engine)
    h = _raw(e)
    check(blocking(() -> co2_engine_finalize(h)))
end

function num_elements(e::Engine)
    out = Ref{Csize_t}(0)
    check(co2_engine_num_elements(e, out))
    return Int(out[])
end

"""Writes the consensus model into `out` (length `num_elements`); `:local_average` is collective."""
function consensus!(e::Engine, out::Vector{Float32}; kind::Symbol=:anchor)
    k = _lookup(_CONSENSUS, kind, "consensus kind")
    h = _raw(e)
    GC.@preserve out begin
        p, n = pointer(out), length(out)
        check(blocking(() -> co2_engine_consensus(h, k, p, n)))
    end
    return out
end

consensus(e::Engine; kind::Symbol=:anchor) = consensus!(e, Vector{Float32}(undef, num_elements(e)); kind=kind)

set_param!(e::Engine, key::Symbol, value::Real) = check(co2_engine_set_param(e, _lookup(_PARAMS, key, "param"), value))

function get_param(e::Engine, key::Symbol)
    out = Ref{Cdouble}(0)
    check(co2_engine_get_param(e, _lookup(_PARAMS, key, "param"), out))
    return out[]
end

"""The engine's counters and timings as a NamedTuple (fields of co2_engine_stats_t)."""
function stats(e::Engine)
    s = Ref(CO2_ENGINE_STATS_INIT())
    check(co2_engine_get_stats(e, s))
    v = s[]
    names = fieldnames(co2_engine_stats_t)[3:end]  # past size and version
    return NamedTuple{names}(Tuple(getfield(v, n) for n in names))
end

function state_size(e::Engine)
    out = Ref{Csize_t}(0)
    check(co2_engine_state_size(e, out))
    return Int(out[])
end

# Checkpoint callbacks: `user` is the IO object (rooted by the caller of save/load). Exceptions
# must not unwind through C: they become a nonzero return, i.e. CO2_ERR_CALLBACK.
function _write_trampoline(user::Ptr{Cvoid}, data::Ptr{Cvoid}, length::Csize_t)::Cint
    try
        io = unsafe_pointer_to_objref(user)::IO
        unsafe_write(io, Ptr{UInt8}(data), length) == length || return Cint(1)
        return Cint(0)
    catch
        return Cint(1)
    end
end

function _read_trampoline(user::Ptr{Cvoid}, data::Ptr{Cvoid}, length::Csize_t)::Cint
    try
        io = unsafe_pointer_to_objref(user)::IO
        unsafe_read(io, Ptr{UInt8}(data), length)
        return Cint(0)
    catch
        return Cint(1)
    end
end

"""Collective: streams the shared engine state into `io`; ranks that do not write pass `nothing`.
A sharded engine writes this rank's shard (every rank saves and loads its own); `portable = true`
writes the replicated format, which loads at any world size and sharding
(co2_engine_save_portable). Not in a GC-safe region: the callbacks run Julia code."""
function save(e::Engine, io::Union{IO,Nothing}; portable::Bool = false)
    if io === nothing
        return check(portable ? co2_engine_save_portable(e, C_NULL, C_NULL) : co2_engine_save(e, C_NULL, C_NULL))
    end
    GC.@preserve io check(portable ?
        co2_engine_save_portable(e, _write_callback[], pointer_from_objref(io)) :
        co2_engine_save(e, _write_callback[], pointer_from_objref(io)))
end

"""Restores the shared state from `io` (transactional: a bad blob changes nothing; collective on a
sharded engine, where a bad blob on one rank fails every rank)."""
function load!(e::Engine, io::IO)
    GC.@preserve io check(co2_engine_load(e, _read_callback[], pointer_from_objref(io)))
end

"""The library's version as a VersionNumber."""
function libversion()
    major, minor, patch = Ref{Cint}(0), Ref{Cint}(0), Ref{Cint}(0)
    check(co2_get_version(major, minor, patch))
    return VersionNumber(major[], minor[], patch[])
end

end # module

# CO2.jl tests. NOT RUN: no Julia on the machines this was written on (see README.md).
#   CO2_LIB_DIR=/path/to/build julia --threads=4 --project=bindings/julia/CO2.jl -e 'using Pkg; Pkg.test()'
using CO2
using Test

const C = CO2  # the generated low-level names live in the module

groupname(test) = "co2-julia-$(test)-$(getpid())-$(rand(UInt32))"

"""Runs `body(rank, comm)` on `world` tasks on separate threads (the local transport needs one
thread per rank: a collective blocks until every rank joined)."""
function run_ranks(body, world, group)
    Threads.nthreads() >= world || error("run with julia --threads=$world or more")
    tasks = [Threads.@spawn begin
                 comm = Communicator(transport=:local, rank=r, world_size=world, group_name=group,
                                     timeout_ms=30_000)
                 try
                     body(r, comm)
                 finally
                     close(comm)
                 end
             end for r in 0:world-1]
    return fetch.(tasks)
end

@testset "struct layouts match clang's" begin
    if Sys.WORD_SIZE == C.GENERATED_ON_WORD_SIZE && Sys.islinux()
        for (name, layout) in pairs(C.LAYOUT)
            T = getfield(C, name)
            @test sizeof(T) == layout.size
            @test Base.datatype_alignment(T) == layout.align
            for (i, field) in enumerate(fieldnames(T))
                @test fieldoffset(T, i) == getfield(layout.offsets, field)
            end
        end
    end
end

@testset "defaults and version" begin
    cfg = Ref(C.CO2_COMM_CONFIG_INIT())
    @test C.co2_comm_config_init(cfg) == C.CO2_OK
    @test cfg[].timeout_ms == C.CO2_DEFAULT_TIMEOUT_MS
    @test cfg[].size == sizeof(C.co2_comm_config_t)
    @test cfg[].elastic_min_ranks == 0  # 1.2: not elastic by default
    @test cfg[].reserved4 == 0
    ecfg = Ref(C.CO2_ENGINE_CONFIG_INIT())
    @test C.co2_engine_config_init(ecfg) == C.CO2_OK
    @test ecfg[].tau == C.CO2_DEFAULT_TAU
    @test ecfg[].outer_momentum == C.CO2_OUTER_MOMENTUM_AUTO
    @test CO2.libversion() == VersionNumber(C.CO2_VERSION_MAJOR, C.CO2_VERSION_MINOR, C.CO2_VERSION_PATCH)
end

@testset "membership changed status" begin
    @test C.CO2_MEMBERSHIP_CHANGED == 50
    e = CO2Error(C.CO2_MEMBERSHIP_CHANGED, "re-formed: rank 0 of 2")
    @test membership_changed(e)
    @test !membership_changed(CO2Error(C.CO2_ERR_PEER_LOST, ""))
    text = sprint(showerror, e)
    @test occursin("(status 50)", text)
    @test unsafe_string(C.co2_status_string(C.CO2_MEMBERSHIP_CHANGED)) !=
          unsafe_string(C.co2_status_string(Int32(77)))  # a text of its own, not "unknown"
end

@testset "create, train, destroy on one rank" begin
    comm = Communicator(transport=:local, group_name=groupname("one"))
    @test CO2.rank(comm) == 0 && size(comm) == 1
    w = Float32[1, 2, 3]
    engine = Engine(comm; tau=2)
    register_tensor!(engine, "w", w)
    commit!(engine)
    @test num_elements(engine) == 3
    w .*= 0.5f0
    @test step!(engine) == false
    @test step!(engine) == true
    finalize!(engine)
    @test stats(engine).rounds == 1
    @test consensus(engine) == w
    io = IOBuffer()
    save(engine, io)
    @test position(io) == state_size(engine)
    seekstart(io)
    load!(engine, io)
    close(engine)
    close(engine)  # idempotent
    close(comm)
end

@testset "errors carry the status" begin
    status(f) = try
        f(); nothing
    catch e
        e isa CO2Error || rethrow()
        @test !isempty(e.message)
        e.status
    end
    g = groupname("errors")
    @test status(() -> Communicator(transport=:local, rank=2, world_size=2, group_name=g)) == C.CO2_ERR_INVALID_ARGUMENT
    @test status(() -> Communicator(transport=:local, group_name=g, connections_per_peer=17)) == C.CO2_ERR_INVALID_ARGUMENT
    # elastic_min_ranks reaches the library: negative is refused, and so is a minimum above the
    # group's size (a keyword that never reached the config would create the group).
    @test status(() -> Communicator(transport=:local, group_name=g, elastic_min_ranks=-1)) == C.CO2_ERR_INVALID_ARGUMENT
    @test status(() -> Communicator(transport=:local, group_name=g, elastic_min_ranks=2)) == C.CO2_ERR_INVALID_ARGUMENT
    close(Communicator(transport=:local, group_name=groupname("elastic0"), elastic_min_ranks=0))
    @test status(() -> Communicator(transport=:local, rank=0, world_size=2, group_name=g, timeout_ms=200)) == C.CO2_ERR_RENDEZVOUS
    comm = Communicator(transport=:local, group_name=g)
    @test status(() -> Engine(comm; tau=0)) == C.CO2_ERR_INVALID_ARGUMENT
    e = Engine(comm)
    @test status(() -> step!(e)) == C.CO2_ERR_INVALID_STATE
    register_tensor!(e, "w", zeros(Float32, 4))
    @test status(() -> register_tensor!(e, "w", zeros(Float32, 4))) == C.CO2_ERR_DUPLICATE_TENSOR
    commit!(e)
    @test status(() -> consensus!(e, zeros(Float32, 3))) == C.CO2_ERR_INVALID_ARGUMENT
    @test status(() -> set_param!(e, :outer_lr, -1.0)) == C.CO2_ERR_INVALID_ARGUMENT
    @test status(() -> reduce_gradients!(e, [zeros(Float32, 3)])) == C.CO2_ERR_INVALID_ARGUMENT
    @test status(() -> load!(e, IOBuffer(UInt8[1, 2, 3]))) == C.CO2_ERR_CALLBACK
    close(e)
    close(comm)
end

@testset "split into nodes and lanes" begin
    if Threads.nthreads() >= 4
        results = run_ranks(4, groupname("split")) do rank, comm
            node, localrank = divrem(rank, 2)
            nodes = split(comm, node, localrank)
            lanes = split(comm, localrank, node)
            @test split(comm, nothing) === nothing
            sums = (allreduce!(nodes, Int64[rank]; op=:sum)[1], allreduce!(lanes, Int64[rank]; op=:sum)[1])
            ranks = (CO2.rank(nodes), CO2.rank(lanes))
            close(nodes)
            close(lanes)
            (ranks, sums)
        end
        @test results == [((0, 0), (1, 2)), ((1, 0), (1, 4)), ((0, 1), (5, 2)), ((1, 1), (5, 4))]
    else
        @info "split skipped: run julia with --threads=4 or more"
    end
end

@testset "split_nodes from node ids" begin
    if Threads.nthreads() >= 4
        results = run_ranks(4, groupname("split_nodes")) do rank, comm
            # Ranks 0, 2 on node id 10 (node 0: it holds rank 0), ranks 1, 3 on node id 11.
            intra, inter = split_nodes(comm; node_id=10 + rank % 2)
            sums = (allreduce!(intra, Int64[rank]; op=:sum)[1], allreduce!(inter, Int64[rank]; op=:sum)[1])
            ranks = (CO2.rank(intra), CO2.rank(inter))
            close(intra)
            close(inter)
            unequal = try
                split_nodes(comm; node_id=rank == 3 ? 1 : 0)
                ""
            catch e
                e isa CO2Error ? e.message : rethrow()
            end
            (ranks, sums, occursin("has 3 ranks", unequal))
        end
        @test results == [((0, 0), (2, 1), true), ((0, 1), (4, 1), true), ((1, 0), (2, 5), true), ((1, 1), (4, 5), true)]
    else
        @info "split_nodes skipped: run julia with --threads=4 or more"
    end
end

@testset "several in-process ranks agree" begin
    if Threads.nthreads() >= 3
        results = run_ranks(3, groupname("ranks")) do rank, comm
            engine = Engine(comm; tau=3, outer_momentum=0.5, nesterov=true)
            flat = alloc_flat!(engine, 10)
            add_segment!(engine, "a", 0, 7)
            add_segment!(engine, "b", 7, 3)
            flat .= rank
            commit!(engine)
            @test all(flat .== 0)  # rank 0's values everywhere
            for step in 1:9
                flat .-= 0.1f0 .* (flat .- Float32(rank + step))
                step!(engine)
            end
            finalize!(engine)
            x = allreduce!(comm, Float64[rank + 1]; op=:sum)
            @test x == [6.0]
            model = copy(flat)
            close(engine)
            model
        end
        @test results[1] == results[2] == results[3]
    else
        @info "in-process ranks skipped: run julia with --threads=3 or more"
    end
end

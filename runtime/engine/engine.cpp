// Rounds and outer updates. docs/algorithm.md is the specification of everything here.
#include "runtime/engine/engine.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <type_traits>

#include "runtime/outer/boundary_pass.hpp"
#include "runtime/base/checksum.hpp"
#include "runtime/collectives/collectives.hpp"
#include "runtime/backends/backend.hpp"
#include "runtime/backends/device/selection.hpp"
#include "runtime/engine/arrival.hpp"
#include "runtime/engine/engine_state.hpp"
#include "runtime/group/group.hpp"
#include "runtime/base/log.hpp"
#include "runtime/engine/observe.hpp"
#include "rendezvous/launch_environment.hpp"

namespace co2 {

namespace {

uint64_t elapsed_ns(Clock::time_point from, Clock::time_point to) {
  return to > from ? uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(to - from).count())
                   : 0;
}

bool is_finite_in(double v, double lo, double hi) { return std::isfinite(v) && v >= lo && v <= hi; }

// The largest tau and anchor check interval, at create as through co2_engine_set_param.
constexpr double kMaxCount = 1e9;

uint32_t as_count(double value, const char* what, double min) {
  require(std::isfinite(value) && value == std::floor(value) && value >= min && value <= kMaxCount,
          Status::InvalidArgument,
          std::string(what) + " must be an integer in [" + std::to_string(int64_t(min)) +
              ", 1e9], got " + std::to_string(value));
  return uint32_t(value);
}

Role parse_role(int role) {
  require(role >= 0 && role <= 2, Status::UnknownEnum,
          "unknown tensor role " + std::to_string(role) +
              " (expected CO2_ROLE_PARAMETER, CO2_ROLE_BUFFER or CO2_ROLE_EXCLUDED)");
  return Role(role);
}

void validate_storage(const StorageDesc& storage) {
  switch (storage.dtype) {
    case int(ParamDType::F32):
    case int(ParamDType::BF16):
    case int(ParamDType::F16):
      break;
    case 3:
      fail(Status::Unsupported,
           "fp64 parameters are not supported: train in float32 (model.float()) or in bf16/fp16 "
           "parameters with the engine's fp32 outer state (model.bfloat16())");
    case 4:
    case 5:
      fail(Status::InvalidArgument, "dtype " + std::to_string(storage.dtype) +
                                        " is for raw collectives only, not a parameter dtype");
    default:
      fail(Status::UnknownEnum, "unknown dtype " + std::to_string(storage.dtype));
  }
  switch (storage.device) {
    case int(DeviceKind::Host):
      break;
    case int(DeviceKind::Cuda):
      require(device_backend_built(), Status::Unsupported,
              kBuiltWithoutCuda);
      break;
    default:
      fail(Status::UnknownEnum, "unknown device kind " + std::to_string(storage.device));
  }
  require(storage.device_index >= 0, Status::InvalidArgument, "device_index must be >= 0");
}

std::unique_ptr<Backend> make_host_side_backend(Engine::State& s) {
  return s.sharded() ? make_sharded_backend(s) : make_host_backend(s);
}

// All tensors of an engine live in one place; the first CUDA one brings up the device path.
void note_placement(Engine::State& s, const StorageDesc& storage) {
  require(s.placement < 0 || (s.placement == storage.device && s.device_index == storage.device_index),
          Status::InvalidArgument,
          "an engine's tensors must all live on the host or all on one CUDA device (got device kind " +
              std::to_string(storage.device) + " index " + std::to_string(storage.device_index) +
              " after kind " + std::to_string(s.placement) + " index " + std::to_string(s.device_index) + ")");
  if (s.placement < 0 && storage.device == int(DeviceKind::Cuda)) s.backend = make_device_backend(s, storage.device_index);
  s.placement = storage.device;
  s.device_index = storage.device_index;
}

// A rejected first tensor or flat storage leaves the engine without a placement, as before.
class PlacementRollback {
 public:
  explicit PlacementRollback(Engine::State& s) : s_(s) {}
  ~PlacementRollback() {
    if (armed_ && s_.segments.empty() && !s_.flat) {
      s_.placement = -1;
      s_.backend = make_host_side_backend(s_);
    }
  }
  void dismiss() { armed_ = false; }

 private:
  Engine::State& s_;
  bool armed_ = true;
};

// Marks the caller's return to its own compute when an engine call leaves, normally or not.
struct AdvisorExitGuard {
  TauAdvisor& advisor;
  ~AdvisorExitGuard() { advisor.caller_left(Clock::now()); }
};

bool ranges_overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const auto a0 = reinterpret_cast<uintptr_t>(a), b0 = reinterpret_cast<uintptr_t>(b);
  return a0 < b0 + b_bytes && b0 < a0 + a_bytes;
}


}  // namespace

void validate(const EngineConfig& c) {
  require(int(c.algorithm) >= 0 && int(c.algorithm) <= 3, Status::UnknownEnum,
          "unknown algorithm " + std::to_string(int(c.algorithm)));
  require(int(c.penalty) >= 0 && int(c.penalty) <= 2, Status::UnknownEnum,
          "unknown penalty policy " + std::to_string(int(c.penalty)));
  require(int(c.clip) >= 0 && int(c.clip) <= 2, Status::UnknownEnum,
          "unknown clip policy " + std::to_string(int(c.clip)));
  require(int(c.eager) >= -1 && int(c.eager) <= 1, Status::InvalidArgument,
          "eager must be 0 (delayed), 1 (eager) or CO2_EAGER_AUTO (-1)");
  require(c.apply_step >= kApplyOnArrival, Status::InvalidArgument,
          "apply_step must be CO2_APPLY_AT_BOUNDARY (0), CO2_APPLY_ON_ARRIVAL (-1) or a step k >= 1, got " +
              std::to_string(c.apply_step));
  require(c.apply_step == kApplyAtBoundary || c.algorithm == Algorithm::Co2, Status::InvalidArgument,
          "apply_step applies co2's overlapped average before the next boundary; the other algorithms "
          "average at the boundary itself (blocking) and have nothing in flight: use CO2_APPLY_AT_BOUNDARY");
  as_count(c.tau, "tau", 1);
  as_count(c.anchor_check_interval, "anchor_check_interval", 0);
  require(is_finite_in(c.outer_lr, 0.0, 1e6), Status::InvalidArgument,
          "outer_lr must be finite and >= 0");
  require(c.outer_momentum < 0.0 ? c.outer_momentum == -1.0 : is_finite_in(c.outer_momentum, 0.0, 0.999999),
          Status::InvalidArgument,
          "outer_momentum must be in [0, 1) or CO2_OUTER_MOMENTUM_AUTO (-1)");
  require(is_finite_in(c.penalty_constant, 1e-12, 1e12), Status::InvalidArgument,
          "penalty_constant must be > 0");
  require(is_finite_in(c.clip_threshold, 1e-30, 1e30), Status::InvalidArgument,
          "clip_threshold must be > 0");
  require(is_finite_in(c.inner_lr, 0.0, 1e30), Status::InvalidArgument, "inner_lr must be >= 0");
  wire_format_of(int(c.wire_format));
  require(int(c.hierarchy) == 0 || int(c.hierarchy) == 1, Status::InvalidArgument,
          "hierarchy must be CO2_HIERARCHY_FLAT (0) or CO2_HIERARCHY_NODES (1)");
  require(c.node_id >= -1, Status::InvalidArgument, "node_id must be >= 0 or CO2_NODE_ID_AUTO (-1)");
  if (c.shard_outer_state || c.hierarchy == Hierarchy::Nodes) {
    require(c.algorithm == Algorithm::Co2, Status::InvalidArgument,
            "shard_outer_state and hierarchical CO2 (which shards the outer state over a node's ranks) "
            "are implemented for co2; other algorithms keep no outer state to shard (or, for diloco, "
            "are not sharded yet): use CO2_ALGO_CO2, or shard_outer_state = 0 and CO2_HIERARCHY_FLAT");
  }
  require(c.wire_format == WireFormat::F32 || c.algorithm == Algorithm::Co2 || c.algorithm == Algorithm::Diloco,
          Status::InvalidArgument,
          std::string("wire_format ") + wire_format_name(c.wire_format) +
              " compresses the outer all-reduce of co2 and diloco; sync and localsgd average in fp32 "
              "(use CO2_WIRE_FP32)");
}

double default_outer_momentum(int outer_participants) {
  if (outer_participants <= 16) return 0.0;
  if (outer_participants <= 32) return 0.2;
  if (outer_participants <= 64) return 0.5;
  return 0.6;
}

// ------------------------------------------------------------------------------------------
// Boundary machinery, as free functions over the state.
// ------------------------------------------------------------------------------------------
namespace {

using S = Engine::State;

void require_committed(const S& s) {
  // A group that failed to re-form after a membership change left its new layout uncommitted:
  // that failure, not a missing commit, is what the caller must hear.
  if (s.formed && !s.committed)
    fail(s.comm->error_status() != Status::Ok ? s.comm->error_status() : Status::PeerLost,
         "the group could not re-form after a membership change: " + s.comm->error_message());
  require(!s.left, Status::Left,
          "this rank left its group (co2_engine_leave): its engine takes no more steps; destroy it and its "
          "communicator");
  require(s.committed, Status::InvalidState,
          "the layout is not committed yet: register tensors, then call co2_engine_commit");
}

// Hierarchical CO2 runs on three communicators, which fail one by one (an inter-node link
// alone); a rank that finds one failed fails the others with its error, so that every rank of
// every node learns of it at its next collective instead of waiting out a timeout there.
void fail_engine_communicators(S& s, Status status, const std::string& message) {
  if (!s.hierarchical()) return;
  for (Communicator* comm : {s.comm.get(), s.intra.get(), s.inter.get()})
    if (comm->error_status() == Status::Ok) comm->fail_with(status, message);
}

// Every communicator the engine runs collectives on: its node groups' errors stop the engine
// as the main one's do.
void check_comm(S& s) {
  for (const Communicator* comm : {s.comm.get(), s.intra.get(), s.inter.get()})
    if (comm && comm->error_status() != Status::Ok) {
      const Status status = comm->error_status();
      const std::string message = comm->error_message();
      fail_engine_communicators(s, status, message);
      fail(status, message);
    }
}


}  // namespace

// An applied update counts; its figures (when known) become the last_* statistics.
void commit_update(Engine::State& s, Clip clip, const UpdateSummary* sum) {
  ++s.stats.outer_updates;
  if (!sum) return;
  s.stats.last_penalty_min = s.num_trained ? sum->penalty_min : 1.0;
  s.stats.last_penalty_max = s.num_trained ? sum->penalty_max : 1.0;
  s.stats.last_clip_scale_min = sum->scale_min;
  if (clip == Clip::Value)
    s.stats.last_clip_fraction = sum->trained_elements ? double(sum->clamped) / double(sum->trained_elements) : 0.0;
  else if (clip == Clip::Norm)
    s.stats.last_clip_fraction = s.num_trained ? double(sum->scaled_segments) / double(s.num_trained) : 0.0;
  else
    s.stats.last_clip_fraction = 0.0;
}

// Blocks on a request, charging the time to the boundary-wait statistics.
void Engine::State::wait_collective(const std::shared_ptr<Request>& request) {
  Engine::State& s = *this;
  const auto start = Clock::now();
  const Status status = request->wait_status();
  const auto end = Clock::now();
  const uint64_t waited = elapsed_ns(start, end);
  s.stats.boundary_wait_ns += waited;
  s.stats.last_boundary_wait_ns = waited;
  if (status != Status::Ok) {
    // The request's own message: it may have run on a node group, not on s.comm.
    std::string message = request->message();
    if (message.empty()) message = s.comm->error_message();
    if (message.empty()) message = "collective failed";
    fail_engine_communicators(s, status, message);
    fail(status, message);
  }
  const uint64_t collective = elapsed_ns(request->submitted_at(), request->completed_at());
  s.stats.collective_ns += collective;
  s.advisor.allreduce_completed(collective);
  observe_collective(s, *request, start, end);
}

// All ranks compare a 64-bit value; every rank learns of a difference.
bool same_on_every_rank(Engine::State& s, uint64_t value, Purpose purpose) {
  return same_on_every_rank_of(s, *s.comm, {s.owner, purpose}, value);
}

bool same_on_every_rank_of(Engine::State& s, Communicator& comm, CollectiveId id, uint64_t value) {
  int64_t mine;
  std::memcpy(&mine, &value, sizeof mine);
  const std::vector<int64_t> all = gathered_from_every_rank(s, comm, id, {mine});
  return std::all_of(all.begin(), all.end(), [&](int64_t v) { return v == all[0]; });
}

std::vector<int64_t> gathered_from_every_rank(Engine::State& s, Communicator& comm, CollectiveId id,
                                              const std::vector<int64_t>& mine) {
  std::vector<int64_t> all(mine.size() * size_t(comm.size()), 0);
  auto request = comm.allgather(mine.data(), all.data(), mine.size(), DataType::I64, id);
  if (request->wait_status() != Status::Ok) fail(comm.error_status(), comm.error_message());
  observe_control_collective(s, *request);
  return all;
}

void check_anchor(Engine::State& s) {
  ++s.stats.anchor_checks;
  if (!same_on_every_rank(s, s.backend->anchor_checksum(), Purpose::AnchorCheck))
    fail(Status::AnchorMismatch,
         "anchor checksums differ across ranks: the ranks no longer train the same model "
         "(memory corruption or a non-deterministic framework step); restore a checkpoint");
}

// Whether this boundary checks the anchor: every anchor_check_interval rounds. The one place
// that decides it; a backend learns it from BoundaryPass::anchor_check_due.
bool anchor_check_due(const Engine::State& s) {
  const uint32_t k = s.config.anchor_check_interval;
  return k && s.stats.rounds % k == 0;
}

void check_anchor_when_due(Engine::State& s) {
  if (anchor_check_due(s)) check_anchor(s);
}

void count_finished_work(Engine::State& s, bool wait) {
  const Backend::Finished done = s.backend->finished(wait);
  for (const Backend::FinishedBoundary& b : done.boundaries) {
    if (b.deltas_nonfinite) ++s.stats.nonfinite_local;  // the engine counted the nonfinite averages
    if (b.applied) commit_update(s, s.config.clip, &b.summary);
  }
  for (const std::shared_ptr<Request>& request : done.collectives) {
    s.stats.collective_ns += elapsed_ns(request->submitted_at(), request->completed_at());
    const Clock::time_point now = Clock::now();
    observe_collective(s, *request, now, now);  // the host did not wait for it
  }
}

// The update a backend just applied: its gap history and statistics become the engine's (a
// backend that reports them later hands over those of the boundaries it finished).
void adopt_applied_update(Engine::State& s) {
  if (s.backend->reports_updates_later()) return count_finished_work(s, /*wait=*/false);
  s.history = s.prepared.history;
  commit_update(s, s.prepared.settings.clip, s.prepared.summary_known ? &s.prepared.summary : nullptr);
  s.prepared.ready = false;
}

void collect_pending_average(Engine::State& s) {
  if (!s.pending) return;
  const Arrival arrival = s.backend->collect_average();
  s.average_ready = true;
  s.ready_average_finite = arrival.finite;
}

namespace {

// Every setting that changes the math or the sequence of collectives, as this engine will run
// it. Ranks that differ in one would train different models (or pair different collectives)
// without an error, so commit compares them. Left out, because they cannot matter: inner_lr
// (recorded only), the penalty constant without the constant policy, the clip threshold
// without clipping, error feedback without a compressed wire, eager outside co2; eager is
// compared as resolved (AUTO and 1 are one policy on host tensors).
std::vector<std::pair<const char*, double>> settings_that_change_the_math(const S& s) {
  const EngineConfig& c = s.config;
  return {
      {"algorithm", double(int(c.algorithm))},
      {"tau", double(c.tau)},
      {"tau of the first round (co2_engine_set_param(TAU) before commit)", double(s.round_tau)},
      {"warmup_sync_rounds", double(c.warmup_sync_rounds)},
      {"outer_lr", c.outer_lr},
      {"outer_momentum", s.beta_auto ? -1.0 : s.beta},
      {"nesterov", double(c.nesterov)},
      {"penalty", double(int(c.penalty))},
      {"penalty_constant", c.penalty == Penalty::Constant ? c.penalty_constant : 0.0},
      {"clip", double(int(c.clip))},
      {"clip_threshold", c.clip != Clip::None ? c.clip_threshold : 0.0},
      {"anchor_check_interval", double(c.anchor_check_interval)},
      {"eager", double(s.eager())},
      {"wire_format", double(int(c.wire_format))},
      {"error_feedback", double(s.error_feedback())},
      {"shard_outer_state", double(c.shard_outer_state)},
      {"hierarchy", double(int(c.hierarchy))},
      {"apply_step", double(c.apply_step)},
  };
}

std::string setting_text(const char* name, double value) {
  if (value == -1.0 && std::strcmp(name, "outer_momentum") == 0) return "CO2_OUTER_MOMENTUM_AUTO";
  char text[32];
  std::snprintf(text, sizeof text, "%.17g", value);
  return text;
}

// Collective: every rank learns of the first setting that differs, with rank 0's and the
// other rank's values, and fails alike.
void check_settings_agree(S& s) {
  const auto settings = settings_that_change_the_math(s);
  std::vector<int64_t> mine(settings.size());
  for (size_t i = 0; i < settings.size(); ++i) std::memcpy(&mine[i], &settings[i].second, sizeof(int64_t));
  const std::vector<int64_t> all = gathered_from_every_rank(s, *s.comm, s.id(Purpose::LayoutHash), mine);
  const size_t k = mine.size();
  for (size_t rank = 1; rank < size_t(s.comm->size()); ++rank)
    for (size_t i = 0; i < k; ++i) {
      if (all[rank * k + i] == all[i]) continue;
      double first, theirs;
      std::memcpy(&first, &all[i], sizeof first);
      std::memcpy(&theirs, &all[rank * k + i], sizeof theirs);
      const char* name = settings[i].first;
      fail(Status::LayoutMismatch,
           std::string("ranks created their engines with different settings: ") + name + " is " +
               setting_text(name, first) + " on rank 0 but " + setting_text(name, theirs) + " on rank " +
               std::to_string(rank) +
               "; they would train different models. Create the engine with the same co2_engine_config_t "
               "on every rank (and make the same co2_engine_set_param calls before commit)");
    }
}

// Hierarchical CO2: the node's ranks and this local index's ranks on every node
// (co2_comm_split_nodes), each with an owner id of this engine; the nodes are the outer
// participants, which an automatic beta counts.
void form_nodes(S& s) {
  GroupRequest request;
  request.options = s.comm->options();
  auto [intra, inter] = split_nodes(*s.comm, s.config.node_id, request);
  // Every rank on one node, found only by its host name (split_nodes refuses a mix of ids and
  // host names, so every rank decides alike): most likely threads or processes of one host
  // whose nodes nobody named. Trained on, it would be sync over the ranks with an outer update
  // of a single participant, and no error anywhere.
  if (inter->size() == 1 && intra->size() > 1 && s.config.node_id < 0 && store::read_node_name().id < 0)
    fail(Status::InvalidArgument,
         "hierarchy = CO2_HIERARCHY_NODES found all " + std::to_string(intra->size()) +
             " ranks on one node (host '" + store::read_node_name().host +
             "'), because no rank names its node: no co2_comm_config_t.node_id and no launcher node index "
             "(GROUP_RANK, LOCAL_RANK with LOCAL_WORLD_SIZE, SLURM_NODEID). Set co2_comm_config_t.node_id on "
             "every rank (equal ids share a node) or launch with co2run --nnodes, torchrun or srun; for "
             "synchronous training on one node use CO2_ALGO_SYNC, for co2 over every rank CO2_HIERARCHY_FLAT");
  if (inter->size() == 1 && intra->size() > 1)
    log::warn("hierarchical co2 on a single node: the " + std::to_string(intra->size()) +
              " ranks average their gradients every step and the outer update has one participant, "
              "i.e. this is synchronous training (CO2_ALGO_SYNC) with an outer step");
  s.intra = std::move(intra);
  s.inter = std::move(inter);
  s.intra_owner = s.intra->register_owner();
  s.inter_owner = s.inter->register_owner();
  if (s.beta_auto) {
    s.beta = default_outer_momentum(s.outer_participants());
    s.stats.resolved_outer_momentum = s.beta;
  }
  log::info("hierarchical co2: node " + std::to_string(s.inter->rank()) + " of " + std::to_string(s.inter->size()) +
            ", local rank " + std::to_string(s.intra->rank()) + " of " + std::to_string(s.intra->size()));
  // Not an error (a small test of a multi-node job), but not what a user asking for nodes expects.
  if (s.inter->size() == 1 && s.comm->size() > 1)
    log::warn("hierarchical co2 found one node holding all " + std::to_string(s.comm->size()) +
              " ranks: there is nothing to run co2 across, so this is sync training (gradients averaged "
              "every step inside the node) with an outer step over the node's own deltas. For co2 "
              "across nodes launch on several nodes (co2run --nnodes, GROUP_RANK, or node_id per rank); "
              "on one machine use the flat hierarchy");
}

// Hierarchical CO2 trains one model per node: its ranks' parameters must be equal at a boundary
// (every step's gradients averaged inside the node). Compared when the anchor check is due,
// before the pass, so that a missing intra-node average fails loudly instead of training a mix.
// BUFFER segments (running statistics of each rank's data) may differ: the pass averages them
// inside the node first.
void check_node_parameters_when_due(S& s) {
  const uint32_t k = s.config.anchor_check_interval;
  if (!s.hierarchical() || !k || s.stats.rounds % k != 0) return;
  if (!same_on_every_rank_of(s, *s.intra, {s.intra_owner, Purpose::AnchorCheck},
                             s.backend->parameters_checksum(/*trained_only=*/true)))
    fail(Status::AnchorMismatch,
         "the ranks of node " + std::to_string(s.inter->rank()) +
             " hold different parameters at a boundary: hierarchical co2 trains one model per node, so "
             "every step's gradients must be averaged inside the node (co2_engine_reduce_gradients, or "
             "the framework's own data parallelism over the node's ranks)");
}

void throw_nonfinite() {
  fail(Status::NonFinite,
       "the averaged update contains NaN or Inf; nothing was applied on any rank (the anchor "
       "is unchanged): lower the learning rate or skip the offending data");
}

// --- the rounds of each algorithm; each returns false when it applied nothing because an
// average was not finite ---

// co2: the average of the previous round's deltas is applied (when it arrived finite), this
// round's deltas are written and their all-reduce runs behind the next round. The anchor check
// comes between the pass and the submit: it sees the anchor this boundary made.
bool co2_boundary(S& s) {
  Backend& b = *s.backend;
  const Arrival arrival = b.collect_average();
  const bool update = arrival.have && arrival.finite;
  if (arrival.have && !arrival.finite) ++s.stats.nonfinite_rounds;
  check_node_parameters_when_due(s);
  BoundaryPass pass;
  pass.update = update;
  pass.eager = s.eager();
  pass.anchor_check_due = anchor_check_due(s);
  const DeltasFinite deltas = b.boundary_pass(pass);
  if (update) {
    adopt_applied_update(s);
    s.stats.last_apply_step = 0;
  }
  if (deltas == DeltasFinite::No) ++s.stats.nonfinite_local;
  check_anchor_when_due(s);
  b.submit_average();
  return !arrival.have || arrival.finite;
}

// co2 with apply_step: the average in flight is applied at a step between boundaries, as soon as
// its agreed step has come. Each rank keeps its progress since the boundary on top of the new
// anchor; the next boundary then applies nothing. An average that is not finite is dropped here,
// as a boundary would drop it.
void apply_on_arrival(S& s) {
  const TraceSpan span(s.trace.get(), "apply on arrival", "round", s.stats.rounds);
  check_comm(s);
  Backend& b = *s.backend;
  const Arrival arrival = b.collect_average();
  if (!arrival.have) return;
  if (!arrival.finite) {
    ++s.stats.nonfinite_rounds;
    throw_nonfinite();
  }
  b.apply_on_arrival();
  adopt_applied_update(s);
  ++s.stats.arrival_updates;
  s.stats.last_apply_step = s.steps_in_round;
}

// diloco, and co2's warm-up rounds: the average of this round's deltas, blocking. A refused
// update resets the parameters to the unchanged anchor.
bool diloco_boundary(S& s) {
  Backend& b = *s.backend;
  check_node_parameters_when_due(s);
  if (!b.average_deltas_blocking()) {
    ++s.stats.nonfinite_rounds;
    b.set_parameters_to_anchor();
    return false;
  }
  b.apply_blocking_update();
  adopt_applied_update(s);
  check_anchor_when_due(s);
  return true;
}

// Blocking average of the parameters across ranks; buffers_only: only BUFFER segments take it.
bool average_parameters(S& s, bool buffers_only) {
  if (s.backend->average_parameters(buffers_only)) return true;
  ++s.stats.nonfinite_rounds;
  return false;
}

bool localsgd_boundary(S& s) {
  if (!average_parameters(s, /*buffers_only=*/false)) return false;
  check_anchor_when_due(s);
  return true;
}

bool sync_boundary(S& s) {
  // Gradients were averaged by reduce_gradients; here only BUFFER segments are averaged.
  if (s.state_count > s.trained_count && !average_parameters(s, /*buffers_only=*/true)) return false;
  check_anchor_when_due(s);
  return true;
}

// co2: waits for the pending average and applies it; parameters = anchor. Returns false when
// the average was not finite (nothing applied).
bool apply_pending(S& s) {
  Backend& b = *s.backend;
  b.clear_eager_state();  // every rank's own deltas are in the average being applied
  const Arrival arrival = b.collect_average();
  if (arrival.have && arrival.finite) {
    b.apply_update();
    adopt_applied_update(s);
    s.stats.last_apply_step = 0;
    return true;
  }
  if (arrival.have) ++s.stats.nonfinite_rounds;
  b.set_parameters_to_anchor();
  return !arrival.have;
}

bool boundary_of_algorithm(S& s) {
  const bool warmup = s.stats.rounds <= s.config.warmup_sync_rounds;
  switch (s.config.algorithm) {
    case Algorithm::Co2:
      return warmup ? diloco_boundary(s) : co2_boundary(s);
    case Algorithm::Diloco:
      return diloco_boundary(s);
    case Algorithm::LocalSgd:
      return localsgd_boundary(s);
    case Algorithm::Sync:
    default:
      return sync_boundary(s);
  }
}

}  // namespace

// ------------------------------------------------------------------------------------------
// Engine
// ------------------------------------------------------------------------------------------

Engine::Engine(std::shared_ptr<Communicator> comm, const EngineConfig& config)
    : state_(std::make_unique<State>()) {
  require(comm != nullptr, Status::InvalidArgument, "communicator is NULL");
  validate(config);
  State& s = *state_;
  s.comm = std::move(comm);
  s.owner = s.comm->register_owner();
  s.config = config;
  s.beta_auto = config.outer_momentum < 0.0;
  s.beta = s.beta_auto ? default_outer_momentum(s.comm->size()) : config.outer_momentum;
  s.round_tau = config.tau;
  s.stats.world_size = s.comm->size();
  s.stats.resolved_outer_momentum = s.beta;
  s.trace = Trace::from_environment(s.comm->rank(), s.owner);
  s.metrics = Metrics::from_environment(s.comm->rank(), s.owner);
  if (s.metrics) publish_metrics(s);
  s.backend = make_host_side_backend(s);  // until a CUDA tensor brings the device backend
}

Engine::~Engine() {
  if (state_) state_->backend->drain();
  if (state_) finish_observing(*state_);
}

void Engine::register_tensor(const TensorDesc& t) {
  State& s = *state_;
  require(!s.committed, Status::InvalidState, "the layout is committed: register tensors before co2_engine_commit");
  require(!t.name.empty(), Status::InvalidArgument, "tensor name is empty");
  require(t.data != nullptr, Status::InvalidArgument, "tensor '" + t.name + "' has a NULL data pointer");
  require(t.count >= 1, Status::InvalidArgument, "tensor '" + t.name + "' has count 0");
  require(t.count <= (size_t(1) << 40), Status::InvalidArgument, "tensor '" + t.name + "' is implausibly large");
  validate_storage(t.storage);
  const Role role = parse_role(t.role);
  const ParamDType dtype = ParamDType(t.storage.dtype);
  const size_t bytes = t.count * element_bytes(dtype);
  PlacementRollback rollback(s);
  note_placement(s, t.storage);
  s.backend->check_memory(t.data, bytes, "tensor '" + t.name + "'");
  for (const Segment& seg : s.segments) {
    require(seg.name != t.name, Status::DuplicateTensor, "a tensor named '" + t.name + "' is already registered");
    require(!ranges_overlap(seg.data, seg.bytes(), t.data, bytes), Status::DuplicateTensor,
            "tensor '" + t.name + "' overlaps the memory of '" + seg.name +
                "' (tied weights: register the shared tensor once)");
  }
  require(!s.flat || !ranges_overlap(s.flat, s.flat_count * element_bytes(s.flat_dtype), t.data, bytes),
          Status::DuplicateTensor, "tensor '" + t.name + "' overlaps the engine's flat storage");
  s.segments.push_back(Segment{t.name, t.data, t.count, role, 0, dtype});
  rollback.dismiss();
}

void* Engine::alloc_flat(size_t count, const StorageDesc& storage) {
  State& s = *state_;
  require(!s.committed, Status::InvalidState, "the layout is committed");
  require(!s.flat, Status::InvalidState, "this engine already has flat storage (one per engine)");
  require(count >= 1 && count <= (size_t(1) << 40), Status::InvalidArgument, "flat storage count must be >= 1");
  validate_storage(storage);
  PlacementRollback rollback(s);
  note_placement(s, storage);
  s.flat_dtype = ParamDType(storage.dtype);
  s.flat = s.backend->allocate_flat(count, s.flat_dtype);  // may throw: the rollback then unpins the placement
  rollback.dismiss();
  s.flat_count = count;
  return s.flat;
}

void Engine::adopt_flat(void* data, size_t count, const StorageDesc& storage) {
  State& s = *state_;
  require(!s.committed, Status::InvalidState, "the layout is committed");
  require(!s.flat, Status::InvalidState, "this engine already has flat storage (one per engine)");
  require(data != nullptr, Status::InvalidArgument, "flat storage pointer is NULL");
  require(count >= 1 && count <= (size_t(1) << 40), Status::InvalidArgument, "flat storage count must be >= 1");
  validate_storage(storage);
  const ParamDType dtype = ParamDType(storage.dtype);
  const size_t bytes = count * element_bytes(dtype);
  for (const Segment& seg : s.segments)
    require(!ranges_overlap(seg.data, seg.bytes(), data, bytes), Status::DuplicateTensor,
            "the adopted flat storage overlaps registered tensor '" + seg.name + "'");
  PlacementRollback rollback(s);
  note_placement(s, storage);
  s.backend->check_memory(data, bytes, "the adopted flat storage");
  rollback.dismiss();
  s.flat = data;
  s.flat_count = count;
  s.flat_dtype = dtype;
}

void Engine::set_device_allocator(const DeviceAllocator& allocator) {
  State& s = *state_;
  require(device_backend_built(), Status::Unsupported,
          "a device allocator needs a build with the cuda option (this libco2 was built without CUDA)");
  require(!s.committed && !(s.on_device() && s.flat), Status::InvalidState,
          "set the allocator before co2_engine_alloc_flat and co2_engine_commit: device memory was already allocated");
  require((allocator.allocate == nullptr) == (allocator.release == nullptr), Status::InvalidArgument,
          "co2_allocator_t needs both allocate and release (or neither, for cudaMalloc)");
  s.allocator = allocator;
}

void Engine::add_segment(const SegmentDesc& d) {
  State& s = *state_;
  require(!s.committed, Status::InvalidState, "the layout is committed");
  require(s.flat != nullptr, Status::InvalidState, "no flat storage: call co2_engine_alloc_flat or co2_engine_adopt_flat first");
  require(!d.name.empty(), Status::InvalidArgument, "segment name is empty");
  require(d.count >= 1, Status::InvalidArgument, "segment '" + d.name + "' has count 0");
  require(d.offset < s.flat_count && d.count <= s.flat_count - d.offset, Status::InvalidArgument,
          "segment '" + d.name + "' [" + std::to_string(d.offset) + ", +" + std::to_string(d.count) +
              ") lies outside the flat storage of " + std::to_string(s.flat_count) + " elements");
  const Role role = parse_role(d.role);
  const size_t element = element_bytes(s.flat_dtype);
  void* data = static_cast<char*>(s.flat) + d.offset * element;
  for (const Segment& seg : s.segments) {
    require(seg.name != d.name, Status::DuplicateTensor, "a segment named '" + d.name + "' already exists");
    require(!ranges_overlap(seg.data, seg.bytes(), data, d.count * element), Status::DuplicateTensor,
            "segment '" + d.name + "' overlaps '" + seg.name + "'");
  }
  s.segments.push_back(Segment{d.name, data, d.count, role, 0, s.flat_dtype});
}

void Engine::commit() {
  State& s = *state_;
  if (s.comm->joining())
    join_running_group(s);
  else
    commit_layout(s);
  s.formed = true;
}

void commit_layout(Engine::State& s) {
  require(!s.committed, Status::InvalidState, "the layout is already committed");
  check_comm(s);
  std::string why;
  device::choose_averaging(s.on_device() ? device::Placement::Device : device::Placement::Host,
                           s.comm->collective_stream() != nullptr, s.config.wire_format != WireFormat::F32, &why);
  require(why.empty(), Status::InvalidArgument, why);
  ByteHasher layout;
  size_t offset = 0;
  s.num_trained = 0;
  s.trained_count = 0;
  s.segment_starts.clear();
  for (Segment& seg : s.segments) {
    layout.update_string(seg.name);
    layout.update_u64(seg.count);
    layout.update_u64(uint64_t(seg.role));
    layout.update_u64(uint64_t(seg.dtype));
    if (seg.role == Role::Excluded) continue;
    seg.state_offset = offset;
    s.segment_starts.push_back(offset);
    offset += seg.count;
    if (seg.role == Role::Parameter) {
      ++s.num_trained;
      s.trained_count += seg.count;
    }
  }
  require(offset > 0, Status::InvalidState,
          "nothing to train: register at least one PARAMETER or BUFFER tensor before commit");
  s.state_count = offset;
  // Host and CUDA ranks in one group would each run their own path to the same collective
  // sequence and only find out at the first anchor check: the placement is part of the layout
  // (mixed in for CUDA only, so that host checkpoints of 1.0 keep their layout hash).
  if (s.on_device()) layout.update_u64(uint64_t(DeviceKind::Cuda));
  s.layout_hash = layout.digest();
  if (!same_on_every_rank(s, s.layout_hash, Purpose::LayoutHash))
    fail(Status::LayoutMismatch,
         "ranks registered different parameter layouts (names, counts, roles, dtypes, order, "
         "or host against CUDA tensors differ); every rank must register the same tensors in the "
         "same order, in the same kind of memory");

  s.eager_resolved = s.config.eager == Eager::On || s.config.eager == Eager::Auto;
  check_settings_agree(s);

  s.history.assign(s.segments.size(), GapHistory{});
  if (s.config.hierarchy == Hierarchy::Nodes) form_nodes(s);
  // As a ring all-reduce sends it (a collective-kind transport's own fp32 algorithm may differ;
  // its compressed one all-gathers every rank's encoding).
  collectives::Tuning tuning;
  tuning.chunk_bytes = s.comm->options().chunk_bytes;
  const bool gathered = s.comm->collective_stream() != nullptr && s.config.wire_format != WireFormat::F32;
  s.outer_wire_bytes =
      gathered ? collectives::gathered_allreduce_wire_bytes(s.comm->size(), s.state_count, s.config.wire_format,
                                                            wire_segments(s))
               : collectives::allreduce_wire_bytes(s.comm->rank(), s.comm->size(), s.state_count,
                                                   s.config.wire_format, tuning, wire_segments(s));
  require(!s.comm->elastic() || s.config.hierarchy != Hierarchy::Nodes, Status::Unsupported,
          "elastic membership (elastic_min_ranks > 0) is implemented for replicated outer state and for outer "
          "state sharded over all ranks, not for hierarchical co2 (CO2_HIERARCHY_NODES): use CO2_HIERARCHY_FLAT "
          "(with shard_outer_state = 1 to keep the memory saving), or elastic_min_ranks = 0");
  s.backend->commit();
  s.committed = true;
}

namespace {

bool step_now(Engine::State& s, void* stream) {
  require_committed(s);
  const Clock::time_point entered = Clock::now();
  if (s.trace) trace_caller_step(s, entered);
  s.advisor.caller_entered(entered);
  s.advisor.step_ended();
  const AdvisorExitGuard left{s.advisor};
  ++s.stats.steps;
  if (s.metrics) s.metrics->series().count_step(s.stats.steps);
  if (++s.steps_in_round < s.round_tau) {
    if (applies_on_arrival(s) && average_unapplied(s) && arrival_step_due(s)) {
      s.backend->set_caller_stream(stream);
      apply_on_arrival(s);
    }
    return false;
  }
  s.steps_in_round = 0;
  s.round_tau = s.config.tau;  // a tau change takes effect here
  ++s.stats.rounds;
  const TraceSpan boundary(s.trace.get(), "boundary", "round", s.stats.rounds);
  check_comm(s);
  s.backend->set_caller_stream(stream);
  count_finished_work(s, /*wait=*/false);
  const bool applied = boundary_of_algorithm(s);
  observe_round(s);  // on every rank, applied or not: the agreements stay paired
  begin_arrival_round(s);  // from the timings the ranks agreed on up to this boundary
  if (!applied) throw_nonfinite();
  return true;
}

void reduce_gradients_now(Engine::State& s, void* const* grads, size_t num_grads, void* stream) {
  require_committed(s);
  require(grads != nullptr, Status::InvalidArgument, "grads is NULL");
  require(num_grads == s.num_trained, Status::InvalidArgument,
          "num_grads is " + std::to_string(num_grads) + " but " + std::to_string(s.num_trained) +
              " PARAMETER tensors are registered");
  check_comm(s);
  const Clock::time_point entered = Clock::now();
  if (s.trace) trace_caller_step(s, entered);
  s.advisor.caller_entered(entered);
  const AdvisorExitGuard left{s.advisor};
  const TraceSpan call(s.trace.get(), "reduce-gradients");
  s.backend->set_caller_stream(stream);
  if (!s.backend->average_gradients(grads, num_grads))
    fail(Status::NonFinite,
         "the averaged gradient contains NaN or Inf; the gradients were left as they were: skip "
         "this optimizer step");
}

}  // namespace

void synchronize_ranks(Engine::State& s, bool finalizing) {
  require_committed(s);
  const RoundsSettled settled(s, finalizing);
  s.advisor.pause();
  check_comm(s);
  s.backend->wait_for_caller("synchronize");
  s.backend->set_caller_stream(nullptr);
  const bool mid_round = s.steps_in_round > 0;
  s.steps_in_round = 0;
  s.round_tau = s.config.tau;
  bool applied = true;
  switch (s.config.algorithm) {
    case Algorithm::Co2:
      // A boundary now, then wait for its average and apply it: nothing local is lost.
      if (mid_round) applied = co2_boundary(s);
      applied = apply_pending(s) && applied;
      break;
    case Algorithm::Diloco:
      if (mid_round) applied = diloco_boundary(s);
      else s.backend->set_parameters_to_anchor();
      break;
    case Algorithm::LocalSgd:
      applied = localsgd_boundary(s);
      break;
    case Algorithm::Sync:
      applied = sync_boundary(s);
      break;
  }
  count_finished_work(s, /*wait=*/true);
  if (!applied) throw_nonfinite();
  check_anchor(s);
}

namespace {

// Runs one training call; when a lost peer failed it and the group is elastic, re-forms the
// group over the survivors (runtime/engine/membership_change.cpp) and reports the change.
template <typename Body>
auto surviving(Engine::State& s, Body&& body) {
  try {
    return body();
  } catch (const Error& e) {
    if (!s.formed || !s.comm->can_reform()) throw;
    try {
      continue_with_survivors(s, e.what());
    } catch (const Error&) {
      throw;  // left out, too few ranks: said precisely where it was found
    } catch (const std::exception& reform) {
      fail(Status::PeerLost, std::string("the group lost a rank (") + e.what() +
                                 ") and could not re-form over the survivors: " + reform.what());
    }
    fail(Status::MembershipChanged,
         "the group lost a rank and re-formed without it: this is rank " + std::to_string(s.comm->rank()) + " of " +
             std::to_string(s.comm->size()) + " now, every rank's parameters and anchor are the agreed anchor, "
             "and the engine's step count is " + std::to_string(s.stats.steps) +
             " on every rank: re-shard the data and go on from there (docs/capi.md, \"Elastic membership\")");
  }
}

}  // namespace

bool Engine::step(void* stream) {
  State& s = *state_;
  return surviving(s, [&] {
    const bool boundary = step_now(s, stream);
    if (leave_agreed(s)) release_leaver(s);
    if (joiners_agreed(s)) {
      const int joined = admit_joiners(s);
      if (joined > 0)
        fail(Status::MembershipChanged,
           "the group admitted " + std::to_string(joined) +
               " joining process(es): this is rank " + std::to_string(s.comm->rank()) + " of " +
               std::to_string(s.comm->size()) + " now; the group synchronized (every rank's parameters are the "
               "anchor) and the engine's step count is " + std::to_string(s.stats.steps) +
               " on every rank: re-shard the data and go on from there (docs/capi.md, \"Elastic membership\")");
    }
    return boundary;
  });
}

void Engine::reduce_gradients(void* const* grads, size_t num_grads, void* stream) {
  surviving(*state_, [&] { reduce_gradients_now(*state_, grads, num_grads, stream); });
}

namespace {

// finalize and synchronize are collective: a rank that waits to be let go would run them alone.
void require_no_leave_pending(const Engine::State& s, const char* call) {
  require(!s.leave_requested || s.left, Status::InvalidState,
          std::string(call) + " while this rank waits to leave the group (co2_engine_leave): keep calling "
                              "co2_engine_step until it returns CO2_LEFT (the group synchronizes then)");
}

}  // namespace

void Engine::leave() {
  State& s = *state_;
  require_committed(s);
  require(s.comm->elastic(), Status::Unsupported,
          "co2_engine_leave needs an elastic group (co2_comm_config_t.elastic_min_ranks >= 1); without one, "
          "a rank that goes ends the group");
  require(s.comm->size() > 1, Status::InvalidState,
          "co2_engine_leave: this rank is the group's only one (call co2_engine_finalize instead)");
  if (!s.leave_requested) log::info("membership: rank " + std::to_string(s.comm->rank()) + " asked to leave the group");
  s.leave_requested = true;
}

void Engine::finalize() {
  require_no_leave_pending(*state_, "co2_engine_finalize");
  const TraceSpan call(state_->trace.get(), "finalize");
  // Applying only the pending average would drop every step since the last boundary (all of
  // them when fewer than tau steps ran): synchronize's last blocking average keeps them.
  surviving(*state_, [&] { synchronize_ranks(*state_, /*finalizing=*/true); });
}

void Engine::synchronize() {
  require_no_leave_pending(*state_, "co2_engine_synchronize");
  const TraceSpan call(state_->trace.get(), "synchronize");
  surviving(*state_, [&] { synchronize_ranks(*state_, /*finalizing=*/false); });
}

void Engine::consensus(ConsensusKind kind, float* out, size_t count) {
  State& s = *state_;
  require_committed(s);
  require(out != nullptr, Status::InvalidArgument, "output buffer is NULL");
  require(count == s.state_count, Status::InvalidArgument,
          "output count is " + std::to_string(count) + " but the consensus has " +
              std::to_string(s.state_count) + " elements (co2_engine_num_elements)");
  s.advisor.pause();
  s.backend->wait_for_caller("consensus");
  switch (kind) {
    case ConsensusKind::Anchor:
      require(s.has_anchor() || s.config.algorithm == Algorithm::Sync, Status::Unsupported,
              "localsgd keeps no anchor: use CO2_CONSENSUS_LOCAL_AVERAGE");
      return s.backend->consensus_into(out, count, /*parameters=*/!s.has_anchor(), /*average=*/false);
    case ConsensusKind::LocalAverage:
      check_comm(s);
      return s.backend->consensus_into(out, count, /*parameters=*/true, /*average=*/true);
  }
  fail(Status::UnknownEnum, "unknown consensus kind " + std::to_string(int(kind)));
}

size_t Engine::num_elements() const {
  require_committed(*state_);
  return state_->state_count;
}

void Engine::set_param(Param key, double value) {
  State& s = *state_;
  EngineConfig next = s.config;
  switch (key) {
    case Param::OuterLr:
      next.outer_lr = value;
      break;
    case Param::OuterMomentum:
      require(is_finite_in(value, 0.0, 0.999999), Status::InvalidArgument, "outer momentum must be in [0, 1)");
      next.outer_momentum = value;
      break;
    case Param::Tau:
      next.tau = as_count(value, "tau", 1);
      break;
    case Param::ClipThreshold:
      next.clip_threshold = value;
      break;
    case Param::PenaltyConstant:
      next.penalty_constant = value;
      break;
    case Param::InnerLr:
      next.inner_lr = value;
      break;
    case Param::AnchorCheckInterval:
      next.anchor_check_interval = as_count(value, "anchor check interval", 0);
      break;
    default:
      fail(Status::UnknownEnum, "unknown parameter key " + std::to_string(int(key)));
  }
  validate(next);
  s.config = next;
  if (key == Param::OuterMomentum) {
    s.beta_auto = false;
    s.beta = value;
    s.stats.resolved_outer_momentum = value;
    if (s.committed && s.momentum_needed()) s.backend->momentum_needed();  // starts from zero momentum
  }
}

double Engine::get_param(Param key) const {
  const State& s = *state_;
  switch (key) {
    case Param::OuterLr: return s.config.outer_lr;
    case Param::OuterMomentum: return s.beta;
    case Param::Tau: return s.config.tau;
    case Param::ClipThreshold: return s.config.clip_threshold;
    case Param::PenaltyConstant: return s.config.penalty_constant;
    case Param::InnerLr: return s.config.inner_lr;
    case Param::AnchorCheckInterval: return s.config.anchor_check_interval;
  }
  fail(Status::UnknownEnum, "unknown parameter key " + std::to_string(int(key)));
}

EngineStats Engine::stats() const {
  if (state_->committed) count_finished_work(*state_, /*wait=*/false);
  return observed_stats(*state_);
}

std::shared_ptr<Communicator> Engine::node_communicator_for_testing(bool inter) {
  return inter ? state_->inter : state_->intra;
}

void Engine::use_backend_for_testing(const std::function<std::unique_ptr<Backend>(State&)>& make) {
  require(state_->segments.empty() && !state_->flat, Status::InvalidState, "the backend is chosen before the layout");
  state_->backend = make(*state_);
}

}  // namespace co2

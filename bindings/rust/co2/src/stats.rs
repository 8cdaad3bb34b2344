//! `Stats`: an engine's counters and overlap timings (`co2_engine_get_stats`).

use co2_sys as sys;

/// See docs/capi.md, `co2_engine_get_stats`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Stats {
    pub world_size: i32,
    /// Calls to `step`.
    pub steps: u64,
    /// Boundaries.
    pub rounds: u64,
    /// Boundaries that applied an outer update.
    pub outer_updates: u64,
    pub bytes_reduced: u64,
    /// Sum over collectives of submit-to-completion time.
    pub collective_ns: u64,
    /// Time the training thread waited for collectives (near 0 when the overlap works).
    pub boundary_wait_ns: u64,
    pub last_boundary_wait_ns: u64,
    pub nonfinite_rounds: u64,
    pub nonfinite_local: u64,
    pub anchor_checks: u64,
    pub resolved_outer_momentum: f64,
    pub last_penalty_min: f64,
    pub last_penalty_max: f64,
    pub last_clip_scale_min: f64,
    pub last_clip_fraction: f64,
    /// The tau advisor: one training step (the caller's time between engine calls).
    pub step_time_ns: u64,
    /// One all-reduce, submit to completion.
    pub allreduce_time_ns: u64,
    /// Smallest tau with tau * step_time_ns >= allreduce_time_ns; 0 until measured.
    /// The ranks agree on it (and on the two times): the same on every rank.
    pub advised_tau: u32,
    /// Submit to completion of the last collective the training thread waited for.
    pub last_collective_ns: u64,
    /// Wall time between the last two boundaries.
    pub last_round_ns: u64,
    /// 1 - boundary_wait_ns / collective_ns, in [0, 1]: the share of collective time hidden.
    pub hidden_fraction: f64,
    /// 1 - last_boundary_wait_ns / last_collective_ns, in [0, 1].
    pub last_hidden_fraction: f64,
    /// This rank's own step time (the ranks combine these into step_time_ns).
    pub rank_step_time_ns: u64,
    /// This rank's own all-reduce time.
    pub rank_allreduce_time_ns: u64,
    /// Compressed outer all-reduce: bytes this rank sent for the last outer all-reduce ...
    pub wire_bytes_last_round: u64,
    /// ... and for all of them (`bytes_reduced` is the fp32 payload).
    pub wire_bytes_total: u64,
    /// Bytes of outer state (anchor, momentum or their shards, buffers) this rank holds.
    pub outer_state_bytes: u64,
    /// co2 averages applied between boundaries (`EngineConfig::apply_step`).
    pub arrival_updates: u64,
    /// The step of its round at which the last co2 average was applied; 0: at a boundary.
    pub last_apply_step: u32,
}

impl From<&sys::co2_engine_stats_t> for Stats {
    fn from(s: &sys::co2_engine_stats_t) -> Stats {
        Stats {
            world_size: s.world_size,
            steps: s.steps,
            rounds: s.rounds,
            outer_updates: s.outer_updates,
            bytes_reduced: s.bytes_reduced,
            collective_ns: s.collective_ns,
            boundary_wait_ns: s.boundary_wait_ns,
            last_boundary_wait_ns: s.last_boundary_wait_ns,
            nonfinite_rounds: s.nonfinite_rounds,
            nonfinite_local: s.nonfinite_local,
            anchor_checks: s.anchor_checks,
            resolved_outer_momentum: s.resolved_outer_momentum,
            last_penalty_min: s.last_penalty_min,
            last_penalty_max: s.last_penalty_max,
            last_clip_scale_min: s.last_clip_scale_min,
            last_clip_fraction: s.last_clip_fraction,
            step_time_ns: s.step_time_ns,
            allreduce_time_ns: s.allreduce_time_ns,
            advised_tau: s.advised_tau,
            last_collective_ns: s.last_collective_ns,
            last_round_ns: s.last_round_ns,
            hidden_fraction: s.hidden_fraction,
            last_hidden_fraction: s.last_hidden_fraction,
            rank_step_time_ns: s.rank_step_time_ns,
            rank_allreduce_time_ns: s.rank_allreduce_time_ns,
            wire_bytes_last_round: s.wire_bytes_last_round,
            wire_bytes_total: s.wire_bytes_total,
            outer_state_bytes: s.outer_state_bytes,
            arrival_updates: s.arrival_updates,
            last_apply_step: s.last_apply_step,
        }
    }
}

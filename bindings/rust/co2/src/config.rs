//! `EngineConfig`: the engine's configuration, starting from the C defaults.

use co2_sys as sys;

use crate::enums::{Algorithm, ApplyStep, Clip, Penalty, WireFormat};

/// Engine configuration. Starts from `co2_engine_config_init`: algorithm `Co2`, τ = 12, no
/// warm-up, α = 1.0, β automatic (by world size), no Nesterov, no penalty (constant 1.0), no
/// clipping (φ = 1.0), anchor check every 100 rounds, inner lr 0. Values are checked by the
/// library when the engine is created.
#[derive(Clone, Copy, Debug)]
pub struct EngineConfig {
    raw: sys::co2_engine_config_t,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig::new()
    }
}

impl EngineConfig {
    pub fn new() -> EngineConfig {
        // SAFETY: zeroed memory is a valid place for the init function to write into.
        let mut raw: sys::co2_engine_config_t = unsafe { std::mem::zeroed() };
        // SAFETY: valid and writable; only fails on NULL.
        let status = unsafe { sys::co2_engine_config_init(&mut raw) };
        debug_assert_eq!(status, sys::CO2_OK as i32);
        EngineConfig { raw }
    }

    pub fn algorithm(mut self, algorithm: Algorithm) -> Self {
        self.raw.algorithm = algorithm.raw();
        self
    }
    /// Local steps per round, >= 1.
    pub fn tau(mut self, tau: u32) -> Self {
        self.raw.tau = tau;
        self
    }
    /// Boundaries run as diloco before co2 starts.
    pub fn warmup_sync_rounds(mut self, rounds: u32) -> Self {
        self.raw.warmup_sync_rounds = rounds;
        self
    }
    /// α, >= 0.
    pub fn outer_lr(mut self, alpha: f64) -> Self {
        self.raw.outer_lr = alpha;
        self
    }
    /// β in [0, 1); `None` resolves it from the number of outer participants.
    pub fn outer_momentum(mut self, beta: Option<f64>) -> Self {
        self.raw.outer_momentum = beta.unwrap_or(sys::CO2_OUTER_MOMENTUM_AUTO);
        self
    }
    pub fn nesterov(mut self, nesterov: bool) -> Self {
        self.raw.nesterov = i32::from(nesterov);
        self
    }
    /// co2 only: the eager outer policy (each rank starts its round from the anchor plus its
    /// own fresh delta's share; docs/algorithm.md); `None` = automatic (the default: eager on
    /// host tensors, delayed on CUDA tensors).
    pub fn eager(mut self, eager: Option<bool>) -> Self {
        self.raw.eager = eager.map_or(sys::CO2_EAGER_AUTO, i32::from);
        self
    }
    /// How the outer all-reduce travels (co2 and diloco; default `WireFormat::Fp32`).
    pub fn wire_format(mut self, wire: WireFormat) -> Self {
        self.raw.wire_format = wire.raw();
        self
    }
    /// With a compressed wire format: each rank adds what its encodings dropped to its next
    /// delta (default true).
    pub fn error_feedback(mut self, on: bool) -> Self {
        self.raw.error_feedback = i32::from(on);
        self
    }
    /// Each rank keeps only its shard of the anchor and outer momentum (reduce-scatter, shard
    /// update, all-gather; default false). The engine refuses combinations sharding does not
    /// implement yet (docs/capi.md, "Sharded outer state").
    pub fn shard_outer_state(mut self, on: bool) -> Self {
        self.raw.shard_outer_state = i32::from(on);
        self
    }
    /// Hierarchical co2 (`true`: sync inside a node, co2 across nodes, outer state sharded over
    /// a node's ranks; the nodes of co2_comm_split_nodes). Default false (flat).
    pub fn hierarchical(mut self, on: bool) -> Self {
        self.raw.hierarchy = if on { sys::CO2_HIERARCHY_NODES as i32 } else { sys::CO2_HIERARCHY_FLAT as i32 };
        self
    }
    /// co2 only: when a round's average is applied (default `ApplyStep::AtBoundary`); each
    /// rank keeps its progress since the boundary on top of the new anchor.
    pub fn apply_step(mut self, when: ApplyStep) -> Self {
        self.raw.apply_step = when.raw();
        self
    }
    pub fn penalty(mut self, penalty: Penalty) -> Self {
        self.raw.penalty = penalty.raw();
        self
    }
    /// c of the constant penalty (Λ = 1/c), > 0.
    pub fn penalty_constant(mut self, c: f64) -> Self {
        self.raw.penalty_constant = c;
        self
    }
    pub fn clip(mut self, clip: Clip) -> Self {
        self.raw.clip = clip.raw();
        self
    }
    /// φ, > 0.
    pub fn clip_threshold(mut self, phi: f64) -> Self {
        self.raw.clip_threshold = phi;
        self
    }
    /// Rounds between anchor checksum comparisons, 0 = off.
    pub fn anchor_check_interval(mut self, rounds: u32) -> Self {
        self.raw.anchor_check_interval = rounds;
        self
    }
    /// Recorded for penalty policies that need it, >= 0.
    pub fn inner_lr(mut self, lr: f64) -> Self {
        self.raw.inner_lr = lr;
        self
    }

    pub fn get_algorithm(&self) -> Option<Algorithm> {
        Algorithm::from_raw(self.raw.algorithm)
    }
    pub fn get_tau(&self) -> u32 {
        self.raw.tau
    }
    pub fn get_warmup_sync_rounds(&self) -> u32 {
        self.raw.warmup_sync_rounds
    }
    pub fn get_outer_lr(&self) -> f64 {
        self.raw.outer_lr
    }
    /// `None` = automatic.
    pub fn get_outer_momentum(&self) -> Option<f64> {
        if self.raw.outer_momentum == sys::CO2_OUTER_MOMENTUM_AUTO {
            None
        } else {
            Some(self.raw.outer_momentum)
        }
    }
    pub fn get_nesterov(&self) -> bool {
        self.raw.nesterov != 0
    }
    /// `None` = automatic.
    pub fn get_eager(&self) -> Option<bool> {
        if self.raw.eager == sys::CO2_EAGER_AUTO {
            None
        } else {
            Some(self.raw.eager != 0)
        }
    }
    pub fn get_wire_format(&self) -> Option<WireFormat> {
        WireFormat::from_raw(self.raw.wire_format)
    }
    pub fn get_error_feedback(&self) -> bool {
        self.raw.error_feedback != 0
    }
    pub fn get_shard_outer_state(&self) -> bool {
        self.raw.shard_outer_state != 0
    }
    pub fn get_apply_step(&self) -> Option<ApplyStep> {
        ApplyStep::from_raw(self.raw.apply_step)
    }
    pub fn get_penalty(&self) -> Option<Penalty> {
        Penalty::from_raw(self.raw.penalty)
    }
    pub fn get_penalty_constant(&self) -> f64 {
        self.raw.penalty_constant
    }
    pub fn get_clip(&self) -> Option<Clip> {
        Clip::from_raw(self.raw.clip)
    }
    pub fn get_clip_threshold(&self) -> f64 {
        self.raw.clip_threshold
    }
    pub fn get_anchor_check_interval(&self) -> u32 {
        self.raw.anchor_check_interval
    }
    pub fn get_inner_lr(&self) -> f64 {
        self.raw.inner_lr
    }

    /// The C struct, for `co2_sys` calls.
    pub fn as_raw(&self) -> &sys::co2_engine_config_t {
        &self.raw
    }
}

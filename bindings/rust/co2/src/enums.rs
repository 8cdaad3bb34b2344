//! The C enumerations as Rust enums (their C values are pinned by the ABI).

use co2_sys as sys;

macro_rules! c_enum {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident = $value:path),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vmeta])* $variant),+
        }

        impl $name {
            /// The C value.
            pub fn raw(self) -> i32 {
                match self {
                    $($name::$variant => $value as i32),+
                }
            }

            /// The variant for a C value, if this crate knows it.
            pub fn from_raw(value: i32) -> Option<$name> {
                $(if value == $value as i32 { return Some($name::$variant); })+
                None
            }
        }
    };
}

c_enum! {
    /// How ranks talk to each other.
    Transport {
        /// `Local` within one process; across processes whatever the build and the launcher offer.
        Auto = sys::CO2_TRANSPORT_AUTO,
        /// Ranks are threads of one process; groups are keyed by the group name.
        Local = sys::CO2_TRANSPORT_LOCAL,
        Ucx = sys::CO2_TRANSPORT_UCX,
        Nccl = sys::CO2_TRANSPORT_NCCL,
    }
}

c_enum! {
    /// The training algorithm an engine runs.
    Algorithm {
        /// τ local steps, then an asynchronous, one-round-stale outer update.
        Co2 = sys::CO2_ALGO_CO2,
        /// Gradients averaged every step (DDP), through `Engine::reduce_gradients`.
        Sync = sys::CO2_ALGO_SYNC,
        /// Parameters averaged every τ steps.
        LocalSgd = sys::CO2_ALGO_LOCALSGD,
        /// Blocking outer update with a fresh average (SlowMo / DiLoCo).
        Diloco = sys::CO2_ALGO_DILOCO,
    }
}

c_enum! {
    /// How the outer all-reduce of co2 and diloco travels (accumulated in fp32 either way).
    WireFormat {
        Fp32 = sys::CO2_WIRE_FP32,
        /// 2 bytes per value, rounded to nearest even.
        Bf16 = sys::CO2_WIRE_BF16,
        /// 1 byte per value plus one fp32 scale per group of at most 128 values of one tensor.
        Int8 = sys::CO2_WIRE_INT8,
        /// 4 bits per value (FP4 E2M1) plus one fp32 scale per group of at most 64 values of
        /// one tensor; use it with error feedback.
        Fp4 = sys::CO2_WIRE_FP4,
    }
}

c_enum! {
    /// Staleness gap penalty Λ.
    Penalty {
        None = sys::CO2_PENALTY_NONE,
        Constant = sys::CO2_PENALTY_CONSTANT,
        Gap = sys::CO2_PENALTY_GAP,
    }
}

c_enum! {
    /// Outer momentum clipping.
    Clip {
        None = sys::CO2_CLIP_NONE,
        Value = sys::CO2_CLIP_VALUE,
        Norm = sys::CO2_CLIP_NORM,
    }
}

c_enum! {
    /// What the engine does with a tensor or segment.
    Role {
        /// Trained: takes part in the outer update.
        Parameter = sys::CO2_ROLE_PARAMETER,
        /// Averaged, not trained (BatchNorm statistics).
        Buffer = sys::CO2_ROLE_BUFFER,
        /// Part of the layout, never touched.
        Excluded = sys::CO2_ROLE_EXCLUDED,
    }
}

c_enum! {
    /// Reduction of a raw all-reduce.
    ReduceOp {
        Sum = sys::CO2_REDUCE_SUM,
        Avg = sys::CO2_REDUCE_AVG,
        Min = sys::CO2_REDUCE_MIN,
        Max = sys::CO2_REDUCE_MAX,
    }
}

c_enum! {
    /// Which consensus model `Engine::consensus` writes.
    Consensus {
        /// The current anchor (no communication).
        Anchor = sys::CO2_CONSENSUS_ANCHOR,
        /// The average of the ranks' current parameters (collective).
        LocalAverage = sys::CO2_CONSENSUS_LOCAL_AVERAGE,
    }
}

c_enum! {
    /// Hyper-parameters that may change during training (`Engine::set_param`).
    Param {
        OuterLr = sys::CO2_PARAM_OUTER_LR,
        OuterMomentum = sys::CO2_PARAM_OUTER_MOMENTUM,
        Tau = sys::CO2_PARAM_TAU,
        ClipThreshold = sys::CO2_PARAM_CLIP_THRESHOLD,
        PenaltyConstant = sys::CO2_PARAM_PENALTY_CONSTANT,
        InnerLr = sys::CO2_PARAM_INNER_LR,
        AnchorCheckInterval = sys::CO2_PARAM_ANCHOR_CHECK_INTERVAL,
    }
}

/// When co2 applies a round's average (`co2_engine_config_t.apply_step`; docs/algorithm.md,
/// "Applying the average on arrival"). Other than `AtBoundary`: co2 only; sharded outer state on
/// CUDA tensors refuses it at commit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ApplyStep {
    /// At the next boundary (the default; co2 1.1's behaviour).
    AtBoundary,
    /// One step after the step in which it is due to arrive, by the ranks' agreed step and
    /// all-reduce times (the same step on every rank; at the boundary until both are measured).
    OnArrival,
    /// At the k-th step after the boundary (k >= 1), waiting there for it if it has not
    /// arrived; k >= τ: at the boundary. `Step(0)` is `AtBoundary`.
    Step(u32),
}

impl ApplyStep {
    /// The C value. A step beyond `i32::MAX` becomes a value the library refuses at create
    /// (`Status::InvalidArgument`) rather than one that wraps into another policy.
    pub fn raw(self) -> i32 {
        match self {
            ApplyStep::AtBoundary => sys::CO2_APPLY_AT_BOUNDARY as i32,
            ApplyStep::OnArrival => sys::CO2_APPLY_ON_ARRIVAL,
            ApplyStep::Step(k) => i32::try_from(k).unwrap_or(i32::MIN),
        }
    }

    /// The policy of a C value, if it is one (values below -1 are not).
    pub fn from_raw(value: i32) -> Option<ApplyStep> {
        match value {
            v if v == sys::CO2_APPLY_AT_BOUNDARY as i32 => Some(ApplyStep::AtBoundary),
            sys::CO2_APPLY_ON_ARRIVAL => Some(ApplyStep::OnArrival),
            k if k >= 1 => Some(ApplyStep::Step(k as u32)),
            _ => None,
        }
    }
}

/// Element types of raw collectives. Sealed: implemented for f32, f64, i32, i64 only.
pub trait Element: Copy + Send + private::Sealed + 'static {
    /// The `co2_dtype_t` value.
    const DTYPE: i32;
}

mod private {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for f64 {}
    impl Sealed for i32 {}
    impl Sealed for i64 {}
}

impl Element for f32 {
    const DTYPE: i32 = sys::CO2_DTYPE_FP32 as i32;
}
impl Element for f64 {
    const DTYPE: i32 = sys::CO2_DTYPE_FP64 as i32;
}
impl Element for i32 {
    const DTYPE: i32 = sys::CO2_DTYPE_INT32 as i32;
}
impl Element for i64 {
    const DTYPE: i32 = sys::CO2_DTYPE_INT64 as i32;
}

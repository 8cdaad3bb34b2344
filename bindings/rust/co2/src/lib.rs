//! Safe Rust interface to libco2 (`co2.h`): communication-efficient data-parallel training.
//!
//! - [`Communicator`] (a group of ranks) and [`Engine`] (one rank's CO2 engine) own their C
//!   handles and destroy them on drop; asynchronous raw collectives return a [`Request`] that
//!   owns its buffer until it completes.
//! - Configurations are builders starting from the C defaults ([`CommConfig`], [`EngineConfig`]).
//! - Every call returns `Result<T, co2::Error>`; the error carries the [`Status`] and the
//!   library's message.
//! - Tensors are `&mut [f32]` slices, borrowed by the engine for its life and reached through
//!   it between calls.
//!
//! ```no_run
//! use co2::{CommConfig, Communicator, Engine, EngineConfig, Role, Transport};
//! # fn main() -> co2::Result<()> {
//! let comm = Communicator::new(&CommConfig::new().transport(Transport::Local).group_name("demo"))?;
//! let mut weights = vec![0.0f32; 16];
//! let mut engine = Engine::new(&comm, &EngineConfig::new().tau(4))?;
//! let w = engine.register_tensor("w", &mut weights, Role::Parameter)?;
//! engine.commit()?;
//! for _ in 0..8 {
//!     for x in engine.tensor_mut(w).iter_mut() { *x -= 0.1 * *x; }  // the inner optimizer
//!     engine.step()?;
//! }
//! engine.finalize()?;
//! # Ok(()) }
//! ```

mod comm;
mod config;
mod engine;
mod enums;
mod error;
mod request;
mod stats;

pub use co2_sys as sys;

pub use comm::{AbortHandle, CommConfig, Communicator, UniqueId};
pub use config::EngineConfig;
pub use engine::{Engine, SegmentId, TensorId};
pub use enums::{
    Algorithm, ApplyStep, Clip, Consensus, Element, Param, Penalty, ReduceOp, Role, Transport, WireFormat,
};
pub use error::{Error, Result, Status};
pub use request::Request;
pub use stats::Stats;

/// The library's version (major, minor, patch).
pub fn version() -> Result<(i32, i32, i32)> {
    let (mut major, mut minor, mut patch) = (0, 0, 0);
    // SAFETY: valid outputs.
    error::check(unsafe { sys::co2_get_version(&mut major, &mut minor, &mut patch) })?;
    Ok((major, minor, patch))
}

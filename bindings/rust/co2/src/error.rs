//! `co2::Error`: a failed status with the library's message.

use std::ffi::CStr;
use std::fmt;

use co2_sys as sys;

/// The status of a failed call. Values are the C `co2_status_t` codes, pinned by the ABI.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Status {
    InvalidArgument,
    InvalidState,
    Unsupported,
    InvalidConfig,
    UnknownEnum,
    DuplicateTensor,
    OutOfMemory,
    NonFinite,
    LayoutMismatch,
    AnchorMismatch,
    CheckpointCorrupt,
    CheckpointMismatch,
    Callback,
    Timeout,
    /// Not a failure of the group: an elastic communicator
    /// ([`CommConfig::elastic_min_ranks`](crate::CommConfig::elastic_min_ranks) >= 1) lost a rank
    /// and re-formed without it. The call did not complete; the engine goes on in the new group
    /// from the agreed outer state (every survivor's parameters are the agreed anchor). Re-read
    /// [`Communicator::rank`](crate::Communicator::rank) / [`size`](crate::Communicator::size),
    /// re-shard the data if it is sharded by rank, and keep training (call `step` again; a
    /// `finalize` that returned it did not finalize). docs/capi.md, "Elastic membership".
    MembershipChanged,
    /// Not a failure: this rank left its elastic group as it asked ([`Engine::leave`](crate::Engine::leave)).
    /// Its parameters are the group's anchor after its last round; the engine takes no more
    /// steps. Drop the engine and the communicator. docs/capi.md, "Leaving".
    Left,
    PeerLost,
    PeerTimeout,
    CollectiveMismatch,
    Aborted,
    Transport,
    Rendezvous,
    Internal,
    /// A code this version of the crate does not know (a newer library).
    Other(i32),
}

const CODES: [(Status, u32); 23] = [
    (Status::InvalidArgument, sys::CO2_ERR_INVALID_ARGUMENT),
    (Status::InvalidState, sys::CO2_ERR_INVALID_STATE),
    (Status::Unsupported, sys::CO2_ERR_UNSUPPORTED),
    (Status::InvalidConfig, sys::CO2_ERR_INVALID_CONFIG),
    (Status::UnknownEnum, sys::CO2_ERR_UNKNOWN_ENUM),
    (Status::DuplicateTensor, sys::CO2_ERR_DUPLICATE_TENSOR),
    (Status::OutOfMemory, sys::CO2_ERR_OUT_OF_MEMORY),
    (Status::NonFinite, sys::CO2_ERR_NONFINITE),
    (Status::LayoutMismatch, sys::CO2_ERR_LAYOUT_MISMATCH),
    (Status::AnchorMismatch, sys::CO2_ERR_ANCHOR_MISMATCH),
    (Status::CheckpointCorrupt, sys::CO2_ERR_CHECKPOINT_CORRUPT),
    (Status::CheckpointMismatch, sys::CO2_ERR_CHECKPOINT_MISMATCH),
    (Status::Callback, sys::CO2_ERR_CALLBACK),
    (Status::Timeout, sys::CO2_ERR_TIMEOUT),
    (Status::MembershipChanged, sys::CO2_MEMBERSHIP_CHANGED),
    (Status::Left, sys::CO2_LEFT),
    (Status::PeerLost, sys::CO2_ERR_PEER_LOST),
    (Status::PeerTimeout, sys::CO2_ERR_PEER_TIMEOUT),
    (Status::CollectiveMismatch, sys::CO2_ERR_COLLECTIVE_MISMATCH),
    (Status::Aborted, sys::CO2_ERR_ABORTED),
    (Status::Transport, sys::CO2_ERR_TRANSPORT),
    (Status::Rendezvous, sys::CO2_ERR_RENDEZVOUS),
    (Status::Internal, sys::CO2_ERR_INTERNAL),
];

impl Status {
    /// The status for a nonzero C code.
    pub fn from_code(code: i32) -> Status {
        CODES.iter().find(|(_, c)| *c as i32 == code).map(|(s, _)| *s).unwrap_or(Status::Other(code))
    }

    /// The C `co2_status_t` value.
    pub fn code(self) -> i32 {
        match self {
            Status::Other(code) => code,
            known => CODES.iter().find(|(s, _)| *s == known).map(|(_, c)| *c as i32).unwrap_or(-1),
        }
    }

    /// Peer and transport failures (100-199): the communicator is unusable; drop it and its
    /// engines.
    pub fn is_communicator_failure(self) -> bool {
        (100..200).contains(&self.code())
    }

    /// The library's static description of the status and what to do about it.
    pub fn description(self) -> &'static str {
        // SAFETY: co2_status_string never returns NULL and its strings are static.
        unsafe { CStr::from_ptr(sys::co2_status_string(self.code())) }
            .to_str()
            .unwrap_or("(non-UTF-8 status text)")
    }
}

/// A failed co2 call: the status and the library's thread-local message, read at the failure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    status: Status,
    message: String,
}

impl Error {
    /// An error raised by this crate itself (a check the C API cannot make on raw pointers).
    pub(crate) fn new(status: Status, message: impl Into<String>) -> Error {
        Error { status, message: message.into() }
    }

    pub fn status(&self) -> Status {
        self.status
    }

    /// What `co2_last_error_message` said (or this crate's own check).
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (status {}): {}", self.status.description(), self.status.code(), self.message)
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

/// Turns a C status into a `Result`, reading the thread-local message before any other co2 call
/// on this thread can overwrite it.
pub(crate) fn check(code: sys::co2_status_t) -> Result<()> {
    if code == sys::CO2_OK as i32 {
        return Ok(());
    }
    // SAFETY: never NULL; valid until the next co2 call on this thread, and copied at once.
    let message = unsafe { CStr::from_ptr(sys::co2_last_error_message()) }.to_string_lossy().into_owned();
    Err(Error { status: Status::from_code(code), message })
}

//! `Engine`: one rank's CO2 (or baseline) engine over the parameters it was given.

use std::ffi::CString;
use std::io::{Read, Write};
use std::marker::PhantomData;
use std::os::raw::{c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::{self, NonNull};

use co2_sys as sys;

use crate::comm::Communicator;
use crate::config::EngineConfig;
use crate::enums::{Consensus, Param, Role};
use crate::error::{check, Error, Result, Status};
use crate::stats::Stats;

/// A registered tensor, in registration order (`Engine::register_tensor`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TensorId(usize);

/// A declared segment of the flat storage (`Engine::add_segment`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SegmentId(usize);

/// Memory the engine reads and writes during calls on it: a registered tensor, or the flat
/// storage (owned by the engine or adopted from the caller).
#[derive(Clone, Copy)]
struct Span {
    data: NonNull<f32>,
    len: usize,
}

#[derive(Clone, Copy)]
struct LayoutEntry {
    role: Role,
    count: usize,
}

/// One rank's engine. Parameters reach it in one of two ways, and are read and written by the
/// caller through the engine afterwards (the engine holds the only mutable borrow):
///
/// - `register_tensor(name, &'a mut [f32], role)`: the caller's memory, borrowed for the
///   engine's life; `tensor_mut(id)` gives it back between calls;
/// - `alloc_flat(count)` (runtime-owned) or `adopt_flat(&'a mut [f32])`, then `add_segment`;
///   `flat_mut()` / `segment_mut(id)`.
///
/// Dropping the engine calls `co2_engine_destroy`, which waits for an all-reduce in flight.
pub struct Engine<'a> {
    raw: NonNull<sys::co2_engine>,
    tensors: Vec<Span>,
    flat: Option<Span>,
    segments: Vec<(usize, usize)>,
    layout: Vec<LayoutEntry>,
    _borrows: PhantomData<&'a mut [f32]>,
}

// SAFETY: an engine is driven from one thread at a time, not necessarily the one that created
// it (docs/capi.md, Threading), so it may move between threads. The spans point to memory the
// engine borrows mutably (or owns), which moves along with it. Not Sync: two threads calling
// into one engine at once is exactly what the C API forbids, and the `&self` getters
// (stats, get_param, num_elements) would race with a `&mut self` call on another thread.
unsafe impl Send for Engine<'_> {}

impl<'a> Engine<'a> {
    /// Creates an engine on `comm` (which the engine keeps alive, C side). Not collective.
    pub fn new(comm: &Communicator, config: &EngineConfig) -> Result<Engine<'a>> {
        let mut raw: sys::co2_engine_t = ptr::null_mut();
        // SAFETY: valid handle, config and output.
        check(unsafe { sys::co2_engine_create(comm.as_raw(), config.as_raw(), &mut raw) })?;
        Ok(Engine {
            raw: NonNull::new(raw).expect("co2_engine_create returned OK and a NULL handle"),
            tensors: Vec::new(),
            flat: None,
            segments: Vec::new(),
            layout: Vec::new(),
            _borrows: PhantomData,
        })
    }

    /// The raw handle, for calls this crate does not wrap. It stays owned by `self`.
    pub fn as_raw(&self) -> sys::co2_engine_t {
        self.raw.as_ptr()
    }

    // ---------------------------------------------------------------------------------------
    // Layout (before commit)
    // ---------------------------------------------------------------------------------------

    /// Registers the caller's fp32 host tensor. The engine borrows it for its whole life; use
    /// `tensor` / `tensor_mut` to read and update it between calls.
    pub fn register_tensor(&mut self, name: &str, data: &'a mut [f32], role: Role) -> Result<TensorId> {
        let name = c_name(name)?;
        let mut tensor = sys::co2_tensor_t::init();
        tensor.name = name.as_ptr();
        tensor.data = data.as_mut_ptr().cast();
        tensor.count = data.len();
        tensor.role = role.raw();
        // SAFETY: the name is copied by the library; `data` stays valid and exclusively ours for
        // 'a, which outlives the engine.
        check(unsafe { sys::co2_engine_register_tensor(self.as_raw(), &tensor) })?;
        let span = Span { data: NonNull::from(data).cast(), len: tensor.count };
        self.tensors.push(span);
        self.layout.push(LayoutEntry { role, count: tensor.count });
        Ok(TensorId(self.tensors.len() - 1))
    }

    /// Runtime-owned flat storage of `count` zero-initialised fp32 elements on the host.
    pub fn alloc_flat(&mut self, count: usize) -> Result<()> {
        let mut data: *mut c_void = ptr::null_mut();
        // SAFETY: valid handle and output.
        check(unsafe {
            sys::co2_engine_alloc_flat(
                self.as_raw(),
                count,
                sys::CO2_DTYPE_FP32 as i32,
                sys::CO2_DEVICE_HOST as i32,
                0,
                &mut data,
            )
        })?;
        let data = NonNull::new(data.cast::<f32>()).expect("alloc_flat returned OK and NULL");
        self.flat = Some(Span { data, len: count });
        Ok(())
    }

    /// Adopts the caller's memory as the flat storage, borrowed for the engine's life.
    pub fn adopt_flat(&mut self, data: &'a mut [f32]) -> Result<()> {
        let len = data.len();
        // SAFETY: `data` stays valid and exclusively ours for 'a.
        check(unsafe {
            sys::co2_engine_adopt_flat(
                self.as_raw(),
                data.as_mut_ptr().cast(),
                len,
                sys::CO2_DTYPE_FP32 as i32,
                sys::CO2_DEVICE_HOST as i32,
                0,
            )
        })?;
        self.flat = Some(Span { data: NonNull::from(data).cast(), len });
        Ok(())
    }

    /// Declares `[offset, offset + count)` of the flat storage as a named segment.
    pub fn add_segment(&mut self, name: &str, offset: usize, count: usize, role: Role) -> Result<SegmentId> {
        let name = c_name(name)?;
        let mut segment = sys::co2_segment_t::init();
        segment.name = name.as_ptr();
        segment.offset = offset;
        segment.count = count;
        segment.role = role.raw();
        // SAFETY: valid pointers for the call; the library checks the range against the storage.
        check(unsafe { sys::co2_engine_add_segment(self.as_raw(), &segment) })?;
        self.segments.push((offset, count));
        self.layout.push(LayoutEntry { role, count });
        Ok(SegmentId(self.segments.len() - 1))
    }

    /// Collective: freezes the layout, checks that it and every engine setting that changes the
    /// math are the same on every rank (`LayoutMismatch`, naming the first difference), copies
    /// rank 0's values into every rank's parameters and anchor.
    pub fn commit(&mut self) -> Result<()> {
        // SAFETY: valid handle; writes only memory the engine borrows.
        check(unsafe { sys::co2_engine_commit(self.as_raw()) })
    }

    // ---------------------------------------------------------------------------------------
    // Access to the parameters between calls
    // ---------------------------------------------------------------------------------------

    pub fn tensor(&self, id: TensorId) -> &[f32] {
        let span = self.tensors[id.0];
        // SAFETY: borrowed for 'a (outlives self); no engine call runs while `&self` is held.
        unsafe { std::slice::from_raw_parts(span.data.as_ptr(), span.len) }
    }

    pub fn tensor_mut(&mut self, id: TensorId) -> &mut [f32] {
        let span = self.tensors[id.0];
        // SAFETY: as `tensor`, and `&mut self` makes the slice unique.
        unsafe { std::slice::from_raw_parts_mut(span.data.as_ptr(), span.len) }
    }

    /// The whole flat storage, if there is one.
    pub fn flat(&self) -> Option<&[f32]> {
        // SAFETY: owned by the engine or borrowed for 'a.
        self.flat.map(|s| unsafe { std::slice::from_raw_parts(s.data.as_ptr(), s.len) })
    }

    pub fn flat_mut(&mut self) -> Option<&mut [f32]> {
        // SAFETY: as `flat`, unique through `&mut self`.
        self.flat.map(|s| unsafe { std::slice::from_raw_parts_mut(s.data.as_ptr(), s.len) })
    }

    pub fn segment(&self, id: SegmentId) -> &[f32] {
        let (offset, count) = self.segments[id.0];
        &self.flat().expect("segments exist only with flat storage")[offset..offset + count]
    }

    pub fn segment_mut(&mut self, id: SegmentId) -> &mut [f32] {
        let (offset, count) = self.segments[id.0];
        &mut self.flat_mut().expect("segments exist only with flat storage")[offset..offset + count]
    }

    // ---------------------------------------------------------------------------------------
    // Training
    // ---------------------------------------------------------------------------------------

    /// Call after every inner optimizer step; `Ok(true)` when this call was a round boundary
    /// (collective at boundaries).
    pub fn step(&mut self) -> Result<bool> {
        let mut boundary: c_int = 0;
        // SAFETY: valid handle and output.
        check(unsafe { sys::co2_engine_step(self.as_raw(), ptr::null_mut(), &mut boundary) })?;
        Ok(boundary != 0)
    }

    /// Collective, blocking: averages gradients in place across ranks. `grads[i]` is the
    /// gradient of the i-th `Role::Parameter` tensor or segment in registration order and must
    /// have its length (checked here: the C API trusts the count).
    pub fn reduce_gradients(&mut self, grads: &mut [&mut [f32]]) -> Result<()> {
        let expected: Vec<usize> =
            self.layout.iter().filter(|e| e.role == Role::Parameter).map(|e| e.count).collect();
        if grads.len() != expected.len() {
            return Err(Error::new(
                Status::InvalidArgument,
                format!("reduce_gradients: {} gradients for {} trained tensors", grads.len(), expected.len()),
            ));
        }
        for (i, (grad, count)) in grads.iter().zip(&expected).enumerate() {
            if grad.len() != *count {
                return Err(Error::new(
                    Status::InvalidArgument,
                    format!("reduce_gradients: gradient {i} has {} elements, its tensor {count}", grad.len()),
                ));
            }
        }
        let mut pointers: Vec<*mut c_void> = grads.iter_mut().map(|g| g.as_mut_ptr().cast()).collect();
        // SAFETY: each pointer covers exactly its tensor's count (checked above) and is borrowed
        // mutably for the (blocking) call.
        check(unsafe {
            sys::co2_engine_reduce_gradients(
                self.as_raw(),
                pointers.as_mut_ptr(),
                pointers.len(),
                ptr::null_mut(),
            )
        })
    }

    /// Collective: finishes and applies what is in flight; every rank ends with the same model.
    pub fn synchronize(&mut self) -> Result<()> {
        // SAFETY: valid handle.
        check(unsafe { sys::co2_engine_synchronize(self.as_raw()) })
    }

    /// Collective: end of training, as `synchronize` (the pending average and the steps since
    /// the last boundary are applied, so no step's work is lost; parameters = anchor).
    pub fn finalize(&mut self) -> Result<()> {
        // SAFETY: valid handle.
        check(unsafe { sys::co2_engine_finalize(self.as_raw()) })
    }

    /// Elastic groups: asks to leave without ending the group (a preemption notice). Returns at
    /// once; keep calling `step`: the step at which the group lets this rank go returns
    /// [`Status::Left`](crate::Status::Left) here (parameters = the anchor, every step's work
    /// kept) and [`Status::MembershipChanged`](crate::Status::MembershipChanged) on the others.
    /// `finalize` and `synchronize` are refused meanwhile. docs/capi.md, "Leaving".
    pub fn leave(&mut self) -> Result<()> {
        // SAFETY: valid handle.
        check(unsafe { sys::co2_engine_leave(self.as_raw()) })
    }

    /// Writes the consensus model (every Parameter and Buffer element, registration order) into
    /// `out`, whose length must be `num_elements()`. `Consensus::LocalAverage` is collective.
    pub fn consensus(&mut self, kind: Consensus, out: &mut [f32]) -> Result<()> {
        // SAFETY: the library checks `out.len()` against the element count before writing.
        check(unsafe { sys::co2_engine_consensus(self.as_raw(), kind.raw(), out.as_mut_ptr(), out.len()) })
    }

    /// Parameter + Buffer elements, after commit.
    pub fn num_elements(&self) -> Result<usize> {
        let mut count = 0usize;
        // SAFETY: valid handle and output.
        check(unsafe { sys::co2_engine_num_elements(self.as_raw(), &mut count) })?;
        Ok(count)
    }

    pub fn set_param(&mut self, key: Param, value: f64) -> Result<()> {
        // SAFETY: valid handle.
        check(unsafe { sys::co2_engine_set_param(self.as_raw(), key.raw(), value) })
    }

    pub fn get_param(&self, key: Param) -> Result<f64> {
        let mut value = 0.0;
        // SAFETY: valid handle and output.
        check(unsafe { sys::co2_engine_get_param(self.as_raw(), key.raw(), &mut value) })?;
        Ok(value)
    }

    pub fn stats(&self) -> Result<Stats> {
        let mut raw = sys::co2_engine_stats_t::init();
        // SAFETY: `raw.size` tells the library how much it may write.
        check(unsafe { sys::co2_engine_get_stats(self.as_raw(), &mut raw) })?;
        Ok(Stats::from(&raw))
    }

    // ---------------------------------------------------------------------------------------
    // Checkpoint
    // ---------------------------------------------------------------------------------------

    /// Exact number of bytes `save` writes now.
    pub fn state_size(&self) -> Result<usize> {
        let mut bytes = 0usize;
        // SAFETY: valid handle and output.
        check(unsafe { sys::co2_engine_state_size(self.as_raw(), &mut bytes) })?;
        Ok(bytes)
    }

    /// Exact number of bytes `save_portable` writes now.
    pub fn portable_state_size(&self) -> Result<usize> {
        let mut bytes = 0usize;
        // SAFETY: valid handle and output.
        check(unsafe { sys::co2_engine_portable_state_size(self.as_raw(), &mut bytes) })?;
        Ok(bytes)
    }

    /// Collective: saves the shared engine state into `writer`; ranks that do not write pass
    /// `None`. A writer error fails the save with `Status::Callback` (its text in the message).
    /// A sharded engine writes this rank's shard: every rank saves and loads its own.
    pub fn save<W: Write>(&mut self, writer: Option<&mut W>) -> Result<()> {
        self.save_with(sys::co2_engine_save, writer)
    }

    /// Collective: as `save`, in the replicated format, which loads at any world size and
    /// sharding (one file for every rank).
    pub fn save_portable<W: Write>(&mut self, writer: Option<&mut W>) -> Result<()> {
        self.save_with(sys::co2_engine_save_portable, writer)
    }

    fn save_with<W: Write>(
        &mut self,
        save: unsafe extern "C" fn(sys::co2_engine_t, sys::co2_write_fn, *mut c_void) -> sys::co2_status_t,
        writer: Option<&mut W>,
    ) -> Result<()> {
        let Some(writer) = writer else {
            // SAFETY: a NULL callback means "this rank writes nothing".
            return check(unsafe { save(self.as_raw(), None, ptr::null_mut()) });
        };
        let mut ctx = CallbackContext { io: writer, error: None };
        // SAFETY: `ctx` outlives the blocking call; the trampoline casts `user` back to it.
        let status = unsafe {
            save(
                self.as_raw(),
                Some(write_trampoline::<W>),
                (&mut ctx as *mut CallbackContext<W>).cast(),
            )
        };
        with_io_error(check(status), ctx.error)
    }

    /// Restores the shared state (transactional: a bad blob changes nothing; not collective,
    /// except on a sharded engine, where one rank's bad blob fails every rank).
    /// Parameters become the restored anchor.
    pub fn load<R: Read>(&mut self, reader: &mut R) -> Result<()> {
        let mut ctx = CallbackContext { io: reader, error: None };
        // SAFETY: as in save.
        let status = unsafe {
            sys::co2_engine_load(
                self.as_raw(),
                Some(read_trampoline::<R>),
                (&mut ctx as *mut CallbackContext<R>).cast(),
            )
        };
        with_io_error(check(status), ctx.error)
    }
}

impl Drop for Engine<'_> {
    fn drop(&mut self) {
        // SAFETY: owned handle, destroyed exactly once; it waits for an all-reduce in flight, so
        // no memory the engine borrows is touched after this returns.
        unsafe { sys::co2_engine_destroy(self.as_raw()) };
    }
}

fn c_name(name: &str) -> Result<CString> {
    CString::new(name)
        .map_err(|_| Error::new(Status::InvalidArgument, format!("name {name:?} contains a NUL byte")))
}

struct CallbackContext<'w, T: ?Sized> {
    io: &'w mut T,
    error: Option<String>,
}

fn with_io_error(result: Result<()>, io_error: Option<String>) -> Result<()> {
    match (result, io_error) {
        (Err(e), Some(io)) => Err(Error::new(e.status(), format!("{} ({io})", e.message()))),
        (result, _) => result,
    }
}

// Panics must not unwind into C: they are caught and reported as a failed callback.
unsafe extern "C" fn write_trampoline<W: Write>(
    user: *mut c_void,
    data: *const c_void,
    length: usize,
) -> c_int {
    let ctx = &mut *user.cast::<CallbackContext<W>>();
    let bytes = std::slice::from_raw_parts(data.cast::<u8>(), length);
    match catch_unwind(AssertUnwindSafe(|| ctx.io.write_all(bytes))) {
        Ok(Ok(())) => 0,
        Ok(Err(e)) => {
            ctx.error = Some(format!("writer: {e}"));
            1
        }
        Err(_) => {
            ctx.error = Some("writer panicked".into());
            1
        }
    }
}

unsafe extern "C" fn read_trampoline<R: Read>(user: *mut c_void, data: *mut c_void, length: usize) -> c_int {
    let ctx = &mut *user.cast::<CallbackContext<R>>();
    let bytes = std::slice::from_raw_parts_mut(data.cast::<u8>(), length);
    match catch_unwind(AssertUnwindSafe(|| ctx.io.read_exact(bytes))) {
        Ok(Ok(())) => 0,
        Ok(Err(e)) => {
            ctx.error = Some(format!("reader: {e}"));
            1
        }
        Err(_) => {
            ctx.error = Some("reader panicked".into());
            1
        }
    }
}

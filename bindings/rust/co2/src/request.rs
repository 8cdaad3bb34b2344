//! `Request`: an asynchronous raw collective that owns its buffer until it completes.

use std::ptr::NonNull;

use co2_sys as sys;

use crate::enums::Element;
use crate::error::{check, Result};

/// An asynchronous collective in flight. Dropping it waits for completion
/// (`co2_request_free`), then frees the buffer.
pub struct Request<T: Element> {
    raw: NonNull<sys::co2_request>,
    buffer: Vec<T>,
}

// SAFETY: a request may be tested or waited on from any one thread at a time (docs/capi.md);
// `&mut self` on test/wait and ownership on free give exactly that. The buffer is a Vec of Send
// elements. Not Sync: two threads testing one request at once is what the C API forbids.
unsafe impl<T: Element> Send for Request<T> {}

impl<T: Element> Request<T> {
    pub(crate) fn new(raw: sys::co2_request_t, buffer: Vec<T>) -> Request<T> {
        Request { raw: NonNull::new(raw).expect("collective returned OK and a NULL request"), buffer }
    }

    /// `true` once complete; a failed collective returns its status as `Err`.
    pub fn test(&mut self) -> Result<bool> {
        let mut done = 0;
        // SAFETY: owned handle, valid output.
        check(unsafe { sys::co2_request_test(self.raw.as_ptr(), &mut done) })?;
        Ok(done != 0)
    }

    /// Waits up to `timeout_ms`: `Err` with `Status::Timeout` leaves the request pending and
    /// usable; a failed collective returns its status.
    pub fn wait_timeout(&mut self, timeout_ms: u32) -> Result<()> {
        // SAFETY: owned handle.
        check(unsafe { sys::co2_request_wait(self.raw.as_ptr(), i64::from(timeout_ms)) })
    }

    /// Waits until completion (bounded by the communicator's no-progress timeout) and returns
    /// the buffer with the result.
    pub fn wait(mut self) -> Result<Vec<T>> {
        // SAFETY: owned handle.
        check(unsafe { sys::co2_request_wait(self.raw.as_ptr(), -1) })?;
        Ok(std::mem::take(&mut self.buffer))
    }
}

impl<T: Element> Drop for Request<T> {
    fn drop(&mut self) {
        // SAFETY: freed exactly once; free waits for an incomplete request, so the buffer (a
        // field, dropped after this body) is no longer in use when it is freed.
        unsafe { sys::co2_request_free(self.raw.as_ptr()) };
    }
}

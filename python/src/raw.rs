//! Raw memory views handed over from Python (a torch tensor's `data_ptr()` and byte size).

/// A `(pointer, length)` pair for memory that Python owns and keeps alive, and does not touch,
/// for the duration of one native call.
#[derive(Debug, Clone, Copy)]
pub struct RawBuf {
    ptr: usize,
    len: usize,
}

impl RawBuf {
    /// Wraps an address and a byte length received from Python.
    pub fn new(ptr: usize, len: usize) -> Self {
        Self { ptr, len }
    }

    /// The memory as a mutable byte slice.
    ///
    /// # Safety
    /// `ptr..ptr+len` must be valid, writable memory that nothing else reads or writes while the
    /// returned slice lives (the Python caller holds the tensor and waits for the call).
    pub unsafe fn as_mut_slice<'a>(self) -> &'a mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: guaranteed by the caller as documented above; the pointer is non-null because
        // a non-empty tensor has storage.
        unsafe { std::slice::from_raw_parts_mut(self.ptr as *mut u8, self.len) }
    }

    /// The memory as a shared byte slice.
    ///
    /// # Safety
    /// `ptr..ptr+len` must be valid memory that nothing writes while the slice lives.
    pub unsafe fn as_slice<'a>(self) -> &'a [u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: guaranteed by the caller as documented above.
        unsafe { std::slice::from_raw_parts(self.ptr as *const u8, self.len) }
    }
}

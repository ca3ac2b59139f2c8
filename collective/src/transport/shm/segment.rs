//! One shared-memory segment: a file under `/dev/shm` mapped into this process.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

/// A mapping of a shared-memory file. The creator unlinks the file (at the latest when the
/// segment is dropped); the mapping lives until the segment is dropped.
#[derive(Debug)]
pub(crate) struct Segment {
    ptr: NonNull<u8>,
    len: usize,
    path: PathBuf,
    /// Whether this process still has to unlink the file.
    owned: bool,
}

// SAFETY: the mapping is plain memory valid until drop; all concurrent access to it goes
// through the node's phase protocol (atomics for flags, disjoint byte ranges for data).
unsafe impl Send for Segment {}
// SAFETY: as for `Send`: `&Segment` only hands out raw pointers whose use the protocol orders.
unsafe impl Sync for Segment {}

impl Segment {
    /// Creates `path` (which must not exist) with `len` zeroed bytes and maps it.
    pub(crate) fn create(path: &Path, len: usize) -> io::Result<Segment> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC)
            .open(path)?;
        let mapped = file
            .set_len(len as u64)
            .and_then(|()| Self::map(&file, path, len, true));
        if mapped.is_err() {
            let _ = std::fs::remove_file(path);
        }
        mapped
    }

    /// Maps the existing `path`, which must hold `len` bytes.
    pub(crate) fn open(path: &Path, len: usize) -> io::Result<Segment> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(path)?;
        let actual = file.metadata()?.len();
        if actual != len as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "shared-memory segment {} holds {actual} bytes, expected {len}",
                    path.display()
                ),
            ));
        }
        Self::map(&file, path, len, false)
    }

    fn map(file: &File, path: &Path, len: usize, owned: bool) -> io::Result<Segment> {
        // SAFETY: a fresh shared mapping of a file we hold open; the kernel picks the address.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(ptr.cast::<u8>())
            .ok_or_else(|| io::Error::other("mmap returned a null mapping"))?;
        Ok(Segment {
            ptr,
            len,
            path: path.to_owned(),
            owned,
        })
    }

    /// Removes the file (the mapping stays valid). Only the creator unlinks; idempotent.
    pub(crate) fn unlink(&mut self) -> io::Result<()> {
        if !self.owned {
            return Ok(());
        }
        self.owned = false;
        match std::fs::remove_file(&self.path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// The start of the mapping.
    pub(crate) fn ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Bytes mapped.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        let _ = self.unlink();
        // SAFETY: unmaps exactly the mapping made in `map`; no references into it outlive the
        // segment (the node hands out slices borrowed from itself).
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

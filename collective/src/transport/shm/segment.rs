//! One shared-memory segment: a file under `/dev/shm` mapped into this process.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

use std::os::unix::fs::MetadataExt;

use crate::error::Error;

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
    /// Creates `path` (which must not exist; a symlink there is never followed) with mode
    /// 0600, writes `header` at its start, reserves `len` bytes (`posix_fallocate`, so a full
    /// directory fails here with a typed error rather than SIGBUS later), and maps it.
    ///
    /// The header (which names the creator) goes in before the reservation, which takes long
    /// for a large segment: a creator killed meanwhile leaves a segment the next setup can
    /// tell is stale, not a nameless one.
    pub(crate) fn create(path: &Path, len: usize, header: &[u8]) -> Result<Segment, Error> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
            .open(path)
            .map_err(|e| match e.kind() {
                io::ErrorKind::AlreadyExists => Error::SharedMemory(format!(
                    "shared-memory segment {} already exists (a file, symlink or segment someone else put \
                     there); kolo neither follows nor reuses it: remove it if it is a leftover of yours, or \
                     set KOLO_TRANSPORT=tcp",
                    path.display()
                )),
                _ => setup_error(path, e),
            })?;
        let reserved = std::os::unix::fs::FileExt::write_all_at(&file, header, 0)
            .map_err(|e| setup_error(path, e))
            .and_then(|()| reserve(&file, path, len))
            .and_then(|()| Self::map(&file, path, len, true).map_err(|e| setup_error(path, e)));
        if reserved.is_err() {
            let _ = std::fs::remove_file(path);
        }
        reserved
    }

    /// Maps the existing `path`, which must be a regular file (not a symlink) owned by this
    /// user, private to it (no group or other permission bits), holding `len` bytes.
    pub(crate) fn open(path: &Path, len: usize) -> Result<Segment, Error> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(path)
            .map_err(|e| match e.raw_os_error() {
                Some(libc::ELOOP) => unsafe_segment(path, "it is a symlink"),
                _ => setup_error(path, e),
            })?;
        let meta = file.metadata().map_err(|e| setup_error(path, e))?;
        check_private(path, &meta)?;
        if meta.len() != len as u64 {
            return Err(unsafe_segment(
                path,
                &format!("it holds {} bytes, expected {len}", meta.len()),
            ));
        }
        Self::map(&file, path, len, false).map_err(|e| setup_error(path, e))
    }

    /// Maps the whole file with its page-table entries filled in (`MAP_POPULATE`; its memory
    /// is already reserved), so the first collective does not take a page fault on every page
    /// of its own halves (written) and of the peers' (read).
    fn map(file: &File, path: &Path, len: usize, owned: bool) -> io::Result<Segment> {
        // SAFETY: a fresh shared mapping of a file we hold open; the kernel picks the address.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
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

/// Refuses a segment file that is not a regular file owned by this user with no group or
/// other permissions (another user could read or change the job's tensors through it).
pub(crate) fn check_private(path: &Path, meta: &std::fs::Metadata) -> Result<(), Error> {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    if !meta.file_type().is_file() {
        return Err(unsafe_segment(path, "it is not a regular file"));
    }
    if meta.uid() != uid {
        return Err(unsafe_segment(
            path,
            &format!(
                "it belongs to uid {}, not to this process's uid {uid}",
                meta.uid()
            ),
        ));
    }
    if meta.mode() & 0o077 != 0 {
        return Err(unsafe_segment(
            path,
            &format!(
                "its mode is {:o}; a segment must be 600",
                meta.mode() & 0o777
            ),
        ));
    }
    Ok(())
}

fn unsafe_segment(path: &Path, why: &str) -> Error {
    Error::SharedMemory(format!(
        "shared-memory segment {} is not safe to use: {why}; kolo only maps segments its own job \
         created (remove the file, or set KOLO_TRANSPORT=tcp)",
        path.display()
    ))
}

fn setup_error(path: &Path, source: io::Error) -> Error {
    Error::SharedMemory(format!(
        "shared-memory segment {}: {source} (is {} mounted and writable? set {} to another \
         directory or KOLO_TRANSPORT=tcp to avoid shared memory)",
        path.display(),
        path.parent().unwrap_or(Path::new("/")).display(),
        super::SHM_DIR_ENV
    ))
}

/// Reserves `len` bytes of `file` so the mapping can never hit a hole the filesystem cannot
/// fill (SIGBUS); on a full filesystem, a typed error naming the size and the free space.
fn reserve(file: &File, path: &Path, len: usize) -> Result<(), Error> {
    let size = libc::off_t::try_from(len).map_err(|_| {
        Error::SharedMemory(format!("shared-memory segment of {len} bytes is too large"))
    })?;
    // SAFETY: a plain call on a descriptor we own; posix_fallocate returns the error number.
    let code = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, size) };
    match code {
        0 => Ok(()),
        libc::ENOSPC | libc::EFBIG => {
            let dir = path.parent().unwrap_or(Path::new("/"));
            let free = free_bytes(dir)
                .map(|b| format!("{b} bytes ({} MiB) free", b >> 20))
                .unwrap_or_else(|e| format!("free space unknown: {e}"));
            Err(Error::SharedMemory(format!(
                "shared memory: the segment {} needs {len} bytes ({} MiB) but {} has only {free}; give it \
                 more space (e.g. Docker --shm-size=1g, or a larger /dev/shm mount), lower {} (bytes per \
                 half-buffer), point {} at a larger tmpfs, or set KOLO_TRANSPORT=tcp",
                path.display(),
                len.div_ceil(1 << 20),
                dir.display(),
                super::SHM_HALF_BYTES,
                super::SHM_DIR_ENV
            )))
        }
        libc::EOPNOTSUPP | libc::EINVAL => {
            // A filesystem without fallocate: size the file; pages are then allocated on touch.
            log::debug!(
                "{}: no posix_fallocate, sizing the file instead",
                path.display()
            );
            file.set_len(len as u64).map_err(|e| setup_error(path, e))
        }
        code => Err(setup_error(path, io::Error::from_raw_os_error(code))),
    }
}

/// Bytes available to this user in the filesystem holding `dir`.
pub(crate) fn free_bytes(dir: &Path) -> io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path holds a NUL byte"))?;
    // SAFETY: statvfs is plain old data; all-zero bytes are a valid value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: statvfs fills the struct for a valid NUL-terminated path.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st.f_bavail as u64 * st.f_frsize as u64)
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

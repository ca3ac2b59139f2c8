//! NCCL, loaded at run time by path (the `nvidia-nccl-cu*` wheel torch installs, or the
//! system's), and a communicator over it. cudarc's own NCCL loader only tries sonames like
//! `libnccl.so`, which the wheels do not ship, so kolo opens the library itself.
//!
//! Uneven allgathers are a group of broadcasts (one per rank's rows), uneven reducescatters a
//! group of reduces, alltoalls a group of sends and receives; every call is enqueued on the
//! given stream and returns at once.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;

use super::discover::Library;
use super::driver::CUstream;
use super::dylib::{open, symbol, Opened};
use super::mapping::{NcclOp, NcclType};
use crate::error::{Error, Result};

type Comm = *mut c_void;

/// `ncclUniqueId`: what every rank of a communicator must be given.
#[derive(Clone, Copy)]
#[repr(C)]
pub struct UniqueId(pub [u8; 128]);

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UniqueId(..)")
    }
}

#[derive(Debug)]
struct Api {
    opened: Opened,
    get_version: unsafe extern "C" fn(*mut c_int) -> c_int,
    error_string: unsafe extern "C" fn(c_int) -> *const c_char,
    unique_id: unsafe extern "C" fn(*mut UniqueId) -> c_int,
    init_rank: unsafe extern "C" fn(*mut Comm, c_int, UniqueId, c_int) -> c_int,
    destroy: unsafe extern "C" fn(Comm) -> c_int,
    async_error: unsafe extern "C" fn(Comm, *mut c_int) -> c_int,
    all_reduce: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        Comm,
        CUstream,
    ) -> c_int,
    broadcast: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        Comm,
        CUstream,
    ) -> c_int,
    reduce: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        c_int,
        Comm,
        CUstream,
    ) -> c_int,
    send: unsafe extern "C" fn(*const c_void, usize, c_int, c_int, Comm, CUstream) -> c_int,
    recv: unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, Comm, CUstream) -> c_int,
    group_start: unsafe extern "C" fn() -> c_int,
    group_end: unsafe extern "C" fn() -> c_int,
}

// SAFETY: function pointers and a library handle, usable from any thread.
unsafe impl Send for Api {}
// SAFETY: see `Send`.
unsafe impl Sync for Api {}

static API: OnceLock<std::result::Result<Api, String>> = OnceLock::new();

fn load() -> Result<Api> {
    let opened = open(Library::Nccl)?;
    // SAFETY: the types are NCCL's documented signatures (enums are C ints).
    unsafe {
        Ok(Api {
            get_version: symbol(&opened, "ncclGetVersion")?,
            error_string: symbol(&opened, "ncclGetErrorString")?,
            unique_id: symbol(&opened, "ncclGetUniqueId")?,
            init_rank: symbol(&opened, "ncclCommInitRank")?,
            destroy: symbol(&opened, "ncclCommDestroy")?,
            async_error: symbol(&opened, "ncclCommGetAsyncError")?,
            all_reduce: symbol(&opened, "ncclAllReduce")?,
            broadcast: symbol(&opened, "ncclBroadcast")?,
            reduce: symbol(&opened, "ncclReduce")?,
            send: symbol(&opened, "ncclSend")?,
            recv: symbol(&opened, "ncclRecv")?,
            group_start: symbol(&opened, "ncclGroupStart")?,
            group_end: symbol(&opened, "ncclGroupEnd")?,
            opened,
        })
    }
}

fn api() -> Result<&'static Api> {
    API.get_or_init(|| load().map_err(|e| e.to_string()))
        .as_ref()
        .map_err(|e| Error::Cuda(e.clone()))
}

fn check(api: &Api, code: c_int, call: &str) -> Result<()> {
    if code == 0 {
        return Ok(());
    }
    // SAFETY: NCCL returns a static string for every code.
    let text = unsafe { CStr::from_ptr((api.error_string)(code)) }.to_string_lossy();
    Err(Error::Cuda(format!(
        "{call} failed: {text} (NCCL error {code}; NCCL_DEBUG=WARN shows why)"
    )))
}

/// The loaded NCCL's file and `ncclGetVersion` code (`22307` is 2.23.7), loading it on first
/// use. Needs no GPU.
pub fn library() -> Result<(String, i32)> {
    let api = api()?;
    let mut version = 0;
    // SAFETY: one valid out-pointer.
    let code = unsafe { (api.get_version)(&mut version) };
    check(api, code, "ncclGetVersion")?;
    Ok((api.opened.path.clone(), version))
}

impl UniqueId {
    /// A fresh id (rank 0 makes it, every rank of the new communicator gets it).
    pub fn new() -> Result<UniqueId> {
        let api = api()?;
        let mut id = UniqueId([0; 128]);
        // SAFETY: one valid out-pointer.
        check(api, unsafe { (api.unique_id)(&mut id) }, "ncclGetUniqueId")?;
        Ok(id)
    }

    /// The id from its 128 bytes.
    pub fn from_bytes(bytes: &[u8]) -> Result<UniqueId> {
        let raw: [u8; 128] = bytes.try_into().map_err(|_| {
            Error::InvalidArgument(format!(
                "an NCCL unique id has 128 bytes, got {}",
                bytes.len()
            ))
        })?;
        Ok(UniqueId(raw))
    }
}

/// An NCCL communicator of `size` ranks on the device current at creation.
#[derive(Debug)]
pub struct Communicator {
    comm: Comm,
    rank: usize,
    size: usize,
    version: i32,
}

// SAFETY: an NCCL communicator may be used from any one thread at a time; `&mut self` on
// every call that enqueues work keeps it to one.
unsafe impl Send for Communicator {}

fn count(n: usize) -> Result<c_int> {
    c_int::try_from(n)
        .map_err(|_| Error::InvalidArgument(format!("{n} ranks is too many for NCCL")))
}

impl Communicator {
    /// Joins the communicator `id` as `rank` of `size` (blocks until every rank joined; the
    /// device must be current on this thread).
    pub fn new(id: &UniqueId, rank: usize, size: usize) -> Result<Communicator> {
        let api = api()?;
        let (_, version) = library()?;
        let mut comm: Comm = std::ptr::null_mut();
        // SAFETY: valid out-pointer; `id` is 128 bytes passed by value as NCCL expects.
        let code = unsafe { (api.init_rank)(&mut comm, count(size)?, *id, count(rank)?) };
        check(api, code, "ncclCommInitRank")?;
        Ok(Communicator {
            comm,
            rank,
            size,
            version,
        })
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Ranks in the communicator.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The loaded NCCL's version code.
    pub fn version(&self) -> i32 {
        self.version
    }

    /// An error NCCL hit in the background (a failed peer, a network error), if any.
    pub fn async_error(&self) -> Result<()> {
        let api = api()?;
        let mut state = 0;
        // SAFETY: the communicator is alive; one valid out-pointer.
        let code = unsafe { (api.async_error)(self.comm, &mut state) };
        check(api, code, "ncclCommGetAsyncError")?;
        check(api, state, "an earlier NCCL collective")
    }

    /// `ncclAllReduce` of `count` elements (in place when `send == recv`).
    ///
    /// # Safety
    /// `send` and `recv` must be device memory of `count` elements, valid until the work on
    /// `stream` ran.
    pub unsafe fn allreduce(
        &mut self,
        send: u64,
        recv: u64,
        count: usize,
        dtype: NcclType,
        op: NcclOp,
        stream: CUstream,
    ) -> Result<()> {
        let api = api()?;
        // SAFETY: the caller's contract.
        let code = unsafe {
            (api.all_reduce)(
                ptr(send),
                ptr(recv).cast_mut(),
                count,
                dtype as c_int,
                op as c_int,
                self.comm,
                stream,
            )
        };
        check(api, code, "ncclAllReduce")
    }

    /// `ncclBroadcast` of `count` elements from `root`.
    ///
    /// # Safety
    /// As for [`Communicator::allreduce`].
    pub unsafe fn broadcast(
        &mut self,
        send: u64,
        recv: u64,
        count: usize,
        dtype: NcclType,
        root: usize,
        stream: CUstream,
    ) -> Result<()> {
        let api = api()?;
        // SAFETY: the caller's contract.
        let code = unsafe {
            (api.broadcast)(
                ptr(send),
                ptr(recv).cast_mut(),
                count,
                dtype as c_int,
                count_of(root)?,
                self.comm,
                stream,
            )
        };
        check(api, code, "ncclBroadcast")
    }

    /// Allgather of uneven parts: rank `r` contributes `counts[r]` elements from `send`, and
    /// `recv` receives every part in rank order.
    ///
    /// # Safety
    /// `send` must hold `counts[rank]` elements, `recv` their sum; valid until the work ran.
    pub unsafe fn allgatherv(
        &mut self,
        send: u64,
        recv: u64,
        counts: &[usize],
        dtype: NcclType,
        elem: usize,
        stream: CUstream,
    ) -> Result<()> {
        self.check_counts(counts)?;
        let api = api()?;
        let mut at = recv;
        self.group(api, |api, comm| {
            for (root, &n) in counts.iter().enumerate() {
                // SAFETY: the caller's contract; each part lands at its own offset.
                let code = unsafe {
                    (api.broadcast)(
                        ptr(send),
                        ptr(at).cast_mut(),
                        n,
                        dtype as c_int,
                        count_of(root)?,
                        comm,
                        stream,
                    )
                };
                check(api, code, "ncclBroadcast (allgather)")?;
                at += (n * elem) as u64;
            }
            Ok(())
        })
    }

    /// Reducescatter of uneven parts: `send` holds every rank's part in rank order
    /// (`counts[r]` elements each); this rank's reduced part lands in `recv`.
    ///
    /// # Safety
    /// `send` must hold the sum of `counts` elements, `recv` `counts[rank]`.
    #[allow(clippy::too_many_arguments, reason = "mirrors the NCCL call")]
    pub unsafe fn reducescatterv(
        &mut self,
        send: u64,
        recv: u64,
        counts: &[usize],
        dtype: NcclType,
        op: NcclOp,
        elem: usize,
        stream: CUstream,
    ) -> Result<()> {
        self.check_counts(counts)?;
        let api = api()?;
        let mut at = send;
        self.group(api, |api, comm| {
            for (root, &n) in counts.iter().enumerate() {
                // SAFETY: the caller's contract; NCCL only writes `recv` on the root.
                let code = unsafe {
                    (api.reduce)(
                        ptr(at),
                        ptr(recv).cast_mut(),
                        n,
                        dtype as c_int,
                        op as c_int,
                        count_of(root)?,
                        comm,
                        stream,
                    )
                };
                check(api, code, "ncclReduce (reducescatter)")?;
                at += (n * elem) as u64;
            }
            Ok(())
        })
    }

    /// Alltoall: `send_counts[r]` elements from `send` (in rank order) go to rank `r`;
    /// `recv_counts[r]` elements from rank `r` land in `recv` (in rank order).
    ///
    /// # Safety
    /// `send` and `recv` must hold the sums of their counts.
    #[allow(clippy::too_many_arguments, reason = "mirrors the NCCL calls")]
    pub unsafe fn alltoallv(
        &mut self,
        send: u64,
        send_counts: &[usize],
        recv: u64,
        recv_counts: &[usize],
        dtype: NcclType,
        elem: usize,
        stream: CUstream,
    ) -> Result<()> {
        self.check_counts(send_counts)?;
        self.check_counts(recv_counts)?;
        let api = api()?;
        let (mut s, mut r) = (send, recv);
        self.group(api, |api, comm| {
            for peer in 0..send_counts.len() {
                let (ns, nr) = (send_counts[peer], recv_counts[peer]);
                let p = count_of(peer)?;
                if ns > 0 {
                    // SAFETY: the caller's contract.
                    let code = unsafe { (api.send)(ptr(s), ns, dtype as c_int, p, comm, stream) };
                    check(api, code, "ncclSend")?;
                }
                if nr > 0 {
                    // SAFETY: the caller's contract.
                    let code = unsafe {
                        (api.recv)(ptr(r).cast_mut(), nr, dtype as c_int, p, comm, stream)
                    };
                    check(api, code, "ncclRecv")?;
                }
                s += (ns * elem) as u64;
                r += (nr * elem) as u64;
            }
            Ok(())
        })
    }

    fn check_counts(&self, counts: &[usize]) -> Result<()> {
        if counts.len() == self.size {
            return Ok(());
        }
        Err(Error::InvalidArgument(format!(
            "{} counts given for an NCCL communicator of {} ranks",
            counts.len(),
            self.size
        )))
    }

    fn group(&mut self, api: &Api, body: impl FnOnce(&Api, Comm) -> Result<()>) -> Result<()> {
        // SAFETY: no arguments.
        check(api, unsafe { (api.group_start)() }, "ncclGroupStart")?;
        let result = body(api, self.comm);
        // SAFETY: closes the group opened above (also after a failed call, as NCCL requires).
        let end = check(api, unsafe { (api.group_end)() }, "ncclGroupEnd");
        result.and(end)
    }
}

fn ptr(addr: u64) -> *const c_void {
    addr as usize as *const c_void
}

fn count_of(rank: usize) -> Result<c_int> {
    count(rank)
}

impl Drop for Communicator {
    fn drop(&mut self) {
        if let Ok(api) = api() {
            // SAFETY: created in `new`, destroyed once.
            if let Err(e) = check(api, unsafe { (api.destroy)(self.comm) }, "ncclCommDestroy") {
                log::warn!("{e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Loads the NCCL of the dev environment (torch's nvidia-nccl wheel) when there is one and
    /// reads its version: no GPU needed.
    #[test]
    fn the_nccl_wheel_loads_without_a_gpu() {
        crate::cuda::discover::tests::use_the_repository_venv();
        let Ok((path, version)) = library() else {
            eprintln!("NCCL is not installed here; the load check did not run");
            return;
        };
        assert!(
            path.ends_with("libnccl.so.2") || path.ends_with("libnccl.so"),
            "{path}"
        );
        assert!(version >= 21_000, "NCCL {version} is older than 2.10");
        assert!(UniqueId::from_bytes(&[0; 12]).is_err());
    }
}

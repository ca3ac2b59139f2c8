//! kolo's one process-global tokio runtime. Nothing else in kolo builds a runtime: the job
//! driver service, the worker's driver client and the data path's store and Parquet requests
//! all run on this one.
//!
//! - [`handle`]: the runtime (two worker threads named `kolo-rt`), created on first use; it
//!   refuses to run in a child forked after it started ([`Error::Forked`]).
//! - [`block_on`]: runs a future to completion on it, from a thread that is not one of its
//!   own (the Python binding releases the GIL first).
//!
//! ```
//! let answer = kolo_runtime::block_on(async { 6 * 7 }).unwrap();
//! assert_eq!(answer, 42);
//!
//! // Spawned tasks run on the runtime's own threads.
//! let task = kolo_runtime::handle().unwrap().spawn(async { "done" });
//! assert_eq!(kolo_runtime::block_on(task).unwrap().unwrap(), "done");
//! ```
#![warn(missing_docs)]

mod error;

use std::future::Future;
use std::sync::OnceLock;

pub use error::{Error, Result};

#[derive(Debug)]
struct Global {
    runtime: tokio::runtime::Runtime,
    pid: u32,
}

static GLOBAL: OnceLock<Global> = OnceLock::new();

/// The process-global runtime (two worker threads), created on first use. Refuses to run in a
/// child forked after the runtime started, whose copy has no threads.
pub fn handle() -> Result<&'static tokio::runtime::Runtime> {
    let global = match GLOBAL.get() {
        Some(global) => global,
        None => {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("kolo-rt")
                .enable_all()
                .build()?;
            // Another thread may have won the race; then this runtime is dropped unused.
            GLOBAL.get_or_init(|| Global {
                runtime,
                pid: std::process::id(),
            })
        }
    };
    if global.pid != std::process::id() {
        return Err(Error::Forked);
    }
    Ok(&global.runtime)
}

/// Runs `future` to completion on the global runtime from a thread that is not a runtime thread.
/// Callers that hold the GIL must release it first (the Python binding's helper does).
pub fn block_on<F: Future>(future: F) -> Result<F::Output> {
    Ok(handle()?.block_on(future))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_on_returns_the_futures_output() {
        assert_eq!(block_on(async { 6 * 7 }).unwrap(), 42);
        let text = block_on(async {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            String::from("slept")
        })
        .unwrap();
        assert_eq!(text, "slept");
    }

    #[test]
    fn the_same_runtime_is_returned_every_time() {
        let first = handle().unwrap();
        let second = handle().unwrap();
        assert!(std::ptr::eq(first, second));
        let from_threads: Vec<usize> = (0..4)
            .map(|_| std::thread::spawn(|| std::ptr::from_ref(handle().unwrap()) as usize))
            .map(|t| t.join().unwrap())
            .collect();
        assert!(from_threads
            .iter()
            .all(|&addr| addr == std::ptr::from_ref(first) as usize));
    }

    #[test]
    fn spawned_tasks_run_on_the_runtimes_threads() {
        let name = block_on(
            handle()
                .unwrap()
                .spawn(async { std::thread::current().name().map(str::to_owned) }),
        )
        .unwrap()
        .unwrap();
        assert_eq!(name.as_deref(), Some("kolo-rt"));
    }

    #[test]
    fn a_child_forked_after_the_runtime_started_is_refused() {
        handle().unwrap();
        // SAFETY: the child only reads the runtime's record and its own pid, then leaves with
        // `_exit` (no unwinding, no destructors, no locks taken).
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            let code = match handle() {
                Err(Error::Forked) => 0,
                _ => 1,
            };
            // SAFETY: ends the forked child at once.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waits for the child forked above; `status` outlives the call.
        let waited = unsafe { libc::waitpid(pid, &mut status, 0) };
        assert_eq!(waited, pid);
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "the forked child was not refused (wait status {status})"
        );
        assert!(handle().is_ok(), "the parent keeps its runtime");
    }

    #[test]
    fn the_fork_message_says_how_to_start_children() {
        assert_eq!(
            Error::Forked.to_string(),
            "kolo's runtime was started before this process was forked; a forked child cannot \
             use it. Start child processes with the 'spawn' method, or call kolo only in the child"
        );
    }
}

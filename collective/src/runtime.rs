//! The one process-global tokio runtime. Nothing else builds a runtime.

use std::future::Future;
use std::sync::OnceLock;

use crate::error::{Error, Result};

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
            let _ = GLOBAL.set(Global {
                runtime,
                pid: std::process::id(),
            });
            GLOBAL
                .get()
                .ok_or_else(|| Error::Internal("runtime vanished".into()))?
        }
    };
    if global.pid != std::process::id() {
        return Err(Error::Config(
            "kolo's runtime was started before this process was forked; a forked child cannot \
             use it. Start child processes with the 'spawn' method, or call kolo only in the child"
                .into(),
        ));
    }
    Ok(&global.runtime)
}

/// Runs `future` to completion on the global runtime from a thread that is not a runtime thread.
/// Callers that hold the GIL must release it first (the Python binding's helper does).
pub fn block_on<F: Future>(future: F) -> Result<F::Output> {
    Ok(handle()?.block_on(future))
}

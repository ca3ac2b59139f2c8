//! The one helper that waits for long native work: the GIL is released, Ctrl-C is polled on the
//! calling (main) thread every 100 ms, and the work runs on its own thread.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use pyo3::prelude::*;

/// Runs `work` on a helper thread while this thread waits without the GIL, checking for
/// Ctrl-C. On Ctrl-C `work` is told through the flag it receives and, unless it finishes within
/// `grace`, abandoned (it must end by itself through its own timeouts); KeyboardInterrupt is
/// raised.
pub fn run_interruptibly<T, F>(py: Python<'_>, grace: Duration, work: F) -> PyResult<T>
where
    T: Send + 'static,
    F: FnOnce(Arc<AtomicBool>) -> T + Send + 'static,
{
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, rx) = mpsc::channel();
    let flag = Arc::clone(&stop);
    std::thread::Builder::new()
        .name("kolo-wait".into())
        .spawn(move || {
            let _ = tx.send(work(flag));
        })
        .map_err(|err| crate::error::to_py(err.into()))?;
    let mut rx = rx;
    loop {
        // The receiver moves in and out of the GIL-free closure (it is Send but not Sync).
        let (received, returned) =
            py.detach(move || (rx.recv_timeout(Duration::from_millis(100)), rx));
        rx = returned;
        match received {
            Ok(value) => return Ok(value),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(crate::error::to_py(kolo_collective::Error::Internal(
                    "the waiting thread ended without a result".into(),
                )))
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        if let Err(err) = py.check_signals() {
            stop.store(true, Ordering::SeqCst);
            let _ = py.detach(move || rx.recv_timeout(grace));
            return Err(err);
        }
    }
}

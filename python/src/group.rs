//! Ops a thread submits together: between `begin_group` and `end_group`, what this thread
//! submits is checked and given its handle at once but held back, then handed to the engine in
//! one go, so the whole group enters one cycle on every rank and fuses (Horovod's grouped ops;
//! submitted one by one, a cycle starting in between would split the group).

use std::cell::RefCell;
use std::sync::Arc;

use kolo_collective::engine::{HeldOps, Submission};
use kolo_collective::worker::Worker;
use kolo_collective::Result;
use pyo3::prelude::*;

use crate::session;

struct OpenGroup {
    /// The session the group's handles belong to.
    worker: Arc<Worker>,
    held: HeldOps,
    /// Nested groups join the outermost one.
    depth: usize,
    /// Whether any held op asked to wake the engine thread.
    wake: bool,
}

thread_local! {
    static GROUP: RefCell<Option<OpenGroup>> = const { RefCell::new(None) };
}

/// Submits `sub` on `worker`'s engine, or holds it when this thread has a group open.
pub(crate) fn submit_or_hold(worker: &Worker, sub: Submission, wake: bool) -> Result<u64> {
    GROUP.with_borrow_mut(|group| match group {
        Some(open) => {
            open.wake |= wake;
            open.worker.engine().hold(&mut open.held, sub)
        }
        None => worker.engine().submit_with(sub, wake),
    })
}

/// Opens a group on this thread (or nests in the open one).
#[pyfunction]
pub fn begin_group(py: Python<'_>) -> PyResult<()> {
    let worker = session::current(py)?;
    GROUP.with_borrow_mut(|group| match group {
        Some(open) => open.depth += 1,
        None => {
            *group = Some(OpenGroup {
                worker,
                held: HeldOps::default(),
                depth: 1,
                wake: false,
            })
        }
    });
    Ok(())
}

/// Closes this thread's group; the outermost one submits everything it holds at once.
#[pyfunction]
pub fn end_group() {
    if let Some(open) = close() {
        open.worker.engine().release(open.held, open.wake);
    }
}

/// Closes this thread's group after a failure; the outermost one submits nothing and forgets
/// the handles it gave out (with the tensors they kept).
#[pyfunction]
pub fn cancel_group() {
    if let Some(open) = close() {
        for handle in open.held.handles() {
            crate::ops::forget(handle);
        }
        open.worker.engine().discard(open.held);
    }
}

/// Leaves one level of this thread's group: the group itself once the outermost level closed.
fn close() -> Option<OpenGroup> {
    GROUP.with_borrow_mut(|group| {
        let open = group.as_mut()?;
        open.depth -= 1;
        if open.depth > 0 {
            return None;
        }
        group.take()
    })
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(begin_group, m)?)?;
    m.add_function(wrap_pyfunction!(end_group, m)?)?;
    m.add_function(wrap_pyfunction!(cancel_group, m)?)?;
    Ok(())
}

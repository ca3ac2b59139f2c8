//! Long-lived helper threads that run the assembler's jobs (gathering shuffle windows ahead):
//! started once per pipeline rather than once per window, which cost a thread start, a fresh
//! stack and its page faults for every 6 MiB window.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::error::{Error, Result};

type Job = Box<dyn FnOnce() + Send>;

/// A fixed set of threads taking jobs in submission order. Dropping it lets them finish the
/// jobs already submitted and waits for them.
#[derive(Debug)]
pub struct Workers {
    jobs: Option<Sender<Job>>,
    threads: Vec<JoinHandle<()>>,
}

/// The result of a submitted job, to wait for.
#[derive(Debug)]
pub struct Pending<T> {
    result: Receiver<std::thread::Result<T>>,
}

impl Workers {
    /// Starts `count` threads named `name`.
    pub fn start(name: &str, count: usize) -> Result<Self> {
        let (jobs, queue) = mpsc::channel::<Job>();
        let queue = Arc::new(Mutex::new(queue));
        let mut workers = Self {
            jobs: Some(jobs),
            threads: Vec::with_capacity(count),
        };
        for _ in 0..count {
            let queue = Arc::clone(&queue);
            let thread = std::thread::Builder::new()
                .name(name.into())
                .spawn(move || loop {
                    // The lock is held only while waiting for the next job; the sender's drop
                    // ends every wait.
                    let job = queue.lock().unwrap_or_else(|e| e.into_inner()).recv();
                    match job {
                        Ok(job) => job(),
                        Err(_) => return,
                    }
                })
                .map_err(Error::LoaderThread)?;
            workers.threads.push(thread);
        }
        Ok(workers)
    }

    /// Runs `job` on the next free thread.
    pub fn submit<T: Send + 'static>(
        &self,
        job: impl FnOnce() -> T + Send + 'static,
    ) -> Result<Pending<T>> {
        let (done, result) = mpsc::sync_channel(1);
        let job: Job = Box::new(move || {
            // The receiver may be gone (the pipeline stopped): the result is then dropped.
            let _ = done.send(catch_unwind(AssertUnwindSafe(job)));
        });
        self.jobs
            .as_ref()
            .and_then(|jobs| jobs.send(job).ok())
            .ok_or_else(|| Error::Internal("the loader's helper threads have stopped".into()))?;
        Ok(Pending { result })
    }
}

impl<T> Pending<T> {
    /// The job's result, looking at `stopped` every `poll`; `None` once it says to stop.
    pub fn wait(self, poll: Duration, stopped: impl Fn() -> bool) -> Result<Option<T>> {
        loop {
            match self.result.recv_timeout(poll) {
                Ok(Ok(value)) => return Ok(Some(value)),
                Ok(Err(_)) => return Err(Error::Internal("a loader helper job panicked".into())),
                Err(RecvTimeoutError::Timeout) if stopped() => return Ok(None),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(Error::Internal("a loader helper thread ended".into()))
                }
            }
        }
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        self.jobs = None;
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLL: Duration = Duration::from_millis(10);

    #[test]
    fn jobs_run_on_the_named_threads_and_return_their_results() {
        let workers = Workers::start("kolo-test-worker", 2).unwrap();
        let pending: Vec<_> = (0..8u64)
            .map(|i| {
                workers
                    .submit(move || (i * i, std::thread::current().name().map(String::from)))
                    .unwrap()
            })
            .collect();
        for (i, p) in pending.into_iter().enumerate() {
            let (square, name) = p.wait(POLL, || false).unwrap().unwrap();
            assert_eq!(square, (i * i) as u64);
            assert_eq!(name.as_deref(), Some("kolo-test-worker"));
        }
    }

    #[test]
    fn a_panicking_job_is_an_error_and_the_thread_goes_on() {
        let workers = Workers::start("kolo-test-worker", 1).unwrap();
        let bad = workers.submit(|| -> u32 { panic!("boom") }).unwrap();
        assert!(matches!(bad.wait(POLL, || false), Err(Error::Internal(_))));
        let good = workers.submit(|| 7u32).unwrap();
        assert_eq!(good.wait(POLL, || false).unwrap(), Some(7));
    }

    #[test]
    fn waiting_ends_when_told_to_stop() {
        let workers = Workers::start("kolo-test-worker", 1).unwrap();
        let slow = workers
            .submit(|| std::thread::sleep(Duration::from_millis(300)))
            .unwrap();
        let started = std::time::Instant::now();
        assert!(slow.wait(POLL, || true).unwrap().is_none());
        assert!(started.elapsed() < Duration::from_millis(200));
    }
}

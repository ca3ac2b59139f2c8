//! `kolo-spark-bridge`: the Rust side of `kolo.spark.run`.
//!
//! A Spark launch has three kinds of processes:
//!
//! - on the Spark driver, [`LaunchDriver`] (shared with the Ray launcher, in
//!   [`kolo_collective::control::launch`]) runs the job's driver service and collects what the
//!   tasks send: start reports (task attempt, host, pid), output lines labelled with ranks, user
//!   messages, exits, results (any size, outside Spark's `collect`) and the first failure;
//! - [`task`] (this crate): in each barrier task, [`run_task`] starts the rank process in its own
//!   process group (killed with the task), forwards its output, stops it when the job is aborted
//!   or the task interrupted, and reports how it ended;
//! - in the rank process, [`WorkerSession`] (shared with the Ray actor, in
//!   [`kolo_collective::worker::session`]) registers with the driver at start (so the rank
//!   environment is set before user code loads, and `init()` adopts that registration), fetches
//!   the pickled function and returns its result, messages or failure.
//!
//! ```
//! use std::time::Duration;
//! use kolo_spark_bridge::{LaunchDriver, LaunchDriverOptions};
//!
//! let driver = LaunchDriver::start(&LaunchDriverOptions {
//!     bind: "127.0.0.1:0".parse().unwrap(),
//!     num_tasks: 2,
//!     start_timeout: Duration::from_secs(30),
//!     heartbeat_timeout: Duration::from_secs(30),
//! })
//! .unwrap();
//! driver.put_payload(b"pickled (fn, args, kwargs)".to_vec()).unwrap();
//! assert_eq!(driver.worker_env(1).task_index, 1);
//! assert!(driver.poll(Duration::from_millis(10)).unwrap().is_empty());
//! assert!(!driver.all_exited());
//! driver.shutdown();
//! ```
#![warn(missing_docs)]

mod error;
pub mod task;

pub use error::{Error, Result};
pub use kolo_collective::control::{DriverEvent, LaunchDriver, LaunchDriverOptions, TaskStart};
pub use kolo_collective::worker::{rank_env, WorkerSession};
pub use task::{run_task, TaskOptions, TaskOutcome};

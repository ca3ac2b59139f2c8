//! The job control plane shared by `kolorun`, Spark and Ray launches.
//!
//! - A launcher starts a [`DriverService`] (gRPC; every connection runs the mutual
//!   [`handshake`] proving the per-job [`JobSecret`] without sending it) and passes workers the [`env`] variables.
//! - [`launch::LaunchDriver`] wraps the service for launchers that collect events, results and
//!   the first failure on the driver (Spark, Ray); [`crate::worker::WorkerSession`] is the
//!   matching worker side (early registration, payload, result, failure report).
//! - Each worker reads [`WorkerEnv::from_env`], binds its data plane on [`data_plane_ip`], and
//!   calls [`join_job`]: it registers `(task index, host hash, data address)`, waits for every
//!   task, and gets its rank values from [`assign_ranks`] plus every peer's address. Background
//!   tasks send heartbeats and turn the driver's abort broadcast into the worker's
//!   [`crate::AbortSignal`].
//!
//! ```
//! use kolo_collective::control::{self, DriverConfig, DriverService, WorkerEnv};
//! use kolo_collective::AbortSignal;
//!
//! let config = DriverConfig::new(1);
//! let env = WorkerEnv {
//!     driver_addr: String::new(),
//!     secret: config.secret.clone(),
//!     job_id: config.job_id,
//!     task_index: 0,
//!     num_tasks: 1,
//!     start_timeout: config.start_timeout,
//!     hostname: None,
//!     host_hash_salt: None,
//!     data_addr: None,
//! };
//! let driver = DriverService::start(config).unwrap();
//! let env = WorkerEnv { driver_addr: driver.addr().to_string(), ..env };
//! let data_ip = control::data_plane_ip(&env).unwrap();
//! let listener = std::net::TcpListener::bind((data_ip, 0)).unwrap();
//! let abort = AbortSignal::new();
//! let (me, client) = control::join_job(&env, listener.local_addr().unwrap(), abort).unwrap();
//! assert_eq!((me.rank, me.size), (0, 1));
//! client.stop_background();
//! driver.shutdown();
//! ```

pub mod assign;
pub mod client;
mod driver_state;
pub mod env;
mod event_queue;
mod handlers;
pub mod handshake;
pub mod heartbeat_gaps;
pub mod host_hash;
pub mod host_updates;
pub mod ids;
mod join;
pub mod kv_space;
pub mod launch;
pub mod mac;
pub mod net;
pub mod proto;
pub mod runner_watch;
pub mod service;
pub(crate) mod silence;
mod status;

pub use assign::{assign_ranks, Assignment};
pub use client::{ClientOptions, DriverClient, PeerInfo, Registration, TaskInfo};
pub use env::WorkerEnv;
pub use heartbeat_gaps::HeartbeatGaps;
pub use host_hash::{host_hash, hostname};
pub use host_updates::HostUpdate;
pub use ids::{JobId, JobSecret};
pub use join::{data_plane_ip, join_job, join_job_async};
pub use launch::{DriverEvent, LaunchDriver, LaunchDriverOptions, TaskStart};
pub use service::{DriverConfig, DriverService, ElasticConfig, PeerAssignment};

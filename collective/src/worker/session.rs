//! The worker's side of a launch, shared by the Spark rank process and the Ray actor: it
//! registers with the job driver before user code runs ([`super::register_early`]), so
//! its rank variables are known before the user's function is loaded and a later `init()`
//! adopts the same registration; then it fetches the pickled function (Spark), and returns the
//! result, messages or a failure through the driver service. The launcher's side is
//! [`crate::control::launch`].

use std::time::Duration;

use super::{leave_early, register_early};
use crate::control::launch::keys;
use crate::control::proto::{task_event, TaskEvent, TaskStarted};
use crate::control::{DriverClient, Registration, WorkerEnv};
use crate::error::{Error, Result};

/// How long a result upload may take.
const UPLOAD_TIMEOUT: Duration = Duration::from_secs(600);

/// One worker's link to its job, from registration to the end.
#[derive(Debug)]
pub struct WorkerSession {
    env: WorkerEnv,
    registration: Registration,
    client: DriverClient,
}

impl WorkerSession {
    /// Reads the `KOLO_*` environment the launcher set and registers with the job driver
    /// (blocks until every task registered, bounded by the start timeout).
    pub fn join_from_env() -> Result<Self> {
        let env = WorkerEnv::from_env()?.ok_or_else(|| {
            Error::InvalidArgument(
                "this process was not started by a kolo launcher (kolo.spark.run, \
                 kolo.ray.RayExecutor): KOLO_DRIVER_ADDR is not set"
                    .into(),
            )
        })?;
        Self::join(env)
    }

    /// Registers with the job driver named by `env` (blocks until every task registered,
    /// bounded by the start timeout). `init()` in this process adopts the registration when
    /// the process environment describes the same job.
    pub fn join(env: WorkerEnv) -> Result<Self> {
        let (registration, client) = register_early(&env)?;
        Ok(Self {
            env,
            registration,
            client,
        })
    }

    /// This rank's assignment.
    pub fn registration(&self) -> &Registration {
        &self.registration
    }

    /// The rank variables to put in the process environment before user code runs
    /// ([`crate::control::env::rank_vars`]).
    pub fn rank_env(&self) -> Vec<(String, String)> {
        rank_env(&self.registration)
    }

    /// Fetches the pickled `(fn, args, kwargs)`.
    pub fn fetch_payload(&self, timeout: Duration) -> Result<Vec<u8>> {
        kolo_runtime::block_on(self.client.kv_get_stream(keys::PAYLOAD, timeout))?
    }

    /// Returns this rank's pickled result to the driver.
    pub fn put_result(&self, result: &[u8]) -> Result<()> {
        let key = keys::result(self.env.task_index);
        kolo_runtime::block_on(self.client.kv_put_stream(&key, result, UPLOAD_TIMEOUT))??;
        Ok(())
    }

    /// Tells the driver this task's worker runs (`attempt`, `hostname`, `pid`); it shows up
    /// as a `Started` event and in the driver's `task_start`.
    pub fn post_started(&self, attempt: u32, hostname: &str, pid: u32) -> Result<()> {
        let event = TaskEvent {
            kind: Some(task_event::Kind::Started(TaskStarted {
                attempt,
                hostname: hostname.to_owned(),
                pid,
            })),
        };
        kolo_runtime::block_on(self.client.post(self.env.task_index, vec![event]))??;
        Ok(())
    }

    /// Sends a small pickled object to the driver (delivered in order).
    pub fn send_message(&self, message: Vec<u8>) -> Result<()> {
        let event = TaskEvent {
            kind: Some(task_event::Kind::Message(message)),
        };
        kolo_runtime::block_on(self.client.post(self.env.task_index, vec![event]))??;
        Ok(())
    }

    /// Reports that the user's function failed (`message` carries the traceback); the driver
    /// aborts the job with it (an elastic job's task leaves it instead). Sent by task index:
    /// the rank of the first registration is stale once an elastic job has reset.
    pub fn report_failure(&self, message: &str) -> Result<()> {
        kolo_runtime::block_on(
            self.client
                .report_task_failure(self.env.task_index, message),
        )??;
        Ok(())
    }

    /// Ends the session: leaves the job unless `init()` adopted the registration (then its
    /// `shutdown()` does).
    pub fn finish(&self) -> Result<()> {
        leave_early()?;
        Ok(())
    }
}

/// The rank variables of `registration` ([`crate::control::env::rank_vars`]).
pub fn rank_env(registration: &Registration) -> Vec<(String, String)> {
    let assignment = crate::control::Assignment {
        task_index: 0,
        rank: registration.rank,
        size: registration.size,
        local_rank: registration.local_rank,
        local_size: registration.local_size,
        cross_rank: registration.cross_rank,
        cross_size: registration.cross_size,
    };
    let hostname = registration
        .peers
        .get(registration.rank as usize)
        .map_or("", |me| me.hostname.as_str());
    crate::control::env::rank_vars(&assignment, hostname)
}

//! The synchronous entry point a worker (the Python binding's `init()`) calls to join its job,
//! and the choice of the data-plane IP.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Mutex, PoisonError};

use crate::abort::AbortSignal;
use crate::control::client::{ClientOptions, DriverClient, Registration, TaskInfo};
use crate::control::env::{WorkerEnv, DATA_ADDR, NUM_TASKS};
use crate::control::host_hash::{host_hash_for, namespaces};
use crate::control::ids::JobId;
use crate::control::net::{local_ip_toward, resolve_nic_or_ip, system_hostname};
use crate::error::{Error, Result};

/// A worker's place in one job: (driver address, job id, task index).
type JoinKey = (String, JobId, u32);

/// How many times this process joined each job as each task: the registration round of its
/// next join (a worker that shut down and calls `init()` again joins the job's next round).
/// Keyed by driver, job and task, since one process may serve several jobs one after another
/// (reused Spark or Ray workers) or, in tests, several tasks.
static JOINED: Mutex<BTreeMap<JoinKey, u32>> = Mutex::new(BTreeMap::new());

fn join_key(env: &WorkerEnv) -> JoinKey {
    (env.driver_addr.clone(), env.job_id, env.task_index)
}

fn joins(key: &JoinKey) -> u32 {
    let joined = JOINED.lock().unwrap_or_else(PoisonError::into_inner);
    joined.get(key).copied().unwrap_or(0)
}

fn count_join(key: JoinKey) {
    let mut joined = JOINED.lock().unwrap_or_else(PoisonError::into_inner);
    *joined.entry(key).or_default() += 1;
}

/// Connects to the driver named by `env`, registers this process (task `env.task_index`, data
/// plane at `data_addr`), waits for everyone, checks the job id, and starts the heartbeat and
/// abort watcher (which set `abort` when the job is aborted or the driver is lost). Blocks up to
/// about `env.start_timeout` (twice that when the driver is unreachable for a while first);
/// call it without holding the GIL. A process that joined this job before (`init()` after
/// `shutdown()`) registers for the job's next round: every task must join again.
pub fn join_job(
    env: &WorkerEnv,
    data_addr: SocketAddr,
    abort: AbortSignal,
) -> Result<(Registration, DriverClient)> {
    kolo_runtime::block_on(join_job_async(env, data_addr, abort))?
}

/// The async form of [`join_job`] (must run on the global runtime).
pub async fn join_job_async(
    env: &WorkerEnv,
    data_addr: SocketAddr,
    abort: AbortSignal,
) -> Result<(Registration, DriverClient)> {
    let options = ClientOptions {
        connect_timeout: env.start_timeout,
        ..ClientOptions::default()
    };
    let client = DriverClient::connect(&env.driver_addr, &env.secret, options).await?;
    let hostname = env.hostname.clone().unwrap_or_else(system_hostname);
    let task = TaskInfo {
        task_index: env.task_index,
        host_hash: host_hash_for(&hostname, &namespaces(), env.host_hash_salt.as_deref()),
        hostname,
        data_addr,
        pid: std::process::id(),
        generation: joins(&join_key(env)),
    };
    let wait = crate::control::env::registration_wait(env.start_timeout)?;
    let registration = client.register(&task, wait).await?;
    if registration.job_id != env.job_id {
        return Err(Error::Rendezvous(format!(
            "the job driver at {} runs job {}, but this worker was started for job {}",
            env.driver_addr, registration.job_id, env.job_id
        )));
    }
    if !registration.elastic && registration.size != env.num_tasks {
        return Err(Error::Rendezvous(format!(
            "the job driver at {} expects {} task(s), but {NUM_TASKS}={}",
            env.driver_addr, registration.size, env.num_tasks
        )));
    }
    count_join(join_key(env));
    client.start_background(registration.rank, abort)?;
    log::info!(
        "joined job {} as rank {} of {} (local {} of {}, cross {} of {})",
        registration.job_id,
        registration.rank,
        registration.size,
        registration.local_rank,
        registration.local_size,
        registration.cross_rank,
        registration.cross_size
    );
    Ok((registration, client))
}

/// The IP this worker's data plane should listen on: `KOLO_DATA_ADDR` (an IP, or an interface
/// name) when set, else the local address of the interface that reaches the driver.
pub fn data_plane_ip(env: &WorkerEnv) -> Result<IpAddr> {
    match &env.data_addr {
        Some(value) => resolve_nic_or_ip(value, DATA_ADDR),
        None => local_ip_toward(&env.driver_addr),
    }
}

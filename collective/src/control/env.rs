//! The environment contract between a launcher (kolorun, Spark, Ray) and its workers: the
//! variable names and [`WorkerEnv`], the parsed form a worker reads at `init()`.

use std::time::Duration;

use crate::control::ids::{JobId, JobSecret};
use crate::error::{Error, Result};

/// `host:port` of the job driver service. Unset means "not launched": the process runs alone.
pub const DRIVER_ADDR: &str = "KOLO_DRIVER_ADDR";
/// The per-job secret, 64 hex digits.
pub const JOB_SECRET: &str = "KOLO_JOB_SECRET";
/// The per-job id, 32 hex digits.
pub const JOB_ID: &str = "KOLO_JOB_ID";
/// This worker's task index, `0..KOLO_NUM_TASKS` (the driver turns it into a rank).
pub const TASK_INDEX: &str = "KOLO_TASK_INDEX";
/// How many tasks the job has.
pub const NUM_TASKS: &str = "KOLO_NUM_TASKS";
/// Seconds every task has (from the driver's start) to register; default 30.
pub const START_TIMEOUT: &str = "KOLO_START_TIMEOUT";
/// Overrides this host's identity (hostname) in the host hash.
pub const HOSTNAME: &str = "KOLO_HOSTNAME";
/// Horovod's name for [`HOSTNAME`], accepted when [`HOSTNAME`] is unset.
pub const HOROVOD_HOSTNAME: &str = "HOROVOD_HOSTNAME";
/// Extra salt mixed into the host hash (e.g. a container id).
pub const HOST_HASH_SALT: &str = "KOLO_HOST_HASH_SALT";
/// The IP address or network interface name the worker's data plane listens on (default: the
/// local address of the interface that reaches the driver).
pub const DATA_ADDR: &str = "KOLO_DATA_ADDR";
/// kolorun: seconds the surviving ranks get to exit by themselves after a failure; default 3.
pub const ABORT_GRACE_SECONDS: &str = "KOLO_ABORT_GRACE_SECONDS";
/// kolorun: seconds without a heartbeat after which the driver declares a rank lost; default 30.
pub const HEARTBEAT_TIMEOUT_SECONDS: &str = "KOLO_HEARTBEAT_TIMEOUT_SECONDS";
/// Elastic jobs: the driver's `--elastic-timeout` in seconds, set by the launcher so a worker's
/// registration waits as long as the driver's elastic rounds may (unset: the start timeout).
pub const ELASTIC_TIMEOUT: &str = "KOLO_ELASTIC_TIMEOUT";
/// Set to `1` for a worker its launcher started to join a running elastic job (an added
/// task): its first `init()` first loads what its framework loads lazily (e.g. torch's
/// optimizers import `torch._dynamo` at first use), since the running ranks wait for it from
/// its registration on.
pub const ELASTIC_JOINING: &str = "KOLO_ELASTIC_JOINING";

/// How long a registration may wait: the start timeout, or [`ELASTIC_TIMEOUT`] when that is
/// set and longer. Errors: `Config` when [`ELASTIC_TIMEOUT`] is not a number of seconds.
pub fn registration_wait(start_timeout: Duration) -> Result<Duration> {
    match std::env::var(ELASTIC_TIMEOUT) {
        Ok(text) => Ok(start_timeout.max(parse_seconds(ELASTIC_TIMEOUT, &text)?)),
        Err(_) => Ok(start_timeout),
    }
}

/// The default for [`START_TIMEOUT`].
pub const DEFAULT_START_TIMEOUT: Duration = Duration::from_secs(30);

/// What a launched worker learns from its environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerEnv {
    /// `host:port` of the job driver service ([`DRIVER_ADDR`]).
    pub driver_addr: String,
    /// The job secret ([`JOB_SECRET`]).
    pub secret: JobSecret,
    /// The job id ([`JOB_ID`]).
    pub job_id: JobId,
    /// This worker's task index ([`TASK_INDEX`]).
    pub task_index: u32,
    /// The number of tasks ([`NUM_TASKS`]).
    pub num_tasks: u32,
    /// How long registration may take ([`START_TIMEOUT`]).
    pub start_timeout: Duration,
    /// Host identity override ([`HOSTNAME`] or [`HOROVOD_HOSTNAME`]).
    pub hostname: Option<String>,
    /// Host hash salt ([`HOST_HASH_SALT`]).
    pub host_hash_salt: Option<String>,
    /// Data-plane IP or interface override ([`DATA_ADDR`]).
    pub data_addr: Option<String>,
}

impl WorkerEnv {
    /// Reads the process environment. `Ok(None)` when [`DRIVER_ADDR`] is unset (the process was
    /// not launched as part of a job); a `Config` error naming the variable when one is missing
    /// or malformed.
    pub fn from_env() -> Result<Option<Self>> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Like [`WorkerEnv::from_env`], reading variables through `lookup` (empty values count as
    /// unset).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Option<Self>> {
        let get = |name: &str| lookup(name).filter(|value| !value.trim().is_empty());
        let Some(driver_addr) = get(DRIVER_ADDR) else {
            return Ok(None);
        };
        let driver_addr = driver_addr.trim().to_owned();
        check_host_port(&driver_addr)?;
        let required = |name: &str| {
            get(name).ok_or_else(|| {
                Error::Config(format!(
                    "{DRIVER_ADDR} is set but {name} is not; a worker launched into a job needs \
                     both (start workers with kolorun, or set every KOLO_* variable)"
                ))
            })
        };
        let secret = JobSecret::from_hex(&required(JOB_SECRET)?, JOB_SECRET)?;
        let job_id = JobId::from_hex(&required(JOB_ID)?, JOB_ID)?;
        let task_index = parse_u32(TASK_INDEX, &required(TASK_INDEX)?)?;
        let num_tasks = parse_u32(NUM_TASKS, &required(NUM_TASKS)?)?;
        if num_tasks == 0 {
            return Err(Error::Config(format!(
                "{NUM_TASKS}=0: a job needs at least one task"
            )));
        }
        if task_index >= num_tasks {
            return Err(Error::Config(format!(
                "{TASK_INDEX}={task_index} is out of range for {NUM_TASKS}={num_tasks} \
                 (expected 0..={})",
                num_tasks - 1
            )));
        }
        let start_timeout = match get(START_TIMEOUT) {
            Some(text) => parse_seconds(START_TIMEOUT, &text)?,
            None => DEFAULT_START_TIMEOUT,
        };
        Ok(Some(Self {
            driver_addr,
            secret,
            job_id,
            task_index,
            num_tasks,
            start_timeout,
            hostname: get(HOSTNAME).or_else(|| get(HOROVOD_HOSTNAME)),
            host_hash_salt: get(HOST_HASH_SALT),
            data_addr: get(DATA_ADDR),
        }))
    }

    /// The variables that reproduce this environment in a child process (optional ones only
    /// when set). The secret is among them: never log the result.
    pub fn to_vars(&self) -> Vec<(&'static str, String)> {
        let mut vars = vec![
            (DRIVER_ADDR, self.driver_addr.clone()),
            (JOB_SECRET, self.secret.to_hex()),
            (JOB_ID, self.job_id.to_hex()),
            (TASK_INDEX, self.task_index.to_string()),
            (NUM_TASKS, self.num_tasks.to_string()),
            (START_TIMEOUT, format_seconds(self.start_timeout)),
        ];
        let optional = [
            (HOSTNAME, &self.hostname),
            (HOST_HASH_SALT, &self.host_hash_salt),
            (DATA_ADDR, &self.data_addr),
        ];
        vars.extend(
            optional
                .into_iter()
                .filter_map(|(name, value)| Some((name, value.clone()?))),
        );
        vars
    }
}

/// The rank variables every rank sees before its user code runs, as horovodrun 0.28.1 sets them
/// (`horovod/runner/gloo_run.py`: `create_slot_env_vars`, `create_run_env_vars`), next to kolo's
/// own: `KOLO_RANK`, `KOLO_SIZE`, `KOLO_LOCAL_RANK`, `KOLO_LOCAL_SIZE`, `KOLO_CROSS_RANK`,
/// `KOLO_CROSS_SIZE`, the same six with the `HOROVOD_` prefix, `HOROVOD_HOSTNAME`, and
/// `HOROVOD_CONTROLLER=gloo` / `HOROVOD_CPU_OPERATIONS=gloo` (kolo's own transport plays Gloo's
/// role). kolorun, the Spark rank process and the Ray actor all set exactly these.
///
/// ```
/// use kolo_collective::control::{env::rank_vars, Assignment};
///
/// let a = Assignment { task_index: 1, rank: 1, size: 2, local_rank: 0, local_size: 1,
///                      cross_rank: 1, cross_size: 2 };
/// let vars = rank_vars(&a, "node2");
/// assert!(vars.contains(&("HOROVOD_RANK".to_owned(), "1".to_owned())));
/// assert!(vars.contains(&("HOROVOD_HOSTNAME".to_owned(), "node2".to_owned())));
/// ```
pub fn rank_vars(assignment: &crate::control::Assignment, hostname: &str) -> Vec<(String, String)> {
    let values = [
        ("RANK", assignment.rank),
        ("SIZE", assignment.size),
        ("LOCAL_RANK", assignment.local_rank),
        ("LOCAL_SIZE", assignment.local_size),
        ("CROSS_RANK", assignment.cross_rank),
        ("CROSS_SIZE", assignment.cross_size),
    ];
    let mut vars = Vec::with_capacity(2 * values.len() + 3);
    for prefix in ["KOLO_", "HOROVOD_"] {
        for (name, value) in values {
            vars.push((format!("{prefix}{name}"), value.to_string()));
        }
    }
    vars.push((HOROVOD_HOSTNAME.to_owned(), hostname.to_owned()));
    vars.push(("HOROVOD_CONTROLLER".to_owned(), "gloo".to_owned()));
    vars.push(("HOROVOD_CPU_OPERATIONS".to_owned(), "gloo".to_owned()));
    vars
}

/// Parses a number of seconds (`"30"`, `"2.5"`) from the setting `name`; must be positive.
pub fn parse_seconds(name: &str, text: &str) -> Result<Duration> {
    let seconds: f64 = text.trim().parse().map_err(|_| {
        Error::Config(format!(
            "{name}={text:?} is not a number of seconds (e.g. 30 or 2.5)"
        ))
    })?;
    if !(seconds.is_finite() && seconds > 0.0 && seconds < 1e9) {
        return Err(Error::Config(format!(
            "{name}={text:?} must be a positive number of seconds"
        )));
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// The text form of a duration in seconds, as [`parse_seconds`] reads it.
pub fn format_seconds(duration: Duration) -> String {
    let seconds = duration.as_secs_f64();
    if seconds.fract() == 0.0 {
        format!("{}", duration.as_secs())
    } else {
        format!("{seconds}")
    }
}

fn parse_u32(name: &str, text: &str) -> Result<u32> {
    text.trim()
        .parse()
        .map_err(|_| Error::Config(format!("{name}={text:?} is not a non-negative integer")))
}

fn check_host_port(addr: &str) -> Result<()> {
    let valid = addr
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p != 0));
    if valid {
        Ok(())
    } else {
        Err(Error::Config(format!(
            "{DRIVER_ADDR}={addr:?} is not host:port (e.g. 10.0.0.5:41234)"
        )))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn lookup(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| map.get(name).cloned()
    }

    fn full() -> Vec<(&'static str, String)> {
        vec![
            (DRIVER_ADDR, "127.0.0.1:4000".into()),
            (JOB_SECRET, JobSecret::generate().to_hex()),
            (JOB_ID, JobId::generate().to_hex()),
            (TASK_INDEX, "1".into()),
            (NUM_TASKS, "2".into()),
        ]
    }

    fn parse(vars: &[(&'static str, String)]) -> Result<Option<WorkerEnv>> {
        let pairs: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
        WorkerEnv::from_lookup(lookup(&pairs))
    }

    #[test]
    fn unset_driver_addr_means_not_launched() {
        assert_eq!(WorkerEnv::from_lookup(lookup(&[])).unwrap(), None);
        assert_eq!(
            WorkerEnv::from_lookup(lookup(&[(DRIVER_ADDR, "")])).unwrap(),
            None
        );
    }

    #[test]
    fn full_env_parses_and_round_trips() {
        let mut vars = full();
        vars.push((START_TIMEOUT, "2.5".into()));
        vars.push((HOROVOD_HOSTNAME, "hv".into()));
        let env = parse(&vars).unwrap().unwrap();
        assert_eq!(env.task_index, 1);
        assert_eq!(env.num_tasks, 2);
        assert_eq!(env.start_timeout, Duration::from_millis(2500));
        assert_eq!(env.hostname.as_deref(), Some("hv"));
        let again = parse(&env.to_vars()).unwrap().unwrap();
        assert_eq!(again, env);
        let mut vars = full();
        vars.push((HOSTNAME, "kolo".into()));
        vars.push((HOROVOD_HOSTNAME, "hv".into()));
        assert_eq!(
            parse(&vars).unwrap().unwrap().hostname.as_deref(),
            Some("kolo")
        );
        assert_eq!(
            parse(&full()).unwrap().unwrap().start_timeout,
            DEFAULT_START_TIMEOUT
        );
    }

    #[test]
    fn malformed_variables_are_named() {
        let cases: Vec<(&'static str, &str, &str)> = vec![
            (DRIVER_ADDR, "nohostport", DRIVER_ADDR),
            (TASK_INDEX, "x", TASK_INDEX),
            (TASK_INDEX, "2", TASK_INDEX),
            (NUM_TASKS, "0", NUM_TASKS),
            (START_TIMEOUT, "soon", START_TIMEOUT),
            (START_TIMEOUT, "-1", START_TIMEOUT),
            (JOB_ID, "abc", JOB_ID),
            (JOB_SECRET, "00", JOB_SECRET),
        ];
        for (name, value, expected) in cases {
            let mut vars: Vec<(&'static str, String)> =
                full().into_iter().filter(|(k, _)| *k != name).collect();
            vars.push((name, value.into()));
            let err = parse(&vars).unwrap_err();
            assert!(matches!(err, Error::Config(_)), "{err:?}");
            assert!(err.to_string().contains(expected), "{name}={value}: {err}");
        }
        let vars: Vec<_> = full().into_iter().filter(|(k, _)| *k != JOB_ID).collect();
        let err = parse(&vars).unwrap_err().to_string();
        assert!(err.contains(JOB_ID) && err.contains(DRIVER_ADDR), "{err}");
    }
}

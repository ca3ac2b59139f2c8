//! The launcher's side of a job, shared by `kolo.spark.run` and `kolo.ray.RayExecutor`: the
//! job driver service plus what it collects from the tasks — start reports (attempt, host,
//! pid), output lines labelled with ranks, user messages, exits, results and the first failure.
//! The worker's side is [`crate::worker::session`].

use std::net::SocketAddr;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use crate::control::ids::{JobId, JobSecret};
use crate::control::proto::{task_event, TaskEvent};
use crate::control::service::MAX_TASKS;
use crate::control::{DriverConfig, DriverService, ElasticConfig, PeerAssignment, WorkerEnv};
use crate::error::{Error, Result};
use crate::AbortCause;

/// The names of the job's key-value entries a launcher and its workers share.
pub mod keys {
    /// The pickled `(fn, args, kwargs)` every worker fetches.
    pub const PAYLOAD: &str = "kolo.launch/payload";

    /// The key holding task `task_index`'s pickled result.
    pub fn result(task_index: u32) -> String {
        format!("kolo.launch/result/{task_index}")
    }
}

/// How to start the driver of one launch.
#[derive(Debug, Clone)]
pub struct LaunchDriverOptions {
    /// Where the service listens (the driver host Spark uses; port 0 picks one).
    pub bind: SocketAddr,
    /// How many tasks (ranks) the job has (`num_proc`, `num_workers`).
    pub num_tasks: usize,
    /// Every task must register this long after the start.
    pub start_timeout: Duration,
    /// A registered rank silent this long gets the job aborted.
    pub heartbeat_timeout: Duration,
}

/// What a task reported when it started its rank process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskStart {
    /// The launcher's attempt number for the task (Spark's task attempt; 0 on Ray).
    pub attempt: u32,
    /// The host the task runs on (an executor's hostname, a Ray node).
    pub hostname: String,
    /// The pid of the process that runs the rank.
    pub pid: u32,
}

/// Something a task sent, with the task's rank when ranks are assigned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DriverEvent {
    /// The task started its rank process.
    Started {
        /// The task index (Spark partition id, Ray actor index).
        task: u32,
        /// What it reported.
        start: TaskStart,
    },
    /// One output line of the rank process.
    Output {
        /// The task index.
        task: u32,
        /// The rank, once assigned.
        rank: Option<u32>,
        /// From stderr (else stdout).
        stderr: bool,
        /// The line, without its newline.
        text: Vec<u8>,
        /// When the task read it (microseconds since the Unix epoch).
        unix_micros: u64,
    },
    /// A pickled object the user's function sent with `send_to_driver`.
    Message {
        /// The task index.
        task: u32,
        /// The rank, once assigned.
        rank: Option<u32>,
        /// The pickled object.
        data: Vec<u8>,
    },
    /// The rank process ended.
    Exited {
        /// The task index.
        task: u32,
        /// The rank, once assigned.
        rank: Option<u32>,
        /// Exit status 0.
        success: bool,
        /// How it ended.
        description: String,
    },
}

#[derive(Debug, Default)]
struct Collected {
    starts: Vec<Option<TaskStart>>,
    exits: Vec<Option<(bool, String)>>,
    ranks: Option<Vec<u32>>,
}

/// The driver of one launch. Dropping it shuts the service down.
#[derive(Debug)]
pub struct LaunchDriver {
    service: DriverService,
    config: DriverConfig,
    collected: Mutex<Collected>,
}

impl LaunchDriver {
    /// Starts the job driver service with a fresh secret and job id.
    pub fn start(options: &LaunchDriverOptions) -> Result<Self> {
        Self::start_with_identity(options, JobSecret::generate(), JobId::generate())
    }

    /// Starts the job driver service for a job whose secret and id the workers already know
    /// (ranks launched by `mpirun`/`srun` without mpi4py share the secret the user exported).
    pub fn start_with_identity(
        options: &LaunchDriverOptions,
        secret: JobSecret,
        job_id: JobId,
    ) -> Result<Self> {
        Self::start_configured(options, secret, job_id, None)
    }

    /// Starts the driver of an elastic launch (see [`ElasticConfig`]): `options.num_tasks`
    /// tasks at first; [`LaunchDriver::add_tasks`] and [`LaunchDriver::remove_task`] change
    /// the live tasks, and a failed task leaves the job instead of aborting it.
    pub fn start_elastic(options: &LaunchDriverOptions, elastic: ElasticConfig) -> Result<Self> {
        Self::start_configured(
            options,
            JobSecret::generate(),
            JobId::generate(),
            Some(elastic),
        )
    }

    fn start_configured(
        options: &LaunchDriverOptions,
        secret: JobSecret,
        job_id: JobId,
        elastic: Option<ElasticConfig>,
    ) -> Result<Self> {
        if options.num_tasks == 0 {
            return Err(Error::InvalidArgument(
                "a job needs at least 1 task (num_proc, num_workers)".to_owned(),
            ));
        }
        let config = DriverConfig {
            bind: options.bind,
            start_timeout: options.start_timeout,
            heartbeat_timeout: options.heartbeat_timeout,
            secret,
            job_id,
            elastic,
            ..DriverConfig::new(options.num_tasks)
        };
        let service = DriverService::start(config.clone())?;
        let collected = Collected {
            starts: vec![None; options.num_tasks],
            exits: vec![None; options.num_tasks],
            ranks: None,
        };
        Ok(Self {
            service,
            config,
            collected: Mutex::new(collected),
        })
    }

    /// The `host:port` tasks connect to.
    pub fn addr(&self) -> SocketAddr {
        self.service.addr()
    }

    /// The job environment of task `task_index` (add [`WorkerEnv::to_vars`] to its process).
    /// In an elastic job, whose task indices grow as tasks are added and never come back,
    /// `KOLO_NUM_TASKS` counts the indices issued up to this one (at least `task_index + 1`).
    pub fn worker_env(&self, task_index: u32) -> WorkerEnv {
        let num_tasks = u32::try_from(self.config.num_tasks).unwrap_or(u32::MAX);
        let num_tasks = if self.config.elastic.is_some() {
            num_tasks.max(task_index.saturating_add(1))
        } else {
            num_tasks
        };
        WorkerEnv {
            driver_addr: self.service.addr().to_string(),
            secret: self.config.secret.clone(),
            job_id: self.config.job_id,
            task_index,
            num_tasks,
            start_timeout: self.config.start_timeout,
            hostname: None,
            host_hash_salt: None,
            data_addr: None,
        }
    }

    /// Publishes the pickled `(fn, args, kwargs)` for the workers. Errors: `InvalidArgument`
    /// when it passes the key-value space's caps.
    pub fn put_payload(&self, payload: Vec<u8>) -> Result<()> {
        self.service.kv_put(keys::PAYLOAD, payload)
    }

    /// Task `task_index`'s pickled result, once it returned one.
    pub fn result(&self, task_index: u32) -> Option<Vec<u8>> {
        self.service
            .kv_value(&keys::result(task_index))
            .map(|value| value.to_vec())
    }

    /// Every task's assignment (by task index) once all registered.
    pub fn assignment(&self) -> Option<Vec<PeerAssignment>> {
        self.service.assignment()
    }

    /// What task `task_index` reported at its start, if it did.
    pub fn task_start(&self, task_index: u32) -> Option<TaskStart> {
        self.lock()
            .starts
            .get(task_index as usize)
            .cloned()
            .flatten()
    }

    /// `(success, description)` of task `task_index`'s rank process, once it ended.
    pub fn task_exit(&self, task_index: u32) -> Option<(bool, String)> {
        self.lock()
            .exits
            .get(task_index as usize)
            .cloned()
            .flatten()
    }

    /// How many ranks joined and have not left (`shutdown()`) yet; 0 before every task joined.
    pub fn active_ranks(&self) -> usize {
        self.service.active_ranks()
    }

    /// True once every task's rank process ended.
    pub fn all_exited(&self) -> bool {
        self.lock().exits.iter().all(Option::is_some)
    }

    /// The job's abort cause (the first failure), if any.
    pub fn failure(&self) -> Option<AbortCause> {
        self.service.abort_cause()
    }

    /// Records that task `task_index` failed (its process died, its actor was lost): the
    /// driver names its rank and host in the abort cause and aborts the job.
    pub fn report_task_failure(&self, task_index: u32, message: impl Into<String>) {
        self.service.report_task_failure(task_index, message);
    }

    /// Elastic launches: announces tasks the launcher started (see
    /// [`DriverService::add_tasks`]); their events are collected like the first tasks'.
    pub fn add_tasks(&self, task_indices: &[u32]) -> Result<()> {
        self.service.add_tasks(task_indices)?;
        let mut collected = self.lock();
        let needed = task_indices
            .iter()
            .map(|index| *index as usize + 1)
            .max()
            .unwrap_or(0);
        if needed > collected.starts.len() {
            collected.starts.resize(needed, None);
            collected.exits.resize(needed, None);
        }
        for index in task_indices {
            // A re-used index is a new process: forget the old one's start and exit.
            collected.starts[*index as usize] = None;
            collected.exits[*index as usize] = None;
        }
        Ok(())
    }

    /// Elastic launches: task `task_index` is gone (see [`DriverService::remove_task`]).
    pub fn remove_task(&self, task_index: u32, reason: impl Into<String>) -> Result<bool> {
        self.service.remove_task(task_index, reason)
    }

    /// The live task indices (every task of a fixed launch), added tasks that have not
    /// registered yet included.
    pub fn live_tasks(&self) -> Vec<u32> {
        self.service.live_tasks()
    }

    /// Whether task `task_index` was added and has not registered yet (see
    /// [`DriverService::is_joining`]).
    pub fn is_joining(&self, task_index: u32) -> bool {
        self.service.is_joining(task_index)
    }

    /// Aborts the job: every task stops its rank process.
    pub fn abort(&self, message: impl Into<String>) {
        self.service.abort(AbortCause {
            rank: None,
            host: String::new(),
            message: message.into(),
        });
    }

    /// Takes what the tasks sent, waiting up to `timeout` for the first event.
    pub fn poll(&self, timeout: Duration) -> Result<Vec<DriverEvent>> {
        let raw = kolo_runtime::block_on(self.service.take_events(timeout))?;
        let mut collected = self.lock();
        if self.config.elastic.is_some() {
            // Ranks change with every elastic round: index the latest by task index.
            collected.ranks = self.service.assignment().map(|peers| {
                let mut ranks = vec![u32::MAX; collected.starts.len()];
                for peer in peers {
                    if let Some(slot) = ranks.get_mut(peer.task_index as usize) {
                        *slot = peer.rank;
                    }
                }
                ranks
            });
        } else if collected.ranks.is_none() {
            collected.ranks = self
                .service
                .assignment()
                .map(|peers| peers.iter().map(|peer| peer.rank).collect());
        }
        let mut events = Vec::with_capacity(raw.len());
        for (task, event) in raw {
            let rank = collected
                .ranks
                .as_ref()
                .and_then(|ranks| ranks.get(task as usize).copied())
                .filter(|rank| *rank != u32::MAX);
            if task as usize >= collected.starts.len() {
                if self.config.elastic.is_none() || task as usize >= MAX_TASKS {
                    log::warn!("an event from task {task}, which this job does not have; ignored");
                    continue;
                }
                // Elastic launches: a task the launcher has not added yet (a Spark task attempt
                // announcing itself before the launcher admits it with `add_tasks`).
                collected.starts.resize(task as usize + 1, None);
                collected.exits.resize(task as usize + 1, None);
            }
            if let Some(event) = convert(&mut collected, task, rank, event) {
                events.push(event);
            }
        }
        Ok(events)
    }

    /// Stops the service (idempotent).
    pub fn shutdown(&self) {
        self.service.shutdown();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Collected> {
        self.collected
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

fn convert(
    collected: &mut Collected,
    task: u32,
    rank: Option<u32>,
    event: TaskEvent,
) -> Option<DriverEvent> {
    let index = task as usize;
    Some(match event.kind? {
        task_event::Kind::Started(started) => {
            let start = TaskStart {
                attempt: started.attempt,
                hostname: started.hostname,
                pid: started.pid,
            };
            collected.starts[index] = Some(start.clone());
            DriverEvent::Started { task, start }
        }
        task_event::Kind::Output(line) => DriverEvent::Output {
            task,
            rank,
            stderr: line.stderr,
            text: line.text,
            unix_micros: line.unix_micros,
        },
        task_event::Kind::Message(data) => DriverEvent::Message { task, rank, data },
        task_event::Kind::Exited(exited) => {
            collected.exits[index] = Some((exited.success, exited.description.clone()));
            DriverEvent::Exited {
                task,
                rank,
                success: exited.success,
                description: exited.description,
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    use crate::control::proto::{TaskExited, TaskStarted};
    use crate::control::runner_watch::{LOST_WITH_RUNNER, RUNNER_GRACE};
    use crate::control::{ClientOptions, DriverClient};
    use crate::AbortSignal;

    fn options() -> LaunchDriverOptions {
        LaunchDriverOptions {
            bind: "127.0.0.1:0".parse().unwrap(),
            num_tasks: 1,
            start_timeout: Duration::from_secs(20),
            heartbeat_timeout: Duration::from_secs(20),
        }
    }

    /// Posts a `Started` event for `task` (attempt 1) as a Spark task runner does.
    fn post_started(driver: &LaunchDriver, task: u32) {
        let client = kolo_runtime::block_on(DriverClient::connect(
            &driver.addr().to_string(),
            &driver.config.secret,
            ClientOptions::default(),
        ))
        .unwrap()
        .unwrap();
        let started = TaskEvent {
            kind: Some(task_event::Kind::Started(TaskStarted {
                attempt: 1,
                hostname: "host-a".into(),
                pid: 42,
            })),
        };
        kolo_runtime::block_on(client.post(task, vec![started]))
            .unwrap()
            .unwrap();
    }

    #[test]
    fn an_elastic_launch_hears_tasks_it_has_not_added_yet() {
        // A Spark task attempt reports its start before the launcher admits it.
        let driver = LaunchDriver::start_elastic(&options(), ElasticConfig::new(1, 2)).unwrap();
        post_started(&driver, 5);
        let events = driver.poll(Duration::from_secs(10)).unwrap();
        assert!(
            matches!(&events[..], [DriverEvent::Started { task: 5, start }] if start.attempt == 1),
            "{events:?}"
        );
        assert_eq!(driver.task_start(5).map(|s| s.pid), Some(42));
        assert_eq!(driver.task_exit(5), None);
        driver.add_tasks(&[5]).unwrap();
        assert_eq!(driver.live_tasks(), vec![0, 5]);
    }

    fn runner_client(driver: &LaunchDriver) -> DriverClient {
        kolo_runtime::block_on(DriverClient::connect(
            &driver.addr().to_string(),
            &driver.config.secret,
            ClientOptions::default(),
        ))
        .unwrap()
        .unwrap()
    }

    /// Polls until an `Exited` event arrives (at most `within`); returns it and when.
    fn next_exit(driver: &LaunchDriver, within: Duration) -> Option<(DriverEvent, Instant)> {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            for event in driver.poll(Duration::from_millis(100)).unwrap() {
                if matches!(event, DriverEvent::Exited { .. }) {
                    return Some((event, Instant::now()));
                }
            }
        }
        None
    }

    #[test]
    fn a_task_whose_runner_goes_away_without_an_exit_is_lost_within_the_grace() {
        // The Spark executor died: its task runner's watch closes and no exit is posted.
        let driver = LaunchDriver::start_elastic(&options(), ElasticConfig::new(1, 2)).unwrap();
        let (description, after) = lost_runner(&driver);
        assert!(description.starts_with(LOST_WITH_RUNNER), "{description}");
        assert!(after >= RUNNER_GRACE, "lost before the grace passed");
        // Well before the heartbeat timeout (20 s), even on a loaded machine.
        assert!(after < Duration::from_secs(10), "{after:?}");
        assert_eq!(driver.live_tasks(), Vec::<u32>::new());
        assert_eq!(driver.task_exit(0).map(|exit| exit.0), Some(false));
    }

    /// The runner watch of task 0 closes without an exit (its executor died): waits for the
    /// exit the driver records for it and returns its description and how long after the
    /// close it came.
    fn lost_runner(driver: &LaunchDriver) -> (String, Duration) {
        let runner = runner_client(driver);
        runner.start_task_watcher(0, AbortSignal::new()).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        let closed = Instant::now();
        runner.stop_background();
        let (event, at) = next_exit(driver, RUNNER_GRACE * 4).expect("no exit recorded");
        let DriverEvent::Exited {
            task,
            success,
            description,
            ..
        } = event
        else {
            unreachable!()
        };
        assert_eq!((task, success), (0, false));
        (description, at - closed)
    }

    #[test]
    fn a_fixed_job_whose_runner_goes_away_records_the_exit_and_aborts_naming_the_task() {
        let driver = LaunchDriver::start(&options()).unwrap();
        let (description, after) = lost_runner(&driver);
        assert!(description.starts_with(LOST_WITH_RUNNER), "{description}");
        assert!(
            after >= RUNNER_GRACE && after < Duration::from_secs(10),
            "{after:?}"
        );
        let cause = driver.failure().expect("the job was not aborted");
        assert!(
            cause
                .message
                .starts_with("task 0's rank process was lost with its task runner"),
            "{cause}"
        );
        // Already aborted (a survivor saw the broken connection first): the exit is still
        // recorded, so the launcher does not wait for it, and the first cause stays.
        let driver = LaunchDriver::start(&options()).unwrap();
        driver.abort("rank 1 lost its peer");
        let (description, _) = lost_runner(&driver);
        assert!(description.starts_with(LOST_WITH_RUNNER), "{description}");
        assert_eq!(driver.failure().unwrap().message, "rank 1 lost its peer");
    }

    #[test]
    fn a_runner_that_posts_its_exit_before_closing_its_watch_is_not_lost() {
        let elastic = LaunchDriver::start_elastic(&options(), ElasticConfig::new(1, 2)).unwrap();
        let fixed = LaunchDriver::start(&options()).unwrap();
        for driver in [elastic, fixed] {
            let runner = runner_client(&driver);
            runner.start_task_watcher(0, AbortSignal::new()).unwrap();
            std::thread::sleep(Duration::from_millis(300));
            let exited = TaskEvent {
                kind: Some(task_event::Kind::Exited(TaskExited {
                    success: true,
                    description: "exited with code 0".into(),
                })),
            };
            kolo_runtime::block_on(runner.post(0, vec![exited]))
                .unwrap()
                .unwrap();
            runner.stop_background();
            let (event, _) = next_exit(&driver, Duration::from_secs(5)).unwrap();
            assert!(
                matches!(&event, DriverEvent::Exited { success: true, .. }),
                "{event:?}"
            );
            assert!(
                next_exit(&driver, RUNNER_GRACE * 2).is_none(),
                "a second exit was recorded"
            );
            assert_eq!(driver.live_tasks(), vec![0]);
            assert!(driver.failure().is_none(), "{:?}", driver.failure());
        }
    }

    #[test]
    fn a_task_whose_rank_still_sends_heartbeats_is_not_lost_with_its_runner_watch() {
        // The runner's connection broke but its rank lives: its heartbeats keep the task.
        let driver = LaunchDriver::start_elastic(&options(), ElasticConfig::new(1, 2)).unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let (me, rank_client) = crate::control::join_job(
            &driver.worker_env(0),
            listener.local_addr().unwrap(),
            AbortSignal::new(),
        )
        .unwrap();
        assert_eq!((me.rank, me.size), (0, 1));
        let runner = runner_client(&driver);
        runner.start_task_watcher(0, AbortSignal::new()).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        runner.stop_background();
        assert!(
            next_exit(&driver, RUNNER_GRACE * 2).is_none(),
            "the task was declared lost"
        );
        assert_eq!(driver.live_tasks(), vec![0]);
        rank_client.stop_background();
    }

    #[test]
    fn a_fixed_launch_ignores_tasks_it_does_not_have() {
        let driver = LaunchDriver::start(&options()).unwrap();
        post_started(&driver, 5);
        let events = driver.poll(Duration::from_millis(500)).unwrap();
        assert!(events.is_empty(), "{events:?}");
        assert_eq!(driver.task_start(5), None);
    }
}

//! The task side: what one Spark task runs. It starts the rank process (its own process
//! group, killed if the task dies), forwards its output lines to the job driver, waits for it
//! while watching the driver's abort broadcast and the task's own interruption, stops it when
//! either fires, and reports its exit (and a failure) to the driver. Its watch stays open
//! until the exit is posted: in an elastic job the driver takes a watch that ends first as the
//! task's loss (its executor died), which it notices within about a second.

use std::io::{ErrorKind, Read};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use kolo_collective::control::proto::{task_event, OutputLine, TaskEvent, TaskExited, TaskStarted};
use kolo_collective::control::{ClientOptions, DriverClient, WorkerEnv};
use kolo_collective::launcher::process::{describe_exit, Launch, RankProcess};
use kolo_collective::AbortSignal;

use crate::error::{Error, Result};

/// How often the runner polls the child, the abort flag and the output queue.
const POLL: Duration = Duration::from_millis(20);
/// The longest the runner holds output lines before sending them.
const FLUSH_EVERY: Duration = Duration::from_millis(50);
/// Output is sent at the latest once this many bytes are waiting.
const FLUSH_BYTES: usize = 512 << 10;
/// Lines longer than this are sent in pieces.
const MAX_LINE: usize = 64 << 10;
/// How long the output readers may take to reach EOF after the child exited.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the child may take to exit after SIGKILL before the runner gives up on it.
const AFTER_KILL: Duration = Duration::from_secs(5);

/// How to run one task's rank process.
#[derive(Debug, Clone)]
pub struct TaskOptions {
    /// The job this task belongs to (driver address, secret, task index, start timeout).
    pub worker: WorkerEnv,
    /// The program to execute (the Python interpreter).
    pub program: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Variables added to the inherited environment (the user's `env`, the `KOLO_*` job
    /// variables, the task's GPU addresses).
    pub envs: Vec<(String, String)>,
    /// Spark's task attempt number, for reports.
    pub attempt: u32,
    /// This executor's hostname, for reports.
    pub hostname: String,
    /// After SIGTERM, how long the child gets before SIGKILL.
    pub term_grace: Duration,
}

/// How the rank process ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskOutcome {
    /// It exited with status 0.
    pub success: bool,
    /// `exited with code 0`, `was killed by signal 9 (SIGKILL)`, or why it was stopped.
    pub description: String,
}

/// Runs the rank process of one task to its end; see the module docs. `interrupted` is polled
/// (the Python binding sets it on Ctrl-C or when the task is killed) and stops the child.
/// Returns `Ok` for every way the child ends (a failure has already been reported to the
/// driver); errors are for a runner that could not reach the driver or start the child.
///
/// The child is spawned on the calling thread, which is the thread its parent-death signal is
/// tied to: the thread must stay alive while the child runs (this function returns only after
/// the child exited or was killed).
pub fn run_task(options: &TaskOptions, interrupted: &dyn Fn() -> bool) -> Result<TaskOutcome> {
    let task = options.worker.task_index;
    let client = kolo_runtime::block_on(DriverClient::connect(
        &options.worker.driver_addr,
        &options.worker.secret,
        ClientOptions {
            connect_timeout: options.worker.start_timeout,
            ..ClientOptions::default()
        },
    ))??;
    let launch = Launch {
        program: options.program.clone(),
        args: options.args.clone(),
        env_remove: Vec::new(),
        envs: options.envs.clone(),
        remote: false,
        stdin_text: String::new(),
    };
    let (mut child, (stdout, stderr)) = RankProcess::spawn(task, &options.hostname, &launch)
        .map_err(|source| Error::Spawn {
            program: options.program.clone(),
            source,
        })?;
    log::info!(
        "task {task} (attempt {}) started its rank process, pid {}",
        options.attempt,
        child.pid()
    );
    let started = TaskEvent {
        kind: Some(task_event::Kind::Started(TaskStarted {
            attempt: options.attempt,
            hostname: options.hostname.clone(),
            pid: child.pid(),
        })),
    };
    let mut sender = OutputSender::new(client.clone(), task);
    sender.push(started, 0);
    let abort = AbortSignal::new();
    let supervised = supervise(
        options,
        &client,
        &mut child,
        (stdout, stderr),
        &mut sender,
        &abort,
        interrupted,
    );
    let outcome = match supervised {
        Ok(outcome) => outcome,
        Err(err) => {
            child.stop(libc::SIGKILL);
            client.stop_background();
            return Err(err);
        }
    };
    let exited = TaskEvent {
        kind: Some(task_event::Kind::Exited(TaskExited {
            success: outcome.success,
            description: outcome.description.clone(),
        })),
    };
    sender.push(exited, 0);
    sender.flush();
    // Only now: the driver takes a task watch that ends before the exit as the task's
    // loss (kolo_collective::control::runner_watch).
    client.stop_background();
    Ok(outcome)
}

fn supervise(
    options: &TaskOptions,
    client: &DriverClient,
    child: &mut RankProcess,
    (stdout, stderr): (impl Read + Send + 'static, impl Read + Send + 'static),
    sender: &mut OutputSender,
    abort: &AbortSignal,
    interrupted: &dyn Fn() -> bool,
) -> Result<TaskOutcome> {
    let task = options.worker.task_index;
    client.start_task_watcher(task, abort.clone())?;
    let (lines, received) = mpsc::channel();
    let readers = [
        read_lines(stdout, false, lines.clone(), task)?,
        read_lines(stderr, true, lines, task)?,
    ];
    let mut stop_reason: Option<String> = None;
    let mut stopping: Option<(Instant, bool)> = None;
    let status = loop {
        if let Some(status) = child.poll().map_err(kolo_collective::Error::from)? {
            break Some(status);
        }
        sender.take_from(&received);
        if stop_reason.is_none() {
            if let Some(cause) = abort.cause() {
                stop_reason = Some(format!("stopped: {cause}"));
            } else if interrupted() {
                stop_reason = Some("stopped: the Spark task was interrupted".to_owned());
            }
        }
        if stop_reason.is_some() {
            match stopping {
                None => {
                    child.stop(libc::SIGTERM);
                    stopping = Some((Instant::now(), false));
                }
                Some((since, false)) if since.elapsed() >= options.term_grace => {
                    child.stop(libc::SIGKILL);
                    stopping = Some((Instant::now(), true));
                }
                Some((since, true)) if since.elapsed() >= AFTER_KILL => {
                    log::error!("task {task}: the rank process did not die after SIGKILL");
                    break None;
                }
                _ => {}
            }
        }
        std::thread::sleep(POLL);
    };
    // The process group was killed when the exit was seen, so the pipes reach EOF.
    let deadline = Instant::now() + DRAIN_TIMEOUT;
    for reader in readers {
        while !reader.is_finished() && Instant::now() < deadline {
            sender.take_from(&received);
            std::thread::sleep(POLL);
        }
        if reader.is_finished() {
            let _ = reader.join();
        }
    }
    sender.take_from(&received);
    sender.flush();
    let (success, description) = match status {
        Some(status) => {
            let (text, _, _) = describe_exit(status, false);
            (status.success(), text)
        }
        None => (false, "could not be stopped".to_owned()),
    };
    if let Some(reason) = stop_reason {
        return Ok(TaskOutcome {
            success: false,
            description: format!("{reason} (the rank process {description})"),
        });
    }
    if !success {
        let message = format!(
            "the rank process of Spark task {task} (attempt {}) on host {} {description}",
            options.attempt, options.hostname
        );
        if let Err(err) = kolo_runtime::block_on(client.report_task_failure(task, &message))
            .map_err(Error::from)
            .and_then(|sent| sent.map_err(Error::from))
        {
            log::warn!("task {task}: could not report its failure to the job driver: {err}");
        }
    }
    Ok(TaskOutcome {
        success,
        description,
    })
}

/// A reader thread: splits `pipe` into lines (long ones in pieces) stamped with the time read.
fn read_lines(
    mut pipe: impl Read + Send + 'static,
    stderr: bool,
    lines: mpsc::Sender<OutputLine>,
    task: u32,
) -> Result<JoinHandle<()>> {
    let name = format!(
        "kolo-task{task}-{}",
        if stderr { "stderr" } else { "stdout" }
    );
    let spawned = std::thread::Builder::new().name(name).spawn(move || {
        let mut pending: Vec<u8> = Vec::new();
        let mut buffer = vec![0u8; 64 << 10];
        let emit = |text: Vec<u8>| {
            lines
                .send(OutputLine {
                    stderr,
                    text,
                    unix_micros: unix_micros(),
                })
                .is_ok()
        };
        loop {
            let read = match pipe.read(&mut buffer) {
                Ok(0) => break,
                Ok(read) => read,
                Err(err) if err.kind() == ErrorKind::Interrupted => continue,
                Err(err) => {
                    log::debug!("task {task}: reading the rank's output: {err}");
                    break;
                }
            };
            pending.extend_from_slice(&buffer[..read]);
            while let Some(end) = pending.iter().position(|&b| b == b'\n') {
                let mut line: Vec<u8> = pending.drain(..=end).collect();
                line.pop();
                if !emit(line) {
                    return;
                }
            }
            while pending.len() >= MAX_LINE {
                let piece: Vec<u8> = pending.drain(..MAX_LINE).collect();
                if !emit(piece) {
                    return;
                }
            }
        }
        if !pending.is_empty() {
            emit(pending);
        }
    });
    spawned.map_err(|err| Error::Collective(err.into()))
}

fn unix_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|since| u64::try_from(since.as_micros()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Batches driver-bound events and posts them.
struct OutputSender {
    client: DriverClient,
    task: u32,
    waiting: Vec<TaskEvent>,
    bytes: usize,
    last_flush: Instant,
    /// Set after a failed post: output is dropped from then on (the driver is gone).
    broken: bool,
}

impl OutputSender {
    fn new(client: DriverClient, task: u32) -> Self {
        Self {
            client,
            task,
            waiting: Vec::new(),
            bytes: 0,
            last_flush: Instant::now(),
            broken: false,
        }
    }

    fn push(&mut self, event: TaskEvent, bytes: usize) {
        self.waiting.push(event);
        self.bytes += bytes;
    }

    /// Queues the lines the readers produced; posts when enough waited or long enough.
    fn take_from(&mut self, received: &mpsc::Receiver<OutputLine>) {
        while let Ok(line) = received.try_recv() {
            let bytes = line.text.len();
            self.push(
                TaskEvent {
                    kind: Some(task_event::Kind::Output(line)),
                },
                bytes,
            );
            if self.bytes >= FLUSH_BYTES {
                self.flush();
            }
        }
        if self.last_flush.elapsed() >= FLUSH_EVERY {
            self.flush();
        }
    }

    fn flush(&mut self) {
        self.last_flush = Instant::now();
        if self.waiting.is_empty() {
            return;
        }
        let events = std::mem::take(&mut self.waiting);
        self.bytes = 0;
        if self.broken {
            return;
        }
        let posted = kolo_runtime::block_on(self.client.post(self.task, events));
        if let Err(err) = posted
            .map_err(Error::from)
            .and_then(|sent| sent.map_err(Error::from))
        {
            log::warn!(
                "task {}: cannot send output to the job driver ({err}); dropping it",
                self.task
            );
            self.broken = true;
        }
    }
}

impl std::fmt::Debug for OutputSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutputSender")
            .field("task", &self.task)
            .field("waiting", &self.waiting.len())
            .finish()
    }
}

//! `kolorun`: starts a job's ranks locally and over ssh, runs the job driver they register
//! with, forwards their output with rank prefixes, and stops every rank as soon as one fails.
//! It speaks horovodrun 0.28.1's command line ([`HOROVODRUN_OPTIONS`]).
//!
//! The Python package's `kolorun` console script calls [`run`] with the arguments after the
//! program name and a callback that reports Ctrl-C; `kolo.run` calls [`run_function`]:
//!
//! ```no_run
//! let args: Vec<String> = ["-np", "2", "python", "train.py"].map(String::from).to_vec();
//! let code = kolo_collective::launcher::run(&args, &|| false).unwrap();
//! std::process::exit(code);
//! ```
//!
//! Each slot `i` runs the command with the launching environment minus a deny-list
//! ([`forward_env`]), `PYTHONUNBUFFERED=1`, `KOLO_DRIVER_ADDR`, `KOLO_JOB_SECRET`,
//! `KOLO_JOB_ID`, `KOLO_TASK_INDEX=i`, `KOLO_NUM_TASKS`, `KOLO_START_TIMEOUT` (and
//! `KOLO_HOSTNAME=<host entry>` when hosts were given), the rank variables horovodrun sets
//! ([`crate::control::env::rank_vars`]: kolorun assigns ranks statically from its slots, as
//! horovodrun does, and the driver's assignment is checked against them), plus the variables of
//! the tuning flags ([`LaunchArgs::engine_env`]). Hosts named `localhost` or this machine's
//! hostname run as local child processes (own session, killed if kolorun dies); every other
//! entry, including `127.0.0.1`, runs through `ssh` under a watchdog that stops the remote
//! command when the connection ends, and receives its environment on ssh's stdin.

mod args;
pub mod blacklist;
pub mod discovery;
mod elastic_args;
mod elastic_job;
pub mod forward_env;
mod hosts;
mod knobs;
mod output;
pub mod planner;
pub mod process;
mod remote;
mod supervise;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::mpsc;
use std::time::Duration;

pub use args::{
    notice_for, parse_args, HostSource, Invocation, LaunchArgs, HOROVODRUN_OPTIONS, USAGE,
};
pub use elastic_args::{
    resolve_elastic_timeout, CooldownRange, ElasticArgs, ElasticFlags,
    COOLDOWN_LOWER_LIMIT_SECONDS, COOLDOWN_UPPER_LIMIT_SECONDS, DEFAULT_ELASTIC_TIMEOUT,
    ELASTIC_TIMEOUT_ENV, HOROVOD_ELASTIC_TIMEOUT_ENV,
};
pub use hosts::{
    checked_host, host_problem, is_local, parse_hostfile, parse_hosts_flag, plan_slots, HostSlots,
};
pub use output::{Output, SharedWriter};
pub use remote::{
    quote, remote_script, ssh_args, stdin_env, HostKeyChecking, SshOptions, KNOWN_HOSTS_ENV,
    STRICT_HOST_KEY_CHECKING_ENV,
};

use crate::abort::AbortCause;
use crate::control::env::{self, parse_seconds, WorkerEnv};
use crate::control::launch::keys;
use crate::control::net::{is_ip_literal, local_ip_toward, resolve_nic_or_ip, system_hostname};
use crate::control::{assign_ranks, Assignment, DriverConfig, DriverService, JobId, JobSecret};
use crate::error::{Error, Result};
use output::{forward, open_rank_files, RankLabels, Stream};
use process::{Launch, RankProcess};
use supervise::{supervise, StopTiming};

/// Default for `KOLO_ABORT_GRACE_SECONDS`.
const DEFAULT_GRACE: Duration = Duration::from_secs(3);
/// Default for `KOLO_HEARTBEAT_TIMEOUT_SECONDS`.
const DEFAULT_HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long after SIGTERM kolorun sends SIGKILL.
const TERM_TO_KILL: Duration = Duration::from_secs(3);
/// How long kolorun waits for output threads after every rank exited.
const OUTPUT_DRAIN: Duration = Duration::from_secs(2);
/// Horovod's name for `KOLO_START_TIMEOUT`, read when that is unset.
const HOROVOD_START_TIMEOUT: &str = "HOROVOD_START_TIMEOUT";

/// How a [`run_function`] job ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FunctionRun {
    /// What kolorun would exit with: 0 when every rank succeeded.
    pub exit_code: i32,
    /// Each rank's pickled result, by rank (`None` for a rank that returned none).
    pub results: Vec<Option<Vec<u8>>>,
    /// The job's first failure (a rank's traceback, a lost rank, a start timeout).
    pub failure: Option<AbortCause>,
}

/// Runs kolorun with `args` (the arguments after the program name), writing to the process's
/// stdout and stderr. Returns the exit code: 0 when every rank succeeded, the failed rank's
/// exit code (128+N for signal N) on failure, 130 when `interrupted` (polled every ~100 ms)
/// returned true. Bad usage is an `Error::Config` with the fix in its message.
pub fn run(args: &[String], interrupted: &dyn Fn() -> bool) -> Result<i32> {
    run_with_output(args, interrupted, &Output::process())
}

/// [`run`] with injected output writers (rank lines, `--help`, and the failure summary).
pub fn run_with_output(
    args: &[String],
    interrupted: &dyn Fn() -> bool,
    output: &Output,
) -> Result<i32> {
    let parsed = match parse_args(args)? {
        Invocation::Help => {
            write_stdout(output, USAGE);
            return Ok(0);
        }
        Invocation::Version => {
            write_stdout(output, &format!("{}\n", env!("CARGO_PKG_VERSION")));
            return Ok(0);
        }
        Invocation::CheckBuild => {
            return Err(Error::Config(
                "kolorun: --check-build is answered by the Python `kolorun` script; run it \
                 through the installed kolorun command"
                    .into(),
            ))
        }
        Invocation::Launch(parsed) => *parsed,
    };
    if parsed.config_file.is_some() {
        return Err(Error::Config(
            "kolorun: --config-file is read by the Python `kolorun` script (it parses YAML); \
             run the installed kolorun command"
                .into(),
        ));
    }
    if parsed.controller.as_deref() == Some("mpi") {
        return Err(Error::Config(
            "kolorun: --mpi (and --mpi-args/--binding-args) hand the launch to mpirun through \
             the Python `kolorun` script; run the installed kolorun command"
                .into(),
        ));
    }
    if parsed.elastic.is_some() {
        return Ok(elastic_job::run(parsed, interrupted, output, None)?.exit_code);
    }
    Ok(Job::plan(parsed, output)?
        .run(interrupted, output, None)?
        .exit_code)
}

/// Runs a `kolo.run` job: the command line `args` (its command starts the rank processes that
/// fetch `payload` — the pickled function — from the driver and store their pickled results
/// there) and returns every rank's result by rank, or the failure.
pub fn run_function(
    args: &[String],
    payload: Vec<u8>,
    interrupted: &dyn Fn() -> bool,
) -> Result<FunctionRun> {
    let output = Output::process();
    match parse_args(args)? {
        Invocation::Launch(parsed) => {
            if parsed.controller.as_deref() == Some("mpi") {
                output.message(
                    "kolo.run: note: use_mpi/mpi_args: kolo.run starts the ranks itself (its \
                     function travels through kolo's job driver); `kolorun --mpi` launches a \
                     command through mpirun",
                );
            }
            if parsed.elastic.is_some() {
                return elastic_job::run(*parsed, interrupted, &output, Some(payload));
            }
            Job::plan(*parsed, &output)?.run(interrupted, &output, Some(payload))
        }
        other => Err(Error::Config(format!(
            "kolo.run: the arguments ask for {other:?}, not a job"
        ))),
    }
}

fn write_stdout(output: &Output, text: &str) {
    if let Ok(mut out) = output.stdout.lock() {
        let _ = out.write_all(text.as_bytes());
        let _ = out.flush();
    }
}

/// Everything decided before anything starts.
#[derive(Debug)]
struct Job {
    args: LaunchArgs,
    /// Host entry of each task index.
    task_hosts: Vec<String>,
    /// Each task's rank assignment, as kolorun sets it in the rank variables.
    assignments: Vec<Assignment>,
    /// Whether hosts were given (then ranks get `KOLO_HOSTNAME`).
    hosts_given: bool,
    this_hostname: String,
    start_timeout: Duration,
    heartbeat_timeout: Duration,
    grace: Duration,
    /// Where the driver listens, and the IP workers are told.
    bind: IpAddr,
    advertise: IpAddr,
    /// Variables every rank gets besides the rank and job ones (elastic launches:
    /// `KOLO_ELASTIC_TIMEOUT`, `HOROVOD_ELASTIC`).
    extra_env: Vec<(String, String)>,
}

impl Job {
    fn plan(args: LaunchArgs, output: &Output) -> Result<Self> {
        print_notices(&args, output);
        let host_list = fixed_host_list(&args)?;
        let task_hosts = plan_slots(
            host_list
                .as_ref()
                .map(|(hosts, name)| (hosts.as_slice(), name.as_str())),
            args.num_proc,
        )?;
        // The driver assigns ranks from host hashes (the host identity is the entry's host
        // name when hosts are given); the same rule on the host names gives each rank's
        // variables before it starts.
        let keyed: Vec<(u32, String)> = task_hosts
            .iter()
            .enumerate()
            .map(|(task, host)| (task as u32, hosts::host_name(host).to_owned()))
            .collect();
        let assignments = assign_ranks(&keyed);
        let hosts_given = host_list.is_some();
        Self::settle(args, task_hosts, assignments, hosts_given)
    }

    /// The settings every launch shares (timeouts, grace, the driver's addresses for hosts
    /// `task_hosts`), for tasks on `task_hosts` with `assignments`.
    fn settle(
        args: LaunchArgs,
        task_hosts: Vec<String>,
        assignments: Vec<Assignment>,
        hosts_given: bool,
    ) -> Result<Self> {
        let this_hostname = system_hostname();
        let start_timeout = match args.start_timeout {
            Some(timeout) => timeout,
            None => env_seconds(env::START_TIMEOUT)?
                .or(env_seconds(HOROVOD_START_TIMEOUT)?)
                .unwrap_or(env::DEFAULT_START_TIMEOUT),
        };
        let heartbeat_timeout =
            env_seconds(env::HEARTBEAT_TIMEOUT_SECONDS)?.unwrap_or(DEFAULT_HEARTBEAT_TIMEOUT);
        let grace = match std::env::var(env::ABORT_GRACE_SECONDS)
            .ok()
            .filter(|v| !v.trim().is_empty())
        {
            Some(text) if text.trim() == "0" => Duration::ZERO,
            Some(text) => parse_seconds(env::ABORT_GRACE_SECONDS, &text)?,
            None => DEFAULT_GRACE,
        };
        let (bind, advertise) = driver_addresses(&args, &task_hosts, &this_hostname)?;
        Ok(Self {
            hosts_given,
            args,
            task_hosts,
            assignments,
            this_hostname,
            start_timeout,
            heartbeat_timeout,
            grace,
            bind,
            advertise,
            extra_env: Vec::new(),
        })
    }

    fn run(
        self,
        interrupted: &dyn Fn() -> bool,
        output: &Output,
        payload: Option<Vec<u8>>,
    ) -> Result<FunctionRun> {
        // `--verbose` prints the launch details (as horovodrun prints its commands); else they
        // are debug log records.
        let verbose = self.args.verbose;
        let say = |text: String| {
            if verbose {
                output.message(&text);
            } else {
                log::debug!("{text}");
            }
        };
        let np = self.task_hosts.len();
        let secret = JobSecret::generate();
        let job_id = JobId::generate();
        let driver = DriverService::start(DriverConfig {
            bind: SocketAddr::new(self.bind, 0),
            num_tasks: np,
            secret: secret.clone(),
            job_id,
            start_timeout: self.start_timeout,
            heartbeat_timeout: self.heartbeat_timeout,
            abort_if_nobody_registers: false,
            elastic: None,
        })?;
        if let Some(payload) = payload {
            driver.kv_put(keys::PAYLOAD, payload)?;
        }
        let driver_addr = SocketAddr::new(self.advertise, driver.addr().port()).to_string();
        // The job id stays out of messages and logs, as the secret does: the data plane's
        // handshake names the job with it.
        say(format!(
            "kolorun: {np} rank(s) on {:?}; driver listening on {} (workers use {driver_addr})",
            self.task_hosts,
            driver.addr()
        ));

        let cwd = std::env::current_dir()?;
        let labels = RankLabels::new(np);
        let (done_sender, done) = mpsc::channel();
        let mut ranks: Vec<RankProcess> = Vec::with_capacity(np);
        let mut forwarders = 0usize;
        for (task, host) in self.task_hosts.iter().enumerate() {
            let assignment = self.assignments[task];
            let task = task as u32;
            let worker = WorkerEnv {
                driver_addr: driver_addr.clone(),
                secret: secret.clone(),
                job_id,
                task_index: task,
                num_tasks: np as u32,
                start_timeout: self.start_timeout,
                hostname: self.hosts_given.then(|| hosts::host_name(host).to_owned()),
                host_hash_salt: None,
                data_addr: self.data_addr_for(host),
            };
            let started = self
                .launch_for(host, &worker, &assignment, &cwd)
                .and_then(|launch| {
                    say(format!(
                        "kolorun: task {task} on {host}: {}",
                        redact(&launch, &secret, &job_id)
                    ));
                    let files = match &self.args.output_dir {
                        Some(dir) => Some(open_rank_files(dir, assignment.rank, np)?),
                        None => None,
                    };
                    let process = spawn_rank(
                        task,
                        host,
                        &launch,
                        files,
                        &labels,
                        output,
                        &done_sender,
                        self.args.prefix_timestamp,
                    )?;
                    ranks.push(process);
                    forwarders += 2;
                    Ok(())
                });
            if let Err(err) = started {
                driver.abort(AbortCause {
                    rank: Some(task),
                    host: host.clone(),
                    message: err.to_string(),
                });
                stop_all(&mut ranks);
                driver.shutdown();
                return Err(err);
            }
        }
        drop(done_sender);

        let timing = StopTiming {
            grace: self.grace,
            term_to_kill: TERM_TO_KILL,
        };
        let expected: Vec<u32> = self.assignments.iter().map(|a| a.rank).collect();
        let outcome = supervise(&mut ranks, &driver, &labels, &expected, timing, interrupted);
        if outcome.is_err() {
            stop_all(&mut ranks);
        }
        let deadline = std::time::Instant::now() + OUTPUT_DRAIN;
        for _ in 0..forwarders {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if done.recv_timeout(left).is_err() {
                log::debug!(
                    "kolorun: output of some rank is still open (a process it started holds it)"
                );
                break;
            }
        }
        let mut results = vec![None; np];
        for peer in driver.assignment().unwrap_or_default() {
            if let Some(slot) = results.get_mut(peer.rank as usize) {
                *slot = driver
                    .kv_value(&keys::result(peer.task_index))
                    .map(|value| value.to_vec());
            }
        }
        let failure = driver.abort_cause();
        driver.shutdown();
        let outcome = outcome?;
        if let Some(summary) = outcome.summary() {
            output.message(&summary);
        }
        say(format!(
            "kolorun: job finished with exit code {}",
            outcome.exit_code
        ));
        Ok(FunctionRun {
            exit_code: outcome.exit_code,
            results,
            failure,
        })
    }

    /// `KOLO_DATA_ADDR` for a task on `host`: an interface name applies everywhere, an IP only
    /// on this machine.
    fn data_addr_for(&self, host: &str) -> Option<String> {
        let nic = self.args.network_interfaces.first()?;
        if !is_ip_literal(nic) || is_local(host, &self.this_hostname) {
            Some(nic.clone())
        } else {
            None
        }
    }

    /// The variables kolorun sets on every rank besides the forwarded environment.
    fn rank_env(
        &self,
        host: &str,
        worker: &WorkerEnv,
        assignment: &Assignment,
    ) -> Vec<(String, String)> {
        let mut vars: Vec<(String, String)> = vec![("PYTHONUNBUFFERED".into(), "1".into())];
        // The interfaces given by name reach NCCL and Horovod's Gloo variable, as horovodrun.
        let names: Vec<&str> = self
            .args
            .network_interfaces
            .iter()
            .map(String::as_str)
            .filter(|nic| !is_ip_literal(nic))
            .collect();
        if let Some(first) = names.first() {
            vars.push(("NCCL_SOCKET_IFNAME".into(), names.join(",")));
            vars.push(("HOROVOD_GLOO_IFACE".into(), (*first).to_owned()));
        }
        vars.extend(self.args.engine_env.iter().cloned());
        vars.extend(self.extra_env.iter().cloned());
        let hostname = if self.hosts_given {
            hosts::host_name(host)
        } else {
            "localhost"
        };
        vars.extend(env::rank_vars(assignment, hostname));
        vars.extend(worker.to_vars().into_iter().map(|(k, v)| (k.to_owned(), v)));
        vars
    }

    fn launch_for(
        &self,
        host: &str,
        worker: &WorkerEnv,
        assignment: &Assignment,
        cwd: &std::path::Path,
    ) -> Result<Launch> {
        let vars = self.rank_env(host, worker, assignment);
        if is_local(host, &self.this_hostname) {
            return Ok(Launch {
                program: self.args.command[0].clone(),
                args: self.args.command[1..].to_vec(),
                env_remove: forward_env::local_removals(),
                envs: vars,
                remote: false,
                stdin_text: String::new(),
            });
        }
        // Everything, the job secret included, travels on ssh's stdin, never on a command line.
        let mut exported = forward_env::remote_forwarded();
        exported.extend(vars);
        let ssh = SshOptions::from_env(self.args.ssh_port, self.args.ssh_identity_file.clone())?;
        let script = remote_script(cwd, &self.args.command);
        Ok(Launch {
            program: "ssh".into(),
            args: ssh_args(host, &ssh, &script),
            env_remove: Vec::new(),
            envs: Vec::new(),
            remote: true,
            stdin_text: stdin_env(&exported)?,
        })
    }
}

/// The hosts of `-H` or `--hostfile` with the name of their source, `None` without either.
/// An `Internal` error for a discovery script (only elastic launches have one).
fn fixed_host_list(args: &LaunchArgs) -> Result<Option<(Vec<HostSlots>, String)>> {
    Ok(match &args.hosts {
        None => None,
        Some(HostSource::Flag(text)) => Some((parse_hosts_flag(text)?, "-H".to_owned())),
        Some(HostSource::File(path)) => {
            let text = std::fs::read_to_string(path).map_err(|err| {
                Error::Config(format!(
                    "kolorun: cannot read --hostfile {}: {err}",
                    path.display()
                ))
            })?;
            let name = format!("--hostfile {}", path.display());
            Some((parse_hostfile(&text, &path.display().to_string())?, name))
        }
        Some(HostSource::Discovery(script)) => {
            return Err(Error::Internal(format!(
                "--host-discovery-script {} reached a fixed-size launch",
                script.display()
            )))
        }
    })
}

/// Prints a notice for each flag kolo accepts without horovodrun's effect.
fn print_notices(args: &LaunchArgs, output: &Output) {
    for (flag, text) in &args.notices {
        output.message(&format!("kolorun: note: {flag}: {text}"));
    }
}

/// Starts task `task`'s process on `host` and two threads forwarding its stdout and stderr
/// with its label (and to `files` when given); each thread sends on `done` at EOF.
#[expect(
    clippy::too_many_arguments,
    reason = "shared by the fixed and the elastic launch; each argument is one concern"
)]
fn spawn_rank(
    task: u32,
    host: &str,
    launch: &Launch,
    files: Option<(std::fs::File, std::fs::File)>,
    labels: &RankLabels,
    output: &Output,
    done: &mpsc::Sender<()>,
    timestamps: bool,
) -> Result<RankProcess> {
    let (process, (stdout, stderr)) = RankProcess::spawn(task, host, launch).map_err(|err| {
        Error::Launch(format!(
            "kolorun: cannot start {:?} for task {task} on {host}: {err}",
            launch.program
        ))
    })?;
    let (out_file, err_file) = files.map_or((None, None), |(o, e)| (Some(o), Some(e)));
    let mut process = process;
    let forwarded = forward(
        stdout,
        task,
        Stream::Stdout,
        labels.clone(),
        output.stdout.clone(),
        out_file,
        timestamps,
        done.clone(),
    )
    .and_then(|_| {
        forward(
            stderr,
            task,
            Stream::Stderr,
            labels.clone(),
            output.stderr.clone(),
            err_file,
            timestamps,
            done.clone(),
        )
    });
    if let Err(err) = forwarded {
        stop_all(std::slice::from_mut(&mut process));
        return Err(err.into());
    }
    Ok(process)
}

/// Where the driver listens and the IP it advertises: the first `--network-interfaces` entry
/// when given; loopback when every host is this machine; otherwise every interface,
/// advertising the local IP that routes to the first remote host.
fn driver_addresses(
    args: &LaunchArgs,
    task_hosts: &[String],
    this_hostname: &str,
) -> Result<(IpAddr, IpAddr)> {
    if let Some(nic) = args.network_interfaces.first() {
        let ip = resolve_nic_or_ip(nic, "--network-interfaces")?;
        return Ok((ip, ip));
    }
    let remote = task_hosts
        .iter()
        .find(|host| !hosts::is_loopback(host, this_hostname));
    let Some(remote) = remote else {
        let loopback = IpAddr::V4(Ipv4Addr::LOCALHOST);
        return Ok((loopback, loopback));
    };
    let target = hosts::host_name(remote);
    let probe = if target.contains(':') {
        format!("[{target}]:22")
    } else {
        format!("{target}:22")
    };
    let advertise = local_ip_toward(&probe)
        .or_else(|_| {
            crate::control::net::resolve(&format!("{this_hostname}:0")).map(|addr| addr.ip())
        })
        .map_err(|err| {
            Error::Config(format!(
                "kolorun: cannot tell which local address {remote} can reach ({err}); pass \
                 --network-interfaces NIC_OR_IP"
            ))
        })?;
    Ok((IpAddr::V4(Ipv4Addr::UNSPECIFIED), advertise))
}

fn env_seconds(name: &str) -> Result<Option<Duration>> {
    match std::env::var(name).ok().filter(|v| !v.trim().is_empty()) {
        Some(text) => Ok(Some(parse_seconds(name, &text)?)),
        None => Ok(None),
    }
}

/// Stops every running rank now (SIGKILL) and reaps it, bounded.
fn stop_all(ranks: &mut [RankProcess]) {
    for rank in ranks.iter_mut() {
        rank.stop(libc::SIGKILL);
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while ranks.iter_mut().any(|r| matches!(r.poll(), Ok(None)))
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The launch as a command line for logs, without the job secret or the job id (neither is on
/// it: both travel in the environment, for ssh ranks on its stdin).
fn redact(launch: &Launch, secret: &JobSecret, job_id: &JobId) -> String {
    let mut words = vec![quote(&launch.program)];
    words.extend(launch.args.iter().map(|arg| quote(arg)));
    let line = words
        .join(" ")
        .replace(&secret.to_hex(), "<secret>")
        .replace(&job_id.to_hex(), "<job id>");
    let names: Vec<&str> = launch.envs.iter().map(|(k, _)| k.as_str()).collect();
    if names.is_empty() {
        line
    } else {
        format!("{line} (with {})", names.join(", "))
    }
}

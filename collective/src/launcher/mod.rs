//! `kolorun`: starts a job's ranks locally and over ssh, runs the job driver they register
//! with, forwards their output with rank prefixes, and stops every rank as soon as one fails.
//!
//! The Python package's `kolorun` console script calls [`run`] with the arguments after the
//! program name and a callback that reports Ctrl-C:
//!
//! ```no_run
//! let args: Vec<String> = ["-np", "2", "python", "train.py"].map(String::from).to_vec();
//! let code = kolo_collective::launcher::run(&args, &|| false).unwrap();
//! std::process::exit(code);
//! ```
//!
//! Each slot `i` runs the command with `KOLO_DRIVER_ADDR`, `KOLO_JOB_SECRET`, `KOLO_JOB_ID`,
//! `KOLO_TASK_INDEX=i`, `KOLO_NUM_TASKS`, `KOLO_START_TIMEOUT` (and `KOLO_HOSTNAME=<host entry>`
//! when hosts were given), plus the variables of the engine flags (`--fusion-threshold-mb` →
//! `KOLO_FUSION_THRESHOLD`, ...; see [`LaunchArgs::engine_env`]). Hosts named `localhost` or this machine's hostname run as local child
//! processes (own session, killed if kolorun dies); every other entry, including `127.0.0.1`,
//! runs through `ssh` under a watchdog that stops the remote command when the connection ends.

mod args;
mod hosts;
mod output;
pub mod process;
mod remote;
mod supervise;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::mpsc;
use std::time::Duration;

pub use args::{parse_args, HostSource, Invocation, LaunchArgs, USAGE};
pub use hosts::{is_local, parse_hostfile, parse_hosts_flag, plan_slots, HostSlots};
pub use output::{Output, SharedWriter};
pub use remote::{quote, remote_script, ssh_args, SshOptions};

use crate::abort::AbortCause;
use crate::control::env::{self, parse_seconds, WorkerEnv};
use crate::control::net::{is_ip_literal, local_ip_toward, resolve_nic_or_ip, system_hostname};
use crate::control::{DriverConfig, DriverService, JobId, JobSecret};
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
            if let Ok(mut out) = output.stdout.lock() {
                let _ = out.write_all(USAGE.as_bytes());
                let _ = out.flush();
            }
            return Ok(0);
        }
        Invocation::Launch(parsed) => parsed,
    };
    Job::plan(parsed)?.run(interrupted, output)
}

/// Everything decided before anything starts.
#[derive(Debug)]
struct Job {
    args: LaunchArgs,
    /// Host entry of each task index.
    task_hosts: Vec<String>,
    /// Whether hosts were given (then ranks get `KOLO_HOSTNAME`).
    hosts_given: bool,
    this_hostname: String,
    start_timeout: Duration,
    heartbeat_timeout: Duration,
    grace: Duration,
    /// Where the driver listens, and the IP workers are told.
    bind: IpAddr,
    advertise: IpAddr,
}

impl Job {
    fn plan(args: LaunchArgs) -> Result<Self> {
        let host_list = match &args.hosts {
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
        };
        let task_hosts = plan_slots(
            host_list
                .as_ref()
                .map(|(hosts, name)| (hosts.as_slice(), name.as_str())),
            args.num_proc,
        )?;
        let this_hostname = system_hostname();
        let start_timeout = match args.start_timeout {
            Some(timeout) => timeout,
            None => env_seconds(env::START_TIMEOUT)?.unwrap_or(env::DEFAULT_START_TIMEOUT),
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
            hosts_given: host_list.is_some(),
            args,
            task_hosts,
            this_hostname,
            start_timeout,
            heartbeat_timeout,
            grace,
            bind,
            advertise,
        })
    }

    fn run(self, interrupted: &dyn Fn() -> bool, output: &Output) -> Result<i32> {
        let level = if self.args.verbose {
            log::Level::Info
        } else {
            log::Level::Debug
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
        })?;
        let driver_addr = SocketAddr::new(self.advertise, driver.addr().port()).to_string();
        log::log!(
            level,
            "kolorun: job {job_id}: {np} rank(s) on {:?}; driver listening on {} (workers use {driver_addr})",
            self.task_hosts,
            driver.addr()
        );

        let cwd = std::env::current_dir()?;
        let labels = RankLabels::new(np);
        let (done_sender, done) = mpsc::channel();
        let mut ranks: Vec<RankProcess> = Vec::with_capacity(np);
        let mut forwarders = 0usize;
        for (task, host) in self.task_hosts.iter().enumerate() {
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
            let launch = self.launch_for(host, &worker, &cwd);
            log::log!(
                level,
                "kolorun: task {task} on {host}: {}",
                redact(&launch, &secret)
            );
            let files = match &self.args.output_dir {
                Some(dir) => open_rank_files(dir, task).map(Some),
                None => Ok(None),
            };
            let spawned = files.and_then(|files| {
                RankProcess::spawn(task, host, &launch)
                    .map(|spawned| (spawned, files))
                    .map_err(|err| {
                        Error::Launch(format!(
                            "kolorun: cannot start {:?} for task {task} on {host}: {err}",
                            launch.program
                        ))
                    })
            });
            let started = spawned.and_then(|((process, (stdout, stderr)), files)| {
                ranks.push(process);
                let (out_file, err_file) = files.map_or((None, None), |(o, e)| (Some(o), Some(e)));
                forward(
                    stdout,
                    task,
                    Stream::Stdout,
                    labels.clone(),
                    output.stdout.clone(),
                    out_file,
                    done_sender.clone(),
                )?;
                forwarders += 1;
                forward(
                    stderr,
                    task,
                    Stream::Stderr,
                    labels.clone(),
                    output.stderr.clone(),
                    err_file,
                    done_sender.clone(),
                )?;
                forwarders += 1;
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
        let outcome = supervise(&mut ranks, &driver, &labels, timing, interrupted);
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
        driver.shutdown();
        let outcome = outcome?;
        if let Some(summary) = outcome.summary() {
            output.message(&summary);
        }
        log::log!(
            level,
            "kolorun: job {job_id} finished with exit code {}",
            outcome.exit_code
        );
        Ok(outcome.exit_code)
    }

    /// `KOLO_DATA_ADDR` for a task on `host`: an interface name applies everywhere, an IP only
    /// on this machine.
    fn data_addr_for(&self, host: &str) -> Option<String> {
        let nic = self.args.network_interface.as_ref()?;
        if !is_ip_literal(nic) || is_local(host, &self.this_hostname) {
            Some(nic.clone())
        } else {
            None
        }
    }

    fn launch_for(&self, host: &str, worker: &WorkerEnv, cwd: &std::path::Path) -> Launch {
        let mut vars: Vec<(String, String)> = worker
            .to_vars()
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect();
        // Engine flags (`--fusion-threshold-mb`, ...) reach local and remote ranks alike.
        vars.extend(self.args.engine_env.iter().cloned());
        if is_local(host, &self.this_hostname) {
            return Launch {
                program: self.args.command[0].clone(),
                args: self.args.command[1..].to_vec(),
                envs: vars,
                remote: false,
                stdin_text: String::new(),
            };
        }
        // The secret travels on ssh's stdin, never on a command line.
        let secret = worker.secret.to_hex();
        let mut exported: Vec<(String, String)> = vars
            .into_iter()
            .filter(|(name, _)| name != env::JOB_SECRET)
            .collect();
        for name in remote::FORWARDED_VARS {
            if let Some(value) = std::env::var(name).ok().filter(|v| !v.is_empty()) {
                exported.push((name.to_owned(), value));
            }
        }
        let ssh = SshOptions {
            port: self.args.ssh_port,
            identity_file: self.args.ssh_identity_file.clone(),
        };
        let script = remote_script(cwd, &exported, &[env::JOB_SECRET], &self.args.command);
        Launch {
            program: "ssh".into(),
            args: ssh_args(host, &ssh, &script),
            envs: Vec::new(),
            remote: true,
            stdin_text: format!("{secret}\n"),
        }
    }
}

/// Where the driver listens and the IP it advertises: `--network-interface` when given;
/// loopback when every host is this machine; otherwise every interface, advertising the local
/// IP that routes to the first remote host.
fn driver_addresses(
    args: &LaunchArgs,
    task_hosts: &[String],
    this_hostname: &str,
) -> Result<(IpAddr, IpAddr)> {
    if let Some(nic) = &args.network_interface {
        let ip = resolve_nic_or_ip(nic, "--network-interface")?;
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
                 --network-interface NIC_OR_IP"
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

/// The launch as a command line for logs, without the job secret.
fn redact(launch: &Launch, secret: &JobSecret) -> String {
    let hex = secret.to_hex();
    let mut words = vec![quote(&launch.program)];
    words.extend(launch.args.iter().map(|arg| quote(arg)));
    let line = words.join(" ").replace(&hex, "<secret>");
    let names: Vec<&str> = launch.envs.iter().map(|(k, _)| k.as_str()).collect();
    if names.is_empty() {
        line
    } else {
        format!("{line} (with {})", names.join(", "))
    }
}

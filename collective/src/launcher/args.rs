//! kolorun's command line: every option string of horovodrun 0.28.1 (`horovod/runner/launch.py`
//! `parse_args`), then the command to run on every slot. Options kolo has no mechanism for are
//! accepted with a notice ([`LaunchArgs::notices`]) saying what kolo does instead.

use std::path::PathBuf;
use std::time::Duration;

use super::elastic_args::{self, CooldownRange, ElasticArgs, ElasticFlags, ElasticMode};
use super::knobs;
use crate::control::env::parse_seconds;
use crate::error::{Error, Result};

/// `kolorun --help`.
pub const USAGE: &str = "\
usage: kolorun [options] [--] COMMAND [ARGS...]

Starts COMMAND once per slot (locally, or over ssh), runs the job driver the ranks register
with, prefixes every output line with its rank, and stops every rank as soon as one fails.
Every horovodrun 0.28.1 option is accepted; the ones kolo has no mechanism for print a
one-line notice saying what kolo does instead (docs/kolorun.md has the full table).

options:
  -np N, --num-proc N          number of processes (default: every slot of -H/--hostfile)
  -H, --hosts H:S,H:S          hosts and their slot counts, e.g. -H node1:4,node2:4
                               (localhost and this machine's hostname run locally; any other
                               entry, including 127.0.0.1, is reached over ssh)
  -hostfile, --hostfile FILE   one host per line: `host slots=N` or `host:N`; # comments
  --config-file FILE           Horovod's YAML configuration (params, autotune, timeline,
                               stall_check, library_options, logging); flags win over it
  --start-timeout SECS         seconds for every rank to register (default 30, or
                               KOLO_START_TIMEOUT / HOROVOD_START_TIMEOUT)
  --network-interfaces A,B     interfaces (or IPs) to use: the first carries the job driver and
  --network-interface NIC      the data plane; all go to NCCL_SOCKET_IFNAME (repeatable)
  -p, --ssh-port PORT          ssh port for remote hosts
  -i, --ssh-identity-file FILE ssh private key for remote hosts
  --output-filename DIR        also write each rank's output to DIR/rank.N/{stdout,stderr}
  -prefix-timestamp, --prefix-output-with-timestamp
                               start every output line with the time, as horovodrun does
  --verbose                    log launch details (commands, hosts, ranks)
  --disable-cache              accepted: kolorun keeps no cache of launch checks
  -cb, --check-build           what this build supports
  -v, --version                kolo's version
  -h, --help                   show this help

engine options (each sets the variables in brackets on every rank):
  --fusion-threshold-mb MB     fuse tensors into one collective up to MB MiB (0: no fusion)
                               [KOLO_/HOROVOD_FUSION_THRESHOLD, in bytes; default 128]
  --cycle-time-ms MS           milliseconds between engine cycles [KOLO_/HOROVOD_CYCLE_TIME]
  --cache-capacity N           response cache entries, 0 turns it off [KOLO_/HOROVOD_CACHE_CAPACITY]
  --timeline-filename PATH     Chrome trace timeline written by rank 0 [KOLO_/HOROVOD_TIMELINE]
  --timeline-mark-cycles, --no-timeline-mark-cycles
                               mark engine cycles in the timeline [.._TIMELINE_MARK_CYCLES]
  --no-stall-check, --stall-check
                               turn the stall inspector off/on [.._STALL_CHECK_DISABLE]
  --stall-check-warning-time-seconds S   [.._STALL_CHECK_TIME_SECONDS; default 60]
  --stall-check-shutdown-time-seconds S  [.._STALL_SHUTDOWN_TIME_SECONDS; default 0: never]
  --log-level LEVEL            trace|debug|info|warning|error|fatal [KOLO_/HOROVOD_LOG_LEVEL]
  --gloo-timeout-seconds S     a collective fails after S seconds without progress
                               [KOLO_COLLECTIVE_TIMEOUT_SECONDS, HOROVOD_GLOO_TIMEOUT_SECONDS]
  --tcp                        NCCL_IB_DISABLE=1, as horovodrun
  --thread-affinity CORE       pin each rank's engine thread to CORE
                               [KOLO_/HOROVOD_THREAD_AFFINITY: a comma list, one per local rank]
  --log-with-timestamp, --log-without-timestamp (--no-log-hide-timestamp, --log-hide-timestamp)
                               show/hide the time in kolo's log lines (shown by default)
                               [KOLO_/HOROVOD_LOG_HIDE_TIME]
  --hierarchical-allreduce, --no-hierarchical-allreduce, --hierarchical-allgather,
  --no-hierarchical-allgather
                               ranks on several hosts (several on one): allreduce/allgather
                               through shared memory within hosts and TCP among them, or a
                               flat TCP ring over every rank [KOLO_/HOROVOD_HIERARCHICAL_*;
                               kolo's default: hierarchical]

controllers:
  --gloo                       kolo's own controller and transport (the default; it plays
                               Gloo's role)
  --mpi                        start the ranks with mpirun (Open MPI or MPICH), as horovodrun
                               --mpi does: --allow-run-as-root --tag-output -np N -H HOSTS
                               -bind-to none -map-by slot and -x for each forwarded variable;
                               the ranks meet through mpi4py, else through a rendezvous address
                               and job secret kolorun passes in their environment
  --mpi-args ARGS              extra mpirun arguments (given without --gloo, selects --mpi)
  --binding-args ARGS          mpirun's binding arguments instead of -bind-to none -map-by slot
  --mpi-threads-disable, --no-mpi-threads-disable
                               initialize MPI without thread support in ranks that use mpi4py
                               [HOROVOD_MPI_THREADS_DISABLE]

elastic options (horovodrun's; --host-discovery-script or --min-np makes a launch elastic):
  --host-discovery-script SCRIPT
                               run through `sh -c` every second; prints one `host` or
                               `host:slots` per line (exclusive with -H/--hostfile, which
                               give an elastic launch fixed hosts)
  --min-np, --min-num-proc N   processes training needs to continue (default: -np); -np is
                               how many slots to wait for before starting (default: --min-np)
  --max-np, --max-num-proc N   at most N processes (default: every available slot)
  --slots-per-host, --slots N  slots of a discovered host printed without `:slots` (default 1)
  --elastic-timeout SECS       longest wait for --min-np slots (default 600, or
                               KOLO_ELASTIC_TIMEOUT / HOROVOD_ELASTIC_TIMEOUT)
  --reset-limit N              fail the job after N resets (default: no limit)
  --blacklist-cooldown-range MIN MAX
                               a failing host returns after a cooldown of MIN..MAX seconds
                               that doubles per failure (1 <= MIN <= MAX <= 3600; default: it
                               never returns)
  A failed rank leaves the job (the others reset) and blacklists its host; new slots get new
  ranks; the first rank to return ends the job (docs/elastic.md). On a fixed-size launch
  (neither --min-np nor a script) the other elastic options change nothing and print a
  notice, as horovodrun ignores them.

autotune (rank 0 tunes fusion threshold x cycle time, then the cache and hierarchical
switches; every rank applies each setting at the same cycle; see docs/autotune.md):
  --autotune / --no-autotune   [KOLO_/HOROVOD_AUTOTUNE]
  --autotune-log-file FILE     CSV of every sample, Horovod's columns [*_AUTOTUNE_LOG]
  --autotune-warmup-samples N  samples discarded first (default 3)
  --autotune-steps-per-sample N
                               steps per sample, scored by their median (default 10)
  --autotune-bayes-opt-max-samples N
                               cap on Bayesian samples; stops earlier once converged (20)
  --autotune-gaussian-process-noise X
                               largest GP noise level assumed, in [0, 1] (default 0.8)

accepted with a notice (kolo has no such mechanism; the HOROVOD_* variable is still set):
  --jsrun, --torus-allreduce, --num-nccl-streams.
  --no-torus-allreduce is what kolo does anyway.

environment: every rank gets the launching environment except the variables docs/kolorun.md
lists (HOSTNAME, PWD, SSH_*, ...); ssh ranks receive it on ssh's stdin, never on a command
line. KOLO_ABORT_GRACE_SECONDS (default 3) is how long surviving ranks get to exit by
themselves after a failure before they are terminated; KOLO_HEARTBEAT_TIMEOUT_SECONDS
(default 30) is how long a registered rank may stay silent before the job is aborted.
";

/// Every option string of horovodrun 0.28.1 (`-h`/`--help` included), as its `parse_args`
/// declares them; kolorun accepts each one.
pub const HOROVODRUN_OPTIONS: [&str; 73] = [
    "-h",
    "--help",
    "-v",
    "--version",
    "-np",
    "--num-proc",
    "-cb",
    "--check-build",
    "--disable-cache",
    "--start-timeout",
    "--network-interfaces",
    "--network-interface",
    "--output-filename",
    "--verbose",
    "--config-file",
    "-p",
    "--ssh-port",
    "-i",
    "--ssh-identity-file",
    "--fusion-threshold-mb",
    "--cycle-time-ms",
    "--cache-capacity",
    "--hierarchical-allreduce",
    "--no-hierarchical-allreduce",
    "--hierarchical-allgather",
    "--no-hierarchical-allgather",
    "--torus-allreduce",
    "--no-torus-allreduce",
    "--autotune",
    "--no-autotune",
    "--autotune-log-file",
    "--autotune-warmup-samples",
    "--autotune-steps-per-sample",
    "--autotune-bayes-opt-max-samples",
    "--autotune-gaussian-process-noise",
    "--min-np",
    "--min-num-proc",
    "--max-np",
    "--max-num-proc",
    "--slots-per-host",
    "--elastic-timeout",
    "--reset-limit",
    "--blacklist-cooldown-range",
    "--timeline-filename",
    "--timeline-mark-cycles",
    "--no-timeline-mark-cycles",
    "--no-stall-check",
    "--stall-check",
    "--stall-check-warning-time-seconds",
    "--stall-check-shutdown-time-seconds",
    "--mpi-threads-disable",
    "--no-mpi-threads-disable",
    "--mpi-args",
    "--tcp",
    "--binding-args",
    "--num-nccl-streams",
    "--thread-affinity",
    "--gloo-timeout-seconds",
    "--log-level",
    "--log-with-timestamp",
    "--log-without-timestamp",
    "-prefix-timestamp",
    "--prefix-output-with-timestamp",
    "--log-hide-timestamp",
    "--no-log-hide-timestamp",
    "-H",
    "--hosts",
    "-hostfile",
    "--hostfile",
    "--host-discovery-script",
    "--gloo",
    "--mpi",
    "--jsrun",
];

/// Where the host list comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostSource {
    /// `-H`/`--hosts` text.
    Flag(String),
    /// `--hostfile` path.
    File(PathBuf),
    /// `--host-discovery-script` path: an elastic launch's hosts, polled while it runs
    /// ([`crate::launcher::discovery`]).
    Discovery(PathBuf),
}

/// Parsed `kolorun` options and command.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LaunchArgs {
    /// `-np`/`--num-proc`.
    pub num_proc: Option<usize>,
    /// `-H`/`--hosts`, `--hostfile` or `--host-discovery-script`.
    pub hosts: Option<HostSource>,
    /// `--start-timeout`.
    pub start_timeout: Option<Duration>,
    /// `--network-interfaces`/`--network-interface`, in the order given, without repeats.
    pub network_interfaces: Vec<String>,
    /// `-p`/`--ssh-port`.
    pub ssh_port: Option<u16>,
    /// `-i`/`--ssh-identity-file`.
    pub ssh_identity_file: Option<PathBuf>,
    /// `--verbose`.
    pub verbose: bool,
    /// `--output-filename`.
    pub output_dir: Option<PathBuf>,
    /// `-prefix-timestamp`/`--prefix-output-with-timestamp`.
    pub prefix_timestamp: bool,
    /// `--disable-cache` (kolorun keeps no cache of launch checks, so it changes nothing).
    pub disable_cache: bool,
    /// `--gloo`, `--mpi` or `--jsrun`, when given.
    pub controller: Option<String>,
    /// `--mpi-args`.
    pub mpi_args: Option<String>,
    /// `--binding-args`.
    pub binding_args: Option<String>,
    /// The elastic options as given.
    pub elastic_flags: ElasticFlags,
    /// The elastic launch's settings, exactly when the launch is elastic (a
    /// `--host-discovery-script` or `--min-np`, as horovodrun's `_is_elastic`).
    pub elastic: Option<ElasticArgs>,
    /// `--config-file`: the Python `kolorun` reads the YAML and passes its settings as flags
    /// ahead of the command line (so the command line wins), without this option.
    pub config_file: Option<PathBuf>,
    /// How many arguments the options took (the command starts there).
    pub options_end: usize,
    /// Variables from the tuning flags (`--fusion-threshold-mb`, `--no-stall-check`, ...), as
    /// `(variable, value)` pairs every rank gets in its environment; one entry per variable, in
    /// the order first given (a repeated flag keeps its last value).
    pub engine_env: Vec<(String, String)>,
    /// `(option, what kolo does instead)` for every option given that kolo accepts without
    /// Horovod's effect; kolorun prints each as one line on stderr.
    pub notices: Vec<(String, String)>,
    /// The command and its arguments.
    pub command: Vec<String>,
}

/// What the command line asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Invocation {
    /// `-h`/`--help`.
    Help,
    /// `-v`/`--version`.
    Version,
    /// `-cb`/`--check-build` (answered by the Python `kolorun` script).
    CheckBuild,
    /// Run a job.
    Launch(Box<LaunchArgs>),
}

/// What kolo does instead of `option`'s Horovod effect, for the options kolo has no mechanism
/// for; `None` for the options kolo honours.
pub fn notice_for(option: &str) -> Option<&'static str> {
    Some(match option {
        "--jsrun" => {
            "kolorun starts ranks itself (or through mpirun with --mpi) and never runs jsrun: \
             run `jsrun ... python train.py` directly (docs/mpi.md)"
        }
        "--torus-allreduce" => {
            "kolo has no NCCL torus allreduce; GPU tensors use kolo's NCCL allreduce"
        }
        "--num-nccl-streams" => {
            "kolo runs one NCCL stream per process set; HOROVOD_NUM_NCCL_STREAMS is set but \
             not read"
        }
        _ => return None,
    })
}

/// Parses kolorun's arguments (without the program name). Options end at `--` or at the first
/// token that is not an option; everything from there on is the command. `--config-file` is
/// only recorded: the Python `kolorun` reads the YAML (see [`LaunchArgs::config_file`]).
pub fn parse_args(args: &[String]) -> Result<Invocation> {
    let mut parsed = LaunchArgs::default();
    let mut autotune: Option<bool> = None;
    let mut autotune_env: Vec<(String, String)> = Vec::new();
    let mut position = 0;
    while position < args.len() {
        let token = args[position].as_str();
        if token == "--" {
            position += 1;
            break;
        }
        if !token.starts_with('-') || token == "-" {
            break;
        }
        let (name, inline) = match token.split_once('=') {
            Some((name, value)) => (name, Some(value.to_owned())),
            None => (token, None),
        };
        position += 1;
        let mut value = || -> Result<String> {
            if let Some(value) = inline.clone() {
                return Ok(value);
            }
            let value = args.get(position).ok_or_else(|| {
                Error::Config(format!("kolorun: {name} needs a value; run kolorun --help"))
            })?;
            position += 1;
            Ok(value.clone())
        };
        if let Some(text) = notice_for(name) {
            if !parsed.notices.iter().any(|(flag, _)| flag == name) {
                parsed.notices.push((name.to_owned(), text.to_owned()));
            }
        }
        match name {
            "-h" | "--help" => return Ok(Invocation::Help),
            "-v" | "--version" => return Ok(Invocation::Version),
            "-cb" | "--check-build" => return Ok(Invocation::CheckBuild),
            "-np" | "--num-proc" => parsed.num_proc = Some(positive(name, &value()?, "processes")?),
            "-H" | "--hosts" => set_hosts(&mut parsed, HostSource::Flag(value()?))?,
            "-hostfile" | "--hostfile" => {
                set_hosts(&mut parsed, HostSource::File(PathBuf::from(value()?)))?
            }
            "--host-discovery-script" => {
                set_hosts(&mut parsed, HostSource::Discovery(PathBuf::from(value()?)))?
            }
            "--start-timeout" => parsed.start_timeout = Some(parse_seconds(name, &value()?)?),
            "--network-interfaces" | "--network-interface" => {
                let text = value()?;
                let nics: Vec<&str> = text
                    .split(',')
                    .map(str::trim)
                    .filter(|n| !n.is_empty())
                    .collect();
                if nics.is_empty() {
                    return Err(Error::Config(format!(
                        "kolorun: {name} {text:?} names no interface; e.g. {name} eth0"
                    )));
                }
                for nic in nics {
                    if !parsed.network_interfaces.iter().any(|n| n == nic) {
                        parsed.network_interfaces.push(nic.to_owned());
                    }
                }
            }
            "-p" | "--ssh-port" => {
                let text = value()?;
                let port = text.parse::<u16>().ok().filter(|p| *p > 0).ok_or_else(|| {
                    Error::Config(format!(
                        "kolorun: {name} {text:?} is not a port number (1-65535)"
                    ))
                })?;
                parsed.ssh_port = Some(port);
            }
            "-i" | "--ssh-identity-file" => {
                parsed.ssh_identity_file = Some(PathBuf::from(value()?))
            }
            "--output-filename" => parsed.output_dir = Some(PathBuf::from(value()?)),
            "--verbose" => parsed.verbose = true,
            "-prefix-timestamp" | "--prefix-output-with-timestamp" => {
                parsed.prefix_timestamp = true
            }
            "--disable-cache" => parsed.disable_cache = true,
            "--gloo" | "--mpi" | "--jsrun" => {
                let controller = name.trim_start_matches('-').to_owned();
                if parsed.controller.as_ref().is_some_and(|c| *c != controller) {
                    return Err(Error::Config(
                        "kolorun: give at most one of --gloo, --mpi and --jsrun".into(),
                    ));
                }
                parsed.controller = Some(controller);
            }
            "--mpi-args" => parsed.mpi_args = Some(value()?),
            "--binding-args" => parsed.binding_args = Some(value()?),
            "--min-np" | "--min-num-proc" => {
                parsed.elastic_flags.min_num_proc = Some(positive(name, &value()?, "processes")?)
            }
            "--max-np" | "--max-num-proc" => {
                parsed.elastic_flags.max_num_proc = Some(positive(name, &value()?, "processes")?)
            }
            // `--slots` is argparse's abbreviation of `--slots-per-host`, which Horovod's
            // elastic docs use.
            "--slots-per-host" | "--slots" => {
                parsed.elastic_flags.slots_per_host =
                    Some(positive(name, &value()?, "slots per host")?)
            }
            "--elastic-timeout" => {
                let text = value()?;
                let seconds = whole(name, &text)?;
                if seconds == 0 {
                    return Err(Error::Config(format!(
                        "kolorun: {name} {text:?} is not a positive whole number of seconds; \
                         e.g. {name} 600 (the default)"
                    )));
                }
                parsed.elastic_flags.elastic_timeout = Some(seconds)
            }
            "--reset-limit" => parsed.elastic_flags.reset_limit = Some(whole(name, &value()?)?),
            "--blacklist-cooldown-range" => {
                let low = whole(name, &value()?)?;
                let high = match args.get(position) {
                    Some(text) if inline.is_none() => {
                        position += 1;
                        whole(name, text)?
                    }
                    _ => {
                        return Err(Error::Config(format!(
                            "kolorun: {name} needs two values, MIN MAX seconds, e.g. {name} 60 \
                             300"
                        )))
                    }
                };
                parsed.elastic_flags.cooldown_range = Some(CooldownRange::new(low, high)?);
            }
            "--autotune" | "--no-autotune" => autotune = Some(name == "--autotune"),
            _ if knobs::AUTOTUNE_SETTINGS.contains(&name) => {
                for (variable, setting) in knobs::setting_vars(name, &value()?)? {
                    set_env(&mut autotune_env, variable, setting);
                }
            }
            _ if knobs::is_knob_switch(name) => {
                for (variable, setting) in knobs::switch_vars(name).unwrap_or_default() {
                    set_env(&mut parsed.engine_env, variable, setting);
                }
            }
            _ if knobs::is_knob_setting(name) => {
                for (variable, setting) in knobs::setting_vars(name, &value()?)? {
                    set_env(&mut parsed.engine_env, variable, setting);
                }
            }
            "--config-file" => parsed.config_file = Some(PathBuf::from(value()?)),
            _ => {
                return Err(Error::Config(format!(
                    "kolorun: unknown option {token:?}; run kolorun --help"
                )))
            }
        }
    }
    // Horovod sets the autotune variables only when autotuning is on.
    if autotune == Some(true) {
        set_env(&mut parsed.engine_env, "KOLO_AUTOTUNE", "1".into());
        set_env(&mut parsed.engine_env, "HOROVOD_AUTOTUNE", "1".into());
        for (variable, setting) in autotune_env {
            set_env(&mut parsed.engine_env, &variable, setting);
        }
    }
    // horovodrun built with MPI runs mpirun unless --gloo is given: arguments for mpirun
    // select it.
    if parsed.controller.is_none() && (parsed.mpi_args.is_some() || parsed.binding_args.is_some()) {
        parsed.controller = Some("mpi".into());
    }
    parsed.options_end = position;
    parsed.command = args[position..].to_vec();
    if parsed.command.is_empty() {
        return Err(Error::Config(
            "kolorun: no command given; usage: kolorun -np N [options] COMMAND [ARGS...]".into(),
        ));
    }
    let discovery = matches!(parsed.hosts, Some(HostSource::Discovery(_)));
    let mpi = parsed.controller.as_deref() == Some("mpi");
    match elastic_args::resolve(&parsed.elastic_flags, parsed.num_proc, discovery, mpi)? {
        ElasticMode::Elastic(elastic) => {
            parsed.num_proc = Some(elastic.num_proc);
            parsed.elastic = Some(elastic);
        }
        ElasticMode::Fixed(notices) => parsed.notices.extend(notices),
    }
    if parsed.num_proc.is_none() && parsed.hosts.is_none() {
        return Err(Error::Config(
            "kolorun: say how many processes to start: -np N (or give hosts with -H/--hostfile)"
                .into(),
        ));
    }
    Ok(Invocation::Launch(Box::new(parsed)))
}

/// A positive count given to option `name`, or a config error saying it must be a positive
/// number of `what`.
fn positive(name: &str, text: &str, what: &str) -> Result<usize> {
    text.trim()
        .parse::<usize>()
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| {
            Error::Config(format!(
                "kolorun: {name} {text:?} is not a positive number of {what}"
            ))
        })
}

fn whole(name: &str, text: &str) -> Result<u64> {
    text.trim().parse::<u64>().map_err(|_| {
        Error::Config(format!(
            "kolorun: {name} {text:?} is not a whole number of seconds or times"
        ))
    })
}

fn set_hosts(parsed: &mut LaunchArgs, source: HostSource) -> Result<()> {
    if parsed.hosts.is_some() {
        return Err(Error::Config(
            "kolorun: give the hosts once: one of -H/--hosts, --hostfile and \
             --host-discovery-script"
                .into(),
        ));
    }
    parsed.hosts = Some(source);
    Ok(())
}

/// Sets `variable` in `env`, replacing an earlier value.
fn set_env(env: &mut Vec<(String, String)>, variable: &str, value: String) {
    match env.iter_mut().find(|(name, _)| name == variable) {
        Some(entry) => entry.1 = value,
        None => env.push((variable.to_owned(), value)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::launcher::knobs::{
        CACHE_CAPACITY, CYCLE_TIME, FUSION_THRESHOLD, LOG_HIDE_TIME, LOG_LEVEL,
        STALL_CHECK_DISABLE, STALL_CHECK_TIME_SECONDS, STALL_SHUTDOWN_TIME_SECONDS,
        THREAD_AFFINITY, TIMELINE, TIMELINE_MARK_CYCLES,
    };

    fn args(text: &str) -> Vec<String> {
        text.split_whitespace().map(str::to_owned).collect()
    }

    fn launch(text: &str) -> LaunchArgs {
        match parse_args(&args(text)).unwrap() {
            Invocation::Launch(parsed) => *parsed,
            other => panic!("{other:?}"),
        }
    }

    fn error(text: &str) -> String {
        let err = parse_args(&args(text)).unwrap_err();
        assert!(matches!(err, Error::Config(_)), "{err:?}");
        err.to_string()
    }

    /// The options horovodrun 0.28.1 has that kolo accepts without Horovod's effect.
    const NOTICE_OPTIONS: [&str; 9] = [
        "--jsrun",
        "--torus-allreduce",
        "--num-nccl-streams",
        "--max-np",
        "--max-num-proc",
        "--slots-per-host",
        "--elastic-timeout",
        "--reset-limit",
        "--blacklist-cooldown-range",
    ];

    /// A valid value (or values) for each option of horovodrun that takes some.
    fn sample(option: &str) -> &'static str {
        match option {
            "-np" | "--num-proc" | "--min-np" | "--min-num-proc" | "--max-np"
            | "--max-num-proc" | "--slots-per-host" => "2",
            "--start-timeout" | "--elastic-timeout" | "--reset-limit" => "30",
            "--network-interfaces" => "lo,eth0",
            "--network-interface" => "lo",
            "--output-filename" => "/tmp/out",
            "--config-file" => "/tmp/c.yaml",
            "-p" | "--ssh-port" => "2222",
            "-i" | "--ssh-identity-file" => "/k/id",
            "--fusion-threshold-mb" => "64",
            "--cycle-time-ms" => "2",
            "--cache-capacity" => "512",
            "--autotune-log-file" => "/tmp/at.csv",
            "--autotune-warmup-samples"
            | "--autotune-steps-per-sample"
            | "--autotune-bayes-opt-max-samples" => "5",
            "--autotune-gaussian-process-noise" => "0.5",
            "--blacklist-cooldown-range" => "60 300",
            "--timeline-filename" => "/tmp/t.json",
            "--stall-check-warning-time-seconds" | "--stall-check-shutdown-time-seconds" => "90",
            "--mpi-args" => "--map-by=ppr:6:node",
            "--binding-args" => "--bind-to=none",
            "--num-nccl-streams" => "2",
            "--thread-affinity" => "1",
            "--gloo-timeout-seconds" => "45",
            "--log-level" => "INFO",
            "-H" | "--hosts" => "localhost:2",
            "-hostfile" | "--hostfile" => "/tmp/hosts",
            "--host-discovery-script" => "/tmp/discover.sh",
            _ => "",
        }
    }

    #[test]
    fn every_horovodrun_option_is_accepted_with_effect_or_notice() {
        let mut with_notice = 0;
        for option in HOROVODRUN_OPTIONS {
            let line = format!("-np 2 {option} {} python x.py", sample(option));
            let parsed = match parse_args(&args(&line)) {
                Ok(Invocation::Launch(parsed)) => parsed,
                Ok(Invocation::Help) => {
                    assert!(["-h", "--help"].contains(&option));
                    continue;
                }
                Ok(Invocation::Version) => {
                    assert!(["-v", "--version"].contains(&option));
                    continue;
                }
                Ok(Invocation::CheckBuild) => {
                    assert!(["-cb", "--check-build"].contains(&option));
                    continue;
                }
                Err(err) => panic!("{line}: {err}"),
            };
            if option == "--config-file" {
                assert_eq!(parsed.config_file, Some(PathBuf::from("/tmp/c.yaml")));
            }
            assert_eq!(parsed.command, args("python x.py"), "{line}");
            let noticed: Vec<&str> = parsed.notices.iter().map(|(f, _)| f.as_str()).collect();
            if NOTICE_OPTIONS.contains(&option) {
                // The fixed-size notices of elastic options name the main spelling.
                let named = if option == "--max-num-proc" {
                    "--max-np"
                } else {
                    option
                };
                assert_eq!(noticed, [named], "{line}");
                with_notice += 1;
            } else {
                assert!(noticed.is_empty(), "{line}: {noticed:?}");
            }
        }
        assert_eq!(with_notice, NOTICE_OPTIONS.len());
        assert_eq!(HOROVODRUN_OPTIONS.len(), 73);
    }

    #[test]
    fn full_command_line() {
        let parsed = launch(
            "-np 4 -H a:2,b:2 --start-timeout 60 --network-interface eth0 -p 2222 \
             -i /k --verbose --output-filename /o -prefix-timestamp --disable-cache \
             python train.py -np 3",
        );
        assert_eq!(parsed.num_proc, Some(4));
        assert_eq!(parsed.hosts, Some(HostSource::Flag("a:2,b:2".into())));
        assert_eq!(parsed.start_timeout, Some(Duration::from_secs(60)));
        assert_eq!(parsed.network_interfaces, ["eth0"]);
        assert_eq!(parsed.ssh_port, Some(2222));
        assert_eq!(parsed.ssh_identity_file, Some(PathBuf::from("/k")));
        assert!(parsed.verbose && parsed.prefix_timestamp && parsed.disable_cache);
        assert_eq!(parsed.output_dir, Some(PathBuf::from("/o")));
        assert_eq!(parsed.command, args("python train.py -np 3"));
        assert!(parsed.notices.is_empty());
    }

    #[test]
    fn short_and_legacy_spellings() {
        let parsed = launch("-np=2 -hostfile /h -i /k -p=22 python x.py");
        assert_eq!(parsed.num_proc, Some(2));
        assert_eq!(parsed.hosts, Some(HostSource::File("/h".into())));
        assert_eq!(parsed.ssh_identity_file, Some(PathBuf::from("/k")));
        assert_eq!(parsed.ssh_port, Some(22));
        assert_eq!(parse_args(&args("-v")).unwrap(), Invocation::Version);
        assert_eq!(parse_args(&args("--version")).unwrap(), Invocation::Version);
        assert_eq!(parse_args(&args("-cb")).unwrap(), Invocation::CheckBuild);
        assert_eq!(
            parse_args(&args("--check-build")).unwrap(),
            Invocation::CheckBuild
        );
    }

    #[test]
    fn long_forms_equals_and_double_dash() {
        let parsed = launch("--num-proc=2 --hostfile=/h --ssh-port=22 -- -weird --flag");
        assert_eq!(parsed.num_proc, Some(2));
        assert_eq!(parsed.hosts, Some(HostSource::File("/h".into())));
        assert_eq!(parsed.ssh_port, Some(22));
        assert_eq!(parsed.command, args("-weird --flag"));
        assert_eq!(launch("--hosts h -- x").command, args("x"));
        assert_eq!(
            parse_args(&args("-np 2 --help x")).unwrap(),
            Invocation::Help
        );
        assert_eq!(parse_args(&args("-h")).unwrap(), Invocation::Help);
    }

    #[test]
    fn network_interfaces_accumulate_in_order_without_repeats() {
        let parsed = launch(
            "-np 1 --network-interfaces eth1,eth0 --network-interface eth0 \
             --network-interface=ib0 x",
        );
        assert_eq!(parsed.network_interfaces, ["eth1", "eth0", "ib0"]);
        assert!(error("-np 1 --network-interfaces , x").contains("names no interface"));
    }

    #[test]
    fn elastic_options_parse_into_elastic_args_without_notices() {
        let parsed = launch(
            "--min-np 2 --max-np 4 --slots-per-host 2 --elastic-timeout 60 --reset-limit 3 \
             --blacklist-cooldown-range 10 20 --host-discovery-script /d.sh x",
        );
        assert_eq!(parsed.num_proc, Some(2));
        assert_eq!(parsed.hosts, Some(HostSource::Discovery("/d.sh".into())));
        assert_eq!(
            parsed.elastic,
            Some(ElasticArgs {
                num_proc: 2,
                min_num_proc: 2,
                max_num_proc: Some(4),
                slots_per_host: 2,
                elastic_timeout_flag: Some(Duration::from_secs(60)),
                reset_limit: Some(3),
                cooldown_range: Some(CooldownRange::new(10, 20).unwrap()),
            })
        );
        assert_eq!(parsed.elastic_flags.max_num_proc, Some(4));
        assert!(parsed.notices.is_empty(), "{:?}", parsed.notices);
        // -np is the start size, --min-np the size to continue with; `--slots` is Horovod's
        // documented abbreviation of --slots-per-host; -H gives fixed hosts.
        let parsed = launch("-np 3 --min-np 2 --slots 4 -H a:2,b:2 x");
        let elastic = parsed.elastic.unwrap();
        assert_eq!((elastic.num_proc, elastic.min_num_proc), (3, 2));
        assert_eq!(elastic.slots_per_host, 4);
        assert_eq!(elastic.elastic_timeout_flag, None);
        // Without --min-np or a script the launch has a fixed size; the rest get notices.
        let parsed = launch("-np 2 --max-np 4 --reset-limit 1 x");
        assert_eq!(parsed.elastic, None);
        let noticed: Vec<&str> = parsed.notices.iter().map(|(f, _)| f.as_str()).collect();
        assert_eq!(noticed, ["--max-np", "--reset-limit"]);
    }

    #[test]
    fn bad_elastic_options_are_config_errors_naming_the_option() {
        let cases = [
            ("-np 2 --blacklist-cooldown-range 10", "two values"),
            (
                "-np 2 --blacklist-cooldown-range 0 10 x",
                "lower limit of 1",
            ),
            (
                "-np 2 --blacklist-cooldown-range 10 4000 x",
                "upper limit of 3600",
            ),
            (
                "-np 2 --blacklist-cooldown-range 20 10 x",
                "MIN 20 is more than MAX 10",
            ),
            (
                "-np 2 --min-np 3 --max-np 2 x",
                "--min-np 3 is more than --max-np 2",
            ),
            ("-np 1 --min-np 2 x", "-np 1 is less than --min-np 2"),
            (
                "-np 5 --min-np 2 --max-np 4 x",
                "-np 5 is more than --max-np 4",
            ),
            ("--host-discovery-script /d.sh x", "needs -np N"),
            (
                "-np 2 --host-discovery-script /d.sh -H a:2 x",
                "give the hosts once",
            ),
            (
                "-np 2 --hostfile /h --host-discovery-script /d.sh x",
                "give the hosts once",
            ),
            ("-np 2 --min-np 2 --mpi x", "drop --mpi"),
            (
                "-np 2 --host-discovery-script /d.sh --mpi-args=-v x",
                "drop --mpi",
            ),
            ("-np 2 --elastic-timeout 0 x", "--elastic-timeout \"0\""),
            (
                "-np 2 --elastic-timeout soon x",
                "--elastic-timeout \"soon\"",
            ),
            ("-np 2 --reset-limit -1 x", "--reset-limit \"-1\""),
            ("-np 2 --slots-per-host 0 x", "slots per host"),
            ("-np 2 --min-np 0 x", "--min-np \"0\""),
            ("-np 2 --max-num-proc many x", "--max-num-proc \"many\""),
        ];
        for (line, said) in cases {
            let message = error(line);
            assert!(message.contains(said), "{line}: {message}");
        }
    }

    #[test]
    fn controllers_are_exclusive_and_mpirun_arguments_select_mpi() {
        let parsed = launch("-np 2 --gloo x");
        assert_eq!(parsed.controller.as_deref(), Some("gloo"));
        assert!(parsed.notices.is_empty());
        let parsed = launch("-np 2 --mpi --mpi-args=--oversubscribe x");
        assert_eq!(parsed.controller.as_deref(), Some("mpi"));
        assert_eq!(parsed.mpi_args.as_deref(), Some("--oversubscribe"));
        assert!(parsed.notices.is_empty());
        // horovodrun built with MPI runs mpirun unless told --gloo.
        let parsed = launch("-np 2 --binding-args=--bind-to=core x");
        assert_eq!(parsed.controller.as_deref(), Some("mpi"));
        let parsed = launch("-np 2 --gloo --mpi-args=--oversubscribe x");
        assert_eq!(parsed.controller.as_deref(), Some("gloo"));
        assert_eq!(launch("-np 2 x").controller, None);
        assert!(error("-np 2 --gloo --mpi x").contains("at most one"));
    }

    #[test]
    fn bad_usage_is_a_precise_config_error() {
        assert!(error("-np 0 x").contains("-np \"0\""));
        assert!(error("-np four x").contains("positive number"));
        assert!(error("-np").contains("-np needs a value"));
        assert!(error("-np 2").contains("no command"));
        assert!(error("python x.py").contains("-np N"));
        assert!(error("-np 2 --bogus x").contains("unknown option \"--bogus\""));
        assert!(error("-np 2 -H a --hostfile b x").contains("give the hosts once"));
        assert!(error("-np 2 -p 0 x").contains("port"));
        assert!(error("-np 2 --start-timeout soon x").contains("--start-timeout"));
        assert_eq!(launch("-np 2 --config-file c.yaml x y").options_end, 4);
    }

    fn engine_env(text: &str) -> Vec<(String, String)> {
        launch(&format!("-np 2 {text} python x.py")).engine_env
    }

    fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
        items
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn no_engine_flags_set_no_variables() {
        assert!(launch("-np 2 python x.py").engine_env.is_empty());
        assert!(engine_env("--no-autotune --autotune-warmup-samples 3").is_empty());
    }

    /// Bad autotune values fail at the launcher, naming the flag, before any rank starts.
    #[test]
    fn bad_autotune_values_are_config_errors() {
        for (flag, value) in [
            ("--autotune-steps-per-sample", "0"),
            ("--autotune-bayes-opt-max-samples", "0"),
            ("--autotune-warmup-samples", "-1"),
            ("--autotune-gaussian-process-noise", "2"),
        ] {
            let message = error(&format!("--autotune {flag} {value} -np 1 python x.py"));
            assert!(message.contains(flag), "{message}");
        }
    }

    /// Each tuning flag sets the variable Horovod's `set_env_from_args` sets (and kolo's name
    /// where kolo's engine reads one).
    #[test]
    fn tuning_flags_set_horovods_variables() {
        let cases: [(&str, &[(&str, &str)]); 24] = [
            (
                "--fusion-threshold-mb 2",
                &[
                    (FUSION_THRESHOLD, "2097152"),
                    ("HOROVOD_FUSION_THRESHOLD", "2097152"),
                ],
            ),
            (
                "--fusion-threshold-mb=0.5",
                &[
                    (FUSION_THRESHOLD, "524288"),
                    ("HOROVOD_FUSION_THRESHOLD", "524288"),
                ],
            ),
            (
                "--cycle-time-ms 2.5",
                &[(CYCLE_TIME, "2.5"), ("HOROVOD_CYCLE_TIME", "2.5")],
            ),
            (
                "--cache-capacity 0",
                &[(CACHE_CAPACITY, "0"), ("HOROVOD_CACHE_CAPACITY", "0")],
            ),
            (
                "--hierarchical-allreduce",
                &[
                    ("KOLO_HIERARCHICAL_ALLREDUCE", "1"),
                    ("HOROVOD_HIERARCHICAL_ALLREDUCE", "1"),
                ],
            ),
            (
                "--no-hierarchical-allreduce",
                &[
                    ("KOLO_HIERARCHICAL_ALLREDUCE", "0"),
                    ("HOROVOD_HIERARCHICAL_ALLREDUCE", "0"),
                ],
            ),
            (
                "--hierarchical-allgather",
                &[
                    ("KOLO_HIERARCHICAL_ALLGATHER", "1"),
                    ("HOROVOD_HIERARCHICAL_ALLGATHER", "1"),
                ],
            ),
            (
                "--no-hierarchical-allgather",
                &[
                    ("KOLO_HIERARCHICAL_ALLGATHER", "0"),
                    ("HOROVOD_HIERARCHICAL_ALLGATHER", "0"),
                ],
            ),
            ("--torus-allreduce", &[("HOROVOD_TORUS_ALLREDUCE", "1")]),
            ("--no-torus-allreduce", &[("HOROVOD_TORUS_ALLREDUCE", "0")]),
            (
                "--autotune --autotune-log-file /a.csv --autotune-gaussian-process-noise 0.25",
                &[
                    ("KOLO_AUTOTUNE", "1"),
                    ("HOROVOD_AUTOTUNE", "1"),
                    ("KOLO_AUTOTUNE_LOG", "/a.csv"),
                    ("HOROVOD_AUTOTUNE_LOG", "/a.csv"),
                    ("KOLO_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", "0.25"),
                    ("HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", "0.25"),
                ],
            ),
            (
                "--timeline-filename /t.json --no-timeline-mark-cycles",
                &[
                    (TIMELINE, "/t.json"),
                    ("HOROVOD_TIMELINE", "/t.json"),
                    (TIMELINE_MARK_CYCLES, "0"),
                    ("HOROVOD_TIMELINE_MARK_CYCLES", "0"),
                ],
            ),
            (
                "--no-stall-check",
                &[
                    (STALL_CHECK_DISABLE, "1"),
                    ("HOROVOD_STALL_CHECK_DISABLE", "1"),
                ],
            ),
            (
                "--stall-check",
                &[
                    (STALL_CHECK_DISABLE, "0"),
                    ("HOROVOD_STALL_CHECK_DISABLE", "0"),
                ],
            ),
            (
                "--stall-check-warning-time-seconds 5",
                &[
                    (STALL_CHECK_TIME_SECONDS, "5"),
                    ("HOROVOD_STALL_CHECK_TIME_SECONDS", "5"),
                ],
            ),
            (
                "--stall-check-shutdown-time-seconds 9",
                &[
                    (STALL_SHUTDOWN_TIME_SECONDS, "9"),
                    ("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "9"),
                ],
            ),
            (
                "--mpi-threads-disable",
                &[("HOROVOD_MPI_THREADS_DISABLE", "1")],
            ),
            (
                "--no-mpi-threads-disable",
                &[("HOROVOD_MPI_THREADS_DISABLE", "0")],
            ),
            ("--tcp", &[("NCCL_IB_DISABLE", "1")]),
            ("--num-nccl-streams 2", &[("HOROVOD_NUM_NCCL_STREAMS", "2")]),
            (
                "--thread-affinity 3",
                &[(THREAD_AFFINITY, "3"), ("HOROVOD_THREAD_AFFINITY", "3")],
            ),
            (
                "--gloo-timeout-seconds 45",
                &[
                    ("KOLO_COLLECTIVE_TIMEOUT_SECONDS", "45"),
                    ("HOROVOD_GLOO_TIMEOUT_SECONDS", "45"),
                ],
            ),
            (
                "--log-level Debug --log-without-timestamp",
                &[
                    (LOG_LEVEL, "debug"),
                    ("HOROVOD_LOG_LEVEL", "DEBUG"),
                    (LOG_HIDE_TIME, "1"),
                    ("HOROVOD_LOG_HIDE_TIME", "1"),
                ],
            ),
            (
                "--log-hide-timestamp --no-log-hide-timestamp",
                &[(LOG_HIDE_TIME, "0"), ("HOROVOD_LOG_HIDE_TIME", "0")],
            ),
        ];
        for (flags, expected) in cases {
            assert_eq!(engine_env(flags), pairs(expected), "{flags}");
        }
    }

    #[test]
    fn timeline_filename_becomes_absolute() {
        let relative = engine_env("--timeline-filename out/t.json");
        let expected = std::env::current_dir().unwrap().join("out/t.json");
        assert_eq!(
            relative[0],
            (TIMELINE.to_owned(), expected.to_str().unwrap().to_owned())
        );
    }

    #[test]
    fn log_level_is_case_insensitive() {
        for level in knobs::LOG_LEVELS {
            let env = engine_env(&format!("--log-level {}", level.to_uppercase()));
            assert_eq!(env[0], (LOG_LEVEL.to_owned(), level.to_owned()));
        }
    }

    #[test]
    fn a_repeated_flag_keeps_its_last_value_in_first_order() {
        let env = engine_env("--cache-capacity 7 --cycle-time-ms 3 --cache-capacity 8");
        assert_eq!(
            env,
            pairs(&[
                (CACHE_CAPACITY, "8"),
                ("HOROVOD_CACHE_CAPACITY", "8"),
                (CYCLE_TIME, "3"),
                ("HOROVOD_CYCLE_TIME", "3"),
            ])
        );
    }

    #[test]
    fn bad_engine_values_name_the_flag_and_what_is_accepted() {
        let cases = [
            ("--fusion-threshold-mb -1", "from 0 (no fusion)"),
            ("--fusion-threshold-mb big", "size in MiB"),
            ("--fusion-threshold-mb NaN", "size in MiB"),
            ("--fusion-threshold-mb 2000000", "1048576"),
            ("--cycle-time-ms 0", "positive number of milliseconds"),
            ("--cycle-time-ms fast", "positive number of milliseconds"),
            ("--cache-capacity -1", "whole number of entries"),
            ("--cache-capacity 1.5", "whole number of entries"),
            (
                "--stall-check-warning-time-seconds soon",
                "whole number of seconds",
            ),
            ("--stall-check-shutdown-time-seconds -3", "0: never"),
            (
                "--log-level verbose",
                "trace, debug, info, warning, error, fatal",
            ),
            (
                "--gloo-timeout-seconds 0",
                "positive whole number of seconds",
            ),
            ("--num-nccl-streams -1", "whole number"),
            ("--autotune-gaussian-process-noise 2", "[0, 1]"),
            ("--autotune-warmup-samples x", "whole number"),
        ];
        for (flags, accepted) in cases {
            let message = error(&format!("-np 2 {flags} python x.py"));
            let (flag, value) = flags.split_once(' ').unwrap();
            assert!(
                message.contains(&format!("{flag} {value:?}")),
                "{flags}: {message}"
            );
            assert!(message.contains(accepted), "{flags}: {message}");
        }
        for flag in ["--fusion-threshold-mb", "--cycle-time-ms", "--log-level"] {
            assert!(error(&format!("-np 2 {flag}")).contains(&format!("{flag} needs a value")));
        }
    }
}

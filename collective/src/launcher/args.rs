//! kolorun's command line: horovodrun-style flags, then the command to run on every slot.

use std::path::PathBuf;
use std::time::Duration;

use crate::control::env::parse_seconds;
use crate::error::{Error, Result};

/// `kolorun --help`.
pub const USAGE: &str = "\
usage: kolorun [options] [--] COMMAND [ARGS...]

Starts COMMAND once per slot (locally, or over ssh), runs the job driver the ranks register
with, prefixes every output line with its rank, and stops every rank as soon as one fails.

options:
  -np N, --num-proc N          number of processes (default: every slot of -H/--hostfile)
  -H, --hosts H:S,H:S          hosts and their slot counts, e.g. -H node1:4,node2:4
                               (localhost and this machine's hostname run locally; any other
                               entry, including 127.0.0.1, is reached over ssh)
  --hostfile FILE              one host per line: `host slots=N` or `host:N`; # comments
  --start-timeout SECS         seconds for every rank to register (default 30, or
                               KOLO_START_TIMEOUT)
  --network-interface NIC|IP   interface (or IP) the job driver and data plane use
  -p, --ssh-port PORT          ssh port for remote hosts
  --ssh-identity-file FILE     ssh private key for remote hosts
  --output-filename DIR        also write each rank's output to DIR/rank.N/{stdout,stderr}
  --verbose                    log launch details (commands, hosts, ranks)
  -h, --help                   show this help

engine options (set the variable in brackets on every rank):
  --fusion-threshold-mb MB     tensors fused into one collective up to MB MiB (float; 0 turns
                               fusion off) [KOLO_FUSION_THRESHOLD, in bytes; default 128]
  --cycle-time-ms MS           milliseconds between engine cycles (float > 0)
                               [KOLO_CYCLE_TIME; default 1]
  --cache-capacity N           response cache entries (0 turns the cache off)
                               [KOLO_CACHE_CAPACITY; default 1024]
  --timeline-filename PATH     write a Chrome trace timeline on rank 0 [KOLO_TIMELINE]
  --timeline-mark-cycles       mark engine cycles in the timeline [KOLO_TIMELINE_MARK_CYCLES=1]
  --no-stall-check             turn the stall inspector off [KOLO_STALL_CHECK_DISABLE=1]
  --stall-check-warning-time-seconds S
                               warn about ranks that lag S whole seconds on a tensor
                               [KOLO_STALL_CHECK_TIME_SECONDS; default 60]
  --stall-check-shutdown-time-seconds S
                               abort the job after a stall of S whole seconds (0: never)
                               [KOLO_STALL_SHUTDOWN_TIME_SECONDS; default 0]
  --log-level LEVEL            trace|debug|info|warning|error|fatal [KOLO_LOG_LEVEL;
                               default warning]

environment: KOLO_ABORT_GRACE_SECONDS (default 3) is how long surviving ranks get to exit by
themselves after a failure before they are terminated; KOLO_HEARTBEAT_TIMEOUT_SECONDS
(default 30) is how long a registered rank may stay silent before the job is aborted.
";

/// Where the host list comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostSource {
    /// `-H`/`--hosts` text.
    Flag(String),
    /// `--hostfile` path.
    File(PathBuf),
}

/// Parsed `kolorun` options and command.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LaunchArgs {
    /// `-np`/`--num-proc`.
    pub num_proc: Option<usize>,
    /// `-H`/`--hosts` or `--hostfile`.
    pub hosts: Option<HostSource>,
    /// `--start-timeout`.
    pub start_timeout: Option<Duration>,
    /// `--network-interface`.
    pub network_interface: Option<String>,
    /// `-p`/`--ssh-port`.
    pub ssh_port: Option<u16>,
    /// `--ssh-identity-file`.
    pub ssh_identity_file: Option<PathBuf>,
    /// `--verbose`.
    pub verbose: bool,
    /// `--output-filename`.
    pub output_dir: Option<PathBuf>,
    /// Engine settings from the engine flags (`--fusion-threshold-mb`, `--cycle-time-ms`, ...)
    /// as `(variable, value)` pairs that every rank gets in its environment; one entry per
    /// variable, in the order first given (a repeated flag keeps its last value).
    pub engine_env: Vec<(String, String)>,
    /// The command and its arguments.
    pub command: Vec<String>,
}

/// `KOLO_FUSION_THRESHOLD` (bytes), set by `--fusion-threshold-mb`.
pub const FUSION_THRESHOLD: &str = "KOLO_FUSION_THRESHOLD";
/// `KOLO_CYCLE_TIME` (milliseconds), set by `--cycle-time-ms`.
pub const CYCLE_TIME: &str = "KOLO_CYCLE_TIME";
/// `KOLO_CACHE_CAPACITY`, set by `--cache-capacity`.
pub const CACHE_CAPACITY: &str = "KOLO_CACHE_CAPACITY";
/// `KOLO_TIMELINE` (an absolute path), set by `--timeline-filename`.
pub const TIMELINE: &str = "KOLO_TIMELINE";
/// `KOLO_TIMELINE_MARK_CYCLES`, set to `1` by `--timeline-mark-cycles`.
pub const TIMELINE_MARK_CYCLES: &str = "KOLO_TIMELINE_MARK_CYCLES";
/// `KOLO_STALL_CHECK_DISABLE`, set to `1` by `--no-stall-check`.
pub const STALL_CHECK_DISABLE: &str = "KOLO_STALL_CHECK_DISABLE";
/// `KOLO_STALL_CHECK_TIME_SECONDS`, set by `--stall-check-warning-time-seconds`.
pub const STALL_CHECK_TIME_SECONDS: &str = "KOLO_STALL_CHECK_TIME_SECONDS";
/// `KOLO_STALL_SHUTDOWN_TIME_SECONDS`, set by `--stall-check-shutdown-time-seconds`.
pub const STALL_SHUTDOWN_TIME_SECONDS: &str = "KOLO_STALL_SHUTDOWN_TIME_SECONDS";
/// `KOLO_LOG_LEVEL`, set by `--log-level`.
pub const LOG_LEVEL: &str = "KOLO_LOG_LEVEL";

/// The levels `--log-level` accepts (Horovod's names).
const LOG_LEVELS: [&str; 6] = ["trace", "debug", "info", "warning", "error", "fatal"];
/// The largest `--fusion-threshold-mb` (1 TiB): anything above is a typo.
const MAX_FUSION_MB: f64 = 1024.0 * 1024.0;

/// What the command line asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Invocation {
    /// `-h`/`--help`.
    Help,
    /// Run a job.
    Launch(LaunchArgs),
}

/// Parses kolorun's arguments (without the program name). Options end at `--` or at the first
/// token that is not an option; everything from there on is the command.
pub fn parse_args(args: &[String]) -> Result<Invocation> {
    let mut parsed = LaunchArgs::default();
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
            Some((name, value)) if name.starts_with("--") => (name, Some(value.to_owned())),
            _ => (token, None),
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
        match name {
            "-h" | "--help" => return Ok(Invocation::Help),
            "-np" | "--num-proc" => {
                let text = value()?;
                let n = text
                    .parse::<usize>()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| {
                        Error::Config(format!(
                            "kolorun: {name} {text:?} is not a positive number of processes"
                        ))
                    })?;
                parsed.num_proc = Some(n);
            }
            "-H" | "--hosts" => set_hosts(&mut parsed, HostSource::Flag(value()?))?,
            "--hostfile" => set_hosts(&mut parsed, HostSource::File(PathBuf::from(value()?)))?,
            "--start-timeout" => {
                parsed.start_timeout = Some(parse_seconds("--start-timeout", &value()?)?)
            }
            "--network-interface" => parsed.network_interface = Some(value()?),
            "-p" | "--ssh-port" => {
                let text = value()?;
                let port = text.parse::<u16>().ok().filter(|p| *p > 0).ok_or_else(|| {
                    Error::Config(format!(
                        "kolorun: {name} {text:?} is not a port number (1-65535)"
                    ))
                })?;
                parsed.ssh_port = Some(port);
            }
            "--ssh-identity-file" => parsed.ssh_identity_file = Some(PathBuf::from(value()?)),
            "--output-filename" => parsed.output_dir = Some(PathBuf::from(value()?)),
            "--verbose" => parsed.verbose = true,
            "--fusion-threshold-mb"
            | "--cycle-time-ms"
            | "--cache-capacity"
            | "--timeline-filename"
            | "--stall-check-warning-time-seconds"
            | "--stall-check-shutdown-time-seconds"
            | "--log-level" => {
                let (variable, setting) = engine_setting(name, &value()?)?;
                set_engine_env(&mut parsed, variable, setting);
            }
            "--timeline-mark-cycles" => {
                set_engine_env(&mut parsed, TIMELINE_MARK_CYCLES, "1".into())
            }
            "--no-stall-check" => set_engine_env(&mut parsed, STALL_CHECK_DISABLE, "1".into()),
            "--check-build" => {
                return Err(Error::Config(
                    "kolorun: --check-build is answered by the Python `kolorun` script; run it \
                     through the installed kolorun command"
                        .into(),
                ))
            }
            _ => {
                return Err(Error::Config(format!(
                    "kolorun: unknown option {token:?}; run kolorun --help"
                )))
            }
        }
    }
    parsed.command = args[position..].to_vec();
    if parsed.command.is_empty() {
        return Err(Error::Config(
            "kolorun: no command given; usage: kolorun -np N [options] COMMAND [ARGS...]".into(),
        ));
    }
    if parsed.num_proc.is_none() && parsed.hosts.is_none() {
        return Err(Error::Config(
            "kolorun: say how many processes to start: -np N (or give hosts with -H/--hostfile)"
                .into(),
        ));
    }
    Ok(Invocation::Launch(parsed))
}

fn set_hosts(parsed: &mut LaunchArgs, source: HostSource) -> Result<()> {
    if parsed.hosts.is_some() {
        return Err(Error::Config(
            "kolorun: give the hosts once: either -H/--hosts or --hostfile, not both".into(),
        ));
    }
    parsed.hosts = Some(source);
    Ok(())
}

/// The variable an engine flag sets and its checked value, e.g. `--fusion-threshold-mb 0.5` →
/// `("KOLO_FUSION_THRESHOLD", "524288")`.
fn engine_setting(flag: &str, text: &str) -> Result<(&'static str, String)> {
    let trimmed = text.trim();
    let bad = |accepted: &str| Error::Config(format!("kolorun: {flag} {text:?} {accepted}"));
    match flag {
        "--fusion-threshold-mb" => {
            let mb = trimmed
                .parse::<f64>()
                .ok()
                .filter(|mb| mb.is_finite() && (0.0..=MAX_FUSION_MB).contains(mb))
                .ok_or_else(|| {
                    bad(
                        "is not a size in MiB: give a number from 0 (no fusion) to 1048576, \
                         e.g. 64 or 0.5",
                    )
                })?;
            let bytes = (mb * 1024.0 * 1024.0).round() as u64;
            Ok((FUSION_THRESHOLD, bytes.to_string()))
        }
        "--cycle-time-ms" => {
            let ms = trimmed
                .parse::<f64>()
                .ok()
                .filter(|ms| ms.is_finite() && *ms > 0.0 && *ms <= 1e6)
                .ok_or_else(|| {
                    bad("is not a cycle time: give a positive number of milliseconds, e.g. 1 or 2.5")
                })?;
            Ok((CYCLE_TIME, ms.to_string()))
        }
        "--cache-capacity" => {
            let n = trimmed.parse::<u32>().map_err(|_| {
                bad(
                    "is not a cache capacity: give a whole number of entries (0 turns the cache \
                     off)",
                )
            })?;
            Ok((CACHE_CAPACITY, n.to_string()))
        }
        "--timeline-filename" => {
            if trimmed.is_empty() {
                return Err(bad("is not a file path"));
            }
            let path = std::path::absolute(text)
                .map_err(|err| bad(&format!("cannot be made an absolute path: {err}")))?;
            let path = path
                .into_os_string()
                .into_string()
                .map_err(|_| bad("is not valid UTF-8 once made absolute; choose a UTF-8 path"))?;
            Ok((TIMELINE, path))
        }
        "--stall-check-warning-time-seconds" | "--stall-check-shutdown-time-seconds" => {
            let (variable, accepted) = if flag == "--stall-check-warning-time-seconds" {
                (
                    STALL_CHECK_TIME_SECONDS,
                    "is not a time: give a whole number of seconds, e.g. 60",
                )
            } else {
                (
                    STALL_SHUTDOWN_TIME_SECONDS,
                    "is not a time: give a whole number of seconds, e.g. 600 (0: never)",
                )
            };
            let seconds = trimmed.parse::<u32>().map_err(|_| bad(accepted))?;
            Ok((variable, seconds.to_string()))
        }
        "--log-level" => {
            let level = trimmed.to_ascii_lowercase();
            if !LOG_LEVELS.contains(&level.as_str()) {
                return Err(bad(&format!(
                    "is not a log level: give one of {}",
                    LOG_LEVELS.join(", ")
                )));
            }
            Ok((LOG_LEVEL, level))
        }
        _ => Err(Error::Internal(format!(
            "kolorun: {flag} is not an engine flag (this is a bug)"
        ))),
    }
}

/// Sets `variable` in [`LaunchArgs::engine_env`], replacing an earlier value.
fn set_engine_env(parsed: &mut LaunchArgs, variable: &str, value: String) {
    match parsed
        .engine_env
        .iter_mut()
        .find(|(name, _)| name == variable)
    {
        Some(entry) => entry.1 = value,
        None => parsed.engine_env.push((variable.to_owned(), value)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(text: &str) -> Vec<String> {
        text.split_whitespace().map(str::to_owned).collect()
    }

    fn launch(text: &str) -> LaunchArgs {
        match parse_args(&args(text)).unwrap() {
            Invocation::Launch(parsed) => parsed,
            Invocation::Help => panic!("help"),
        }
    }

    fn error(text: &str) -> String {
        let err = parse_args(&args(text)).unwrap_err();
        assert!(matches!(err, Error::Config(_)), "{err:?}");
        err.to_string()
    }

    #[test]
    fn full_command_line() {
        let parsed = launch(
            "-np 4 -H a:2,b:2 --start-timeout 60 --network-interface eth0 -p 2222 \
             --ssh-identity-file /k --verbose --output-filename /o python train.py -np 3",
        );
        assert_eq!(parsed.num_proc, Some(4));
        assert_eq!(parsed.hosts, Some(HostSource::Flag("a:2,b:2".into())));
        assert_eq!(parsed.start_timeout, Some(Duration::from_secs(60)));
        assert_eq!(parsed.network_interface.as_deref(), Some("eth0"));
        assert_eq!(parsed.ssh_port, Some(2222));
        assert_eq!(parsed.ssh_identity_file, Some(PathBuf::from("/k")));
        assert!(parsed.verbose);
        assert_eq!(parsed.output_dir, Some(PathBuf::from("/o")));
        assert_eq!(parsed.command, args("python train.py -np 3"));
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
    fn bad_usage_is_a_precise_config_error() {
        assert!(error("-np 0 x").contains("-np \"0\""));
        assert!(error("-np four x").contains("positive number"));
        assert!(error("-np").contains("-np needs a value"));
        assert!(error("-np 2").contains("no command"));
        assert!(error("python x.py").contains("-np N"));
        assert!(error("-np 2 --bogus x").contains("unknown option \"--bogus\""));
        assert!(error("-np 2 -H a -H b x").contains("not both"));
        assert!(error("-np 2 -p 0 x").contains("port"));
        assert!(error("-np 2 --start-timeout soon x").contains("--start-timeout"));
        assert!(error("-np 2 --check-build").contains("Python"));
    }
    fn engine_env(text: &str) -> Vec<(String, String)> {
        launch(&format!("-np 2 {text} python x.py")).engine_env
    }

    fn pair(name: &str, value: &str) -> (String, String) {
        (name.to_owned(), value.to_owned())
    }

    #[test]
    fn no_engine_flags_set_no_variables() {
        assert!(launch("-np 2 python x.py").engine_env.is_empty());
    }

    #[test]
    fn fusion_threshold_is_converted_to_bytes() {
        assert_eq!(
            engine_env("--fusion-threshold-mb 2"),
            [pair(FUSION_THRESHOLD, "2097152")]
        );
        assert_eq!(
            engine_env("--fusion-threshold-mb=0.5"),
            [pair(FUSION_THRESHOLD, "524288")]
        );
        assert_eq!(
            engine_env("--fusion-threshold-mb 0"),
            [pair(FUSION_THRESHOLD, "0")]
        );
        assert_eq!(
            engine_env("--fusion-threshold-mb 128"),
            [pair(FUSION_THRESHOLD, "134217728")]
        );
    }

    #[test]
    fn cycle_time_accepts_floats() {
        assert_eq!(engine_env("--cycle-time-ms 3"), [pair(CYCLE_TIME, "3")]);
        assert_eq!(engine_env("--cycle-time-ms 2.5"), [pair(CYCLE_TIME, "2.5")]);
        assert_eq!(engine_env("--cycle-time-ms=0.1"), [pair(CYCLE_TIME, "0.1")]);
    }

    #[test]
    fn cache_capacity_including_zero() {
        assert_eq!(
            engine_env("--cache-capacity 7"),
            [pair(CACHE_CAPACITY, "7")]
        );
        assert_eq!(
            engine_env("--cache-capacity 0"),
            [pair(CACHE_CAPACITY, "0")]
        );
    }

    #[test]
    fn timeline_filename_becomes_absolute() {
        assert_eq!(
            engine_env("--timeline-filename /tmp/t.json"),
            [pair(TIMELINE, "/tmp/t.json")]
        );
        let relative = engine_env("--timeline-filename out/t.json");
        let expected = std::env::current_dir().unwrap().join("out/t.json");
        assert_eq!(relative, [pair(TIMELINE, expected.to_str().unwrap())]);
        assert!(std::path::Path::new(&relative[0].1).is_absolute());
    }

    #[test]
    fn switches_set_one() {
        assert_eq!(
            engine_env("--timeline-mark-cycles"),
            [pair(TIMELINE_MARK_CYCLES, "1")]
        );
        assert_eq!(
            engine_env("--no-stall-check"),
            [pair(STALL_CHECK_DISABLE, "1")]
        );
    }

    #[test]
    fn stall_check_times() {
        assert_eq!(
            engine_env("--stall-check-warning-time-seconds 30"),
            [pair(STALL_CHECK_TIME_SECONDS, "30")]
        );
        assert_eq!(
            engine_env("--stall-check-shutdown-time-seconds=120"),
            [pair(STALL_SHUTDOWN_TIME_SECONDS, "120")]
        );
        assert_eq!(
            engine_env("--stall-check-shutdown-time-seconds 0"),
            [pair(STALL_SHUTDOWN_TIME_SECONDS, "0")]
        );
    }

    #[test]
    fn log_level_is_case_insensitive_and_lowercased() {
        for level in LOG_LEVELS {
            assert_eq!(
                engine_env(&format!("--log-level {}", level.to_uppercase())),
                [pair(LOG_LEVEL, level)]
            );
        }
        assert_eq!(engine_env("--log-level Debug"), [pair(LOG_LEVEL, "debug")]);
    }

    #[test]
    fn every_engine_flag_together_in_order_and_last_value_wins() {
        let env = engine_env(
            "--fusion-threshold-mb 2 --cycle-time-ms 3 --cache-capacity 7 --timeline-filename \
             /t.json --timeline-mark-cycles --no-stall-check \
             --stall-check-warning-time-seconds 5 --stall-check-shutdown-time-seconds 9 \
             --log-level info --cache-capacity 8",
        );
        assert_eq!(
            env,
            [
                pair(FUSION_THRESHOLD, "2097152"),
                pair(CYCLE_TIME, "3"),
                pair(CACHE_CAPACITY, "8"),
                pair(TIMELINE, "/t.json"),
                pair(TIMELINE_MARK_CYCLES, "1"),
                pair(STALL_CHECK_DISABLE, "1"),
                pair(STALL_CHECK_TIME_SECONDS, "5"),
                pair(STALL_SHUTDOWN_TIME_SECONDS, "9"),
                pair(LOG_LEVEL, "info"),
            ]
        );
    }

    #[test]
    fn bad_engine_values_name_the_flag_and_what_is_accepted() {
        let cases = [
            ("--fusion-threshold-mb -1", "from 0 (no fusion)"),
            ("--fusion-threshold-mb big", "size in MiB"),
            ("--fusion-threshold-mb NaN", "size in MiB"),
            ("--fusion-threshold-mb inf", "size in MiB"),
            ("--fusion-threshold-mb 2000000", "1048576"),
            ("--cycle-time-ms 0", "positive number of milliseconds"),
            ("--cycle-time-ms -2", "positive number of milliseconds"),
            ("--cycle-time-ms fast", "positive number of milliseconds"),
            ("--cache-capacity -1", "whole number of entries"),
            ("--cache-capacity 1.5", "whole number of entries"),
            (
                "--stall-check-warning-time-seconds 1.5",
                "whole number of seconds",
            ),
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
                "--log-level warn",
                "trace, debug, info, warning, error, fatal",
            ),
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
        let message = error("-np 2 --timeline-filename= python x.py");
        assert!(
            message.contains("--timeline-filename \"\" is not a file path"),
            "{message}"
        );
        for flag in ["--fusion-threshold-mb", "--cycle-time-ms", "--log-level"] {
            assert!(error(&format!("-np 2 {flag}")).contains(&format!("{flag} needs a value")));
        }
    }
}

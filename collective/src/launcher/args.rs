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
    /// The command and its arguments.
    pub command: Vec<String>,
}

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
}

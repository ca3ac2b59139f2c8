//! The ssh command line for a remote rank, and the POSIX shell script it runs there: read the
//! rank's environment from stdin, cd to the launch directory, run the command in its own
//! session under a watchdog that kills it when the ssh connection goes away (stdin reaches EOF).
//!
//! The environment (the job secret, kolo's variables and the forwarded launching environment)
//! never appears on a command line, where `ps` on either machine would show it: kolorun writes
//! it to ssh's stdin as `<byte count>\n` followed by that many bytes of `export NAME='value'`
//! lines, which the script reads with `head -c` and evaluates.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// Seconds the remote watchdog waits between SIGTERM and SIGKILL.
const REMOTE_KILL_GRACE_SECONDS: u32 = 3;

/// The most environment kolorun sends to one remote rank (Linux limits a process's arguments
/// and environment together to a few MiB).
pub const MAX_REMOTE_ENV_BYTES: usize = 1 << 20;

/// Quotes `text` for a POSIX shell (single quotes; embedded `'` as `'\''`).
pub fn quote(text: &str) -> String {
    if !text.is_empty()
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./:=@,+%".contains(&b))
    {
        return text.to_owned();
    }
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// True for names a POSIX shell can export (`[A-Za-z_][A-Za-z0-9_]*`).
pub fn is_shell_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// What kolorun writes to a remote rank's ssh stdin: the length line and the `export` lines of
/// `vars` (later entries win). A `Config` error when it exceeds [`MAX_REMOTE_ENV_BYTES`],
/// naming the largest variables.
pub fn stdin_env(vars: &[(String, String)]) -> Result<String> {
    let block: String = vars
        .iter()
        .map(|(name, value)| format!("export {name}={}\n", quote(value)))
        .collect();
    if block.len() > MAX_REMOTE_ENV_BYTES {
        let mut sizes: Vec<(usize, &str)> = vars
            .iter()
            .map(|(name, value)| (name.len() + value.len(), name.as_str()))
            .collect();
        sizes.sort_unstable_by(|a, b| b.cmp(a));
        let largest: Vec<String> = sizes
            .iter()
            .take(3)
            .map(|(size, name)| format!("{name} ({size} bytes)"))
            .collect();
        return Err(Error::Config(format!(
            "kolorun: the environment for remote ranks is {} bytes, more than the {} kolorun \
             sends; the largest variables are {}: unset them before launching",
            block.len(),
            MAX_REMOTE_ENV_BYTES,
            largest.join(", ")
        )));
    }
    Ok(format!("{}\n{block}", block.len()))
}

/// The script a remote rank runs (see the module docs): it first reads its environment from
/// stdin ([`stdin_env`]). The command's exit status becomes the script's (128+N when it was
/// killed by signal N).
pub fn remote_script(cwd: &Path, command: &[String]) -> String {
    let command: Vec<String> = command.iter().map(|arg| quote(arg)).collect();
    let command = command.join(" ");
    let grace = REMOTE_KILL_GRACE_SECONDS;
    format!(
        "IFS= read -r kolo_env_bytes || exit 1\n\
         kolo_env=$(head -c \"$kolo_env_bytes\") || exit 1\n\
         eval \"$kolo_env\" || exit 1\n\
         unset kolo_env kolo_env_bytes\n\
         cd {cwd} || exit 1\n\
         exec 3<&0\n\
         if command -v setsid >/dev/null 2>&1; then setsid {command} </dev/null 3<&- &\n\
         else {command} </dev/null 3<&- & fi\n\
         kolo_pid=$!\n\
         ( cat <&3 >/dev/null 2>&1; kill -TERM -$kolo_pid $kolo_pid 2>/dev/null; sleep {grace}; \
         kill -KILL -$kolo_pid $kolo_pid 2>/dev/null ) >/dev/null 2>&1 &\n\
         kolo_watchdog=$!\n\
         exec 3<&-\n\
         wait $kolo_pid 2>/dev/null\n\
         kolo_status=$?\n\
         {{ kill $kolo_watchdog; wait $kolo_watchdog; }} 2>/dev/null\n\
         kill -KILL -$kolo_pid 2>/dev/null\n\
         exit $kolo_status\n",
        cwd = quote(&cwd.to_string_lossy()),
    )
}

/// `KOLO_SSH_STRICT_HOST_KEY_CHECKING`: how ssh treats host keys (see [`HostKeyChecking`]).
pub const STRICT_HOST_KEY_CHECKING_ENV: &str = "KOLO_SSH_STRICT_HOST_KEY_CHECKING";
/// `KOLO_SSH_KNOWN_HOSTS`: the known_hosts file ssh checks and records host keys in, instead
/// of the user's (`~/.ssh/known_hosts`, or what `~/.ssh/config` names).
pub const KNOWN_HOSTS_ENV: &str = "KOLO_SSH_KNOWN_HOSTS";

/// How ssh checks the identity of remote hosts (its `StrictHostKeyChecking`). The job secret
/// travels over the connection, so kolorun checks by default, unlike horovodrun (which runs
/// `ssh -o PasswordAuthentication=no -o StrictHostKeyChecking=no`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum HostKeyChecking {
    /// `accept-new` (the default): a host seen for the first time has its key recorded in
    /// known_hosts; a host whose key differs from the recorded one is refused.
    #[default]
    AcceptNew,
    /// `yes`: only hosts whose key is already in known_hosts.
    Yes,
    /// `no`: any key is accepted (horovodrun's behaviour; anyone who can impersonate a host
    /// receives the job secret). Opt-in only.
    No,
}

impl HostKeyChecking {
    /// The setting `text` names (`accept-new`, `yes`, `no`, case-insensitive); a `Config`
    /// error naming `source` and the accepted values otherwise.
    pub fn parse(text: &str, source: &str) -> Result<Self> {
        match text.trim().to_ascii_lowercase().as_str() {
            "accept-new" => Ok(Self::AcceptNew),
            "yes" => Ok(Self::Yes),
            "no" => Ok(Self::No),
            other => Err(Error::Config(format!(
                "kolorun: {source}={other:?} is not a host key checking mode; use accept-new \
                 (the default), yes, or no (checks nothing: see docs/kolorun.md)"
            ))),
        }
    }

    /// ssh's spelling.
    pub fn as_ssh(self) -> &'static str {
        match self {
            Self::AcceptNew => "accept-new",
            Self::Yes => "yes",
            Self::No => "no",
        }
    }
}

/// How to reach remote hosts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SshOptions {
    /// `-p PORT`.
    pub port: Option<u16>,
    /// `-i KEY`.
    pub identity_file: Option<PathBuf>,
    /// `-o StrictHostKeyChecking=…`.
    pub host_key_checking: HostKeyChecking,
    /// `-o UserKnownHostsFile=…`; `None` keeps ssh's own (the user's known_hosts).
    pub known_hosts: Option<PathBuf>,
}

impl SshOptions {
    /// Port and key from the command line; host key checking and known_hosts from
    /// [`STRICT_HOST_KEY_CHECKING_ENV`] and [`KNOWN_HOSTS_ENV`].
    pub fn from_env(port: Option<u16>, identity_file: Option<PathBuf>) -> Result<Self> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let host_key_checking = match var(STRICT_HOST_KEY_CHECKING_ENV) {
            Some(text) => HostKeyChecking::parse(&text, STRICT_HOST_KEY_CHECKING_ENV)?,
            None => HostKeyChecking::default(),
        };
        Ok(Self {
            port,
            identity_file,
            host_key_checking,
            known_hosts: var(KNOWN_HOSTS_ENV).map(PathBuf::from),
        })
    }
}

/// The arguments of `ssh` (program name excluded) that run `script` on `host` through `sh`.
/// `--` ends ssh's options, so the host and the command are never read as one (the host lists
/// also refuse entries starting with `-`: [`super::hosts::checked_host`]).
pub fn ssh_args(host: &str, ssh: &SshOptions, script: &str) -> Vec<String> {
    let mut args: Vec<String> = [
        "-o",
        "BatchMode=yes",
        "-o",
        "PasswordAuthentication=no",
        "-o",
        "LogLevel=ERROR",
        "-o",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    args.push(format!(
        "StrictHostKeyChecking={}",
        ssh.host_key_checking.as_ssh()
    ));
    if let Some(file) = &ssh.known_hosts {
        args.push("-o".to_owned());
        args.push(format!("UserKnownHostsFile={}", file.to_string_lossy()));
    }
    if let Some(port) = ssh.port {
        args.extend(["-p".to_owned(), port.to_string()]);
    }
    if let Some(key) = &ssh.identity_file {
        args.extend(["-i".to_owned(), key.to_string_lossy().into_owned()]);
    }
    args.push("--".to_owned());
    args.push(host.to_owned());
    args.push(format!("sh -c {}", quote(script)));
    args
}

#[cfg(test)]
mod tests {
    use std::process::Command;

    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(quote("plain-word_1.py"), "plain-word_1.py");
        assert_eq!(quote(""), "''");
        assert_eq!(quote("a b"), "'a b'");
        assert_eq!(quote("it's"), r"'it'\''s'");
        assert_eq!(quote("$HOME"), "'$HOME'");
    }

    /// Runs `script` with stdin a pipe that starts with `input` and stays open, or is closed
    /// after `close_after`.
    fn sh(
        script: &str,
        input: &str,
        close_after: Option<std::time::Duration>,
    ) -> std::process::Output {
        use std::io::Write;
        use std::process::Stdio;
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take();
        stdin.as_mut().unwrap().write_all(input.as_bytes()).unwrap();
        if let Some(pause) = close_after {
            std::thread::sleep(pause);
            drop(stdin);
            child.wait_with_output().unwrap()
        } else {
            let out = child.wait_with_output().unwrap();
            drop(stdin);
            out
        }
    }

    #[test]
    fn script_reads_its_environment_from_stdin_runs_in_cwd_and_keeps_the_exit_status() {
        let dir = std::env::temp_dir();
        let vars = vec![
            ("KOLO_X".to_owned(), "it's $ok\nsecond line".to_owned()),
            ("KOLO_S".to_owned(), "s3cret value".to_owned()),
            (
                "KOLO_X".to_owned(),
                "later wins: it's $ok\nline 2".to_owned(),
            ),
        ];
        let command: Vec<String> = [
            "sh",
            "-c",
            "pwd; echo \"$KOLO_X\"; echo \"$KOLO_S\"; exit 7",
        ]
        .map(String::from)
        .to_vec();
        let script = remote_script(&dir, &command);
        assert!(!script.contains("s3cret") && !script.contains("later wins"));
        let out = sh(&script, &stdin_env(&vars).unwrap(), None);
        let text = String::from_utf8_lossy(&out.stdout);
        let cwd = std::fs::canonicalize(&dir).unwrap();
        assert!(
            text.starts_with(&cwd.to_string_lossy().to_string()),
            "{text}"
        );
        assert!(
            text.contains("later wins: it's $ok\nline 2\ns3cret value\n"),
            "{text}"
        );
        assert_eq!(out.status.code(), Some(7));
    }

    #[test]
    fn remote_environment_is_bounded_and_names_the_largest_variable() {
        let vars = vec![("BIG".to_owned(), "x".repeat(MAX_REMOTE_ENV_BYTES))];
        let err = stdin_env(&vars).unwrap_err().to_string();
        assert!(err.contains("BIG (1048579 bytes)"), "{err}");
        assert!(is_shell_name("_A1") && !is_shell_name("1A") && !is_shell_name("a.b"));
    }

    #[test]
    fn closing_stdin_kills_the_command() {
        let started = std::time::Instant::now();
        let command: Vec<String> = ["sleep", "30"].map(String::from).to_vec();
        let script = remote_script(Path::new("/"), &command);
        let out = sh(
            &script,
            &stdin_env(&[]).unwrap(),
            Some(std::time::Duration::from_millis(300)),
        );
        assert_eq!(out.status.code(), Some(128 + 15));
        assert!(started.elapsed() < std::time::Duration::from_secs(10));
    }

    #[test]
    fn ssh_command_line_checks_host_keys_and_ends_options_before_the_host() {
        let ssh = SshOptions {
            port: Some(2222),
            identity_file: Some("/k/id".into()),
            ..SshOptions::default()
        };
        let args = ssh_args("node2", &ssh, "echo hi");
        assert_eq!(
            &args[args.len() - 7..],
            [
                "-p",
                "2222",
                "-i",
                "/k/id",
                "--",
                "node2",
                "sh -c 'echo hi'"
            ]
        );
        assert!(args.contains(&"BatchMode=yes".to_owned()));
        assert!(args.contains(&"StrictHostKeyChecking=accept-new".to_owned()));
        assert!(!args.iter().any(|a| a.contains("UserKnownHostsFile")));
        assert!(!args.iter().any(|a| a.contains("/dev/null")));
        let relaxed = SshOptions {
            host_key_checking: HostKeyChecking::parse("No", "X").unwrap(),
            known_hosts: Some("/k/known".into()),
            ..SshOptions::default()
        };
        let args = ssh_args("node2", &relaxed, "true");
        assert!(args.contains(&"StrictHostKeyChecking=no".to_owned()));
        assert!(args.contains(&"UserKnownHostsFile=/k/known".to_owned()));
        let err = HostKeyChecking::parse("off", "KOLO_SSH_STRICT_HOST_KEY_CHECKING")
            .unwrap_err()
            .to_string();
        assert!(err.contains("KOLO_SSH_STRICT_HOST_KEY_CHECKING") && err.contains("accept-new"));
    }
}

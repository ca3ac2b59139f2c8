//! Host discovery for elastic launches, as Horovod's `horovod/runner/elastic/discovery.py`:
//! a `--host-discovery-script` ([`DiscoveryScript`]) or fixed `-H`/`--hostfile` hosts
//! ([`FixedHosts`]) say which hosts are available with how many slots, and a [`HostPoller`]
//! asks every [`POLL_INTERVAL`] (Horovod's `DISCOVER_HOSTS_FREQUENCY_SECS`) and reports each
//! change ([`HostChanges`]: hosts added and removed, slot counts changed) as a
//! [`DiscoveryEvent`].
//!
//! Unlike Horovod, a script run is bounded: it is killed (with every process it started) after
//! [`ScriptLimits::timeout`], and its output may not exceed [`ScriptLimits::max_output_bytes`].
//! A failed run, an unusable line (a slot count that is not a positive number, a host starting
//! with `-` that ssh would read as an option, a host listed twice with different slot counts)
//! is an [`Error::HostDiscovery`] naming the script. As in Horovod, a failure of the first run
//! ends the launch ([`HostPoller::start`] returns it) and later failures are reported
//! ([`DiscoveryEvent::Failed`]) while the poller keeps trying.
//!
//! ```no_run
//! use std::time::Duration;
//! use kolo_collective::launcher::discovery::{
//!     DiscoveryEvent, DiscoveryScript, HostPoller, ScriptLimits, POLL_INTERVAL,
//! };
//!
//! let script = DiscoveryScript::new("./discover_hosts.sh".into(), 1, ScriptLimits::default());
//! let (poller, hosts, events) = HostPoller::start(Box::new(script), POLL_INTERVAL).unwrap();
//! println!("starting on {hosts:?}");
//! if let Ok(DiscoveryEvent::Updated { hosts, changes }) = events.recv_timeout(Duration::from_secs(5)) {
//!     println!("now {hosts:?}: added {:?}, removed {:?}", changes.added, changes.removed);
//! }
//! poller.stop();
//! ```

use std::io::Read;
use std::net::IpAddr;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::hosts::{host_problem, HostSlots};
use crate::error::{Error, Result};

/// How often a [`HostPoller`] runs discovery (Horovod's `DISCOVER_HOSTS_FREQUENCY_SECS`).
pub const POLL_INTERVAL: Duration = Duration::from_secs(1);

/// Bounds on one run of a discovery script.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScriptLimits {
    /// The script (and everything it started) is killed after this long.
    pub timeout: Duration,
    /// The most stdout it may print, in bytes.
    pub max_output_bytes: usize,
}

impl Default for ScriptLimits {
    /// 60 seconds and 1 MiB (some 30 000 hosts).
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(60),
            max_output_bytes: 1 << 20,
        }
    }
}

/// Why a discovery script run gave no host list ([`Error::HostDiscovery`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DiscoveryProblem {
    /// The script could not be started or its output not read.
    #[error("cannot run it: {0}")]
    Spawn(String),
    /// The script exited unsuccessfully.
    #[error("it failed ({status}){hint}")]
    Failed {
        /// The exit status as the OS reports it.
        status: String,
        /// What to check, when the status suggests it (empty otherwise).
        hint: String,
    },
    /// The script ran longer than [`ScriptLimits::timeout`]; it was killed.
    #[error("it did not finish within {0:?}; it was stopped (make it answer faster)")]
    TimedOut(Duration),
    /// The script printed more than [`ScriptLimits::max_output_bytes`]; it was killed.
    #[error("it printed more than {0} bytes; print one `host` or `host:slots` per line")]
    OutputTooLarge(usize),
    /// The output is not UTF-8 text.
    #[error("its output is not UTF-8 text; print one `host` or `host:slots` per line")]
    NotText,
    /// A line of the output cannot be used.
    #[error("output line {number} {line:?}: {reason}; print one `host` or `host:slots` per line")]
    BadLine {
        /// The 1-based line number.
        number: usize,
        /// The line (at most 200 characters of it).
        line: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// Something that says which hosts are available now, with their slots (Horovod's
/// `HostDiscovery.find_available_hosts_and_slots`).
pub trait HostDiscovery: Send {
    /// The available hosts in a stable order, each once.
    fn find_available_hosts_and_slots(&mut self) -> Result<Vec<HostSlots>>;
}

/// `--host-discovery-script`: run through `sh -c` (as horovodrun runs it), its stdout read as
/// one `host` or `host:slots` per line; blank lines are skipped and a line repeated is listed
/// once. An empty output means no host is available right now.
#[derive(Debug, Clone)]
pub struct DiscoveryScript {
    script: PathBuf,
    default_slots: usize,
    limits: ScriptLimits,
}

impl DiscoveryScript {
    /// The script at `script`; hosts it prints without `:slots` get `default_slots`
    /// (`--slots-per-host`).
    pub fn new(script: PathBuf, default_slots: usize, limits: ScriptLimits) -> Self {
        Self {
            script,
            default_slots,
            limits,
        }
    }

    fn error(&self, problem: DiscoveryProblem) -> Error {
        Error::HostDiscovery {
            script: self.script.display().to_string(),
            problem,
        }
    }

    /// Runs the script once, bounded by its [`ScriptLimits`], and returns its stdout.
    fn run(&self) -> Result<Vec<u8>> {
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(self.script.as_os_str())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            // Its own process group, so a timeout stops everything it started.
            .process_group(0)
            .spawn()
            .map_err(|err| self.error(DiscoveryProblem::Spawn(err.to_string())))?;
        let started = Instant::now();
        let Some(mut stdout) = child.stdout.take() else {
            kill_group(&mut child);
            return Err(Error::Internal(
                "discovery script without stdout pipe".into(),
            ));
        };
        let limit = self.limits.max_output_bytes;
        let deadline = started + self.limits.timeout;
        let bytes = match read_bounded(&mut stdout, limit, deadline) {
            Ok(Some(bytes)) if bytes.len() > limit => {
                kill_group(&mut child);
                return Err(self.error(DiscoveryProblem::OutputTooLarge(limit)));
            }
            Ok(Some(bytes)) => bytes,
            Ok(None) => {
                kill_group(&mut child);
                return Err(self.error(DiscoveryProblem::TimedOut(self.limits.timeout)));
            }
            Err(err) => {
                kill_group(&mut child);
                return Err(self.error(DiscoveryProblem::Spawn(err.to_string())));
            }
        };
        drop(stdout);
        // Its stdout is closed; it may still run (bounded by the same deadline).
        let status = loop {
            if let Some(status) = child.try_wait()? {
                break status;
            }
            if started.elapsed() >= self.limits.timeout {
                kill_group(&mut child);
                return Err(self.error(DiscoveryProblem::TimedOut(self.limits.timeout)));
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        if !status.success() {
            let hint = match status.code() {
                Some(126) => "; is it executable? chmod +x it",
                Some(127) => "; no such file or command",
                _ => "",
            };
            return Err(self.error(DiscoveryProblem::Failed {
                status: status.to_string(),
                hint: hint.into(),
            }));
        }
        Ok(bytes)
    }

    /// Parses the script's output (see [`DiscoveryScript`]).
    pub fn parse(&self, output: &[u8]) -> Result<Vec<HostSlots>> {
        let text =
            std::str::from_utf8(output).map_err(|_| self.error(DiscoveryProblem::NotText))?;
        let mut hosts: Vec<HostSlots> = Vec::new();
        for (index, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            let bad = |reason: String| {
                self.error(DiscoveryProblem::BadLine {
                    number: index + 1,
                    line: line.chars().take(200).collect(),
                    reason,
                })
            };
            let entry = parse_line(line, self.default_slots).map_err(bad)?;
            match hosts.iter().find(|h| h.host == entry.host) {
                Some(earlier) if earlier.slots != entry.slots => {
                    return Err(bad(format!(
                        "host {:?} is listed again with {} slot(s) after {}",
                        entry.host, entry.slots, earlier.slots
                    )))
                }
                Some(_) => {}
                None => hosts.push(entry),
            }
        }
        Ok(hosts)
    }
}

impl HostDiscovery for DiscoveryScript {
    fn find_available_hosts_and_slots(&mut self) -> Result<Vec<HostSlots>> {
        let output = self.run()?;
        self.parse(&output)
    }
}

/// One line: `host`, `host:slots`, an IPv6 address alone or `[v6]:slots`.
fn parse_line(line: &str, default_slots: usize) -> std::result::Result<HostSlots, String> {
    let (host, slots) = if line.parse::<IpAddr>().is_ok() {
        (line, None)
    } else if let Some(rest) = line.strip_prefix('[') {
        match rest.split_once(']') {
            Some((v6, "")) => (v6, None),
            Some((v6, tail)) => match tail.strip_prefix(':') {
                Some(slots) => (v6, Some(slots)),
                None => return Err("expected `[address]:slots`".into()),
            },
            None => return Err("`[` without `]`".into()),
        }
    } else {
        match line.rsplit_once(':') {
            Some((host, slots)) => (host, Some(slots)),
            None => (line, None),
        }
    };
    if let Some(rule) = host_problem(host) {
        return Err(format!("host {host:?} is refused: {rule}"));
    }
    let name = host.rsplit_once('@').map_or(host, |(_, name)| name);
    if name.contains(':') && name.parse::<IpAddr>().is_err() {
        return Err(format!(
            "host {host:?} is neither a host name nor an IP address"
        ));
    }
    let slots = match slots {
        None => default_slots,
        Some(text) => text
            .trim()
            .parse::<usize>()
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| format!("slot count {text:?} is not a positive number"))?,
    };
    Ok(HostSlots {
        host: host.to_owned(),
        slots,
    })
}

/// Reads `stdout` to its end, but no more than `limit + 1` bytes (more means too much) and no
/// later than `deadline` (`None`). Waits with poll(2) on this thread, so a process that keeps
/// the pipe open past the deadline (even one that left the script's process group) costs
/// nothing once the pipe is dropped.
fn read_bounded(
    stdout: &mut std::process::ChildStdout,
    limit: usize,
    deadline: Instant,
) -> std::io::Result<Option<Vec<u8>>> {
    use std::os::fd::AsRawFd;
    let mut bytes = Vec::new();
    let mut chunk = [0u8; 64 * 1024];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(None);
        }
        let mut ready = libc::pollfd {
            fd: stdout.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let wait_ms = i32::try_from(left.as_millis().max(1)).unwrap_or(i32::MAX);
        // SAFETY: `ready` is one valid pollfd for the duration of the call.
        let answered = unsafe { libc::poll(&mut ready, 1, wait_ms) };
        if answered < 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        if answered == 0 {
            continue;
        }
        // Readable or hung up: this read does not block.
        let room = (limit + 1 - bytes.len()).min(chunk.len());
        let read = match stdout.read(&mut chunk[..room]) {
            Ok(read) => read,
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(err) => return Err(err),
        };
        if read == 0 {
            return Ok(Some(bytes));
        }
        bytes.extend_from_slice(&chunk[..read]);
        if bytes.len() > limit {
            return Ok(Some(bytes));
        }
    }
}

/// Kills `child`'s process group (everything the script started) and reaps `child`.
fn kill_group(child: &mut Child) {
    if let Ok(pid) = i32::try_from(child.id()) {
        // SAFETY: kill(2) with a negative pid signals that process group; no memory is touched.
        unsafe {
            libc::kill(-pid, libc::SIGKILL);
        }
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Fixed hosts (`-H`/`--hostfile` on an elastic launch; Horovod's `FixedHosts`): the same
/// list at every poll.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FixedHosts(pub Vec<HostSlots>);

impl HostDiscovery for FixedHosts {
    fn find_available_hosts_and_slots(&mut self) -> Result<Vec<HostSlots>> {
        Ok(self.0.clone())
    }
}

/// A host whose slot count changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotChange {
    /// The host.
    pub host: String,
    /// Its slots before.
    pub before: usize,
    /// Its slots now.
    pub after: usize,
}

/// The difference between two discoveries.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HostChanges {
    /// Hosts not there before, with their slots.
    pub added: Vec<HostSlots>,
    /// Hosts gone.
    pub removed: Vec<String>,
    /// Hosts whose slot count changed.
    pub resized: Vec<SlotChange>,
}

impl HostChanges {
    /// What changed from `before` to `after`.
    pub fn between(before: &[HostSlots], after: &[HostSlots]) -> Self {
        let slots_in =
            |list: &[HostSlots], host: &str| list.iter().find(|h| h.host == host).map(|h| h.slots);
        Self {
            added: after
                .iter()
                .filter(|h| slots_in(before, &h.host).is_none())
                .cloned()
                .collect(),
            removed: before
                .iter()
                .filter(|h| slots_in(after, &h.host).is_none())
                .map(|h| h.host.clone())
                .collect(),
            resized: after
                .iter()
                .filter_map(|h| {
                    let before = slots_in(before, &h.host)?;
                    (before != h.slots).then(|| SlotChange {
                        host: h.host.clone(),
                        before,
                        after: h.slots,
                    })
                })
                .collect(),
        }
    }

    /// True when nothing changed.
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty() && self.resized.is_empty()
    }

    /// Horovod's `HostUpdateResult` `added` bit: a host added or given more slots.
    pub fn any_added(&self) -> bool {
        !self.added.is_empty() || self.resized.iter().any(|c| c.after > c.before)
    }

    /// Horovod's `HostUpdateResult` `removed` bit: a host removed or given fewer slots.
    pub fn any_removed(&self) -> bool {
        !self.removed.is_empty() || self.resized.iter().any(|c| c.after < c.before)
    }
}

/// `found` in a stable order: hosts of `previous` still found keep their places (so the
/// oldest hosts keep the lowest ranks, as Horovod's `order_available_hosts`), new ones follow
/// in the order found.
pub fn ordered_update(previous: &[HostSlots], found: &[HostSlots]) -> Vec<HostSlots> {
    let mut ordered: Vec<HostSlots> = previous
        .iter()
        .filter_map(|old| found.iter().find(|h| h.host == old.host).cloned())
        .collect();
    for host in found {
        if !ordered.iter().any(|h| h.host == host.host) {
            ordered.push(host.clone());
        }
    }
    ordered
}

/// What a [`HostPoller`] reports.
#[derive(Debug)]
pub enum DiscoveryEvent {
    /// The available hosts changed: `hosts` is the new list (in [`ordered_update`] order),
    /// `changes` what changed from the one reported before.
    Updated {
        /// The available hosts now.
        hosts: Vec<HostSlots>,
        /// The difference from the previous list.
        changes: HostChanges,
    },
    /// A discovery after the first failed; the poller keeps polling (Horovod retries until
    /// the job's elastic timeout) and the previous list still stands.
    Failed(Error),
}

/// Runs a [`HostDiscovery`] every interval on its own thread and sends each change.
#[derive(Debug)]
pub struct HostPoller {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl HostPoller {
    /// Runs `discovery` once now (its failure is returned: a misconfiguration ends the launch,
    /// as in Horovod), then every `interval` on a thread. Returns the poller, the first host
    /// list and the receiver of [`DiscoveryEvent`]s. The thread ends at [`HostPoller::stop`],
    /// on drop, or when the receiver is dropped.
    pub fn start(
        mut discovery: Box<dyn HostDiscovery>,
        interval: Duration,
    ) -> Result<(Self, Vec<HostSlots>, mpsc::Receiver<DiscoveryEvent>)> {
        let first = discovery.find_available_hosts_and_slots()?;
        let (events, receiver) = mpsc::channel();
        let (stop, stopped) = mpsc::channel::<()>();
        let mut current = first.clone();
        let thread = std::thread::Builder::new()
            .name("kolo-discovery".into())
            .spawn(move || loop {
                match stopped.recv_timeout(interval) {
                    Err(mpsc::RecvTimeoutError::Timeout) => {}
                    _ => return,
                }
                let event = match discovery.find_available_hosts_and_slots() {
                    Ok(found) => {
                        let hosts = ordered_update(&current, &found);
                        let changes = HostChanges::between(&current, &hosts);
                        if changes.is_empty() {
                            continue;
                        }
                        current = hosts.clone();
                        DiscoveryEvent::Updated { hosts, changes }
                    }
                    Err(err) => DiscoveryEvent::Failed(err),
                };
                if events.send(event).is_err() {
                    return;
                }
            })?;
        Ok((
            Self {
                stop: Some(stop),
                thread: Some(thread),
            },
            first,
            receiver,
        ))
    }

    /// Stops polling; waits for a script run in progress (bounded by its timeout).
    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for HostPoller {
    fn drop(&mut self) {
        self.halt();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::launcher::hosts::hs;

    /// An executable script with `body` in a fresh temp dir (kept alive by the returned dir).
    fn script(body: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("discover.sh");
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        let executable = std::os::unix::fs::PermissionsExt::from_mode(0o755);
        std::fs::set_permissions(&path, executable).unwrap();
        (dir, path)
    }

    fn limits(timeout_ms: u64) -> ScriptLimits {
        ScriptLimits {
            timeout: Duration::from_millis(timeout_ms),
            ..ScriptLimits::default()
        }
    }

    fn problem(result: Result<Vec<HostSlots>>, script: &std::path::Path) -> DiscoveryProblem {
        match result {
            Err(Error::HostDiscovery {
                script: named,
                problem,
            }) => {
                assert_eq!(named, script.display().to_string());
                problem
            }
            other => panic!("expected a HostDiscovery error, got {other:?}"),
        }
    }

    #[test]
    fn a_script_lists_hosts_with_slots_or_the_default() {
        let (_dir, path) = script(
            "echo node1:4; echo; echo '  node2  '; echo node1:4; echo 10.0.0.7:2; \
             echo fe80::1; echo '[::1]:3'; echo me@node3",
        );
        let mut discovery = DiscoveryScript::new(path, 2, limits(10_000));
        assert_eq!(
            discovery.find_available_hosts_and_slots().unwrap(),
            [
                hs("node1", 4),
                hs("node2", 2),
                hs("10.0.0.7", 2),
                hs("fe80::1", 2),
                hs("::1", 3),
                hs("me@node3", 2)
            ]
        );
        // No host available right now is an empty list, not an error (Horovod's comment:
        // "The discovery script might return empty string when all workers are not ready").
        let (_dir, path) = script("true");
        let mut discovery = DiscoveryScript::new(path, 1, limits(10_000));
        assert_eq!(discovery.find_available_hosts_and_slots().unwrap(), []);
    }

    #[test]
    fn garbage_lines_are_refused_with_their_number() {
        let cases = [
            ("echo node1; echo '-oProxyCommand=touch'", 2, "option"),
            ("echo 'me@-oProxyCommand=x:2'", 1, "option"),
            ("echo node1:0", 1, "positive"),
            ("echo node1:four", 1, "positive"),
            ("echo 'node 1'", 1, "whitespace"),
            ("echo a:b:2", 1, "neither a host name nor an IP"),
            ("echo '[::1'", 1, "without `]`"),
            ("echo node1:2; echo node1:3", 2, "listed again"),
        ];
        for (body, number, reason) in cases {
            let (_dir, path) = script(body);
            let mut discovery = DiscoveryScript::new(path.clone(), 1, limits(10_000));
            match problem(discovery.find_available_hosts_and_slots(), &path) {
                DiscoveryProblem::BadLine {
                    number: at,
                    reason: why,
                    ..
                } => {
                    assert_eq!(at, number, "{body}");
                    assert!(why.contains(reason), "{body}: {why}");
                }
                other => panic!("{body}: {other:?}"),
            }
        }
        let (_dir, path) = script("printf 'node\\377\\n'");
        let mut discovery = DiscoveryScript::new(path.clone(), 1, limits(10_000));
        assert_eq!(
            problem(discovery.find_available_hosts_and_slots(), &path),
            DiscoveryProblem::NotText
        );
    }

    #[test]
    fn a_failing_script_is_an_error_naming_it_and_its_status() {
        let (_dir, path) = script("echo node1; exit 3");
        let mut discovery = DiscoveryScript::new(path.clone(), 1, limits(10_000));
        let err = discovery.find_available_hosts_and_slots().unwrap_err();
        let message = err.to_string();
        assert!(
            message.contains(&path.display().to_string()) && message.contains("exit status: 3"),
            "{message}"
        );
        let missing = path.with_file_name("absent.sh");
        let mut discovery = DiscoveryScript::new(missing.clone(), 1, limits(10_000));
        match problem(discovery.find_available_hosts_and_slots(), &missing) {
            DiscoveryProblem::Failed { hint, .. } => assert!(hint.contains("no such"), "{hint}"),
            other => panic!("{other:?}"),
        }
        let not_executable = std::os::unix::fs::PermissionsExt::from_mode(0o644);
        std::fs::set_permissions(&path, not_executable).unwrap();
        let mut discovery = DiscoveryScript::new(path.clone(), 1, limits(10_000));
        match problem(discovery.find_available_hosts_and_slots(), &path) {
            DiscoveryProblem::Failed { hint, .. } => assert!(hint.contains("chmod"), "{hint}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_hanging_script_is_killed_with_what_it_started_at_the_timeout() {
        let (dir, path) =
            script("echo node1; sleep 30 & echo $! > \"$(dirname \"$0\")/pid\"; wait");
        let mut discovery = DiscoveryScript::new(path.clone(), 1, limits(300));
        let started = Instant::now();
        let found = problem(discovery.find_available_hosts_and_slots(), &path);
        assert_eq!(
            found,
            DiscoveryProblem::TimedOut(Duration::from_millis(300))
        );
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        // The script's own child (`sleep 30`) was stopped too.
        let pid: i32 = std::fs::read_to_string(dir.path().join("pid"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let alive = || {
            // SAFETY: kill(pid, 0) only checks whether the process exists.
            unsafe { libc::kill(pid, 0) == 0 }
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        while alive() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(!alive(), "sleep {pid} outlived the timeout");
        // A script that closes stdout and keeps running is bounded too.
        let (_dir, path) = script("exec >/dev/null; sleep 30");
        let mut discovery = DiscoveryScript::new(path.clone(), 1, limits(300));
        let found = problem(discovery.find_available_hosts_and_slots(), &path);
        assert_eq!(
            found,
            DiscoveryProblem::TimedOut(Duration::from_millis(300))
        );
    }

    #[test]
    fn ten_megabytes_of_output_are_refused_without_reading_them_all() {
        // The script goes on running after its 10 MB: the run ends at the limit, not at the
        // script's end (nor at the 10 s timeout).
        let (_dir, path) = script("head -c 10485760 /dev/zero | tr '\\0' 'a'; sleep 30");
        let mut discovery = DiscoveryScript::new(path.clone(), 1, limits(10_000));
        let started = Instant::now();
        assert_eq!(
            problem(discovery.find_available_hosts_and_slots(), &path),
            DiscoveryProblem::OutputTooLarge(1 << 20)
        );
        assert!(started.elapsed() < Duration::from_secs(5));
        // Just under the limit is fine.
        let (_dir, path) = script("i=0; while [ $i -lt 1000 ]; do echo node$i:1; i=$((i+1)); done");
        let mut discovery = DiscoveryScript::new(path, 1, limits(10_000));
        assert_eq!(
            discovery.find_available_hosts_and_slots().unwrap().len(),
            1000
        );
    }

    #[test]
    fn changes_between_discoveries() {
        let before = [hs("a", 2), hs("b", 2), hs("c", 1)];
        let after = [hs("a", 2), hs("c", 2), hs("d", 1), hs("b", 1)];
        let changes = HostChanges::between(&before, &after);
        assert_eq!(changes.added, [hs("d", 1)]);
        assert!(changes.removed.is_empty());
        assert_eq!(
            changes.resized,
            [
                SlotChange {
                    host: "c".into(),
                    before: 1,
                    after: 2
                },
                SlotChange {
                    host: "b".into(),
                    before: 2,
                    after: 1
                }
            ]
        );
        assert!(changes.any_added() && changes.any_removed());
        let gone = HostChanges::between(&before, &before[..1]);
        assert_eq!(gone.removed, ["b", "c"]);
        assert!(gone.any_removed() && !gone.any_added());
        assert!(HostChanges::between(&before, &before).is_empty());
        // Survivors keep their order; newcomers follow in the order found.
        assert_eq!(
            ordered_update(&before, &[hs("e", 1), hs("c", 1), hs("a", 3)]),
            [hs("a", 3), hs("c", 1), hs("e", 1)]
        );
    }

    #[test]
    fn the_poller_reports_each_change_of_a_script_driven_by_a_state_file() {
        let (dir, path) = script(
            "state=\"$(dirname \"$0\")/hosts\"; [ -f \"$state\" ] && cat \"$state\"; \
             [ -f \"$(dirname \"$0\")/fail\" ] && exit 1; exit 0",
        );
        let state = dir.path().join("hosts");
        std::fs::write(&state, "a:2\nb:1\n").unwrap();
        let discovery = DiscoveryScript::new(path, 1, limits(10_000));
        let interval = Duration::from_millis(20);
        let (poller, first, events) = HostPoller::start(Box::new(discovery), interval).unwrap();
        assert_eq!(first, [hs("a", 2), hs("b", 1)]);
        let wait = Duration::from_secs(10);
        // Nothing changes: no event.
        assert!(events.recv_timeout(Duration::from_millis(200)).is_err());
        std::fs::write(&state, "c:1\na:4\n").unwrap();
        match events.recv_timeout(wait).unwrap() {
            DiscoveryEvent::Updated { hosts, changes } => {
                assert_eq!(hosts, [hs("a", 4), hs("c", 1)]);
                assert_eq!(changes.added, [hs("c", 1)]);
                assert_eq!(changes.removed, ["b"]);
                assert_eq!(changes.resized.len(), 1);
            }
            other => panic!("{other:?}"),
        }
        // A later failure is reported and polling goes on.
        std::fs::write(dir.path().join("fail"), "").unwrap();
        match events.recv_timeout(wait).unwrap() {
            DiscoveryEvent::Failed(Error::HostDiscovery { problem, .. }) => {
                assert!(
                    matches!(problem, DiscoveryProblem::Failed { .. }),
                    "{problem:?}"
                )
            }
            other => panic!("{other:?}"),
        }
        std::fs::remove_file(dir.path().join("fail")).unwrap();
        std::fs::write(&state, "").unwrap();
        let deadline = Instant::now() + wait;
        let emptied = loop {
            match events.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(DiscoveryEvent::Updated { hosts, changes }) => break (hosts, changes),
                Ok(DiscoveryEvent::Failed(_)) => continue,
                Err(err) => panic!("no update: {err}"),
            }
        };
        assert_eq!(emptied.0, []);
        assert_eq!(emptied.1.removed, ["a", "c"]);
        let started = Instant::now();
        poller.stop();
        assert!(started.elapsed() < Duration::from_secs(2));
        assert!(matches!(
            events.recv_timeout(Duration::from_millis(100)),
            Err(mpsc::RecvTimeoutError::Disconnected)
        ));
    }

    #[test]
    fn the_first_failure_ends_the_start() {
        let (_dir, path) = script("exit 2");
        let discovery = DiscoveryScript::new(path.clone(), 1, limits(10_000));
        match HostPoller::start(Box::new(discovery), POLL_INTERVAL) {
            Err(Error::HostDiscovery { script, problem }) => {
                assert_eq!(script, path.display().to_string());
                assert!(matches!(problem, DiscoveryProblem::Failed { .. }));
            }
            other => panic!("{other:?}"),
        }
        let fixed = FixedHosts(vec![hs("a", 2)]);
        let (poller, first, events) =
            HostPoller::start(Box::new(fixed), Duration::from_millis(10)).unwrap();
        assert_eq!(first, [hs("a", 2)]);
        assert!(events.recv_timeout(Duration::from_millis(100)).is_err());
        drop(poller);
    }
}

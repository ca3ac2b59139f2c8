//! One rank's process: spawned in its own session (so its whole process group can be
//! signalled) with a parent-death signal, polled without blocking, and signalled by group.

use std::io::{self, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, ChildStderr, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};

/// What to execute for one rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    /// The program to execute.
    pub program: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Removed from the inherited environment (local ranks: the deny-list).
    pub env_remove: Vec<String>,
    /// Added to the inherited environment (local ranks; remote ranks get theirs on stdin).
    pub envs: Vec<(String, String)>,
    /// An ssh client: keep its stdin open (closing it stops the remote command).
    pub remote: bool,
    /// Written to an ssh client's stdin right after it starts (the environment the remote
    /// script reads, the job secret among it).
    pub stdin_text: String,
}

/// A running (or finished) rank process.
#[derive(Debug)]
pub struct RankProcess {
    pub(crate) task_index: u32,
    pub(crate) host: String,
    pub(crate) remote: bool,
    child: Child,
    stdin: Option<ChildStdin>,
    status: Option<ExitStatus>,
}

/// The process's output pipes, handed to the forwarding threads.
pub type Pipes = (ChildStdout, ChildStderr);

impl RankProcess {
    /// Spawns `launch` in a new session (process group = its pid) that gets SIGKILL if the
    /// spawning thread dies.
    pub fn spawn(task_index: u32, host: &str, launch: &Launch) -> io::Result<(Self, Pipes)> {
        let mut command = Command::new(&launch.program);
        for name in &launch.env_remove {
            command.env_remove(name);
        }
        command
            .args(&launch.args)
            .envs(launch.envs.iter().map(|(k, v)| (k, v)))
            .stdin(if launch.remote {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // SAFETY: getpid has no preconditions.
        let parent = unsafe { libc::getpid() };
        // SAFETY: the closure runs in the forked child before exec and only makes
        // async-signal-safe calls (setsid, prctl, getppid) without allocating.
        unsafe {
            command.pre_exec(move || {
                if libc::setsid() == -1 {
                    return Err(io::Error::last_os_error());
                }
                if libc::prctl(
                    libc::PR_SET_PDEATHSIG,
                    libc::SIGKILL as libc::c_ulong,
                    0,
                    0,
                    0,
                ) == -1
                {
                    return Err(io::Error::last_os_error());
                }
                if libc::getppid() != parent {
                    // kolorun died between fork and prctl.
                    return Err(io::Error::from_raw_os_error(libc::ESRCH));
                }
                Ok(())
            });
        }
        let mut child = command.spawn()?;
        let mut stdin = child.stdin.take();
        if let Some(pipe) = stdin.as_mut().filter(|_| !launch.stdin_text.is_empty()) {
            // A failure here means ssh already exited; polling reports that.
            let _ = pipe
                .write_all(launch.stdin_text.as_bytes())
                .and_then(|()| pipe.flush());
        }
        let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(io::Error::other("the child's output pipes are missing"));
        };
        let process = Self {
            task_index,
            host: host.to_owned(),
            remote: launch.remote,
            child,
            stdin,
            status: None,
        };
        Ok((process, (stdout, stderr)))
    }

    /// The exit status once the process has exited (checks without blocking). When it is
    /// first seen, anything the rank left behind in its process group is killed.
    pub fn poll(&mut self) -> io::Result<Option<ExitStatus>> {
        if self.status.is_none() {
            if let Some(status) = self.child.try_wait()? {
                self.status = Some(status);
                self.stdin = None;
                // The group outlives its leader only through processes the rank left behind.
                self.signal_group(libc::SIGKILL);
            }
        }
        Ok(self.status)
    }

    /// True until the exit status has been collected.
    pub fn is_running(&self) -> bool {
        self.status.is_none()
    }

    /// Asks the rank to stop: closes an ssh client's stdin (the remote watchdog then stops the
    /// remote command) and sends `signal` to the process group.
    pub fn stop(&mut self, signal: libc::c_int) {
        if self.is_running() {
            self.stdin = None;
            self.signal_group(signal);
        }
    }

    fn signal_group(&self, signal: libc::c_int) {
        let Ok(pgid) = libc::pid_t::try_from(self.child.id()) else {
            return;
        };
        // SAFETY: kill has no memory-safety preconditions; the negative pid addresses the
        // process group this rank leads (its leader is either unreaped or was reaped just now).
        unsafe { libc::kill(-pgid, signal) };
    }

    /// The process id (also its process group id).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

/// `(for people, for the abort cause, exit code kolorun should return)` describing `status`.
pub fn describe_exit(status: ExitStatus, remote: bool) -> (String, String, i32) {
    if let Some(signal) = status.signal() {
        let what = format!("killed by signal {signal} ({})", signal_name(signal));
        return (format!("was {what}"), what, 128 + signal);
    }
    let code = status.code().unwrap_or(1);
    let mut what = format!("exited with code {code}");
    if remote && code == 255 {
        what.push_str(" (ssh failed: the host could not be reached or refused the login)");
    } else if remote && code > 128 && code - 128 <= 31 {
        what.push_str(&format!(
            " (on the remote host: killed by signal {} ({}))",
            code - 128,
            signal_name(code - 128)
        ));
    }
    (what.clone(), what, code)
}

/// The conventional name of a signal number (`"SIGKILL"`), or `"SIG?"`.
pub fn signal_name(signal: i32) -> &'static str {
    match signal {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGXFSZ => "SIGXFSZ",
        _ => "SIG?",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_descriptions() {
        let killed = ExitStatus::from_raw(9);
        assert_eq!(
            describe_exit(killed, false),
            (
                "was killed by signal 9 (SIGKILL)".into(),
                "killed by signal 9 (SIGKILL)".into(),
                137
            )
        );
        let exited = ExitStatus::from_raw(3 << 8);
        assert_eq!(describe_exit(exited, false).0, "exited with code 3");
        assert_eq!(describe_exit(exited, false).2, 3);
        let ssh_failed = ExitStatus::from_raw(255 << 8);
        assert!(describe_exit(ssh_failed, true).0.contains("ssh failed"));
        let remote_killed = ExitStatus::from_raw(137 << 8);
        assert!(describe_exit(remote_killed, true).0.contains("SIGKILL"));
    }

    #[test]
    fn spawned_process_leads_its_own_group_and_stops() {
        let launch = Launch {
            program: "sh".into(),
            args: vec!["-c".into(), "echo $KOLO_T; sleep 30".into()],
            env_remove: Vec::new(),
            envs: vec![("KOLO_T".into(), "hello".into())],
            remote: false,
            stdin_text: String::new(),
        };
        let (mut process, (stdout, _stderr)) = RankProcess::spawn(0, "localhost", &launch).unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line).unwrap();
        assert_eq!(line, "hello\n");
        // SAFETY: getpgid has no preconditions.
        let pgid = unsafe { libc::getpgid(process.pid() as libc::pid_t) };
        assert_eq!(pgid as u32, process.pid());
        assert!(process.poll().unwrap().is_none());
        process.stop(libc::SIGTERM);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let status = loop {
            if let Some(status) = process.poll().unwrap() {
                break status;
            }
            assert!(std::time::Instant::now() < deadline, "did not stop");
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        assert_eq!(status.signal(), Some(libc::SIGTERM));
    }
}

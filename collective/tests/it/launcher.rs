//! kolorun, in-process with captured output, on real child processes (`sh -c ...` and this
//! test binary acting as a registering worker).

use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kolo_collective::control::{self, WorkerEnv};
use kolo_collective::launcher::{self, Output, SharedWriter};
use kolo_collective::{AbortSignal, Error};
use kolo_runtime::block_on;

struct Run {
    result: kolo_collective::Result<i32>,
    stdout: String,
    stderr: String,
    took: Duration,
}

fn run_with(args: &[&str], interrupted: &dyn Fn() -> bool) -> Run {
    let stdout = Arc::new(Mutex::new(Vec::<u8>::new()));
    let stderr = Arc::new(Mutex::new(Vec::<u8>::new()));
    let output = Output {
        stdout: stdout.clone() as SharedWriter,
        stderr: stderr.clone() as SharedWriter,
    };
    let args: Vec<String> = args.iter().map(|s| (*s).to_owned()).collect();
    let started = Instant::now();
    let result = launcher::run_with_output(&args, interrupted, &output);
    let took = started.elapsed();
    let text = |buffer: &Arc<Mutex<Vec<u8>>>| {
        String::from_utf8_lossy(&buffer.lock().unwrap()).into_owned()
    };
    let run = Run {
        result,
        stdout: text(&stdout),
        stderr: text(&stderr),
        took,
    };
    eprintln!(
        "kolorun {args:?} -> {:?} in {:?}\n--- stdout\n{}--- stderr\n{}",
        run.result, run.took, run.stdout, run.stderr
    );
    run
}

fn run(args: &[&str]) -> Run {
    run_with(args, &|| false)
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kolo-it-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Processes (not zombies) whose process group is `pgid`.
fn live_group_members(pgid: i32) -> Vec<i32> {
    let mut members = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // Fields after the command name: state ppid pgrp ...
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.len() > 2 && fields[2] == pgid.to_string() && fields[0] != "Z" && fields[0] != "X"
        {
            members.push(pid);
        }
    }
    members
}

#[test]
fn the_group_probe_sees_live_processes() {
    use std::os::unix::process::CommandExt;
    let mut child = std::process::Command::new("sleep")
        .arg("30")
        .process_group(0)
        .spawn()
        .unwrap();
    let pgid = child.id() as i32;
    assert_eq!(live_group_members(pgid), [pgid]);
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(live_group_members(pgid).is_empty());
}

fn assert_group_gone(pid_file: &Path) {
    let pid: i32 = std::fs::read_to_string(pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let members = live_group_members(pid);
        if members.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "processes of group {pid} survived: {members:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn every_line_is_prefixed_with_its_rank() {
    let r = run(&[
        "-np",
        "2",
        "sh",
        "-c",
        "echo out $KOLO_TASK_INDEX of $KOLO_NUM_TASKS; echo err $KOLO_TASK_INDEX >&2; printf tail",
    ]);
    assert_eq!(r.result.unwrap(), 0);
    for rank in 0..2 {
        assert!(
            r.stdout
                .contains(&format!("[{rank}]<stdout>:out {rank} of 2\n")),
            "{}",
            r.stdout
        );
        assert!(
            r.stdout.contains(&format!("[{rank}]<stdout>:tail\n")),
            "{}",
            r.stdout
        );
        assert!(
            r.stderr.contains(&format!("[{rank}]<stderr>:err {rank}\n")),
            "{}",
            r.stderr
        );
    }
    assert!(!r.stdout.contains("<stderr>") && !r.stderr.contains("<stdout>"));
    assert!(
        !r.stderr.contains("kolorun:"),
        "no summary on success: {}",
        r.stderr
    );
}

#[test]
fn workers_get_the_job_environment() {
    let r = run(&[
        "-np", "1", "--start-timeout", "7", "sh", "-c",
        "echo \"$KOLO_DRIVER_ADDR|${#KOLO_JOB_SECRET}|${#KOLO_JOB_ID}|$KOLO_START_TIMEOUT|${KOLO_HOSTNAME-unset}\"",
    ]);
    assert_eq!(r.result.unwrap(), 0);
    let line = r
        .stdout
        .lines()
        .next()
        .unwrap()
        .trim_start_matches("[0]<stdout>:")
        .to_owned();
    let fields: Vec<&str> = line.split('|').collect();
    assert!(fields[0].starts_with("127.0.0.1:"), "{line}");
    assert_eq!(&fields[1..], ["64", "32", "7", "unset"]);
    let r = run(&["-H", "localhost:2", "sh", "-c", "echo host=$KOLO_HOSTNAME"]);
    assert_eq!(r.result.unwrap(), 0);
    assert!(
        r.stdout.contains("[1]<stdout>:host=localhost"),
        "{}",
        r.stdout
    );
}

#[test]
fn output_filename_writes_per_rank_files() {
    let dir = temp_dir("output");
    let r = run(&[
        "-np",
        "2",
        "--output-filename",
        dir.to_str().unwrap(),
        "sh",
        "-c",
        "echo out $KOLO_TASK_INDEX; echo err $KOLO_TASK_INDEX >&2",
    ]);
    assert_eq!(r.result.unwrap(), 0);
    for rank in 0..2 {
        let read = |name: &str| {
            std::fs::read_to_string(dir.join(format!("rank.{rank}")).join(name)).unwrap()
        };
        assert_eq!(read("stdout"), format!("out {rank}\n"));
        assert_eq!(read("stderr"), format!("err {rank}\n"));
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_failed_rank_exit_code_is_returned() {
    // Rank 1 fails a second after rank 0 succeeded, so no other rank is left to stop even on a
    // loaded machine.
    let r = run(&[
        "-np",
        "2",
        "sh",
        "-c",
        "[ $KOLO_TASK_INDEX = 1 ] && sleep 1; exit $((KOLO_TASK_INDEX * 3))",
    ]);
    assert_eq!(r.result.unwrap(), 3);
    assert!(
        r.stderr.contains(
            "kolorun: rank 1 on host localhost exited with code 3; stopped 0 other rank(s)"
        ),
        "{}",
        r.stderr
    );
}

#[test]
fn fail_fast_stops_the_other_ranks_when_one_is_killed() {
    let dir = temp_dir("failfast");
    let script = format!(
        "echo $$ > {}/pid.$KOLO_TASK_INDEX; if [ $KOLO_TASK_INDEX = 1 ]; then sleep 0.3; kill -9 $$; else sleep 60; fi",
        dir.display()
    );
    let r = run(&["-np", "2", "sh", "-c", &script]);
    assert_eq!(r.result.unwrap(), 128 + 9);
    assert!(r.took < Duration::from_secs(10), "took {:?}", r.took);
    assert!(
        r.stderr.contains("kolorun: rank 1 on host localhost was killed by signal 9 (SIGKILL); stopped 1 other rank(s)"),
        "{}",
        r.stderr
    );
    // Neither the sleeping rank's shell nor its `sleep` child survived.
    assert_group_gone(&dir.join("pid.0"));
    assert_group_gone(&dir.join("pid.1"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn ctrl_c_stops_every_rank_and_returns_130() {
    let dir = temp_dir("interrupt");
    let script = format!("echo $$ > {}/pid.$KOLO_TASK_INDEX; sleep 60", dir.display());
    let started = Instant::now();
    let interrupted = move || started.elapsed() > Duration::from_millis(500);
    let r = run_with(&["-np", "2", "sh", "-c", &script], &interrupted);
    assert_eq!(r.result.unwrap(), 130);
    assert!(r.took < Duration::from_secs(6), "took {:?}", r.took);
    assert!(
        r.stderr
            .contains("kolorun: interrupted by the user; stopped 2 rank(s)"),
        "{}",
        r.stderr
    );
    assert_group_gone(&dir.join("pid.0"));
    assert_group_gone(&dir.join("pid.1"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_usage_is_a_config_error() {
    let cases: [(&[&str], &str); 6] = [
        (
            &["-np", "4", "-H", "localhost:2", "true"],
            "-np 4 asks for 4 processes but -H provides only 2 slots",
        ),
        (
            &["-np", "2", "--frobnicate", "true"],
            "unknown option \"--frobnicate\"",
        ),
        (&["-np", "2"], "no command given"),
        (&["true"], "-np N"),
        (
            &["-np", "2", "--hostfile", "/nonexistent/hosts", "true"],
            "cannot read --hostfile /nonexistent/hosts",
        ),
        (
            &[
                "-np",
                "1",
                "--output-filename",
                "/proc/kolo-no-such-dir",
                "true",
            ],
            "cannot create --output-filename directory /proc/kolo-no-such-dir/rank.0",
        ),
    ];
    for (args, expected) in cases {
        let r = run(args);
        match r.result {
            Err(Error::Config(message)) => {
                assert!(message.contains(expected), "{args:?}: {message}")
            }
            other => panic!("{args:?}: expected a Config error, got {other:?}"),
        }
    }
    let r = run(&["--help"]);
    assert_eq!(r.result.unwrap(), 0);
    assert!(r.stdout.starts_with("usage: kolorun"), "{}", r.stdout);
}

/// This machine's hostname: a second local host name besides `localhost` (both run as local
/// child processes, with different host identities).
fn this_hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap()
        .trim()
        .to_owned()
}

/// An elastic launch's loop on shell ranks: a rank that fails leaves the job and blacklists
/// its host instead of stopping the others; the first rank to exit 0 ends the job with exit
/// code 0; every rank sees the elastic variables and its own task index; `--output-filename`
/// writes each task's output to `DIR/task.T/`.
#[test]
fn an_elastic_launch_survives_a_failed_rank_and_ends_with_the_first_success() {
    let dir = temp_dir("elastic-loop");
    let me = this_hostname();
    let hosts = format!("localhost:1,{me}:1");
    let script = format!(
        "echo task=$KOLO_TASK_INDEX elastic=$HOROVOD_ELASTIC timeout=$KOLO_ELASTIC_TIMEOUT \
         host=$HOROVOD_HOSTNAME rank=$HOROVOD_RANK size=$HOROVOD_SIZE; \
         if [ \"$HOROVOD_HOSTNAME\" = localhost ]; then exit 3; fi; \
         while [ ! -e {0}/go ]; do sleep 0.05; done; touch {0}/finished",
        dir.display()
    );
    let go = dir.join("go");
    let watcher = std::thread::spawn(move || {
        // Released once the failure was handled (the launch goes on without the failed rank).
        std::thread::sleep(Duration::from_secs(2));
        std::fs::write(go, b"").unwrap();
    });
    let files = dir.join("out");
    let files_arg = files.display().to_string();
    let r = run(&[
        "-np",
        "2",
        "--min-np",
        "1",
        "--elastic-timeout",
        "7",
        "-H",
        &hosts,
        "--output-filename",
        &files_arg,
        "sh",
        "-c",
        &script,
    ]);
    watcher.join().unwrap();
    // Per task (a rank number is reused across rounds, a task index never is).
    for task in 0..2 {
        let text = std::fs::read_to_string(files.join(format!("task.{task}/stdout"))).unwrap();
        assert!(text.starts_with(&format!("task={task} ")), "{text}");
    }
    assert_eq!(r.result.unwrap(), 0, "{}", r.stderr);
    assert!(dir.join("finished").exists());
    for task in 0..2 {
        assert!(
            r.stdout
                .contains(&format!("task={task} elastic=1 timeout=7 ")),
            "{}",
            r.stdout
        );
    }
    assert!(
        r.stdout.contains("host=localhost rank=0 size=2"),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout.contains(&format!("host={me} rank=1 size=2")),
        "{}",
        r.stdout
    );
    assert!(
        r.stderr
            .contains("(task 0) on host localhost exited with code 3")
            && r.stderr
                .contains("host localhost is blacklisted for the rest of the job"),
        "{}",
        r.stderr
    );
    assert!(
        r.stderr
            .contains(&format!("(task 1) on host {me} finished")),
        "{}",
        r.stderr
    );
    // The failed rank was not replaced on its blacklisted host, nor were new indices needed.
    assert!(!r.stdout.contains("task=2"), "{}", r.stdout);
}

/// When every rank fails the elastic job fails (Horovod: every worker recorded a failure),
/// with the last failure's exit code.
#[test]
fn an_elastic_launch_fails_when_every_rank_failed() {
    let me = this_hostname();
    let hosts = format!("localhost:1,{me}:1");
    let r = run(&[
        "-np", "2", "--min-np", "1", "-H", &hosts, "sh", "-c", "exit 4",
    ]);
    assert_eq!(r.result.unwrap(), 4, "{}", r.stderr);
    assert!(
        r.stderr.contains("every rank of the elastic job failed"),
        "{}",
        r.stderr
    );
    assert!(r.took < Duration::from_secs(20), "{:?}", r.took);
}

/// Too few slots to start: the launch waits at most --elastic-timeout, then fails naming the
/// numbers, having started nothing.
#[test]
fn an_elastic_launch_without_enough_slots_times_out_naming_the_numbers() {
    let dir = temp_dir("elastic-wait");
    let marker = dir.join("started");
    let touch = format!("touch {}", marker.display());
    let r = run(&[
        "-np",
        "3",
        "--min-np",
        "2",
        "--elastic-timeout",
        "1",
        "-H",
        "localhost:1",
        "sh",
        "-c",
        &touch,
    ]);
    match r.result {
        Err(Error::Timeout { what, after }) => {
            assert_eq!(after, Duration::from_secs(1));
            assert!(
                what.contains("3 slot(s)")
                    && what.contains("--min-np 2")
                    && what.contains("only 1 were available"),
                "{what}"
            );
        }
        other => panic!("expected a Timeout, got {other:?}"),
    }
    assert!(r.took < Duration::from_secs(10), "{:?}", r.took);
    assert!(!marker.exists(), "a rank started");
    // A fixed-size launch with elastic-only options runs, with a notice for each.
    let r = run(&["-np", "1", "--max-np", "4", "--reset-limit", "2", "true"]);
    assert_eq!(r.result.unwrap(), 0);
    let notes: Vec<&str> = r
        .stderr
        .lines()
        .filter(|l| l.starts_with("kolorun: note:"))
        .collect();
    assert_eq!(notes.len(), 2, "{}", r.stderr);
    assert!(
        notes[0].contains("--max-np") && notes[0].contains("fixed size"),
        "{notes:?}"
    );
}

#[test]
fn a_missing_program_is_a_launch_error() {
    let r = run(&["-np", "2", "/nonexistent/program"]);
    match r.result {
        Err(Error::Launch(message)) => {
            assert!(message.contains("/nonexistent/program"), "{message}")
        }
        other => panic!("expected a Launch error, got {other:?}"),
    }
}

#[test]
fn hostfile_slots_are_used() {
    let dir = temp_dir("hostfile");
    let hostfile = dir.join("hosts");
    let mut file = std::fs::File::create(&hostfile).unwrap();
    writeln!(file, "# local only\nlocalhost slots=3").unwrap();
    let r = run(&[
        "--hostfile",
        hostfile.to_str().unwrap(),
        "sh",
        "-c",
        "echo n=$KOLO_NUM_TASKS",
    ]);
    assert_eq!(r.result.unwrap(), 0);
    assert_eq!(r.stdout.matches("n=3").count(), 3, "{}", r.stdout);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// This test binary, by a path that stays valid while this process runs even when a
/// concurrent build replaces the file.
fn this_exe() -> PathBuf {
    PathBuf::from(format!("/proc/{}/exe", std::process::id()))
}

/// This test binary, re-run by kolorun as a worker that registers with the driver.
fn worker_command(role: &str) -> Vec<String> {
    let exe = this_exe();
    vec![
        "env".into(),
        format!("KOLO_IT_WORKER={role}"),
        exe.to_string_lossy().into_owned(),
        "--exact".into(),
        "launcher::worker_process".into(),
        "--nocapture".into(),
        "--test-threads=1".into(),
    ]
}

/// Not a test by itself: the body of a worker process that kolorun starts (see
/// `worker_command`); does nothing unless `KOLO_IT_WORKER` is set.
#[test]
fn worker_process() {
    let Ok(role) = std::env::var("KOLO_IT_WORKER") else {
        return;
    };
    let env = WorkerEnv::from_env().unwrap().expect("launched by kolorun");
    let ip = control::data_plane_ip(&env).unwrap();
    let listener = TcpListener::bind((ip, 0)).unwrap();
    let abort = AbortSignal::new();
    let (me, client) =
        control::join_job(&env, listener.local_addr().unwrap(), abort.clone()).unwrap();
    println!(
        "\nkolo-it task={} rank={} size={} local={}/{} cross={}/{} host={}",
        env.task_index,
        me.rank,
        me.size,
        me.local_rank,
        me.local_size,
        me.cross_rank,
        me.cross_size,
        me.peers[me.rank as usize].hostname
    );
    match role.as_str() {
        "report" => block_on(client.leave(me.rank)).unwrap().unwrap(),
        "fail" if me.rank == 1 => {
            eprintln!("rank 1 fails on purpose");
            std::process::exit(3);
        }
        "fail" => {
            let deadline = Instant::now() + Duration::from_secs(30);
            while !abort.is_aborted() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            println!(
                "\nkolo-it rank {} saw: {}",
                me.rank,
                abort.cause().map(|c| c.to_string()).unwrap_or_default()
            );
            std::process::exit(1);
        }
        other => panic!("unknown role {other}"),
    }
}

#[test]
fn registered_workers_get_ranks_and_prefixes_follow_them() {
    let mut args = vec!["-np".to_owned(), "3".to_owned()];
    args.extend(worker_command("report"));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let r = run(&args);
    assert_eq!(r.result.unwrap(), 0);
    for rank in 0..3 {
        let line = format!(
            "[{rank}]<stdout>:kolo-it task={rank} rank={rank} size=3 local={rank}/3 cross=0/1"
        );
        assert!(
            r.stdout.contains(&line),
            "missing {line:?} in\n{}",
            r.stdout
        );
    }
}

#[test]
fn a_failing_worker_aborts_the_others_through_the_driver() {
    let mut args = vec!["-np".to_owned(), "2".to_owned()];
    args.extend(worker_command("fail"));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let r = run(&args);
    assert_eq!(r.result.unwrap(), 3);
    assert!(r.took < Duration::from_secs(20), "took {:?}", r.took);
    assert!(
        r.stderr.contains(
            "kolorun: rank 1 on host localhost exited with code 3; stopped 1 other rank(s)"
        ),
        "{}",
        r.stderr
    );
    // Rank 0 learned why through its AbortSignal, before kolorun had to stop it.
    assert!(
        r.stdout.contains("[0]<stdout>:kolo-it rank 0 saw: job aborted: rank 1 on host localhost: exited with code 3"),
        "{}",
        r.stdout
    );
}

/// Not a test by itself: kolorun as a separate process (arguments in `KOLO_IT_KOLORUN`,
/// separated by U+001F), so a test can kill it.
#[test]
fn kolorun_process() {
    let Ok(args) = std::env::var("KOLO_IT_KOLORUN") else {
        return;
    };
    let args: Vec<String> = args.split('\u{1f}').map(String::from).collect();
    let code = launcher::run(&args, &|| false).unwrap();
    std::process::exit(code);
}

/// Starts kolorun (as a separate process) with `hosts_args` on two ranks that record their
/// pids, SIGKILLs kolorun once both run, and checks that no rank survives.
fn killing_kolorun_leaves_no_rank(name: &str, hosts_args: &[&str]) {
    let dir = temp_dir(name);
    let script = format!(
        "echo $$ > {}/pid.$KOLO_TASK_INDEX; exec sleep 60",
        dir.display()
    );
    let mut args: Vec<&str> = hosts_args.to_vec();
    args.extend(["sh", "-c", &script]);
    let mut kolorun = std::process::Command::new(this_exe())
        .args([
            "--exact",
            "launcher::kolorun_process",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("KOLO_IT_KOLORUN", args.join("\u{1f}"))
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !(dir.join("pid.0").exists() && dir.join("pid.1").exists()) {
        assert!(Instant::now() < deadline, "the ranks did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(100));
    kolorun.kill().unwrap();
    kolorun.wait().unwrap();
    assert_group_gone(&dir.join("pid.0"));
    assert_group_gone(&dir.join("pid.1"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn killing_kolorun_kills_its_local_ranks() {
    killing_kolorun_leaves_no_rank("killed-local", &["-np", "2"]);
}

/// Over ssh to 127.0.0.1 (an sshd from tests/support/start_sshd.sh); skipped unless
/// KOLO_TEST_SSH_PORT and KOLO_TEST_SSH_KEY are set.
#[test]
fn ssh_ranks_register_and_fail_fast() {
    let (Ok(port), Ok(key)) = (
        std::env::var("KOLO_TEST_SSH_PORT"),
        std::env::var("KOLO_TEST_SSH_KEY"),
    ) else {
        eprintln!("skipped: set KOLO_TEST_SSH_PORT and KOLO_TEST_SSH_KEY (see tests/support/start_sshd.sh)");
        return;
    };
    // One local rank and one over ssh: two simulated hosts.
    let mut args: Vec<String> = [
        "-H",
        "localhost:1,127.0.0.1:1",
        "-p",
        &port,
        "--ssh-identity-file",
        &key,
    ]
    .map(String::from)
    .to_vec();
    args.extend(worker_command("report"));
    let r = run(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(r.result.unwrap(), 0);
    assert!(
        r.stdout.contains(
            "[0]<stdout>:kolo-it task=0 rank=0 size=2 local=0/1 cross=0/2 host=localhost"
        ),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout.contains(
            "[1]<stdout>:kolo-it task=1 rank=1 size=2 local=0/1 cross=1/2 host=127.0.0.1"
        ),
        "{}",
        r.stdout
    );

    // Both ranks over ssh; rank 1 is killed; the remote sleeping rank must not survive.
    let dir = temp_dir("ssh-failfast");
    let script = format!(
        "echo $$ > {}/pid.$KOLO_TASK_INDEX; if [ $KOLO_TASK_INDEX = 1 ]; then sleep 0.5; kill -9 $$; else sleep 60; fi",
        dir.display()
    );
    let r = run(&[
        "-H",
        "127.0.0.1:2",
        "-p",
        &port,
        "--ssh-identity-file",
        &key,
        "sh",
        "-c",
        &script,
    ]);
    assert_ne!(r.result.unwrap(), 0);
    assert!(r.took < Duration::from_secs(15), "took {:?}", r.took);
    assert!(
        r.stderr
            .contains("kolorun: rank 1 on host 127.0.0.1 exited with code 137"),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains("SIGKILL"), "{}", r.stderr);
    assert_group_gone(&dir.join("pid.0"));
    assert_group_gone(&dir.join("pid.1"));
    std::fs::remove_dir_all(&dir).unwrap();

    // kolorun killed outright: the ssh clients die with it, and the remote watchdogs stop the
    // remote ranks.
    killing_kolorun_leaves_no_rank(
        "killed-ssh",
        &[
            "-H",
            "127.0.0.1:2",
            "-p",
            &port,
            "--ssh-identity-file",
            &key,
        ],
    );
}

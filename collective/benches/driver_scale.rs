//! The job driver at scale (`cargo bench -p kolo-collective --bench driver_scale`): for n = 64,
//! 256 and 1,024 workers, a real [`DriverService`] in a child process (so its memory and file
//! descriptors are its own) and `n` real [`DriverClient`]s as tokio tasks of this process on
//! 127.0.0.1, each with its own connection and keyed handshake, as `n` worker processes would
//! have. Prints, as text and then as one JSON document on the last line:
//!
//! - registration: until every client connected, until every client had its assignment, and
//!   how long handing the completed assignment to everyone took;
//! - heartbeats (every client at the production interval of 1 s for `KOLO_DRIVER_BENCH_HOLD`
//!   seconds, default 60): the gaps between each rank's consecutive heartbeats as the driver
//!   received them (p50/p99/p99.9/max), how many ranks the driver ever called silent (asked
//!   every second as a stalled collective would, silent = two intervals), whether any client
//!   or the driver declared a failure;
//! - KV: rank 0 puts a 128-byte value (an NCCL unique id) that the n-1 others wait for; then
//!   all n read it again at once;
//! - abort: the driver aborts; how long until every client's abort signal was set;
//! - the driver process's RSS (now and peak) and open descriptors.
//!
//! `KOLO_DRIVER_BENCH_SIZES=64,256` picks the sizes; `KOLO_DRIVER_BENCH_HOLD=10` shortens the
//! heartbeat phase; `KOLO_DRIVER_BENCH_ELASTIC=1` makes the job elastic (min = max = n), where
//! the driver checks each heartbeat's sender against the latest round's assignment. The soft
//! open-file limit is raised as needed (an error names a hard limit that is too low).

#[path = "support/driver_load.rs"]
mod driver_load;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use kolo_collective::control::{
    ClientOptions, DriverConfig, DriverService, ElasticConfig, JobSecret,
};
use kolo_collective::AbortCause;

/// The argument that makes this binary the driver child.
const CHILD: &str = "--driver-child";
/// Heartbeat interval of the clients (production default).
const INTERVAL: Duration = Duration::from_secs(1);
/// Registration start timeout and heartbeat timeout of the driver (production defaults).
const TIMEOUT: Duration = Duration::from_secs(30);

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(at) = args.iter().position(|a| a == CHILD) {
        let n: usize = args[at + 1].parse().expect("the child's task count");
        serve_driver(n);
        return;
    }
    let sizes: Vec<usize> = std::env::var("KOLO_DRIVER_BENCH_SIZES")
        .unwrap_or_else(|_| "64,256,1024".into())
        .split(',')
        .map(|s| {
            s.trim()
                .parse()
                .expect("KOLO_DRIVER_BENCH_SIZES: comma-separated counts")
        })
        .collect();
    let hold = Duration::from_secs(
        std::env::var("KOLO_DRIVER_BENCH_HOLD")
            .map(|s| s.parse().expect("KOLO_DRIVER_BENCH_HOLD: seconds"))
            .unwrap_or(60),
    );
    let biggest = sizes.iter().copied().max().unwrap_or(0);
    if let Err(err) = driver_load::raise_fd_limit(biggest, false) {
        eprintln!("driver_scale: {err}");
        std::process::exit(2);
    }
    let results: Vec<String> = sizes.iter().map(|&n| run(n, hold)).collect();
    println!("{{\"bench\":\"driver_scale\",\"elastic\":{},\"heartbeat_interval_ms\":{},\"hold_s\":{},\"results\":[{}]}}",
        elastic(), INTERVAL.as_millis(), hold.as_secs(), results.join(","));
}

/// Whether the job is elastic (`KOLO_DRIVER_BENCH_ELASTIC=1`).
fn elastic() -> bool {
    std::env::var("KOLO_DRIVER_BENCH_ELASTIC").is_ok_and(|v| v == "1")
}

/// The driver child: reads the secret from stdin, starts the driver, prints its address, then
/// answers `stats` and `abort` lines until stdin closes.
fn serve_driver(n: usize) {
    let mut lines = std::io::stdin().lock().lines();
    let secret = lines.next().expect("the secret").expect("stdin");
    let config = DriverConfig {
        secret: JobSecret::from_hex(secret.trim(), "secret").expect("a hex secret"),
        start_timeout: TIMEOUT,
        heartbeat_timeout: TIMEOUT,
        elastic: elastic().then(|| ElasticConfig::new(n, n)),
        ..DriverConfig::new(n)
    };
    let driver = DriverService::start(config).expect("the driver starts");
    println!("{}", driver.addr());
    for line in lines {
        match line.expect("stdin").trim() {
            "abort" => {
                driver.abort(AbortCause {
                    rank: None,
                    host: String::new(),
                    message: "driver_scale bench".into(),
                });
                println!("aborted");
            }
            "stats" => {
                let gaps = driver.heartbeat_gaps();
                let at = |q| driver_load::ms(gaps.percentile(q).unwrap_or_default());
                let (rss, peak) = rss_kib("self");
                println!(
                    "{{\"cpu_ms\":{:.0},\"rss_kib\":{rss},\"peak_rss_kib\":{peak},\"fds\":{},\
                     \"active_ranks\":{},\
                     \"heartbeats\":{},\"gap_p50_ms\":{:.1},\"gap_p99_ms\":{:.1},\
                     \"gap_p999_ms\":{:.1},\"gap_max_ms\":{:.1},\"aborted\":{}}}",
                    cpu_ms(),
                    driver_load::open_fds("self"),
                    driver.active_ranks(),
                    gaps.count(),
                    at(0.5),
                    at(0.99),
                    at(0.999),
                    driver_load::ms(gaps.max()),
                    driver.abort_cause().is_some()
                );
            }
            other => panic!("unknown command {other:?}"),
        }
    }
    driver.shutdown();
}

/// `VmRSS` and `VmHWM` (peak) of process `pid` ("self" for this one), in KiB.
fn rss_kib(pid: &str) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|kib| kib.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// User + system CPU time of this process so far, in milliseconds.
fn cpu_ms() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command (which may hold spaces) start at the last ')'.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or(Vec::new(), |(_, rest)| rest.split_whitespace().collect());
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // SAFETY: sysconf has no preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    // utime and stime are fields 14 and 15 of stat(5); 12 and 13 after the command.
    (ticks(11) + ticks(12)) * 1e3 / per_second
}

struct DriverChild {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl DriverChild {
    fn start(n: usize, secret: &JobSecret) -> (Self, String) {
        let mut child = Command::new(std::env::current_exe().expect("this binary"))
            .args([CHILD, &n.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("the driver child starts");
        let mut stdin = child.stdin.take().expect("piped");
        let mut stdout = BufReader::new(child.stdout.take().expect("piped"));
        writeln!(stdin, "{}", secret.to_hex()).expect("the child reads its secret");
        let mut addr = String::new();
        stdout.read_line(&mut addr).expect("the driver's address");
        (
            Self {
                child,
                stdin,
                stdout,
            },
            addr.trim().to_owned(),
        )
    }

    fn ask(&mut self, command: &str) -> String {
        writeln!(self.stdin, "{command}").expect("the child reads");
        let mut answer = String::new();
        self.stdout
            .read_line(&mut answer)
            .expect("the child answers");
        answer.trim().to_owned()
    }
}

/// One size: returns its JSON object.
fn run(n: usize, hold: Duration) -> String {
    let secret = JobSecret::generate();
    let (mut driver, addr) = DriverChild::start(n, &secret);
    let idle = driver.ask("stats");
    let options = ClientOptions {
        connect_timeout: TIMEOUT,
        heartbeat_interval: INTERVAL,
        lost_after: Duration::from_secs(5),
    };
    let json = kolo_runtime::block_on(async {
        let generator_cpu = cpu_ms();
        let mut fleet = driver_load::join_fleet(&addr, &secret, n, options, TIMEOUT)
            .await
            .unwrap_or_else(|err| panic!("n = {n}: {err}"));
        let registered = driver.ask("stats");
        let generator_cpu = cpu_ms() - generator_cpu;
        let held = driver_load::hold(&fleet, hold, INTERVAL, INTERVAL * 2).await;
        let heartbeating = driver.ask("stats");
        let (fan_out, burst) = driver_load::kv_fan_out(&fleet, "nccl-unique-id", 128)
            .await
            .unwrap_or_else(|err| panic!("n = {n}: {err}"));
        let mut arrivals = driver_load::abort_reach(
            &fleet,
            || {
                driver.ask("abort");
            },
            Duration::from_secs(30),
        )
        .await
        .unwrap_or_else(|err| panic!("n = {n}: {err}"));
        for client in &fleet.clients {
            client.stop_background();
        }
        let mut questions = held.question_latency.clone();
        let register_p50 = driver_load::quantile(&mut fleet.register_calls, 0.5);
        let connect_p50 = driver_load::quantile(&mut fleet.connect_times, 0.5);
        let connect_p99 = driver_load::quantile(&mut fleet.connect_times, 0.99);
        let ms = driver_load::ms;
        println!(
            "n = {n}: connected {:.0} ms (p50 {:.0}, p99 {:.0}), registered {:.0} ms (assignment \
             handed out over {:.0} ms; a registration call p50 {:.0} ms; the {n} clients used \
             {:.0} ms CPU for it)",
            ms(fleet.all_connected),
            ms(connect_p50),
            ms(connect_p99),
            ms(fleet.all_registered),
            ms(fleet.assignment_spread),
            ms(register_p50),
            generator_cpu
        );
        println!("  driver idle:        {idle}");
        println!("  after registration: {registered}");
        println!("  after {} s of heartbeats: {heartbeating}", hold.as_secs());
        println!(
            "  silence samples {}, most ranks called silent {}, clients that gave up on the \
             driver {}; a SilentRanks call p50 {:.1} ms, max {:.1} ms",
            held.samples,
            held.most_silent,
            held.clients_aborted.len(),
            ms(driver_load::quantile(&mut questions, 0.5)),
            ms(driver_load::quantile(&mut questions, 1.0))
        );
        let abort_p50 = driver_load::quantile(&mut arrivals, 0.5);
        let abort_all = driver_load::quantile(&mut arrivals, 1.0);
        println!(
            "  KV fan-out to {} readers {:.1} ms; {n} reads of a present key {:.1} ms; abort \
             reached half {:.1} ms, all {:.1} ms",
            n - 1,
            ms(fan_out),
            ms(burst),
            ms(abort_p50),
            ms(abort_all)
        );
        format!(
            "{{\"n\":{n},\"connect_all_ms\":{:.1},\"connect_p50_ms\":{:.1},\
             \"connect_p99_ms\":{:.1},\"clients_cpu_registering_ms\":{generator_cpu:.0},\
             \"register_all_ms\":{:.1},\
             \"assignment_spread_ms\":{:.1},\"register_call_p50_ms\":{:.1},\
             \"driver_idle\":{idle},\"driver_registered\":{registered},\
             \"driver_heartbeating\":{heartbeating},\"silence_samples\":{},\"most_silent\":{},\
             \"clients_gave_up\":{},\"kv_fan_out_ms\":{:.2},\"kv_read_burst_ms\":{:.2},\
             \"abort_p50_ms\":{:.2},\"abort_all_ms\":{:.2}}}",
            ms(fleet.all_connected),
            ms(connect_p50),
            ms(connect_p99),
            ms(fleet.all_registered),
            ms(fleet.assignment_spread),
            ms(register_p50),
            held.samples,
            held.most_silent,
            held.clients_aborted.len(),
            ms(fan_out),
            ms(burst),
            ms(abort_p50),
            ms(abort_all)
        )
    })
    .expect("kolo's runtime");
    drop(driver.stdin);
    let _ = driver.child.wait();
    json
}

//! A load generator for the job driver service: `n` real [`DriverClient`]s (one TCP connection
//! and one keyed handshake each, as `n` worker processes would open) as tokio tasks of this
//! process, registering, heartbeating, reading the key-value space and watching for the abort
//! broadcast through the client's own background tasks. Shared by the `driver_scale` bench and
//! the `driver_scale` integration test (included with `#[path]`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kolo_collective::control::{ClientOptions, DriverClient, JobSecret, Registration, TaskInfo};
use kolo_collective::AbortSignal;

/// File descriptors this process needs beyond one per client connection (runtime, stdio,
/// the listener, test harness).
const SPARE_FDS: u64 = 256;

/// Raises this process's soft limit on open files to what `clients` connections need (twice
/// that when the driver runs in this process too: both ends are ours). Errors name the hard
/// limit when it is too low.
pub fn raise_fd_limit(clients: usize, driver_in_process: bool) -> Result<u64, String> {
    let ends = if driver_in_process { 2 } else { 1 };
    let needed = clients as u64 * ends + SPARE_FDS;
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the limit into the valid rlimit we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(format!(
            "cannot read the open-file limit: {}",
            std::io::Error::last_os_error()
        ));
    }
    if limit.rlim_cur >= needed {
        return Ok(limit.rlim_cur);
    }
    if limit.rlim_max < needed {
        return Err(format!(
            "{clients} driver clients need about {needed} open files, but this process's hard \
             limit is {} (ulimit -Hn): raise it (limits.conf, systemd LimitNOFILE, or \
             `ulimit -Hn {needed}` as root) or run with fewer clients",
            limit.rlim_max
        ));
    }
    limit.rlim_cur = needed;
    // SAFETY: setrlimit reads the valid rlimit we pass; the soft limit is within the hard one.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } != 0 {
        return Err(format!(
            "cannot raise the open-file soft limit to {needed}: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(needed)
}

/// How many file descriptors process `pid` ("self" for this one) has open.
pub fn open_fds(pid: &str) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |dir| dir.count())
}

/// The `q` quantile of `samples` (sorted in place), `Duration::ZERO` when empty.
pub fn quantile(samples: &mut [Duration], q: f64) -> Duration {
    if samples.is_empty() {
        return Duration::ZERO;
    }
    samples.sort_unstable();
    let index = ((q * samples.len() as f64).ceil() as usize).clamp(1, samples.len()) - 1;
    samples[index]
}

/// Milliseconds, for reports.
pub fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}

/// `n` registered clients with their background heartbeat and abort watch running.
pub struct Fleet {
    /// One client per task, by task index.
    pub clients: Vec<DriverClient>,
    /// Each client's abort signal (set by its abort watcher), by task index.
    pub signals: Vec<AbortSignal>,
    /// Each client's assignment, by task index.
    pub registrations: Vec<Registration>,
    /// From the start until every client had connected (TCP + handshake + HTTP/2).
    pub all_connected: Duration,
    /// From the start until every client had its assignment.
    pub all_registered: Duration,
    /// Each client's connection (TCP, handshake, HTTP/2), from the start.
    pub connect_times: Vec<Duration>,
    /// Each client's own registration call (the wait for the others included).
    pub register_calls: Vec<Duration>,
    /// From the first client's assignment to the last one's: how long the driver took to
    /// hand the completed assignment to everyone.
    pub assignment_spread: Duration,
}

/// Task `index` of a job spread over hosts of 8 tasks each (as on 8-GPU machines).
fn task(index: u32) -> TaskInfo {
    let host = format!("load-host-{}", index / 8);
    TaskInfo {
        task_index: index,
        host_hash: kolo_collective::control::host_hash::host_hash_for(&host, "load", None),
        hostname: host,
        data_addr: SocketAddr::from(([127, 0, 0, 1], 10_000 + (index % 50_000) as u16)),
        pid: 100_000 + index,
        generation: 0,
    }
}

/// Starts `n` clients at once: each connects, proves the secret, registers as task `i`, waits
/// for the assignment, and starts its heartbeat loop and abort watcher.
/// Must run on kolo's global runtime.
pub async fn join_fleet(
    addr: &str,
    secret: &JobSecret,
    n: usize,
    options: ClientOptions,
    start_timeout: Duration,
) -> Result<Fleet, String> {
    let addr: Arc<str> = addr.into();
    let started = Instant::now();
    let joins: Vec<_> = (0..n as u32)
        .map(|index| {
            let (addr, secret) = (Arc::clone(&addr), secret.clone());
            tokio::spawn(async move {
                let client = DriverClient::connect(&addr, &secret, options)
                    .await
                    .map_err(|err| format!("task {index} could not connect: {err}"))?;
                let connected = started.elapsed();
                let call = Instant::now();
                let registration = client
                    .register(&task(index), start_timeout)
                    .await
                    .map_err(|err| format!("task {index} could not register: {err}"))?;
                // As a worker does right after `join_job`.
                let signal = AbortSignal::new();
                client
                    .start_background(registration.rank, signal.clone())
                    .map_err(|err| format!("cannot start the background tasks: {err}"))?;
                Ok::<_, String>((
                    client,
                    signal,
                    registration,
                    connected,
                    call.elapsed(),
                    started.elapsed(),
                ))
            })
        })
        .collect();
    let mut fleet = Fleet {
        clients: Vec::with_capacity(n),
        signals: Vec::with_capacity(n),
        registrations: Vec::with_capacity(n),
        all_connected: Duration::ZERO,
        all_registered: Duration::ZERO,
        connect_times: Vec::with_capacity(n),
        register_calls: Vec::with_capacity(n),
        assignment_spread: Duration::ZERO,
    };
    let mut first_registered = Duration::MAX;
    let mut outcomes = Vec::with_capacity(n);
    for join in joins {
        outcomes.push(
            join.await
                .map_err(|err| format!("a client task failed: {err}"))
                .and_then(|outcome| outcome),
        );
    }
    // Every task's own error, not only the first index's (which is often a timeout waiting for
    // the task that really failed).
    let errors: Vec<&String> = outcomes.iter().filter_map(|o| o.as_ref().err()).collect();
    if !errors.is_empty() {
        let waiting = "waiting for every task to register";
        let mut own: Vec<&String> = errors
            .iter()
            .copied()
            .filter(|e| !e.contains(waiting))
            .collect();
        own.truncate(5);
        return Err(format!(
            "{} of {n} clients failed; {}",
            errors.len(),
            if own.is_empty() {
                errors[0].clone()
            } else {
                own.iter()
                    .map(|e| e.as_str())
                    .collect::<Vec<_>>()
                    .join("; ")
            }
        ));
    }
    for outcome in outcomes {
        let (client, signal, registration, connected, call, registered) =
            outcome.expect("errors returned above");
        fleet.all_connected = fleet.all_connected.max(connected);
        fleet.all_registered = fleet.all_registered.max(registered);
        first_registered = first_registered.min(registered);
        fleet.register_calls.push(call);
        fleet.connect_times.push(connected);
        fleet.clients.push(client);
        fleet.signals.push(signal);
        fleet.registrations.push(registration);
    }
    fleet.assignment_spread = fleet.all_registered.saturating_sub(first_registered);
    Ok(fleet)
}

/// What [`hold`] saw while the fleet heartbeat.
pub struct Held {
    /// The most ranks the driver called silent in one sample (must stay 0).
    pub most_silent: u32,
    /// Samples taken.
    pub samples: usize,
    /// The task indices whose own abort signal got set (a client that lost the driver).
    pub clients_aborted: Vec<usize>,
    /// How long each `SilentRanks` question took (a heartbeat-sized call through the driver).
    pub question_latency: Vec<Duration>,
}

/// Lets the fleet heartbeat for `length`, asking the driver every `every` (as rank 0, exactly
/// as a stalled collective would) which ranks it has not heard from for `silent_after`.
pub async fn hold(
    fleet: &Fleet,
    length: Duration,
    every: Duration,
    silent_after: Duration,
) -> Held {
    let end = Instant::now() + length;
    let mut held = Held {
        most_silent: 0,
        samples: 0,
        clients_aborted: Vec::new(),
        question_latency: Vec::new(),
    };
    while Instant::now() < end {
        tokio::time::sleep(every).await;
        let asked = Instant::now();
        match fleet.clients[0]
            .silent_ranks(0, silent_after, Duration::from_secs(10))
            .await
        {
            Ok(reply) => {
                held.question_latency.push(asked.elapsed());
                held.most_silent = held.most_silent.max(reply.total);
                held.samples += 1;
            }
            Err(err) => {
                held.most_silent = u32::MAX;
                eprintln!("asking the driver which ranks are silent failed: {err}");
            }
        }
    }
    held.clients_aborted = fleet
        .signals
        .iter()
        .enumerate()
        .filter(|(_, signal)| signal.is_aborted())
        .map(|(index, _)| index)
        .collect();
    held
}

/// KV fan-out: every client but task 0 waits for `key`, then task 0 puts `value_len` bytes.
/// Returns the time from the put's start until the last reader had the value, and how long
/// every client then took to read the (present) key again all at once.
pub async fn kv_fan_out(
    fleet: &Fleet,
    key: &str,
    value_len: usize,
) -> Result<(Duration, Duration), String> {
    let value: Vec<u8> = (0..value_len).map(|i| i as u8).collect();
    let readers: Vec<_> = fleet.clients[1..]
        .iter()
        .map(|client| {
            let (client, key) = (client.clone(), key.to_owned());
            tokio::spawn(async move {
                let got = client.kv_get(&key, Duration::from_secs(60)).await;
                (got, Instant::now())
            })
        })
        .collect();
    // Let the readers reach the driver and park there.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let put = Instant::now();
    fleet.clients[0]
        .kv_put(key, value.clone())
        .await
        .map_err(|err| format!("rank 0 could not put {key:?}: {err}"))?;
    let mut last = put;
    for reader in readers {
        let (got, at) = reader
            .await
            .map_err(|err| format!("a reader failed: {err}"))?;
        let got = got.map_err(|err| format!("a reader could not get {key:?}: {err}"))?;
        if got != value {
            return Err(format!(
                "a reader got {} wrong bytes for {key:?}",
                got.len()
            ));
        }
        last = last.max(at);
    }
    let fan_out = last - put;
    let burst = Instant::now();
    let again: Vec<_> = fleet
        .clients
        .iter()
        .map(|client| {
            let (client, key) = (client.clone(), key.to_owned());
            tokio::spawn(async move { client.kv_get(&key, Duration::from_secs(60)).await })
        })
        .collect();
    for read in again {
        let got = read
            .await
            .map_err(|err| format!("a reader failed: {err}"))?
            .map_err(|err| format!("a reader could not get {key:?} again: {err}"))?;
        if got != value {
            return Err(format!("a second read of {key:?} got wrong bytes"));
        }
    }
    Ok((fan_out, burst.elapsed()))
}

/// Calls `abort` (which makes the driver broadcast an abort) and waits up to `limit` until
/// every client's abort signal is set. Returns, per client, when it saw the abort (counted
/// from just before `abort`, sampled every millisecond); `Err` lists who had not after
/// `limit`.
pub async fn abort_reach(
    fleet: &Fleet,
    abort: impl FnOnce(),
    limit: Duration,
) -> Result<Vec<Duration>, String> {
    let mut seen: Vec<Option<Duration>> = vec![None; fleet.signals.len()];
    let started = Instant::now();
    abort();
    loop {
        let now = started.elapsed();
        for (slot, signal) in seen.iter_mut().zip(&fleet.signals) {
            if slot.is_none() && signal.is_aborted() {
                *slot = Some(now);
            }
        }
        if seen.iter().all(Option::is_some) {
            return Ok(seen.into_iter().flatten().collect());
        }
        if now > limit {
            let missing: Vec<usize> = seen
                .iter()
                .enumerate()
                .filter(|(_, s)| s.is_none())
                .map(|(i, _)| i)
                .collect();
            return Err(format!(
                "{} of {} clients had not seen the abort after {limit:?}: tasks {:?}",
                missing.len(),
                seen.len(),
                &missing[..missing.len().min(16)]
            ));
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

//! The job driver with hundreds of real clients on 127.0.0.1 (one connection and handshake
//! each): everyone registers, heartbeats arrive without starving (no rank is ever called
//! silent), a key rank 0 puts reaches every reader, and the abort broadcast reaches everyone.
//! The 1,024-client, 60 s run is the `driver_scale` bench.

#[path = "../../benches/support/driver_load.rs"]
mod driver_load;

use std::time::Duration;

use kolo_collective::control::{ClientOptions, DriverConfig, DriverService};
use kolo_collective::AbortCause;
use kolo_runtime::block_on;

/// Clients in the test (the bench runs 1,024).
const CLIENTS: usize = 256;
/// The test's heartbeat interval (production: 1 s).
const INTERVAL: Duration = Duration::from_millis(500);
/// Silence this long (in heartbeat intervals) counts as a false failure here: production
/// calls a rank silent after 2 intervals when a collective stalls and lost after 30; a shared
/// CI machine, whose 2 cores also run every client, gets 6.
const SILENT_AFTER: u32 = 6;

#[test]
fn hundreds_of_clients_register_heartbeat_without_false_silence_and_all_hear_the_abort() {
    driver_load::raise_fd_limit(CLIENTS, true).unwrap();
    let config = DriverConfig {
        start_timeout: Duration::from_secs(60),
        heartbeat_timeout: Duration::from_secs(10),
        ..DriverConfig::new(CLIENTS)
    };
    let secret = config.secret.clone();
    let driver = DriverService::start(config).unwrap();
    let options = ClientOptions {
        connect_timeout: Duration::from_secs(30),
        heartbeat_interval: INTERVAL,
        lost_after: Duration::from_secs(10),
    };
    let addr = driver.addr().to_string();
    block_on(async {
        let fleet =
            driver_load::join_fleet(&addr, &secret, CLIENTS, options, Duration::from_secs(60))
                .await
                .unwrap();
        eprintln!(
            "{CLIENTS} clients connected in {:?}, registered in {:?} (assignment handed out \
             over {:?})",
            fleet.all_connected, fleet.all_registered, fleet.assignment_spread
        );
        let mut ranks: Vec<u32> = fleet.registrations.iter().map(|r| r.rank).collect();
        ranks.sort_unstable();
        assert_eq!(ranks, (0..CLIENTS as u32).collect::<Vec<_>>());
        assert!(fleet
            .registrations
            .iter()
            .all(|r| r.size as usize == CLIENTS && r.peers.len() == CLIENTS));
        assert_eq!(driver.active_ranks(), CLIENTS);

        // Several intervals of heartbeats; the driver is asked the question a stalled
        // collective asks (which ranks are silent) every interval.
        let held =
            driver_load::hold(&fleet, INTERVAL * 10, INTERVAL, INTERVAL * SILENT_AFTER).await;
        let gaps = driver.heartbeat_gaps();
        eprintln!(
            "heartbeat gaps at the driver: {} gaps, p50 {:?}, p99 {:?}, max {:?}; {} silence \
             samples, most silent {}",
            gaps.count(),
            gaps.percentile(0.5).unwrap_or_default(),
            gaps.percentile(0.99).unwrap_or_default(),
            gaps.max(),
            held.samples,
            held.most_silent
        );
        assert!(held.samples >= 5, "only {} samples", held.samples);
        assert_eq!(held.most_silent, 0, "the driver called live ranks silent");
        assert!(
            held.clients_aborted.is_empty(),
            "{:?}",
            held.clients_aborted
        );
        assert!(driver.abort_cause().is_none(), "{:?}", driver.abort_cause());
        assert!(
            gaps.count() >= (CLIENTS * 6) as u64,
            "only {} heartbeats in 10 intervals of {CLIENTS} ranks",
            gaps.count()
        );
        assert!(
            gaps.max() < INTERVAL * SILENT_AFTER,
            "a heartbeat gap of {:?}",
            gaps.max()
        );

        let (fan_out, burst) = driver_load::kv_fan_out(&fleet, "nccl-unique-id", 128)
            .await
            .unwrap();
        eprintln!(
            "KV fan-out to {} readers {fan_out:?}, {CLIENTS} reads again {burst:?}",
            CLIENTS - 1
        );

        let fds = driver_load::open_fds("self");
        assert!(fds < 2 * CLIENTS + 256, "{fds} descriptors open");

        let arrivals = driver_load::abort_reach(
            &fleet,
            || {
                driver.abort(AbortCause {
                    rank: None,
                    host: String::new(),
                    message: "driver_scale test".into(),
                });
            },
            Duration::from_secs(5),
        )
        .await
        .unwrap();
        let mut arrivals = arrivals;
        eprintln!(
            "abort reached half the clients in {:.1} ms, all {CLIENTS} in {:.1} ms",
            driver_load::ms(driver_load::quantile(&mut arrivals, 0.5)),
            driver_load::ms(driver_load::quantile(&mut arrivals, 1.0))
        );
        for signal in &fleet.signals {
            assert!(signal
                .cause()
                .is_some_and(|cause| cause.message.contains("driver_scale test")));
        }
        for client in &fleet.clients {
            client.stop_background();
        }
    })
    .unwrap();
    driver.shutdown();
}

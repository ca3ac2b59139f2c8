//! The negotiation at scale in the simulator (`cargo bench -p kolo-collective --bench
//! scale_sim`): for n = 2, 8, 64, 256 and 1,024 virtual ranks and both protocols
//! (`all_to_all`, today's design, and `tree`), the real negotiation, cycle message codec and
//! coordinator agree on a step of 161 tensors twice: first uncached (full descriptors), then
//! through the response cache (the steady state). Virtual time over a modelled link (5 µs,
//! 10 GB/s; see `engine::negotiation::sim`) plus each rank's measured thread CPU time, so the
//! figures do not depend on how loaded this machine is. Prints a table, then one JSON document
//! on the last line.
//!
//! `KOLO_SIM_SIZES=2,8,64` picks the sizes (default 2, 8, 64, 256, 1,024: all 1,024 ranks in
//! one process peak at ~0.9 GB resident with the tree, ~0.7 GB with all-to-all; the whole
//! default run ~1.1 GB and ~20 s);
//! `KOLO_SIM_PROTOCOLS=tree` picks the protocols (default `all_to_all,tree`).
//! `KOLO_SIM_LATENCY_US` and `KOLO_SIM_GBPS` (bytes: gigabytes per second) change the link;
//! `KOLO_SIM_FANOUT` the tree's children per node (default: the engine's `TREE_FANOUT`);
//! `KOLO_SIM_DEBUG=1` prints percentiles over the ranks of each phase's CPU and of agreement.
//! Agreement is reported for the median rank and the latest, with the floor this host allows
//! (`SimReport::floor`: every message built, carried along its path at the link's latency, then
//! the rank's own decode and decision) and the median rank's share of it (floor / agreement).

use std::time::Duration;

use kolo_collective::engine::negotiation::sim::{run, LinkModel, RankCycle, SimConfig};
use kolo_collective::engine::negotiation::{Negotiation, TREE_FANOUT};

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

struct Row {
    n: usize,
    protocol: &'static str,
    step: &'static str,
    root: RankCycle,
    non_root_msgs_max: usize,
    non_root_msgs_mean: f64,
    non_root_bytes_mean: f64,
    cpu_mean_us: f64,
    cpu_max_us: f64,
    agreement_us: f64,
    agreement_p50_us: f64,
    /// The median rank's floor (`SimReport::floor`) and the median over ranks of floor / agreement.
    floor_p50_us: f64,
    floor_share: f64,
    peers_max: usize,
    peers_root: usize,
    identical: bool,
    /// Mean CPU per rank by phase: build, negotiate, decode, decide (µs).
    phases_us: [f64; 4],
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// The median (the upper one of an even count) of `v`.
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

fn main() {
    let sizes: Vec<usize> = std::env::var("KOLO_SIM_SIZES")
        .ok()
        .map(|v| v.split(',').filter_map(|s| s.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![2, 8, 64, 256, 1024]);
    let link = LinkModel {
        latency: Duration::from_secs_f64(env_or("KOLO_SIM_LATENCY_US", 5.0) / 1e6),
        bandwidth: env_or("KOLO_SIM_GBPS", 10.0) * 1e9,
    };
    let fanout = env_or("KOLO_SIM_FANOUT", TREE_FANOUT);
    println!(
        "negotiation simulator: 161 tensors, link {:.1} µs, {:.1} GB/s, tree fan-out {fanout}; virtual time + measured CPU",
        us(link.latency),
        link.bandwidth / 1e9
    );
    let protocols =
        std::env::var("KOLO_SIM_PROTOCOLS").unwrap_or_else(|_| "all_to_all,tree".into());
    let mut rows = Vec::new();
    for &n in &sizes {
        for (protocol, knob) in [
            ("all_to_all", Negotiation::AllToAll),
            ("tree", Negotiation::Tree),
        ] {
            if !protocols.split(',').any(|p| p.trim() == protocol) {
                continue;
            }
            let mut config = SimConfig::new(n, knob);
            config.link = link;
            config.fanout = fanout;
            let started = std::time::Instant::now();
            let report = match run(&config) {
                Ok(report) => report,
                Err(e) => {
                    eprintln!("n={n} {protocol}: {e}");
                    std::process::exit(1);
                }
            };
            eprintln!("n={n} {protocol}: simulated in {:.1?}", started.elapsed());
            for (step, label) in [(0, "first"), (1, "cached")] {
                let cycles = &report.cycles[step];
                if std::env::var("KOLO_SIM_DEBUG").is_ok() {
                    let pct = |f: &dyn Fn(&RankCycle) -> f64| {
                        let mut v: Vec<f64> = cycles.iter().map(f).collect();
                        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
                        format!(
                            "p50 {:.1} p90 {:.1} p99 {:.1} max {:.1}",
                            v[v.len() / 2],
                            v[v.len() * 9 / 10],
                            v[v.len() * 99 / 100],
                            v[v.len() - 1]
                        )
                    };
                    eprintln!("{label} cpu {}", pct(&|c| us(c.cpu)));
                    eprintln!("{label} build {}", pct(&|c| us(c.phases.build)));
                    eprintln!("{label} negotiate {}", pct(&|c| us(c.phases.negotiate)));
                    eprintln!("{label} decode {}", pct(&|c| us(c.phases.decode)));
                    eprintln!("{label} decide {}", pct(&|c| us(c.phases.decide)));
                    eprintln!("{label} agreed {}", pct(&|c| us(c.agreed_at)));
                }
                let floor = report.floor(step);
                let non_root = &cycles[1.min(cycles.len() - 1)..];
                let others = non_root.len().max(1) as f64;
                rows.push(Row {
                    n,
                    protocol,
                    step: label,
                    root: cycles[0].clone(),
                    non_root_msgs_max: non_root.iter().map(|c| c.messages).max().unwrap_or(0),
                    non_root_msgs_mean: non_root.iter().map(|c| c.messages).sum::<usize>() as f64
                        / others,
                    non_root_bytes_mean: non_root.iter().map(|c| c.bytes).sum::<usize>() as f64
                        / others,
                    cpu_mean_us: cycles.iter().map(|c| us(c.cpu)).sum::<f64>() / n as f64,
                    cpu_max_us: cycles.iter().map(|c| us(c.cpu)).fold(0.0, f64::max),
                    agreement_us: us(report.agreement(step)),
                    agreement_p50_us: median(cycles.iter().map(|c| us(c.agreed_at)).collect()),
                    floor_p50_us: median(floor.iter().map(|&f| us(f)).collect()),
                    floor_share: median(
                        floor
                            .iter()
                            .zip(cycles)
                            .map(|(f, c)| f.as_secs_f64() / c.agreed_at.as_secs_f64().max(1e-12))
                            .collect(),
                    ),
                    peers_max: report.peers.iter().copied().max().unwrap_or(0),
                    peers_root: report.peers[0],
                    identical: cycles.iter().all(|c| c.decision == cycles[0].decision)
                        && cycles[0].decision.len() == 161,
                    phases_us: [
                        cycles.iter().map(|c| us(c.phases.build)).sum::<f64>() / n as f64,
                        cycles.iter().map(|c| us(c.phases.negotiate)).sum::<f64>() / n as f64,
                        cycles.iter().map(|c| us(c.phases.decode)).sum::<f64>() / n as f64,
                        cycles.iter().map(|c| us(c.phases.decide)).sum::<f64>() / n as f64,
                    ],
                });
            }
        }
    }
    println!(
        "{:>5} {:>10} {:>6} | {:>9} {:>11} | {:>8} {:>8} {:>11} | {:>9} {:>9} | {:>19} | {:>15} | {:>5} {:>5} | agree | cpu µs: build negotiate decode decide",
        "n", "protocol", "step", "root msgs", "root bytes", "nr msg mx", "nr msg", "nr bytes", "cpu µs", "cpu mx µs",
        "agreement p50/max µs", "floor p50 µs/share", "peers", "root"
    );
    for r in &rows {
        println!(
            "{:>5} {:>10} {:>6} | {:>9} {:>11} | {:>8} {:>8.1} {:>11.0} | {:>9.1} {:>9.1} | {:>9.1} {:>9.1} | {:>8.1} {:>5.0}% | {:>5} {:>5} | {:>5} | {:>12.1} {:>9.1} {:>6.1} {:>6.1}",
            r.n,
            r.protocol,
            r.step,
            r.root.messages,
            r.root.bytes,
            r.non_root_msgs_max,
            r.non_root_msgs_mean,
            r.non_root_bytes_mean,
            r.cpu_mean_us,
            r.cpu_max_us,
            r.agreement_p50_us,
            r.agreement_us,
            r.floor_p50_us,
            100.0 * r.floor_share,
            r.peers_max,
            r.peers_root,
            if r.identical { "yes" } else { "NO" },
            r.phases_us[0],
            r.phases_us[1],
            r.phases_us[2],
            r.phases_us[3]
        );
    }
    let json: Vec<String> = rows
        .iter()
        .map(|r| {
            format!(
                "{{\"n\":{},\"protocol\":\"{}\",\"step\":\"{}\",\"root_messages\":{},\"root_bytes\":{},\
                 \"non_root_messages_max\":{},\"non_root_messages_mean\":{:.2},\"non_root_bytes_mean\":{:.0},\
                 \"cpu_mean_us\":{:.1},\"cpu_max_us\":{:.1},\"agreement_us\":{:.1},\"agreement_p50_us\":{:.1},\"floor_p50_us\":{:.1},\"floor_share\":{:.3},\"peers_max\":{},\
                 \"peers_root\":{},\"identical_decisions\":{},\"cpu_phases_us\":{{\"build\":{:.1},\
                 \"negotiate\":{:.1},\"decode\":{:.1},\"decide\":{:.1}}}}}",
                r.n,
                r.protocol,
                r.step,
                r.root.messages,
                r.root.bytes,
                r.non_root_msgs_max,
                r.non_root_msgs_mean,
                r.non_root_bytes_mean,
                r.cpu_mean_us,
                r.cpu_max_us,
                r.agreement_us,
                r.agreement_p50_us,
                r.floor_p50_us,
                r.floor_share,
                r.peers_max,
                r.peers_root,
                r.identical,
                r.phases_us[0],
                r.phases_us[1],
                r.phases_us[2],
                r.phases_us[3]
            )
        })
        .collect();
    println!(
        "{{\"latency_us\":{:.2},\"bandwidth_gbps\":{:.2},\"fanout\":{fanout},\"tensors\":161,\"rows\":[{}]}}",
        us(link.latency),
        link.bandwidth / 1e9,
        json.join(",")
    );
}

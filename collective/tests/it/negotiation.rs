//! The negotiation protocols: in the simulator at 64 ranks (identical decisions on every rank and
//! under both protocols, O(1) messages and `TREE_FANOUT` + 1 peers per rank under the tree, no rank
//! agreeing before its floor, a mismatch failing everywhere), and real engines over loopback with
//! the tree forced (every engine scenario: allreduce cached and uncached, allgather, broadcast, a
//! mismatch, a process set, join).

use std::sync::Arc;
use std::time::Duration;

use kolo_collective::engine::negotiation::sim::{run, SimConfig};
use kolo_collective::engine::negotiation::{Negotiation, TREE_FANOUT};
use kolo_collective::engine::{Engine, EngineConfig, Output, RawTensor, Submission};
use kolo_collective::wire::OpKind;
use kolo_collective::{DType, Error, ReduceOp};

use super::collectives::with_ranks;

const WAIT: Duration = Duration::from_secs(30);

#[test]
fn simulated_64_ranks_agree_alike_under_both_protocols_and_the_tree_sends_o1_messages() {
    let tree = run(&SimConfig::new(64, Negotiation::Tree)).unwrap();
    let mesh = run(&SimConfig::new(64, Negotiation::AllToAll)).unwrap();
    for step in 0..2 {
        let reference = &tree.cycles[step][0].decision;
        assert_eq!(reference.len(), 161, "step {step}: {reference:?}");
        let prefix = if step == 0 { "run " } else { "cached " };
        assert!(
            reference.iter().all(|d| d.starts_with(prefix)),
            "{reference:?}"
        );
        for (rank, cycle) in tree.cycles[step].iter().enumerate() {
            assert_eq!(&cycle.decision, reference, "tree, step {step}, rank {rank}");
            // Parent (1 up) and up to `TREE_FANOUT` children (poke and digest each).
            assert!(
                cycle.messages <= 1 + 2 * TREE_FANOUT,
                "tree rank {rank} sent {}",
                cycle.messages
            );
        }
        for (rank, cycle) in mesh.cycles[step].iter().enumerate() {
            assert_eq!(
                &cycle.decision, reference,
                "all-to-all, step {step}, rank {rank}"
            );
            assert_eq!(cycle.messages, 63, "all-to-all rank {rank}");
        }
    }
    assert!(
        tree.peers.iter().all(|&p| p <= 1 + TREE_FANOUT),
        "{:?}",
        tree.peers
    );
    assert!(mesh.peers.iter().all(|&p| p == 63));
    // The steady state's digest is one message however many ranks: constant bytes per hop
    // (at 64 and 256 ranks alike, the busiest rank has a parent and four children).
    let cached_bytes = tree.cycles[1].iter().map(|c| c.bytes).max().unwrap();
    let larger = run(&SimConfig::new(256, Negotiation::Tree)).unwrap();
    assert_eq!(
        cached_bytes,
        larger.cycles[1].iter().map(|c| c.bytes).max().unwrap()
    );
}

#[test]
fn no_simulated_rank_agrees_before_the_floor_its_paths_and_cpu_allow() {
    // The floor (what the bench reports agreement against) is a lower bound: each member's
    // message crosses its path at the link's latency after it was built, and the rank then
    // decodes and decides; a broken time model (a hop without latency, uncharged CPU) breaks it.
    for knob in [Negotiation::Tree, Negotiation::AllToAll] {
        let report = run(&SimConfig::new(64, knob)).unwrap();
        let deepest = *report.depth.iter().max().unwrap();
        assert!(knob == Negotiation::AllToAll || deepest >= 3, "{deepest}");
        for step in 0..2 {
            let floor = report.floor(step);
            for (rank, (floor, cycle)) in floor.iter().zip(&report.cycles[step]).enumerate() {
                assert!(
                    cycle.agreed_at + Duration::from_nanos(1) >= *floor,
                    "{knob:?} step {step} rank {rank} agreed at {:?}, before its floor {floor:?}",
                    cycle.agreed_at
                );
                let links = match knob {
                    Negotiation::Tree => deepest + report.depth[rank],
                    _ => 1,
                };
                let below = report.link.latency * links as u32 + cycle.phases.decide;
                assert!(
                    *floor >= below,
                    "{knob:?} rank {rank}: {floor:?} < {below:?}"
                );
            }
        }
    }
}

#[test]
fn a_simulated_mismatch_fails_on_every_rank_under_the_tree() {
    let mut config = SimConfig::new(64, Negotiation::Tree);
    config.mismatch_rank = Some(37);
    let report = run(&config).unwrap();
    for (rank, cycle) in report.cycles[0].iter().enumerate() {
        assert_eq!(cycle.decision[0], "fail grad.layer0.weight", "rank {rank}");
        assert_eq!(cycle.decision, report.cycles[0][0].decision);
    }
}

fn tree() -> EngineConfig {
    EngineConfig {
        negotiation: Negotiation::Tree,
        ..EngineConfig::default()
    }
}

fn f32_op(kind: OpKind, name: &str, buf: &mut [f32], rows: Option<usize>) -> Submission {
    let mut sub = Submission::new(kind, name);
    sub.dtype = DType::F32;
    sub.shape = match rows {
        Some(r) => vec![r as i64, (buf.len() / r.max(1)) as i64],
        None => vec![buf.len() as i64],
    };
    // SAFETY: every caller waits for the op before `buf` is dropped or read.
    sub.tensor = unsafe { RawTensor::new(buf.as_mut_ptr().cast(), std::mem::size_of_val(buf)) };
    sub
}

fn run_op(engine: &Engine, sub: Submission) -> Result<Output, Error> {
    let handle = engine.submit(sub)?;
    engine.wait(handle, WAIT).expect("the op completes in time")
}

#[test]
fn real_engines_run_every_scenario_over_the_tree() {
    const N: usize = 5;
    with_ranks(N, |rank, comm| {
        let engine = Engine::start(Arc::new(comm), tree()).unwrap();
        // Allreduce: the first step negotiates descriptors, the next ones cache bits.
        for step in 0..3 {
            let mut grads: Vec<Vec<f32>> = (0..4).map(|i| vec![(rank + i) as f32; 8]).collect();
            let subs = grads
                .iter_mut()
                .enumerate()
                .map(|(i, g)| f32_op(OpKind::Allreduce, &format!("g{i}"), g, None))
                .collect();
            for handle in engine.submit_group(subs, true).unwrap() {
                engine.wait(handle, WAIT).unwrap().unwrap();
            }
            for (i, g) in grads.iter().enumerate() {
                let want = (0..N).map(|r| (r + i) as f32).sum::<f32>();
                assert!(g.iter().all(|&x| x == want), "step {step} g{i}: {g:?}");
            }
        }
        let hits = engine
            .stats()
            .into_iter()
            .find(|(k, _)| *k == "cache_hits")
            .map(|(_, v)| v)
            .unwrap();
        assert!(hits >= 8, "rank {rank}: {hits} cache hits");

        // Allgather with a different first dimension on every rank.
        let mut mine = vec![rank as f32; 2 * (rank + 1)];
        match run_op(
            &engine,
            f32_op(OpKind::Allgather, "ag", &mut mine, Some(rank + 1)),
        )
        .unwrap()
        {
            Output::Tensor { rows, .. } => {
                assert_eq!(rows, (1..=N as u64).collect::<Vec<_>>())
            }
            other => panic!("{other:?}"),
        }

        // Broadcast from rank 2.
        let mut b = vec![rank as f32; 4];
        let mut sub = f32_op(OpKind::Broadcast, "b", &mut b, None);
        sub.root = 2;
        run_op(&engine, sub).unwrap();
        assert_eq!(b, vec![2.0; 4]);

        // A mismatched shape fails on every rank, and the engine keeps working.
        let mut m = vec![0f32; if rank == 3 { 5 } else { 4 }];
        let error = run_op(&engine, f32_op(OpKind::Allreduce, "m", &mut m, None)).unwrap_err();
        assert!(error.to_string().contains("rank"), "rank {rank}: {error}");

        // A process set of the odd ranks runs its own tree.
        let handle = engine.add_process_set(&[1, 3], true).unwrap();
        let id = match engine.wait(handle, WAIT).unwrap().unwrap() {
            Output::ProcessSet(id) => id,
            other => panic!("{other:?}"),
        };
        if rank % 2 == 1 {
            let mut x = vec![rank as f32; 3];
            let mut sub = f32_op(OpKind::Allreduce, "odd", &mut x, None);
            sub.process_set = id;
            run_op(&engine, sub).unwrap();
            assert_eq!(x, vec![4.0; 3]);
        }

        // Join: rank 4 joins first, the others allreduce once more and join; the last to join
        // is reported alike everywhere.
        if rank != 4 {
            let mut x = vec![1f32; 2];
            run_op(&engine, f32_op(OpKind::Allreduce, "late", &mut x, None)).unwrap();
            assert_eq!(x, vec![4.0; 2]);
        }
        let handle = engine.join().unwrap();
        let last = match engine.wait(handle, WAIT).unwrap().unwrap() {
            Output::LastJoined(last) => last,
            other => panic!("{other:?}"),
        };
        assert!(last < N);
        engine.shutdown();
        last
    });
}

fn stat(engine: &Engine, name: &str) -> u64 {
    engine
        .stats()
        .into_iter()
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
        .unwrap()
}

#[test]
fn a_cached_tensor_resubmitted_with_other_arguments_is_renegotiated_not_served_stale() {
    // "w" runs twice (the second time through its cache bit), then comes back under the same
    // name with another shape, another dtype and another reduction, each twice: each change
    // is a cache miss that runs with the new arguments (a stale response would run the old
    // shape, dtype or op), and the changed tensor's next submission hits again.
    const N: usize = 4;
    with_ranks(N, |rank, comm| {
        let engine = Engine::start(Arc::new(comm), tree()).unwrap();
        let r = rank as f32;
        let sum = |f: fn(usize) -> f32| (0..N).map(f).sum::<f32>();
        let mut expect_hits = 0;
        for len in [8, 8, 5, 5] {
            let before = stat(&engine, "cache_hits");
            let mut x = vec![r + 1.0; len];
            run_op(&engine, f32_op(OpKind::Allreduce, "w", &mut x, None)).unwrap();
            assert_eq!(x, vec![sum(|r| r as f32 + 1.0); len], "shape [{len}]");
            let hit = stat(&engine, "cache_hits") - before;
            assert_eq!(hit, expect_hits, "shape [{len}]");
            expect_hits = 1 - expect_hits;
        }
        // Another dtype (same name, same element count as the cached [5] f32).
        for round in 0..2 {
            let before = stat(&engine, "cache_hits");
            let mut x = vec![f64::from(r) * 0.5; 5];
            let mut sub = Submission::new(OpKind::Allreduce, "w");
            sub.dtype = DType::F64;
            sub.shape = vec![5];
            // SAFETY: the op completes before `x` is read or dropped.
            sub.tensor = unsafe { RawTensor::new(x.as_mut_ptr().cast(), 40) };
            run_op(&engine, sub).unwrap();
            let want = (0..N).map(|r| r as f64 * 0.5).sum::<f64>();
            assert_eq!(x, vec![want; 5], "f64 round {round}");
            assert_eq!(
                stat(&engine, "cache_hits") - before,
                round,
                "f64 round {round}"
            );
        }
        // Another reduction (max instead of sum), back to f32 [5].
        for round in 0..2 {
            let before = stat(&engine, "cache_hits");
            let mut x = vec![r; 5];
            let mut sub = f32_op(OpKind::Allreduce, "w", &mut x, None);
            sub.op = ReduceOp::Max;
            run_op(&engine, sub).unwrap();
            assert_eq!(x, vec![(N - 1) as f32; 5], "max round {round}");
            // The first f32 [5] max misses: the cache holds "w" as f64 sum.
            assert_eq!(
                stat(&engine, "cache_hits") - before,
                round,
                "max round {round}"
            );
        }
        engine.shutdown();
    });
}

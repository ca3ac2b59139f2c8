//! Autotune across real ranks (the real engine and mesh): rank 1 is slowed, so the ranks see
//! different step timings, yet every rank applies the same settings in the same order, because
//! only global rank 0 decides and its decision rides on its cycle message. The collectives stay
//! correct while the fusion threshold changes under them, and the search ends by itself.

use std::sync::Arc;
use std::time::Duration;

use kolo_collective::engine::autotune::settings::AutotuneConfig;
use kolo_collective::engine::{AppliedTrial, Engine, EngineConfig, RawTensor, Submission};
use kolo_collective::wire::OpKind;
use kolo_collective::DType;

use super::collectives::with_ranks;

const WAIT: Duration = Duration::from_secs(30);
const TENSORS: usize = 4;
const ELEMENTS: usize = 16 << 10;
/// Enough for the search at these settings: a warm-up sample, at most 9 joint samples of
/// 2 × 2 steps, the paired re-checks (3 settings × 6 rounds, then 2 × 6 for the cache, twice
/// that when unresolved) of 2 steps, each sample plus one unscored step: 150 to 260.
const STEPS: usize = 360;

/// One training-like step: allreduce (sum) `TENSORS` gradients of `rank + 1`.
fn step(engine: &Engine, rank: usize, buffers: &mut [Vec<u8>]) {
    let mut handles = Vec::new();
    for (i, buf) in buffers.iter_mut().enumerate() {
        let value = (rank + 1) as f32;
        for chunk in buf.chunks_mut(4) {
            chunk.copy_from_slice(&value.to_le_bytes());
        }
        let mut sub = Submission::new(OpKind::Allreduce, &format!("grad.{i}"));
        sub.dtype = DType::F32;
        sub.shape = vec![ELEMENTS as i64];
        // SAFETY: `buf` outlives the op (waited for below).
        sub.tensor = unsafe { RawTensor::new(buf.as_mut_ptr(), buf.len()) };
        handles.push(engine.submit(sub).expect("submitted"));
    }
    for handle in handles {
        engine
            .wait(handle, WAIT)
            .expect("the allreduce finished within the timeout")
            .expect("the allreduce ran");
    }
    for buf in buffers.iter() {
        let got = f32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]);
        assert_eq!(got, 3.0, "1 + 2 on every element");
    }
}

#[test]
fn every_rank_applies_the_same_settings_although_one_rank_is_slow() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("autotune.csv");
    let config = EngineConfig {
        autotune: AutotuneConfig {
            enabled: true,
            log: Some(log.clone()),
            warmup_samples: 1,
            steps_per_sample: 2,
            bayes_opt_max_samples: 9,
            ..AutotuneConfig::default()
        },
        ..EngineConfig::default()
    };
    let histories: Vec<(Vec<AppliedTrial>, bool)> = with_ranks(2, |rank, comm| {
        let engine = Engine::start(Arc::new(comm), config.clone()).unwrap();
        let mut buffers = vec![vec![0u8; ELEMENTS * 4]; TENSORS];
        for n in 0..STEPS {
            // Rank 1 is slow, unevenly: on its own it would score settings differently.
            if rank == 1 {
                std::thread::sleep(Duration::from_micros(200 + 700 * (n as u64 % 3)));
            }
            step(&engine, rank, &mut buffers);
        }
        let finished = !engine.tuned_params().active;
        engine.shutdown();
        (engine.autotune_trials(), finished)
    });
    let (first, finished) = &histories[0];
    assert!(*finished, "the search converged within {STEPS} steps");
    for (rank, (history, _)) in histories.iter().enumerate() {
        assert_eq!(history, first, "rank {rank} applied other settings");
    }
    // Trials count up from 1, the search tried several fusion thresholds, and the last
    // setting is the kept one.
    assert!(first.len() >= 5, "{first:?}");
    assert!(first
        .iter()
        .enumerate()
        .all(|(i, t)| t.trial == i as u32 + 1));
    let thresholds: std::collections::HashSet<usize> =
        first.iter().map(|t| t.params.fusion_threshold).collect();
    assert!(thresholds.len() >= 3, "{first:?}");
    let last = first.last().unwrap();
    assert!(!last.params.active && first[..first.len() - 1].iter().all(|t| t.params.active));
    // Rank 0's CSV: the header, one line per scored sample, the best line (the kept setting).
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("hierarchical_allreduce,hierarchical_allgather,torus_allreduce"));
    assert!(lines.len() >= 4, "{text}");
    let best: Vec<&str> = lines.last().unwrap().split(',').collect();
    let mb: f64 = best[5].parse().unwrap();
    let kept = last.params.fusion_threshold as f64 / (1024.0 * 1024.0);
    assert!((mb - kept).abs() <= 1e-4 * kept.max(1.0), "{mb} vs {kept}");
}

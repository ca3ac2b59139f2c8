//! Grouped submissions (Horovod's grouped ops): the tensors of a group enter one cycle on every
//! rank, so they become ready together and fuse into one collective, however the engine thread
//! is scheduled; and a group is submitted all or none.

use std::sync::Arc;
use std::time::Duration;

use kolo_collective::engine::{Engine, EngineConfig, RawTensor, Submission};
use kolo_collective::wire::OpKind;
use kolo_collective::{DType, Error};

use super::collectives::with_ranks;

const WAIT: Duration = Duration::from_secs(30);
const GROUP: usize = 5;
const STEPS: u64 = 40;

fn allreduce(name: &str, buf: &mut [f32]) -> Submission {
    let mut sub = Submission::new(OpKind::Allreduce, name);
    sub.dtype = DType::F32;
    sub.shape = vec![buf.len() as i64];
    // SAFETY: every caller waits for the op (or gets it refused) before `buf` is dropped.
    sub.tensor = unsafe { RawTensor::new(buf.as_mut_ptr().cast(), std::mem::size_of_val(buf)) };
    sub
}

fn collectives(engine: &Engine) -> u64 {
    engine
        .stats()
        .into_iter()
        .find(|(name, _)| *name == "collectives")
        .map(|(_, n)| n)
        .expect("the engine counts collectives")
}

/// An engine that starts a cycle as soon as anything is submitted: one op at a time, a group
/// would be split across cycles (and so across collectives) whenever the engine thread runs
/// between two submissions.
fn eager() -> EngineConfig {
    EngineConfig {
        cycle_time: Duration::ZERO,
        submit_quiet_time: Duration::ZERO,
        ..EngineConfig::default()
    }
}

#[test]
fn a_group_is_one_fused_collective_even_when_cycles_start_at_once() {
    let counts = with_ranks(2, |rank, comm| {
        let engine = Engine::start(Arc::new(comm), eager()).unwrap();
        let mut bufs = vec![vec![0f32; 64]; GROUP];
        for step in 0..STEPS {
            for (i, buf) in bufs.iter_mut().enumerate() {
                buf.fill((rank + i) as f32);
            }
            let subs = bufs
                .iter_mut()
                .enumerate()
                .map(|(i, buf)| allreduce(&format!("grad.{i}"), buf))
                .collect();
            let handles = engine.submit_group(subs, true).unwrap();
            assert_eq!(handles.len(), GROUP);
            for handle in handles {
                engine.wait(handle, WAIT).unwrap().unwrap();
            }
            for (i, buf) in bufs.iter().enumerate() {
                assert!(
                    buf.iter().all(|&x| x == (2 * i + 1) as f32),
                    "step {step} grad.{i}: {:?}",
                    &buf[..4]
                );
            }
        }
        let count = collectives(&engine);
        engine.shutdown();
        count
    });
    for (rank, count) in counts.into_iter().enumerate() {
        assert_eq!(
            count, STEPS,
            "rank {rank}: {STEPS} groups of {GROUP} took {count} collectives"
        );
    }
}

#[test]
fn a_group_with_one_bad_op_submits_none_of_it() {
    with_ranks(2, |rank, comm| {
        let engine = Engine::start(Arc::new(comm), EngineConfig::default()).unwrap();
        let (mut a, mut b, mut c) = (vec![1f32; 8], vec![2f32; 8], vec![3f32; 8]);
        // The third op reuses the first one's name: refused, and so are the first two.
        let bad = vec![
            allreduce("a", &mut a),
            allreduce("b", &mut b),
            allreduce("a", &mut c),
        ];
        let refused = engine.submit_group(bad, true).unwrap_err();
        assert!(
            matches!(&refused, Error::InvalidArgument(m) if m.contains("'a' is already in progress")),
            "rank {rank}: {refused}"
        );
        // Nothing of the refused group is outstanding or ran: the same names go again.
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(
            collectives(&engine),
            0,
            "rank {rank}: part of a refused group ran"
        );
        let good = vec![allreduce("a", &mut a), allreduce("b", &mut b)];
        for handle in engine.submit_group(good, true).unwrap() {
            engine.wait(handle, WAIT).unwrap().unwrap();
        }
        assert_eq!((a[0], b[0]), (2.0, 4.0), "rank {rank}");
        engine.shutdown();
    });
}

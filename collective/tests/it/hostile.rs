//! A hostile (or broken) rank running the real engine and mesh, whose descriptors skip its own
//! argument checks (`Engine::submit_unchecked`): huge or negative shapes, alltoall splits that
//! add up to petabytes, NaN scale factors. Every rank must fail that op with a typed error —
//! no abort, no out-of-memory, no hang — and the next collective must still run on every rank.

use std::sync::{Arc, Barrier};
use std::time::Duration;

use kolo_collective::engine::{Engine, EngineConfig, Output, RawTensor, Submission};
use kolo_collective::wire::OpKind;
use kolo_collective::{DType, Error};

use super::collectives::with_ranks;

const WAIT: Duration = Duration::from_secs(30);

fn wait(engine: &Engine, handle: u64) -> Result<Output, Error> {
    engine
        .wait(handle, WAIT)
        .expect("the op finished within the timeout (no hang)")
}

/// Every rank's outcome of `hostile` (run by rank 1, unchecked) against `honest` (rank 0,
/// through the ordinary checked submit), then of a normal allreduce run afterwards.
fn against_hostile_rank(
    honest: impl Fn(&mut Vec<u8>) -> Submission + Sync,
    hostile: impl Fn(&mut Vec<u8>) -> Submission + Sync,
) -> Vec<(Result<Output, Error>, Vec<f32>)> {
    with_ranks(2, |rank, comm| {
        let engine = Engine::start(Arc::new(comm), EngineConfig::default()).unwrap();
        let mut buf = vec![0u8; 64];
        let outcome = if rank == 0 {
            let handle = engine.submit(honest(&mut buf)).expect("a valid submission");
            wait(&engine, handle)
        } else {
            let sub = hostile(&mut buf);
            // SAFETY: `buf` outlives the op; the test proves its claimed size is refused
            // before anything reads past it.
            let handle = unsafe { engine.submit_unchecked(sub) }.expect("submitted unchecked");
            wait(&engine, handle)
        };
        // The next collective pairs on every rank.
        let mut values: Vec<u8> = [1.0f32 + rank as f32, 10.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let mut sub = Submission::new(OpKind::Allreduce, "after");
        sub.dtype = DType::F32;
        sub.shape = vec![2];
        // SAFETY: `values` outlives the op (waited for below).
        sub.tensor = unsafe { RawTensor::new(values.as_mut_ptr(), values.len()) };
        let handle = engine.submit(sub).expect("the engine still runs");
        wait(&engine, handle).expect("the collective after the refused one runs");
        let sums = values
            .chunks(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        engine.shutdown();
        (outcome, sums)
    })
}

fn submission(kind: OpKind, dtype: DType, shape: &[i64], buf: &mut [u8]) -> Submission {
    let mut sub = Submission::new(kind, "hostile");
    sub.dtype = dtype;
    sub.shape = shape.to_vec();
    // SAFETY: the callers keep `buf` alive until the op's handle completes.
    sub.tensor = unsafe { RawTensor::new(buf.as_mut_ptr(), buf.len()) };
    sub
}

/// A byte alltoall of `len` rows sending `splits` rows to each rank.
fn alltoall(len: i64, splits: Vec<u64>) -> impl Fn(&mut Vec<u8>) -> Submission + Sync {
    move |buf| {
        let mut sub = submission(OpKind::Alltoall, DType::U8, &[len], buf);
        sub.splits = splits.clone();
        sub
    }
}

fn assert_refused_everywhere(outcomes: &[(Result<Output, Error>, Vec<f32>)], what: &str) {
    for (rank, (outcome, sums)) in outcomes.iter().enumerate() {
        match outcome {
            Err(Error::Mismatch(message)) => assert!(
                message.contains("rank 1 announced") && message.contains(what),
                "rank {rank}: {message}"
            ),
            other => panic!("rank {rank}: expected a typed refusal naming {what:?}, got {other:?}"),
        }
        assert_eq!(sums, &[3.0, 20.0], "rank {rank}: the next allreduce ran");
    }
}

#[test]
fn an_allgather_first_dimension_of_2_pow_40_is_refused_on_every_rank() {
    let outcomes = against_hostile_rank(
        |buf| submission(OpKind::Allgather, DType::F32, &[4, 4], buf),
        |buf| submission(OpKind::Allgather, DType::F32, &[1 << 40, 4], buf),
    );
    assert_refused_everywhere(&outcomes, "more than the limit");
}

#[test]
fn alltoall_splits_adding_up_to_2_pow_50_are_refused_on_every_rank() {
    let outcomes = against_hostile_rank(
        alltoall(64, vec![32, 32]),
        alltoall(1 << 50, vec![1 << 49, 1 << 49]),
    );
    assert_refused_everywhere(&outcomes, "more than the limit");
}

#[test]
fn alltoall_splits_that_do_not_add_up_are_refused_on_every_rank() {
    let outcomes =
        against_hostile_rank(alltoall(64, vec![32, 32]), alltoall(64, vec![u64::MAX, 2]));
    assert_refused_everywhere(&outcomes, "invalid splits");
}

#[test]
fn a_negative_dimension_is_refused_on_every_rank() {
    let outcomes = against_hostile_rank(
        |buf| submission(OpKind::Allgather, DType::F32, &[4, 4], buf),
        |buf| submission(OpKind::Allgather, DType::F32, &[-3, 4], buf),
    );
    assert_refused_everywhere(&outcomes, "negative dimension");
}

#[test]
fn nan_scale_factors_are_refused_on_every_rank() {
    // The honest rank cannot even submit them.
    with_ranks(1, |_, comm| {
        let engine = Engine::start(Arc::new(comm), EngineConfig::default()).unwrap();
        let mut buf = vec![0u8; 16];
        let mut sub = submission(OpKind::Allreduce, DType::F32, &[4], &mut buf);
        sub.prescale = f64::NAN;
        assert!(
            matches!(engine.submit(sub), Err(Error::InvalidArgument(m)) if m.contains("must be finite")),
        );
        engine.shutdown();
    });
    // Sent by a peer (on both ranks, so they agree bit for bit), they fail everywhere.
    let nan = |buf: &mut Vec<u8>| {
        let mut sub = submission(OpKind::Allreduce, DType::F32, &[4], buf);
        sub.postscale = f64::NAN;
        sub
    };
    let outcomes = with_ranks(2, |_, comm| {
        let engine = Engine::start(Arc::new(comm), EngineConfig::default()).unwrap();
        let mut buf = vec![0u8; 16];
        // SAFETY: `buf` outlives the op.
        let handle = unsafe { engine.submit_unchecked(nan(&mut buf)) }.unwrap();
        let outcome = wait(&engine, handle);
        engine.shutdown();
        outcome
    });
    for (rank, outcome) in outcomes.iter().enumerate() {
        assert!(
            matches!(outcome, Err(Error::Mismatch(m)) if m.contains("must be finite")),
            "rank {rank}: {outcome:?}"
        );
    }
}

#[test]
fn a_tensor_in_flight_cannot_be_submitted_again() {
    let both_submitted = Barrier::new(2);
    let outcomes = with_ranks(2, |rank, comm| {
        let engine = Engine::start(Arc::new(comm), EngineConfig::default()).unwrap();
        let mut buf = vec![0u8; 16];
        let first = submission(OpKind::Allreduce, DType::F32, &[4], &mut buf);
        let mut again = first.clone();
        again.name = "again".into();
        let mut view = first.clone();
        view.name = "view".into();
        view.kind = OpKind::Allgather;
        view.shape = vec![2];
        // SAFETY: the same 8 bytes inside `buf`, which outlives every op.
        view.tensor = unsafe { RawTensor::new(buf.as_mut_ptr().add(4), 8) };
        let mut same_name = submission(OpKind::Allreduce, DType::F32, &[0], &mut []);
        same_name.name = first.name.clone();
        let handle = engine.submit(first).unwrap();
        let refusals = (rank == 0).then(|| {
            [again, view, same_name].map(|sub| match engine.submit(sub) {
                Err(Error::InvalidArgument(message)) => message,
                other => panic!("a second op on a tensor in flight was accepted: {other:?}"),
            })
        });
        both_submitted.wait();
        let outcome = wait(&engine, handle);
        engine.shutdown();
        (outcome, refusals)
    });
    for (outcome, _) in &outcomes {
        assert_eq!(outcome.as_ref().unwrap(), &Output::Done);
    }
    let refusals = outcomes[0].1.as_ref().unwrap();
    assert!(refusals[0].contains("overlaps the memory of a collective still in progress"));
    assert!(refusals[1].contains("overlaps"));
    assert!(refusals[2].contains("already in progress"));
}

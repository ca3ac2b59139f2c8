//! alltoall: pairwise exchange over the mesh (also across hosts in the hierarchical layout);
//! chunked through shared memory on one host.

use super::allgather::check_first_dim;
use super::allreduce::no_mesh;
use super::{back, check_tensor, invalid, label, row_bytes, row_segments, Session};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::transport::{Buffers, Layout, RecvBlock, SendBlock, StreamPlan};
use crate::wire::{OpDescriptor, OpKind};

pub(crate) fn alltoall<'a>(
    session: &mut Session,
    name: &str,
    input: &[u8],
    shape: &[i64],
    dtype: DType,
    splits: &[u64],
    alloc: impl FnOnce(&[u64]) -> Result<&'a mut [u8]>,
) -> Result<Vec<u64>> {
    let kind = OpKind::Alltoall;
    let (rank, size) = (session.rank, session.size);
    let mut desc = OpDescriptor {
        dtype,
        shape: shape.to_vec(),
        splits: splits.to_vec(),
        ..OpDescriptor::new(kind, name)
    };
    desc.invalid = check_first_dim(shape)
        .and_then(|()| check_tensor(name, input.len(), shape, dtype, "input"))
        .and_then(|()| check_splits(splits, shape, size))
        .err()
        .map(|m| invalid(kind, name, m));
    if desc.invalid.is_some() {
        // Do not send oversized or inconsistent splits; the error says what was wrong.
        desc.splits.clear();
    }
    let (descs, tag) = session.negotiate(desc)?;
    let what = label(kind, name);
    let recv_rows: Option<Vec<u64>> = descs.iter().map(|d| d.splits.get(rank).copied()).collect();
    let Some(recv_rows) = recv_rows else {
        let e = Error::Internal(format!("{what}: a rank announced no splits"));
        return Err(session.abandon(&what, e));
    };
    let segments = row_bytes(shape, dtype)
        .map_err(Error::InvalidArgument)
        .and_then(|row| Ok((row_segments(splits, row)?, row_segments(&recv_rows, row)?)));
    let (send_segs, recv_segs) = segments.map_err(|e| session.abandon(&what, e))?;
    let total = recv_segs.last().map_or(0, |s| s.end);
    let output = match alloc(&recv_rows) {
        Ok(output) if output.len() == total => output,
        Ok(output) => {
            let e = Error::InvalidArgument(format!(
                "{what}: the output buffer holds {} bytes but the received rows need {total} bytes",
                output.len()
            ));
            return Err(session.abandon(&what, e));
        }
        Err(e) => return Err(session.abandon(&what, e)),
    };
    output[recv_segs[rank].clone()].copy_from_slice(&input[send_segs[rank].clone()]);
    if size == 1 {
        return Ok(recv_rows);
    }
    if let Some(Layout::Flat) = session.shm_layout() {
        let row = row_bytes(shape, dtype).unwrap_or(0);
        let longest = descs
            .iter()
            .flat_map(|d| d.splits.iter())
            .map(|&rows| {
                usize::try_from(rows)
                    .unwrap_or(usize::MAX)
                    .saturating_mul(row)
            })
            .max()
            .unwrap_or(0);
        session.on_node(&what, |node| {
            node.alltoall(input, &send_segs, output, &recv_segs, longest)
        })?;
        return Ok(recv_rows);
    }
    let members = session.members.clone();
    let mesh = session.mesh.as_mut().ok_or_else(no_mesh)?;
    for k in 1..size {
        let (to, from) = ((rank + k) % size, back(rank, k, size));
        let send = [SendBlock {
            range: send_segs[to].clone(),
            after: None,
        }];
        let recv = [RecvBlock {
            range: recv_segs[from].clone(),
            reduce: false,
        }];
        let plan = StreamPlan {
            tag,
            send_to: Some(members[to]),
            recv_from: Some(members[from]),
            send_blocks: &send,
            recv_blocks: &recv,
        };
        mesh.run_stream(
            &what,
            &plan,
            Buffers::Split {
                send: input,
                recv: &mut *output,
            },
            &mut [],
            |_, _, _| Err(Error::Internal("alltoall has nothing to reduce".into())),
        )?;
    }
    Ok(recv_rows)
}

pub(crate) fn check_splits(splits: &[u64], shape: &[i64], size: usize) -> Result<(), String> {
    if splits.len() != size {
        return Err(format!(
            "{} splits were given but the job has {size} ranks; pass one row count per rank",
            splits.len()
        ));
    }
    let rows = shape.first().copied().unwrap_or(0);
    let sum = splits.iter().try_fold(0u64, |acc, &s| acc.checked_add(s));
    if sum != u64::try_from(rows).ok() {
        return Err(format!(
            "the splits {splits:?} add up to {} rows but the tensor has {rows} rows (first dimension); the \
             splits must add up to it",
            sum.map_or_else(|| "more than 2^64".to_owned(), |s| s.to_string())
        ));
    }
    Ok(())
}

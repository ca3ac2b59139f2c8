//! allgather: recursive doubling for small results, else a ring ([`super::algorithm`]
//! chooses), with one block per rank (ranks may differ in the first dimension); chunked
//! copies through shared memory on one host; hierarchical across hosts.

use super::algorithm::Algorithm;
use super::{check_tensor, invalid, label, row_bytes, row_segments, Session};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::transport::Layout;
use crate::wire::{OpDescriptor, OpKind};

pub(crate) fn allgather<'a>(
    session: &mut Session,
    name: &str,
    input: &[u8],
    shape: &[i64],
    dtype: DType,
    alloc: impl FnOnce(&[u64]) -> Result<&'a mut [u8]>,
) -> Result<Vec<u64>> {
    let kind = OpKind::Allgather;
    let mut desc = OpDescriptor {
        dtype,
        shape: shape.to_vec(),
        ..OpDescriptor::new(kind, name)
    };
    let forced = session.algorithm(kind, 0);
    desc.invalid = check_first_dim(shape)
        .and_then(|()| forced.map(|_| ()))
        .and_then(|()| check_tensor(name, input.len(), shape, dtype, "input"))
        .err()
        .map(|m| invalid(kind, name, m));
    let (descs, tag) = session.negotiate(desc)?;
    let what = label(kind, name);
    let (rank, size) = (session.rank, session.size);
    // Checked alike on every rank (`check_sizes`): non-negative first dims, same row size, a
    // result within `MAX_TENSOR_BYTES`.
    let rows: Vec<u64> = descs
        .iter()
        .map(|d| {
            d.shape
                .first()
                .map_or(0, |&r| u64::try_from(r).unwrap_or(u64::MAX))
        })
        .collect();
    let segs = row_bytes(shape, dtype)
        .map_err(Error::InvalidArgument)
        .and_then(|row| row_segments(&rows, row))
        .map_err(|e| session.abandon(&what, e))?;
    let total = segs.last().map_or(0, |s| s.end);
    let output = match alloc(&rows) {
        Ok(output) if output.len() == total => output,
        Ok(output) => {
            let e = Error::InvalidArgument(format!(
                "{what}: the output buffer holds {} bytes but the gathered tensor needs {total} bytes ({} rows)",
                output.len(),
                rows.iter().sum::<u64>()
            ));
            return Err(session.abandon(&what, e));
        }
        Err(e) => return Err(session.abandon(&what, e)),
    };
    output[segs[rank].clone()].copy_from_slice(input);
    if size == 1 {
        return Ok(rows);
    }
    match session.shm_layout() {
        Some(Layout::Flat) => session.on_node(&what, |node| node.allgather(output, &segs))?,
        Some(Layout::Hierarchical(hosts))
            if hosts.ranges.is_some() && super::hier::chosen(OpKind::Allgather) =>
        {
            super::hier::allgather(session, &hosts, &what, tag, output, &segs)?
        }
        _ => {
            // The gathered size is known only now, and alike on every rank.
            let algorithm = session.algorithm(kind, total).map_err(Error::Internal)?;
            session.run_algorithm(
                kind,
                algorithm,
                tag,
                &what,
                |ring, mesh, _, _| match algorithm {
                    Algorithm::RecursiveDoubling => ring.doubling_allgather(mesh, output, &segs),
                    _ => ring.allgather(mesh, output, &segs),
                },
            )?
        }
    }
    Ok(rows)
}

/// Allgather, alltoall and reducescatter split along the first dimension.
pub(crate) fn check_first_dim(shape: &[i64]) -> Result<(), String> {
    if shape.is_empty() {
        return Err("the tensor is a scalar but the collective splits along the first dimension; reshape it \
                    to [1] first"
            .into());
    }
    Ok(())
}

//! reducescatter: the ring reduce-scatter with Horovod's uneven row split.

use super::allgather::check_first_dim;
use super::allreduce::{no_mesh, Reduction};
use super::check_tensor;
use super::{
    invalid, label, reducescatter_rows, ring_pieces, ring_reduce_scatter, row_bytes, row_segments,
    Session,
};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::reduce;
use crate::transport::{Buffers, Layout, StreamPlan, CHUNK};
use crate::wire::OpKind;

/// Work buffers larger than this are released after each reducescatter.
const KEEP_WORK: usize = 64 << 20;

pub(crate) fn reducescatter(
    session: &mut Session,
    name: &str,
    input: &[u8],
    output: &mut [u8],
    shape: &[i64],
    dtype: DType,
    reduction: Reduction,
) -> Result<()> {
    let kind = OpKind::Reducescatter;
    let (rank, size) = (session.rank, session.size);
    let mut desc = reduction.descriptor(kind, name, dtype, shape);
    desc.invalid = check_first_dim(shape)
        .and_then(|()| check_tensor(name, input.len(), shape, dtype, "input"))
        .and_then(|()| {
            reduce::check_reduction(dtype, reduction.op, reduction.prescale, reduction.postscale)
        })
        .and_then(|()| check_output(output.len(), shape, dtype, rank, size))
        .err()
        .map(|m| invalid(kind, name, m));
    let tag = session.negotiate_tag(desc)?;
    let what = label(kind, name);
    let factor = reduction.result_factor(size);
    if size == 1 {
        output.copy_from_slice(input);
        reduce::scale(dtype, output, reduction.prescale)?;
        return reduce::scale(dtype, output, factor);
    }
    let rows = reducescatter_rows(shape.first().map_or(0, |&r| r as u64), size);
    let segs = row_bytes(shape, dtype)
        .map_err(Error::InvalidArgument)
        .and_then(|row| row_segments(&rows, row))
        .map_err(|e| session.abandon(&what, e))?;
    match session.shm_layout() {
        // Without a prescale the node reads the input as it is: no work copy.
        Some(Layout::Flat) if reduction.prescale == 1.0 => {
            return session.on_node(&what, |node| {
                node.reducescatter(input, output, &segs, dtype, reduction.op, factor)
            });
        }
        // Otherwise the prescaled input goes through the work buffer.
        Some(layout) => {
            let mut work = std::mem::take(&mut session.work);
            let work_buf = work.get(input.len());
            work_buf.copy_from_slice(input);
            let result = reduce::scale(dtype, work_buf, reduction.prescale)
                .map_err(|e| session.abandon(&what, e))
                .and_then(|()| match layout {
                    Layout::Flat => session.on_node(&what, |node| {
                        node.reducescatter(work_buf, output, &segs, dtype, reduction.op, factor)
                    }),
                    Layout::Hierarchical(hosts) => {
                        super::hier::allreduce(
                            session,
                            &hosts,
                            &what,
                            tag,
                            work_buf,
                            dtype,
                            reduction.op,
                            factor,
                        )?;
                        output.copy_from_slice(&work_buf[segs[rank].clone()]);
                        Ok(())
                    }
                });
            work.trim(KEEP_WORK);
            session.work = work;
            return result;
        }
        None => {}
    }
    let Session {
        mesh,
        scratch,
        work,
        members,
        ..
    } = session;
    let mesh = mesh.as_mut().ok_or_else(no_mesh)?;
    let work_buf = work.get(input.len());
    work_buf.copy_from_slice(input);
    if let Err(e) = reduce::scale(dtype, work_buf, reduction.prescale) {
        mesh.break_links(&format!("rank {rank} abandoned {what}: {e}"));
        return Err(e);
    }
    let (mut sends, mut recvs) = (Vec::new(), Vec::new());
    let mut is_final = Vec::new();
    for piece in ring_pieces(&segs, dtype.size()) {
        ring_reduce_scatter(&piece, rank, &mut sends, &mut recvs);
        is_final.resize(recvs.len() - 1, false);
        is_final.push(true);
    }
    let plan = StreamPlan {
        tag,
        send_to: Some(members[(rank + 1) % size]),
        recv_from: Some(members[(rank + size - 1) % size]),
        send_blocks: &sends,
        recv_blocks: &recvs,
    };
    mesh.run_stream(
        &what,
        &plan,
        Buffers::InPlace(work_buf),
        scratch.get(CHUNK),
        reduction.sink(dtype, factor, &is_final),
    )?;
    output.copy_from_slice(&work_buf[segs[rank].clone()]);
    work.trim(KEEP_WORK);
    Ok(())
}

fn check_output(
    len: usize,
    shape: &[i64],
    dtype: DType,
    rank: usize,
    size: usize,
) -> Result<(), String> {
    let rows = shape.first().copied().unwrap_or(0).max(0) as u64;
    let mine = reducescatter_rows(rows, size)[rank];
    let row = row_bytes(shape, dtype)?;
    let need = usize::try_from(mine).ok().and_then(|m| m.checked_mul(row));
    if need != Some(len) {
        return Err(format!(
            "the output buffer holds {len} bytes but rank {rank} receives {mine} of the {rows} rows ({} bytes); \
             rank r receives rows/size rows, plus one if r < rows % size",
            need.map_or_else(|| "too many".to_owned(), |n| n.to_string())
        ));
    }
    Ok(())
}

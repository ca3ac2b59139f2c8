//! Running a cycle's agreed responses on one process set: fusion planning, copying into and
//! out of the fusion buffer, the collectives themselves, and completing handles.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use super::coordinator::Response;
use super::device::{run_device_batch, DevicePart};
use super::handles::Handles;
use super::request::{Output, Submission};
use super::stats::Stats;
use super::timeline::Timeline;
use crate::collectives::allreduce::Reduction;
use crate::collectives::{self, reducescatter_rows, row_bytes, AlignedBuf, Session};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::reduce;
use crate::wire::{OpDescriptor, OpKind};

/// A submitted op waiting for its response on this rank.
#[derive(Debug)]
pub(crate) struct Local {
    pub handle: u64,
    pub sub: Submission,
}

impl Local {
    /// The submitted tensor's memory, for an op that writes it (allreduce, broadcast).
    fn bytes<'a>(&self) -> &'a mut [u8] {
        // SAFETY: the submitter handed this memory to the engine until the handle completes,
        // only the engine thread (the caller) runs ops, and `Handles::open` refused any other
        // pending op over these bytes: no other reference to them exists while this one lives.
        unsafe { self.sub.tensor.bytes() }
    }
}

/// The bytes of `local`'s tensor (read only), or nothing for a joined rank.
fn input<'a>(local: &Option<Local>) -> &'a [u8] {
    // SAFETY: as for `Local::bytes`; other pending ops may only read these bytes too.
    local
        .as_ref()
        .map_or(&[], |l| unsafe { l.sub.tensor.read() })
}

/// Output buffers handed back by [`recycle_output`], largest total [`SPARE_BYTES`].
static SPARE: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());
/// The most bytes (capacity) [`SPARE`] keeps.
const SPARE_BYTES: usize = 256 << 20;
/// Smaller outputs are neither kept nor taken from [`SPARE`] (fresh ones are cheap).
const SPARE_MIN: usize = 1 << 20;

/// Takes back the bytes of an [`Output::Tensor`] whose tensor is gone, so that the next
/// allgather, alltoall or reducescatter writes into pages that are already mapped instead of
/// faulting in (and zeroing) fresh ones: at 64 MiB that costs more than the collective itself.
/// Keeps at most 256 MiB; buffers under 1 MiB are dropped.
pub fn recycle_output(buf: Vec<u8>) {
    if buf.capacity() < SPARE_MIN || buf.capacity() > SPARE_BYTES {
        return;
    }
    let mut spare = SPARE.lock().unwrap_or_else(PoisonError::into_inner);
    let mut held: usize = spare.iter().map(Vec::capacity).sum();
    while held + buf.capacity() > SPARE_BYTES && !spare.is_empty() {
        held -= spare.remove(0).capacity();
    }
    spare.push(buf);
}

/// A `len`-byte output buffer, every byte of which the collective overwrites: a recycled one
/// (stale contents) when one holds `len` bytes without being more than twice as large, else a
/// fresh zeroed allocation (see [`zeroed`]). An error, not an abort, when memory runs out.
fn output_buffer(len: usize) -> Result<Vec<u8>> {
    if len >= SPARE_MIN {
        let mut spare = SPARE.lock().unwrap_or_else(PoisonError::into_inner);
        let best = spare
            .iter()
            .enumerate()
            .filter(|(_, b)| b.len() >= len && b.capacity() / 2 <= len)
            .min_by_key(|(_, b)| b.capacity())
            .map(|(i, _)| i);
        if let Some(i) = best {
            let mut buf = spare.swap_remove(i);
            buf.truncate(len);
            return Ok(buf);
        }
    }
    zeroed(len)
}

/// `len` zero bytes, allocated fallibly (`calloc`: untouched pages are not written): a typed
/// error naming the size when the allocator refuses, where `vec![0; len]` would abort the
/// process.
pub(crate) fn zeroed(len: usize) -> Result<Vec<u8>> {
    if len == 0 {
        return Ok(Vec::new());
    }
    let refused = || {
        Error::Io(std::io::Error::new(
            std::io::ErrorKind::OutOfMemory,
            format!("could not allocate {len} bytes for a collective's buffer"),
        ))
    };
    let layout = std::alloc::Layout::array::<u8>(len).map_err(|_| refused())?;
    // SAFETY: `layout` has a non-zero size; a null result is handled below.
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
    if ptr.is_null() {
        return Err(refused());
    }
    // SAFETY: `ptr` was allocated by the global allocator with the layout of `len` bytes
    // (alignment 1), which is what a `Vec<u8>` of capacity `len` frees with; all `len` bytes
    // are initialized (zero).
    Ok(unsafe { Vec::from_raw_parts(ptr, len, len) })
}

/// An output allocator for collectives whose result size depends on other ranks: makes `out`
/// the rows received times `row` bytes long (see [`output_buffer`]). The size is checked
/// arithmetic (the coordinator already bounded it by [`collectives::MAX_TENSOR_BYTES`]).
fn grow<'a>(out: &'a mut Vec<u8>, row: usize) -> impl FnOnce(&[u64]) -> Result<&'a mut [u8]> {
    move |rows| {
        let len = rows
            .iter()
            .try_fold(0usize, |acc, &r| {
                acc.checked_add(usize::try_from(r).ok()?.checked_mul(row)?)
            })
            .ok_or_else(|| {
                Error::InvalidArgument(format!("rows {rows:?} of {row} bytes do not fit in memory"))
            })?;
        *out = output_buffer(len)?;
        Ok(&mut out[..])
    }
}

/// A change to the set of process sets, agreed on the global set.
#[derive(Debug, PartialEq)]
pub(crate) enum SetAction {
    /// Register a set with these members; complete `handle` (if this rank submitted it) with
    /// the new id.
    Add {
        members: Vec<usize>,
        handle: Option<u64>,
        /// The id asked for (used when not below the next free id).
        wanted: u32,
    },
    /// Remove set `id`; complete `handle` (if this rank submitted it) once it is gone.
    Remove { id: u32, handle: Option<u64> },
}

/// What executing needs besides the session.
pub(crate) struct Executor<'e> {
    pub handles: &'e Handles,
    pub stats: &'e Stats,
    pub timeline: &'e Timeline,
    pub fusion: &'e mut AlignedBuf,
    pub fusion_threshold: usize,
    /// `KOLO_STALL_SHUTDOWN_TIME_SECONDS`, for the error of stalled tensors.
    pub stall_shutdown: std::time::Duration,
}

/// Bytes of the tensor `desc` describes (0 if it does not fit).
pub(crate) fn tensor_bytes(desc: &OpDescriptor) -> usize {
    let elements = desc
        .shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(usize::try_from(d).ok()?));
    elements
        .and_then(|n| n.checked_mul(desc.dtype.size()))
        .unwrap_or(0)
}

/// Groups the responses into batches run as one collective: allreduces with the same dtype,
/// op, scale factors and place (host or device) are fused up to `threshold(on_device)` bytes
/// (0: no fusion); everything else runs alone. Returns indices into `responses`, batches in
/// first-appearance order.
pub(crate) fn plan_batches(
    responses: &[Response],
    threshold: impl Fn(bool) -> usize,
) -> Vec<Vec<usize>> {
    type Key = (DType, Option<crate::dtype::ReduceOp>, u64, u64, bool);
    let mut batches: Vec<(Vec<usize>, usize)> = Vec::new();
    let mut open: HashMap<Key, usize> = HashMap::new();
    for (i, response) in responses.iter().enumerate() {
        let fusible = match response {
            Response::Run { descs, .. } if descs[0].kind == OpKind::Allreduce => {
                let d = &descs[0];
                let bytes = tensor_bytes(d);
                let limit = threshold(d.device);
                (limit > 0 && bytes <= limit).then(|| {
                    let key = (
                        d.dtype,
                        d.op,
                        d.prescale.to_bits(),
                        d.postscale.to_bits(),
                        d.device,
                    );
                    (key, bytes, limit)
                })
            }
            _ => None,
        };
        let Some((key, bytes, limit)) = fusible else {
            batches.push((vec![i], 0));
            continue;
        };
        match open.get(&key) {
            Some(&b) if batches[b].1 + bytes <= limit => {
                batches[b].0.push(i);
                batches[b].1 += bytes;
            }
            _ => {
                open.insert(key, batches.len());
                batches.push((vec![i], bytes));
            }
        }
    }
    batches.into_iter().map(|(b, _)| b).collect()
}

impl Executor<'_> {
    /// Runs `responses` (this cycle's, for the set `session` now acts for) and completes the
    /// handles in `pending`. Returns the process-set changes to apply. An error is fatal: the
    /// data plane failed.
    pub(crate) fn run(
        &mut self,
        session: &mut Session,
        responses: Vec<Response>,
        pending: &mut HashMap<String, Local>,
        join: &mut Option<u64>,
    ) -> Result<Vec<SetAction>> {
        let mut actions = Vec::new();
        let batches = plan_batches(&responses, |_| self.fusion_threshold);
        let mut slots: Vec<Option<Response>> = responses.into_iter().map(Some).collect();
        for batch in batches {
            let items: Vec<Response> = batch.iter().filter_map(|&i| slots[i].take()).collect();
            if matches!(items.first(), Some(Response::Run { descs, .. }) if descs[0].device) {
                self.device_batch(session, items, pending)?;
                continue;
            }
            if items.len() > 1 {
                self.fused_allreduce(session, items, pending)?;
                continue;
            }
            let Some(item) = items.into_iter().next() else {
                continue;
            };
            match item {
                Response::Run { descs, cached } => {
                    let name = descs[0].name.clone();
                    let local = pending.remove(&name);
                    self.count(local.is_some(), cached);
                    if let Some(action) = self.run_one(session, descs, local)? {
                        actions.push(action);
                    }
                }
                Response::Fail { name, message } => {
                    self.count(pending.contains_key(&name), false);
                    if let Some(local) = pending.remove(&name) {
                        self.timeline_end(&local.sub.name);
                        self.handles
                            .complete(local.handle, Err(Error::Mismatch(message)));
                    }
                }
                Response::Stalled { name, message } => {
                    if let Some(local) = pending.remove(&name) {
                        self.timeline_end(&local.sub.name);
                        let error = Error::Timeout {
                            what: message,
                            after: self.stall_shutdown,
                        };
                        self.handles.complete(local.handle, Err(error));
                    }
                }
                Response::Join { last } => {
                    if let Some(handle) = join.take() {
                        self.handles.complete(handle, Ok(Output::LastJoined(last)));
                    }
                }
            }
        }
        Ok(actions)
    }

    fn count(&self, local: bool, cached: bool) {
        if local {
            self.stats.negotiated(cached);
        }
    }

    fn timeline_end(&self, name: &str) {
        if self.timeline.is_on() {
            self.timeline.negotiate_end(name);
        }
    }

    /// Runs one agreed collective. A joined rank (no `local`) takes part with a stand-in.
    fn run_one(
        &mut self,
        session: &mut Session,
        descs: Vec<Arc<OpDescriptor>>,
        local: Option<Local>,
    ) -> Result<Option<SetAction>> {
        let me = session.rank;
        // One descriptor may stand for every member (see `Response::Run`): it is handed to the
        // collective as it is, not copied per member.
        let desc = match &descs[..] {
            [one] => Arc::clone(one),
            each => each.get(me).cloned().ok_or_else(|| {
                Error::Internal(format!(
                    "{} agreed descriptors for a set of {}",
                    each.len(),
                    session.size
                ))
            })?,
        };
        let kind = desc.kind;
        let name = desc.name.clone();
        let on = self.timeline.is_on() && local.is_some();
        if on {
            self.timeline.negotiate_end(&name);
            self.timeline.start_op(&name, kind);
            self.timeline
                .activity_start(&name, format!("TCP_{}", kind.name().to_uppercase()));
        }
        let handle = local.as_ref().map(|l| l.handle);
        let moves_data = !matches!(
            kind,
            OpKind::Barrier | OpKind::AddProcessSet | OpKind::RemoveProcessSet
        );
        if moves_data && session.size > 1 {
            session.set_agreed(descs.into_iter().map(Arc::unwrap_or_clone).collect());
        }
        let mut action = None;
        let result = match kind {
            OpKind::Allreduce => {
                let reduction = reduction_of(&desc);
                let mut stand_in: Vec<u8>;
                let buf = match &local {
                    Some(l) => l.bytes(),
                    None => match zeroed(tensor_bytes(&desc)) {
                        Ok(zeros) => {
                            stand_in = zeros;
                            reduce::fill_identity(desc.dtype, reduction.op, &mut stand_in);
                            &mut stand_in[..]
                        }
                        Err(e) => return Err(session.abandon_agreed(&name, e)),
                    },
                };
                collectives::allreduce(session, &name, buf, &desc.shape, desc.dtype, reduction)
                    .map(|()| Output::Done)
            }
            OpKind::Broadcast => {
                let mut stand_in: Vec<u8>;
                let buf = match &local {
                    Some(l) => l.bytes(),
                    None => match zeroed(tensor_bytes(&desc)) {
                        Ok(zeros) => {
                            stand_in = zeros;
                            &mut stand_in[..]
                        }
                        Err(e) => return Err(session.abandon_agreed(&name, e)),
                    },
                };
                collectives::broadcast(
                    session,
                    &name,
                    buf,
                    &desc.shape,
                    desc.dtype,
                    desc.root as usize,
                )
                .map(|()| Output::Done)
            }
            OpKind::Allgather => {
                let input = input(&local);
                let row = row_bytes(&desc.shape, desc.dtype).map_err(Error::InvalidArgument)?;
                let mut data = Vec::new();
                collectives::allgather(
                    session,
                    &name,
                    input,
                    &desc.shape,
                    desc.dtype,
                    grow(&mut data, row),
                )
                .map(|rows| Output::Tensor { data, rows })
            }
            OpKind::Alltoall => {
                let input = input(&local);
                let row = row_bytes(&desc.shape, desc.dtype).map_err(Error::InvalidArgument)?;
                let mut data = Vec::new();
                collectives::alltoall(
                    session,
                    &name,
                    input,
                    &desc.shape,
                    desc.dtype,
                    &desc.splits,
                    grow(&mut data, row),
                )
                .map(|rows| Output::Tensor { data, rows })
            }
            OpKind::Reducescatter => {
                let input = input(&local);
                let row = row_bytes(&desc.shape, desc.dtype).map_err(Error::InvalidArgument)?;
                let first = desc
                    .shape
                    .first()
                    .map_or(0, |&r| u64::try_from(r).unwrap_or(0));
                let rows = reducescatter_rows(first, session.size);
                let len = usize::try_from(rows[me])
                    .ok()
                    .and_then(|r| r.checked_mul(row))
                    .ok_or_else(|| {
                        Error::InvalidArgument(format!("{} rows of {row} bytes", rows[me]))
                    });
                let mut data = match len.and_then(output_buffer) {
                    Ok(data) => data,
                    Err(e) => return Err(session.abandon_agreed(&name, e)),
                };
                collectives::reducescatter(
                    session,
                    &name,
                    input,
                    &mut data,
                    &desc.shape,
                    desc.dtype,
                    reduction_of(&desc),
                )
                .map(|()| Output::Tensor { data, rows })
            }
            OpKind::Barrier => Ok(Output::Done),
            OpKind::AddProcessSet => {
                action = Some(SetAction::Add {
                    members: desc.splits.iter().map(|&m| m as usize).collect(),
                    handle,
                    wanted: desc.root,
                });
                Ok(Output::Done)
            }
            OpKind::RemoveProcessSet => {
                action = Some(SetAction::Remove {
                    id: desc.root,
                    handle,
                });
                Ok(Output::Done)
            }
        };
        if on {
            self.timeline.activity_end(&name);
            self.timeline.end_op(&name);
        }
        if moves_data {
            // Adasum always runs over the TCP mesh.
            let on_shm = desc.op != Some(crate::dtype::ReduceOp::Adasum);
            self.stats.ran(1, on_shm && session.shm_layout().is_some());
        }
        match result {
            Ok(output) => {
                // add/remove_process_set complete once the engine applied them (after the
                // cycle): completing a removal earlier let its caller's next
                // add_process_set of the same ranks see the old set on this rank only, fail
                // here and leave the other ranks waiting for it.
                if let (Some(handle), None) = (handle, &action) {
                    self.handles.complete(handle, Ok(output));
                }
                Ok(action)
            }
            Err(error) => {
                if let Some(handle) = handle {
                    self.handles.complete(handle, Err(error.replicate()));
                }
                Err(error)
            }
        }
    }

    /// Runs an agreed batch of CUDA ops (a fused allreduce or a broadcast) through NCCL
    /// (`super::device`). An error is fatal, as for the CPU transports.
    fn device_batch(
        &mut self,
        session: &mut Session,
        items: Vec<Response>,
        pending: &mut HashMap<String, Local>,
    ) -> Result<()> {
        let mut parts = Vec::with_capacity(items.len());
        for item in items {
            if let Response::Run { descs, cached } = item {
                let desc = Arc::unwrap_or_clone(own_descriptor(descs, session.rank));
                let local = pending.remove(&desc.name);
                self.count(local.is_some(), cached);
                if local.is_some() {
                    self.timeline_end(&desc.name);
                }
                let local = local.map(|l| (l.handle, l.sub));
                parts.push(DevicePart { desc, local });
            }
        }
        let ran = parts.len();
        let done = run_device_batch(session, parts)?;
        self.stats.ran(ran, false);
        for (handle, outcome) in done {
            self.handles.complete(handle, outcome);
        }
        Ok(())
    }

    /// Runs several allreduces as one through the fusion buffer.
    fn fused_allreduce(
        &mut self,
        session: &mut Session,
        items: Vec<Response>,
        pending: &mut HashMap<String, Local>,
    ) -> Result<()> {
        let mut parts: Vec<(Arc<OpDescriptor>, Option<Local>, usize)> =
            Vec::with_capacity(items.len());
        let mut total = 0usize;
        for item in items {
            if let Response::Run { descs, cached } = item {
                let desc = own_descriptor(descs, session.rank);
                let local = pending.remove(&desc.name);
                self.count(local.is_some(), cached);
                let bytes = tensor_bytes(&desc);
                parts.push((desc, local, total));
                // Bounded by the fusion threshold (`plan_batches`); checked all the same.
                total = total
                    .checked_add(bytes)
                    .ok_or_else(|| Error::Internal("a fused batch larger than memory".into()))?;
            }
        }
        let Some((first, _, _)) = parts.first() else {
            return Ok(());
        };
        let (dtype, reduction) = (first.dtype, reduction_of(first));
        let name = format!("fused.{}.{}", first.name, parts.len());
        if collectives::allreduce::scattered_fits(session, reduction.op) {
            return self.fused_in_place(session, parts, &name, dtype, reduction);
        }
        let on = self.timeline.is_on();
        let buf = self.fusion.get(total);
        for (desc, local, at) in &parts {
            let dst = &mut buf[*at..*at + tensor_bytes(desc)];
            match local {
                Some(l) => {
                    if on {
                        self.timeline.negotiate_end(&desc.name);
                        self.timeline.start_op(&desc.name, OpKind::Allreduce);
                        self.timeline
                            .activity_start(&desc.name, "MEMCPY_IN_FUSION_BUFFER");
                    }
                    dst.copy_from_slice(l.bytes());
                    if on {
                        self.timeline.activity_end(&desc.name);
                        self.timeline.activity_start(&desc.name, "TCP_ALLREDUCE");
                    }
                }
                None => reduce::fill_identity(dtype, reduction.op, dst),
            }
        }
        let elements = (total / dtype.size()) as i64;
        let fused = OpDescriptor {
            dtype,
            shape: vec![elements],
            op: Some(reduction.op),
            prescale: reduction.prescale,
            postscale: reduction.postscale,
            ..OpDescriptor::new(OpKind::Allreduce, &name)
        };
        if session.size > 1 {
            session.set_agreed(vec![fused; session.size]);
        }
        let counts: Vec<usize> = parts
            .iter()
            .map(|(desc, _, _)| tensor_bytes(desc) / dtype.size())
            .collect();
        let result = collectives::allreduce_tensors(
            session,
            &name,
            buf,
            &[elements],
            dtype,
            reduction,
            &counts,
        );
        let on_shm = reduction.op != crate::dtype::ReduceOp::Adasum;
        self.stats
            .ran(parts.len(), on_shm && session.shm_layout().is_some());
        for (desc, local, at) in parts {
            let Some(local) = local else { continue };
            let outcome = match &result {
                Ok(()) => {
                    if on {
                        self.timeline.activity_end(&desc.name);
                        self.timeline
                            .activity_start(&desc.name, "MEMCPY_OUT_FUSION_BUFFER");
                    }
                    let src = &buf[at..at + tensor_bytes(&desc)];
                    local.bytes().copy_from_slice(src);
                    if on {
                        self.timeline.activity_end(&desc.name);
                        self.timeline.end_op(&desc.name);
                    }
                    Ok(Output::Done)
                }
                Err(e) => Err(e.replicate()),
            };
            self.handles.complete(local.handle, outcome);
        }
        self.fusion.trim(self.fusion_threshold.max(64 << 20));
        result
    }
}

impl Executor<'_> {
    /// A fused batch on shared memory: the tensors themselves are the fusion buffer. They are
    /// read straight into the shared halves and the results written straight back
    /// ([`collectives::allreduce_scattered`]), so fusing costs no copy (a joined rank reduces
    /// stand-ins holding the op's identity). The collective runs under the fused name and
    /// descriptor every rank's engine derives from the same agreed batch, as the packed path.
    fn fused_in_place(
        &mut self,
        session: &mut Session,
        parts: Vec<(Arc<OpDescriptor>, Option<Local>, usize)>,
        name: &str,
        dtype: DType,
        reduction: Reduction,
    ) -> Result<()> {
        let on = self.timeline.is_on();
        let mut stand_ins: Vec<Vec<u8>> = Vec::new();
        for (desc, local, _) in &parts {
            if local.is_none() {
                let mut zeros = match zeroed(tensor_bytes(desc)) {
                    Ok(zeros) => zeros,
                    Err(e) => return Err(self.fail_batch(session, name, &parts, e)),
                };
                reduce::fill_identity(dtype, reduction.op, &mut zeros);
                stand_ins.push(zeros);
            }
        }
        let mut spare = stand_ins.iter_mut();
        let mut views: Vec<&mut [u8]> = Vec::with_capacity(parts.len());
        for (desc, local, _) in &parts {
            match local {
                Some(l) => {
                    if on {
                        self.timeline.negotiate_end(&desc.name);
                        self.timeline.start_op(&desc.name, OpKind::Allreduce);
                        self.timeline
                            .activity_start(&desc.name, "SHM_FUSED_ALLREDUCE");
                    }
                    views.push(l.bytes());
                }
                None => {
                    if let Some(zeros) = spare.next() {
                        views.push(&mut zeros[..]);
                    }
                }
            }
        }
        let mut batch = match collectives::scattered::Scattered::new(views) {
            Ok(batch) => batch,
            Err(e) => return Err(self.fail_batch(session, name, &parts, e)),
        };
        let fused = OpDescriptor {
            dtype,
            shape: vec![(batch.len() / dtype.size()) as i64],
            op: Some(reduction.op),
            prescale: reduction.prescale,
            postscale: reduction.postscale,
            ..OpDescriptor::new(OpKind::Allreduce, name)
        };
        session.set_agreed(vec![fused; session.size]);
        let result = collectives::allreduce_scattered(
            session,
            name,
            &mut batch,
            dtype,
            reduction,
            self.fusion,
        );
        drop(batch);
        self.stats.ran(parts.len(), true);
        for (desc, local, _) in parts {
            let Some(local) = local else { continue };
            if on {
                self.timeline.activity_end(&desc.name);
                self.timeline.end_op(&desc.name);
            }
            let outcome = match &result {
                Ok(()) => Ok(Output::Done),
                Err(e) => Err(e.replicate()),
            };
            self.handles.complete(local.handle, outcome);
        }
        self.fusion.trim(self.fusion_threshold.max(64 << 20));
        result
    }

    /// Gives up on a fused batch this rank cannot start (a stand-in could not be allocated):
    /// the peers are told (the mesh breaks), every local handle of the batch fails with
    /// `error`, which is returned.
    fn fail_batch(
        &self,
        session: &mut Session,
        name: &str,
        parts: &[(Arc<OpDescriptor>, Option<Local>, usize)],
        error: Error,
    ) -> Error {
        let error = session.abandon_agreed(name, error);
        for (_, local, _) in parts {
            if let Some(local) = local {
                self.handles.complete(local.handle, Err(error.replicate()));
            }
        }
        error
    }
}

fn reduction_of(desc: &OpDescriptor) -> Reduction {
    Reduction {
        op: desc.op.unwrap_or(crate::dtype::ReduceOp::Sum),
        prescale: desc.prescale,
        postscale: desc.postscale,
    }
}

/// This member's (group rank `rank`) descriptor of an agreed collective.
fn own_descriptor(mut descs: Vec<Arc<OpDescriptor>>, rank: usize) -> Arc<OpDescriptor> {
    if descs.len() == 1 {
        return descs.swap_remove(0);
    }
    descs.swap_remove(rank)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::ReduceOp;

    fn run(name: &str, dtype: DType, len: i64, op: ReduceOp) -> Response {
        Response::Run {
            descs: vec![Arc::new(OpDescriptor {
                dtype,
                shape: vec![len],
                op: Some(op),
                ..OpDescriptor::new(OpKind::Allreduce, name)
            })],
            cached: false,
        }
    }

    #[test]
    fn output_buffers_are_reused_once_recycled() {
        // An odd size no other test asks for, so a test running alongside does not take it.
        let len = (3 << 20) + 8 * 7919;
        let mut first = output_buffer(len).unwrap();
        assert_eq!(first.len(), len);
        first.fill(7);
        let at = first.as_ptr();
        recycle_output(first);
        let again = output_buffer(len - 8).unwrap();
        assert_eq!(again.len(), len - 8);
        assert_eq!(
            again.as_ptr(),
            at,
            "a recycled buffer is taken before a fresh one"
        );
        // Tiny outputs are not kept, and a buffer far larger than asked for is not taken.
        recycle_output(again);
        let small = output_buffer(len / 4).unwrap();
        assert_ne!(small.as_ptr(), at);
        assert_eq!(output_buffer(100).unwrap(), vec![0u8; 100]);
    }

    #[test]
    fn an_allocation_the_allocator_refuses_is_an_error_not_an_abort() {
        assert!(zeroed(0).unwrap().is_empty());
        assert_eq!(zeroed(3).unwrap(), vec![0, 0, 0]);
        for len in [usize::MAX, isize::MAX as usize, 1 << 62] {
            assert!(
                matches!(zeroed(len), Err(Error::Io(e)) if e.kind() == std::io::ErrorKind::OutOfMemory),
                "{len}"
            );
        }
        let mut out = Vec::new();
        assert!(grow(&mut out, 8)(&[u64::MAX, 1]).is_err());
        assert!(grow(&mut out, 1 << 40)(&[1 << 30]).is_err());
        assert_eq!(grow(&mut out, 4)(&[1, 2]).unwrap().len(), 12);
    }

    #[test]
    fn fuses_compatible_allreduces_up_to_the_threshold() {
        let responses = vec![
            run("a", DType::F32, 10, ReduceOp::Sum),
            run("b", DType::F64, 10, ReduceOp::Sum),
            run("c", DType::F32, 10, ReduceOp::Sum),
            run("d", DType::F32, 10, ReduceOp::Average),
            run("e", DType::F32, 10, ReduceOp::Sum),
            Response::Join { last: 0 },
            run("big", DType::F32, 1000, ReduceOp::Sum),
        ];
        assert_eq!(
            plan_batches(&responses, |_| 80),
            vec![vec![0, 2], vec![1], vec![3], vec![4], vec![5], vec![6]]
        );
        assert_eq!(plan_batches(&responses, |_| 0).len(), responses.len());
        // CUDA and CPU tensors of one dtype and op never fuse together.
        let mut on_device = run("gpu", DType::F32, 10, ReduceOp::Sum);
        if let Response::Run { descs, .. } = &mut on_device {
            Arc::make_mut(&mut descs[0]).device = true;
        }
        let mixed = vec![run("cpu", DType::F32, 10, ReduceOp::Sum), on_device];
        assert_eq!(plan_batches(&mixed, |_| 1 << 20), vec![vec![0], vec![1]]);
        assert_eq!(plan_batches(&responses, |_| 1 << 20)[0], vec![0, 2, 4, 6]);
    }
}

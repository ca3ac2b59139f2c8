//! allreduce, allgather, broadcast, alltoall, reducescatter and barrier on CPU memory.
//!
//! Every collective starts with a *negotiation*: each rank sends every other rank a compact
//! [`OpDescriptor`] (collective, name, dtype, shape, op, root, scale factors, alltoall splits)
//! and checks that all ranks agree. If they do not, every rank fails with the same
//! [`Error::Mismatch`] naming the ranks and what differs, before any tensor bytes move, so the
//! communicator stays usable. A rank whose own arguments are invalid still takes part (its
//! descriptor carries the error): it reports [`Error::InvalidArgument`], the others a mismatch.
//!
//! The data then moves over the [`Mesh`]:
//!
//! - allreduce: recursive doubling for small messages ([`tree`]), ring reduce-scatter then
//!   ring allgather, pipelined chunk by chunk, for large ones ([`algorithm`] chooses); Adasum by
//!   Horovod's vector-halving distance-doubling pairwise exchanges ([`adasum`]);
//! - reducescatter: the ring reduce-scatter alone, with Horovod's uneven row split
//!   ([`reducescatter_rows`]);
//! - allgather: recursive doubling for small results, else a ring, with one block per rank
//!   (sizes may differ, even be zero);
//! - broadcast: a binomial tree for small messages, else a pipelined chain from the root;
//! - alltoall: pairwise exchange (step k: send to rank + k, receive from rank - k);
//! - barrier: the negotiation alone.
//!
//! When the mesh has a shared-memory plane and the collective runs on the whole job, the data
//! (and, on one host, the negotiation) goes through it instead: [`shm`] on one host,
//! [`hier`] across hosts.

mod adasum;
pub mod algorithm;
pub(crate) mod allgather;
pub(crate) mod allreduce;
pub(crate) mod alltoall;
mod broadcast;
pub(crate) mod hier;
mod reducescatter;
pub(crate) mod scattered;
pub(crate) mod shm;
pub(crate) mod tree;

pub(crate) use adasum::size_refusal as adasum_size_refusal;
pub use algorithm::{Algorithm, AlgorithmChoices};
pub(crate) use allgather::allgather;
pub(crate) use allreduce::{allreduce, allreduce_scattered, allreduce_tensors};
pub(crate) use alltoall::alltoall;
pub(crate) use broadcast::broadcast;
pub(crate) use reducescatter::reducescatter;

use std::ops::Range;
use std::sync::Arc;

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::transport::shm::ShmNode;
use crate::transport::{Failure, Layout, Mesh, RecvBlock, SendBlock};
use crate::wire::{OpDescriptor, OpKind, MAX_DIMS, MAX_NAME_LEN};

/// The most bytes a collective's tensor, or its result on one rank, may take: 1 TiB, far
/// beyond what a host holds. A larger size can only come from a broken or hostile peer; every
/// rank refuses it (see [`check_sizes`]) before anything is allocated.
pub const MAX_TENSOR_BYTES: usize = 1 << 40;

/// Rows of a `rows`-row tensor that each of `size` ranks receives from a reducescatter
/// (Horovod's split: `rows / size` each, plus one for the first `rows % size` ranks).
pub fn reducescatter_rows(rows: u64, size: usize) -> Vec<u64> {
    let size = size.max(1) as u64;
    (0..size)
        .map(|r| rows / size + u64::from(r < rows % size))
        .collect()
}

/// Returns once every rank reached the barrier: the negotiation alone.
pub(crate) fn barrier(session: &mut Session) -> Result<()> {
    session
        .negotiate(OpDescriptor::new(OpKind::Barrier, ""))
        .map(|_| ())
}

/// Bytes of the work buffer kept between collectives (recursive doubling's partner copy).
const KEEP_PARTNER_COPY: usize = 4 << 20;

/// A buffer with 8-byte alignment, reused across collectives.
#[derive(Debug, Default)]
pub(crate) struct AlignedBuf(Vec<u64>);

impl AlignedBuf {
    /// The first `len` bytes, growing the buffer if needed.
    pub(crate) fn get(&mut self, len: usize) -> &mut [u8] {
        let words = len.div_ceil(8);
        if self.0.len() < words {
            self.0.resize(words, 0);
        }
        &mut bytemuck::cast_slice_mut::<u64, u8>(&mut self.0)[..len]
    }

    /// Gives memory back when the buffer grew beyond `keep` bytes.
    pub(crate) fn trim(&mut self, keep: usize) {
        if self.0.len() * 8 > keep {
            self.0 = Vec::new();
        }
    }
}

/// One rank's view of a group of ranks for running collectives: the mesh (none for a single
/// rank), this rank's position in the group, the group's members (global ranks), the
/// collective sequence number, and reusable buffers. The engine runs process sets by swapping
/// in a [`Group`] with [`Session::with_group`].
#[derive(Debug)]
pub(crate) struct Session {
    pub(crate) mesh: Option<Mesh>,
    /// This rank's position in `members`.
    pub(crate) rank: usize,
    /// The number of members.
    pub(crate) size: usize,
    /// Global rank of each group rank.
    pub(crate) members: Vec<usize>,
    seq: u64,
    /// The acting group's own shared-memory node, if it has one.
    node: GroupNode,
    /// Every member's descriptor for the next collective, agreed beforehand (by the engine):
    /// the next negotiation uses them instead of exchanging descriptors.
    agreed: Option<Vec<OpDescriptor>>,
    scratch: AlignedBuf,
    work: AlignedBuf,
    /// The forced TCP algorithms ([`algorithm`]'s variables, read when the session starts),
    /// or why the variables are invalid (every collective then refuses to run).
    algorithms: Result<AlgorithmChoices, String>,
    /// How many times each TCP algorithm ran.
    pub(crate) runs: algorithm::AlgorithmRuns,
}

/// A process set's part of a [`Session`]: id, members, this rank's position, sequence
/// number, and its own shared-memory node.
#[derive(Debug, Clone)]
pub(crate) struct Group {
    id: u32,
    pub(crate) rank: usize,
    pub(crate) members: Vec<usize>,
    seq: u64,
    node: GroupNode,
}

/// Whether a group runs on a shared-memory node of its own: a process set that is a subset
/// of one host's ranks does, set up at its first use; the whole job uses the mesh's plane.
#[derive(Debug, Clone, Default)]
enum GroupNode {
    /// Not set up yet.
    #[default]
    Unknown,
    /// The mesh decides: its plane for the whole job, TCP for anything else.
    Mesh,
    Own(Arc<ShmNode>),
}

impl Group {
    /// Process set `id`'s group of `members` (global ranks, in group-rank order) seen from
    /// global rank `me`; `None` when `me` is not a member.
    pub(crate) fn new(id: u32, members: Vec<usize>, me: usize) -> Option<Self> {
        let rank = members.iter().position(|&m| m == me)?;
        Some(Group {
            id,
            rank,
            members,
            seq: 0,
            node: GroupNode::Unknown,
        })
    }
}

impl Session {
    pub(crate) fn new(mesh: Option<Mesh>, rank: usize, size: usize) -> Self {
        Session {
            mesh,
            rank,
            size,
            members: (0..size).collect(),
            seq: 0,
            node: GroupNode::Mesh,
            agreed: None,
            scratch: AlignedBuf::default(),
            work: AlignedBuf::default(),
            algorithms: AlgorithmChoices::from_env(),
            runs: algorithm::AlgorithmRuns::default(),
        }
    }

    /// Forces (or frees, with `None`) the TCP algorithms of this session, replacing what the
    /// variables said. Every rank must choose alike.
    pub(crate) fn set_algorithms(&mut self, choices: AlgorithmChoices) {
        self.algorithms = Ok(choices);
    }

    /// The TCP algorithm `kind` runs for `bytes` on this session, or why the variables
    /// forcing one are invalid.
    pub(crate) fn algorithm(&self, kind: OpKind, bytes: usize) -> Result<Algorithm, String> {
        let choices = self.algorithms.as_ref().map_err(Clone::clone)?;
        Ok(algorithm::select(kind, bytes, self.size, choices))
    }

    /// The TCP algorithm `kind` runs for `bytes` among `members` ranks (the hierarchical
    /// path's host leaders); `auto` when the variables are invalid (the collective's
    /// negotiation refused them already).
    pub(crate) fn algorithm_among(&self, kind: OpKind, bytes: usize, members: usize) -> Algorithm {
        let auto = AlgorithmChoices::default();
        let choices = self.algorithms.as_ref().unwrap_or(&auto);
        algorithm::select(kind, bytes, members, choices)
    }

    /// Runs `f` with the TCP ring over all of this session's members after counting a run
    /// of `algorithm` for `kind`; `f` gets the mesh, the scratch and the work buffer.
    pub(crate) fn run_algorithm<R>(
        &mut self,
        kind: OpKind,
        algorithm: Algorithm,
        tag: u32,
        what: &str,
        f: impl FnOnce(&allreduce::Ring<'_>, &mut Mesh, &mut AlignedBuf, &mut AlignedBuf) -> Result<R>,
    ) -> Result<R> {
        self.runs.count(kind, algorithm);
        let ring = allreduce::Ring {
            members: &self.members,
            rank: self.rank,
            tag,
            what,
        };
        let mesh = self.mesh.as_mut().ok_or_else(allreduce::no_mesh)?;
        let out = f(&ring, mesh, &mut self.scratch, &mut self.work);
        self.work.trim(KEEP_PARTNER_COPY);
        out
    }

    /// The global rank of group rank `r`.
    pub(crate) fn peer(&self, r: usize) -> usize {
        self.members[r]
    }

    /// Runs `f` with this session acting for `group` (its members, rank, sequence number and
    /// shared-memory node; at the group's first use, every member sets that node up here).
    pub(crate) fn with_group<T>(
        &mut self,
        group: &mut Group,
        f: impl FnOnce(&mut Self) -> Result<T>,
    ) -> Result<T> {
        let saved_rank = std::mem::replace(&mut self.rank, group.rank);
        let saved_size = std::mem::replace(&mut self.size, group.members.len());
        std::mem::swap(&mut self.members, &mut group.members);
        std::mem::swap(&mut self.seq, &mut group.seq);
        std::mem::swap(&mut self.node, &mut group.node);
        let out = self.set_up_node(group.id).and_then(|()| f(self));
        std::mem::swap(&mut self.node, &mut group.node);
        std::mem::swap(&mut self.seq, &mut group.seq);
        std::mem::swap(&mut self.members, &mut group.members);
        self.rank = saved_rank;
        self.size = saved_size;
        self.agreed = None;
        out
    }

    /// Gives the acting group of process set `set` its own shared-memory node if it is a
    /// subset of this host's ranks (every member does this at the group's first use).
    fn set_up_node(&mut self, set: u32) -> Result<()> {
        if !matches!(self.node, GroupNode::Unknown) {
            return Ok(());
        }
        self.node = GroupNode::Mesh;
        let whole = self.mesh.as_ref().is_none_or(|mesh| {
            self.members.len() == mesh.size()
                && self.members.iter().enumerate().all(|(i, &m)| i == m)
        });
        if whole {
            return Ok(());
        }
        let tags = [self.next_tag(), self.next_tag(), self.next_tag()];
        let (members, me) = (self.members.clone(), self.rank);
        if let Some(node) = self.mesh()?.setup_set_shm(set, &members, me, tags)? {
            self.node = GroupNode::Own(node);
        }
        Ok(())
    }

    /// Makes the next collective skip its descriptor exchange: `descs` (one per member, or one
    /// that stands for every member) were agreed by the engine.
    pub(crate) fn set_agreed(&mut self, descs: Vec<OpDescriptor>) {
        self.agreed = Some(descs);
    }

    /// The tag of the next message round.
    pub(crate) fn next_tag(&mut self) -> u32 {
        let tag = self.seq as u32;
        self.seq += 1;
        tag
    }

    /// Sends `payload` to every other member and receives one payload of at most `max_len`
    /// bytes from each; returns them indexed by group rank (this rank's own included).
    pub(crate) fn exchange(
        &mut self,
        what: &str,
        tag: u32,
        payload: &[u8],
        max_len: usize,
    ) -> Result<Vec<Vec<u8>>> {
        if self.size == 1 {
            return Ok(vec![payload.to_vec()]);
        }
        let me = self.rank;
        let peers: Vec<usize> = self
            .members
            .iter()
            .enumerate()
            .filter(|(r, _)| *r != me)
            .map(|(_, &g)| g)
            .collect();
        if let Some(Layout::Flat) = self.shm_layout() {
            return self.on_node(what, |node| node.exchange(payload, max_len));
        }
        let mut out = self.mesh()?.exchange(what, tag, payload, max_len, &peers)?;
        out.insert(me, payload.to_vec());
        Ok(out)
    }

    /// How this collective uses shared memory: the mesh's layout when the session acts for
    /// the whole job (every rank, in rank order); `None` for TCP.
    pub(crate) fn shm_layout(&self) -> Option<Layout> {
        if let GroupNode::Own(_) = self.node {
            return Some(Layout::Flat);
        }
        let mesh = self.mesh.as_ref()?;
        let plane = mesh.shm()?;
        let whole = self.members.len() == mesh.size()
            && self.members.iter().enumerate().all(|(i, &m)| i == m);
        whole.then(|| plane.layout.clone())
    }

    /// Runs `f` on this host's shared-memory node; a failure makes the mesh unusable and is
    /// reported as an error naming `what`.
    pub(crate) fn on_node<T>(
        &mut self,
        what: &str,
        f: impl FnOnce(&shm::Node<'_>) -> Result<T, Failure>,
    ) -> Result<T> {
        let own = match &self.node {
            GroupNode::Own(node) => Some(Arc::clone(node)),
            _ => None,
        };
        let mesh = self.mesh()?;
        let node = own.or_else(|| mesh.shm().map(|plane| Arc::clone(&plane.node)));
        let result = match node {
            Some(node) => {
                let members = node.members();
                let alive = |j: usize| mesh.peer_alive(members[j]);
                f(&shm::Node {
                    alive: &alive,
                    node: &node,
                })
            }
            None => Err(Failure::Other(Error::Internal(
                "a shared-memory collective ran without a shared-memory plane".into(),
            ))),
        };
        result.map_err(|failure| mesh.fail(failure, what))
    }

    fn mesh(&mut self) -> Result<&mut Mesh> {
        self.mesh.as_mut().ok_or_else(|| {
            Error::Internal(format!(
                "no data-plane mesh for a job of {} ranks",
                self.size
            ))
        })
    }

    /// Runs the negotiation for `desc`: on success every rank's descriptor, indexed by rank,
    /// and the tag of this collective's data frames.
    fn negotiate(&mut self, desc: OpDescriptor) -> Result<(Vec<OpDescriptor>, u32)> {
        let size = self.size;
        let (descs, tag) = self.negotiate_shared(desc)?;
        let descs = match <[OpDescriptor; 1]>::try_from(descs) {
            Ok([one]) => vec![one; size],
            Err(descs) => descs,
        };
        Ok((descs, tag))
    }

    /// [`Session::negotiate`] for a collective that needs only the tag (every member's
    /// descriptor was checked alike during the negotiation): an agreed descriptor standing
    /// for every member is not copied per member.
    fn negotiate_tag(&mut self, desc: OpDescriptor) -> Result<u32> {
        self.negotiate_shared(desc).map(|(_, tag)| tag)
    }

    /// The negotiation: every rank's descriptor indexed by rank, or one that is every rank's
    /// (what the engine agreed through its coordinator), and the tag.
    fn negotiate_shared(&mut self, desc: OpDescriptor) -> Result<(Vec<OpDescriptor>, u32)> {
        if let Some(descs) = self.agreed.take() {
            if let Some(message) = desc.invalid {
                return Err(Error::Internal(format!(
                    "the engine agreed on a collective whose local arguments are invalid: {message}"
                )));
            }
            let tag = self.next_tag();
            return Ok((descs, tag));
        }
        if self.size == 1 {
            return match desc.invalid {
                Some(message) => Err(Error::InvalidArgument(message)),
                None => Ok((vec![desc], 0)),
            };
        }
        let tag = self.next_tag();
        let (rank, size) = (self.rank, self.size);
        let what = label(desc.kind, &desc.name);
        let payloads = self.exchange(
            &what,
            tag,
            &desc.encode(),
            OpDescriptor::max_encoded_len(size),
        )?;
        let mut descs = Vec::with_capacity(size);
        for (peer, payload) in payloads.iter().enumerate() {
            match OpDescriptor::decode(payload, size) {
                Ok(d) => descs.push(d),
                Err(source) => {
                    let peer = self.peer(peer);
                    let mesh = self.mesh()?;
                    return Err(mesh.fail(Failure::Frame { peer, source }, &what));
                }
            }
        }
        check_agreement(&descs, rank)?;
        Ok((descs, tag))
    }

    /// Gives up on the current collective after the negotiation (e.g. the output allocation
    /// failed): peers are told, the mesh becomes unusable, and `error` is returned.
    fn abandon(&mut self, what: &str, error: Error) -> Error {
        let rank = self.rank;
        if let Some(mesh) = self.mesh.as_mut() {
            mesh.break_links(&format!("rank {rank} abandoned {what}: {error}"));
        }
        error
    }

    /// [`Session::abandon`] for a collective the engine agreed on but this rank cannot start
    /// (its buffer could not be allocated): the agreement is dropped too.
    pub(crate) fn abandon_agreed(&mut self, name: &str, error: Error) -> Error {
        self.agreed = None;
        self.abandon(name, error)
    }
}

/// "allreduce 'grad.3'", or "allreduce" for an unnamed tensor.
pub(crate) fn label(kind: OpKind, name: &str) -> String {
    if name.is_empty() {
        kind.name().to_owned()
    } else {
        format!("{kind} '{name}'")
    }
}

/// Checks that every rank's descriptor agrees with rank 0's. The error is the same on every
/// rank (it depends only on the descriptors), except that a rank whose own arguments were
/// invalid reports its own [`Error::InvalidArgument`].
pub(crate) fn check_agreement(descs: &[OpDescriptor], me: usize) -> Result<()> {
    if let Some(message) = descs.get(me).and_then(|d| d.invalid.clone()) {
        return Err(Error::InvalidArgument(message));
    }
    if let Some((j, d)) = descs.iter().enumerate().find(|(_, d)| d.invalid.is_some()) {
        return Err(Error::Mismatch(format!(
            "{}: rank {j} passed invalid arguments, so no rank ran it: {}",
            label(d.kind, &d.name),
            d.invalid.as_deref().unwrap_or_default()
        )));
    }
    let Some(first) = descs.first() else {
        return Ok(());
    };
    for (j, d) in descs.iter().enumerate().skip(1) {
        if let Some(difference) = difference(first, 0, d, j) {
            return Err(Error::Mismatch(difference));
        }
    }
    match check_sizes(descs) {
        Some(message) => Err(Error::Mismatch(message)),
        None => Ok(()),
    }
}

/// Checks what the agreed descriptors (one per member, in group-rank order) would make any
/// rank compute or allocate: every shape valid (no negative dimension, element and byte counts
/// that fit, at most [`MAX_TENSOR_BYTES`]), finite scale factors, alltoall splits that add up
/// to each rank's rows, each rank's gathered or received result within [`MAX_TENSOR_BYTES`],
/// roots and process-set members in range. All arithmetic is checked. The answer depends only
/// on the descriptors, so every rank reaches the same one: a bad value from one peer becomes the
/// same error everywhere, before any allocation or data transfer (the communicator stays
/// usable).
pub(crate) fn check_sizes<D: std::borrow::Borrow<OpDescriptor>>(descs: &[D]) -> Option<String> {
    check_sizes_of(descs.len(), |j| descs[j].borrow(), false)
}

/// [`check_sizes`] of `size` members that all announced `desc`, with the same answer (and
/// message) as on `size` copies of it, at a cost that does not grow with `size` (except an
/// alltoall's per-receiver sums, one per rank).
pub(crate) fn check_sizes_uniform(desc: &OpDescriptor, size: usize) -> Option<String> {
    if size == 0 {
        return None;
    }
    check_sizes_of(size, |_| desc, true)
}

/// [`check_sizes`] over the members' descriptors `member(0..size)`; `uniform`: they are all
/// the same one, so each member's own checks run once and the sums over members are products.
fn check_sizes_of<'a>(
    size: usize,
    member: impl Fn(usize) -> &'a OpDescriptor,
    uniform: bool,
) -> Option<String> {
    if size == 0 {
        return None;
    }
    let first = member(0);
    let fail = |j: usize, m: String| {
        Some(format!(
            "{}: rank {j} announced {m}; no rank ran it (a broken or hostile peer, or a bug)",
            label(first.kind, &first.name)
        ))
    };
    let mut gathered = 0usize;
    let checked = if uniform { 1 } else { size };
    for j in 0..checked {
        let d = member(j);
        if !d.prescale.is_finite() || !d.postscale.is_finite() {
            return fail(
                j,
                format!(
                    "prescale_factor {} and postscale_factor {} (they must be finite)",
                    d.prescale, d.postscale
                ),
            );
        }
        let bytes = match element_count(&d.shape).and_then(|n| {
            n.checked_mul(d.dtype.size())
                .ok_or_else(|| format!("shape {:?} has too many elements", d.shape))
        }) {
            Ok(bytes) if bytes <= MAX_TENSOR_BYTES => bytes,
            Ok(bytes) => {
                return fail(
                    j,
                    format!(
                        "a {} tensor of shape {:?} ({bytes} bytes), more than the limit of {MAX_TENSOR_BYTES} bytes",
                        d.dtype, d.shape
                    ),
                )
            }
            Err(m) => return fail(j, format!("an invalid shape: {m}")),
        };
        match d.kind {
            OpKind::Allgather | OpKind::Alltoall | OpKind::Reducescatter if d.shape.is_empty() => {
                return fail(j, "a scalar for a collective that splits rows".into());
            }
            OpKind::Allgather if uniform => {
                // Member j's running total is (j + 1) · bytes: the first one past the limit.
                if let Some(j) = (bytes > 0)
                    .then(|| MAX_TENSOR_BYTES / bytes)
                    .filter(|&j| j < size)
                {
                    return fail(
                        j,
                        format!(
                            "shape {:?}, which makes the gathered result more than the limit of \
                             {MAX_TENSOR_BYTES} bytes",
                            d.shape
                        ),
                    );
                }
            }
            OpKind::Allgather => match gathered.checked_add(bytes) {
                Some(total) if total <= MAX_TENSOR_BYTES => gathered = total,
                _ => {
                    return fail(
                        j,
                        format!(
                            "shape {:?}, which makes the gathered result more than the limit of \
                             {MAX_TENSOR_BYTES} bytes",
                            d.shape
                        ),
                    )
                }
            },
            OpKind::Alltoall => {
                if let Err(m) = alltoall::check_splits(&d.splits, &d.shape, size) {
                    return fail(j, format!("invalid splits: {m}"));
                }
            }
            OpKind::Broadcast if d.root as usize >= size => {
                return fail(j, format!("root rank {} of {size} ranks", d.root));
            }
            OpKind::AddProcessSet => {
                let increasing = d.splits.windows(2).all(|w| w[0] < w[1]);
                let in_range = d.splits.last().is_some_and(|&m| m < size as u64);
                if !increasing || !in_range {
                    return fail(
                        j,
                        format!("process set members {:?} of {size} ranks", d.splits),
                    );
                }
            }
            _ => {}
        }
    }
    if first.kind == OpKind::Alltoall {
        let row = row_bytes(&first.shape, first.dtype).unwrap_or(usize::MAX);
        for receiver in 0..size {
            let received = if uniform {
                (first.splits.get(receiver))
                    .and_then(|&rows| usize::try_from(rows).ok())
                    .and_then(|rows| rows.checked_mul(row)?.checked_mul(size))
            } else {
                (0..size).try_fold(0usize, |acc, j| {
                    let rows = usize::try_from(*member(j).splits.get(receiver)?).ok()?;
                    acc.checked_add(rows.checked_mul(row)?)
                })
            };
            if received.is_none_or(|bytes| bytes > MAX_TENSOR_BYTES) {
                return Some(format!(
                    "{}: the splits {:?} make rank {receiver} receive more than the limit of \
                     {MAX_TENSOR_BYTES} bytes; no rank ran it (a broken or hostile peer, or a bug)",
                    label(first.kind, &first.name),
                    (0..size).map(|j| &member(j).splits).collect::<Vec<_>>()
                ));
            }
        }
    }
    None
}

/// What differs between rank `i`'s descriptor `a` and rank `j`'s `b`, if anything.
pub(crate) fn difference(a: &OpDescriptor, i: usize, b: &OpDescriptor, j: usize) -> Option<String> {
    const ORDER: &str = "every rank must run the same collectives in the same order";
    if a.kind != b.kind {
        return Some(format!(
            "mismatched collectives: rank {i} called {} but rank {j} called {}; {ORDER}",
            label(a.kind, &a.name),
            label(b.kind, &b.name)
        ));
    }
    if a.name != b.name {
        return Some(format!(
            "{}: rank {i} called it '{}' but rank {j} called it '{}'; {ORDER}",
            a.kind, a.name, b.name
        ));
    }
    let what = label(a.kind, &a.name);
    if a.kind == OpKind::Barrier {
        return None;
    }
    if a.device != b.device {
        let place = |d: bool| if d { "a CUDA tensor" } else { "a CPU tensor" };
        return Some(format!(
            "{what}: rank {i} passes {} but rank {j} passes {}; every rank must pass its tensor on \
             the same kind of device",
            place(a.device),
            place(b.device)
        ));
    }
    let first_dim_free = matches!(a.kind, OpKind::Allgather | OpKind::Alltoall);
    let shapes_agree = if first_dim_free {
        a.shape.len() == b.shape.len() && a.shape.get(1..) == b.shape.get(1..)
    } else {
        a.shape == b.shape
    };
    if a.dtype != b.dtype || !shapes_agree {
        let note = if first_dim_free {
            " (all dimensions but the first must match)"
        } else {
            ""
        };
        return Some(format!(
            "{what}: rank {i} has {} {:?} but rank {j} has {} {:?}{note}",
            a.dtype, a.shape, b.dtype, b.shape
        ));
    }
    if a.op != b.op {
        let name = |op: Option<crate::dtype::ReduceOp>| op.map_or("none", |op| op.name());
        return Some(format!(
            "{what}: rank {i} uses op {} but rank {j} uses op {}",
            name(a.op),
            name(b.op)
        ));
    }
    if a.prescale.to_bits() != b.prescale.to_bits()
        || a.postscale.to_bits() != b.postscale.to_bits()
    {
        return Some(format!(
            "{what}: rank {i} uses prescale_factor {} and postscale_factor {} but rank {j} uses {} and {}",
            a.prescale, a.postscale, b.prescale, b.postscale
        ));
    }
    if a.root != b.root {
        return Some(format!(
            "{what}: rank {i} uses root rank {} but rank {j} uses root rank {}",
            a.root, b.root
        ));
    }
    None
}

/// Elements of `shape`, or why it is not a valid shape.
fn element_count(shape: &[i64]) -> Result<usize, String> {
    if shape.len() > MAX_DIMS {
        return Err(format!(
            "shape has {} dimensions; at most {MAX_DIMS} are supported",
            shape.len()
        ));
    }
    shape.iter().try_fold(1usize, |acc, &d| {
        let d =
            usize::try_from(d).map_err(|_| format!("shape {shape:?} has a negative dimension"))?;
        acc.checked_mul(d)
            .ok_or_else(|| format!("shape {shape:?} has too many elements"))
    })
}

/// Bytes of one row (all dimensions but the first) of `shape`.
pub(crate) fn row_bytes(shape: &[i64], dtype: DType) -> Result<usize, String> {
    let rest = shape.get(1..).unwrap_or_default();
    element_count(rest)?
        .checked_mul(dtype.size())
        .ok_or_else(|| format!("shape {shape:?} has too many elements"))
}

/// Checks the common arguments: name length, shape, and that `len` bytes hold the tensor.
pub(crate) fn check_tensor(
    name: &str,
    len: usize,
    shape: &[i64],
    dtype: DType,
    buffer: &str,
) -> Result<(), String> {
    if name.len() > MAX_NAME_LEN {
        return Err(format!(
            "the tensor name is {} bytes long; at most {MAX_NAME_LEN} are supported",
            name.len()
        ));
    }
    let count = element_count(shape)?;
    let need = count
        .checked_mul(dtype.size())
        .ok_or_else(|| format!("shape {shape:?} has too many elements"))?;
    if need > MAX_TENSOR_BYTES {
        return Err(format!(
            "shape {shape:?} of {dtype} needs {need} bytes, more than the limit of {MAX_TENSOR_BYTES} bytes \
             for one collective; split the tensor"
        ));
    }
    if len != need {
        return Err(format!(
            "the {buffer} buffer holds {len} bytes but shape {shape:?} of {dtype} needs {need} bytes ({count} \
             elements of {} bytes); pass a contiguous buffer of exactly that size",
            dtype.size()
        ));
    }
    Ok(())
}

/// Prefixes `message` with the collective's label.
fn invalid(kind: OpKind, name: &str, message: String) -> String {
    format!("{}: {message}", label(kind, name))
}

/// Byte ranges of consecutive blocks of `rows[i] * row_bytes` bytes.
fn row_segments(rows: &[u64], row_bytes: usize) -> Result<Vec<Range<usize>>> {
    let mut out = Vec::with_capacity(rows.len());
    let mut at = 0usize;
    for &r in rows {
        let len = usize::try_from(r)
            .ok()
            .and_then(|r| r.checked_mul(row_bytes))
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "{r} rows of {row_bytes} bytes do not fit in memory"
                ))
            })?;
        let end = at
            .checked_add(len)
            .ok_or_else(|| Error::InvalidArgument("the result does not fit in memory".into()))?;
        out.push(at..end);
        at = end;
    }
    Ok(out)
}

/// `size` nearly equal element-aligned byte ranges covering `count` elements of `elem` bytes.
fn even_segments(count: usize, elem: usize, size: usize) -> Vec<Range<usize>> {
    let (base, extra) = (count / size, count % size);
    let mut at = 0;
    (0..size)
        .map(|r| {
            let len = (base + usize::from(r < extra)) * elem;
            let range = at..at + len;
            at += len;
            range
        })
        .collect()
}

/// Horovod's uneven row split of `bytes` of float32 as byte ranges, for
/// the shared-memory unit tests.
#[cfg(test)]
pub(crate) fn shm_test_segments(bytes: usize, size: usize) -> Vec<Range<usize>> {
    let rows = reducescatter_rows((bytes / 4) as u64, size);
    row_segments(&rows, 4).unwrap_or_default()
}

/// `(rank - k) mod size`.
fn back(rank: usize, k: usize, size: usize) -> usize {
    (rank + size - k % size) % size
}

/// Bytes of each rank's segment in one piece of a segmented ring. Big rings run as several
/// rounds over pieces of the buffer, so a reduced chunk is forwarded while it is still in
/// cache and the allgather of one piece overlaps the reduce-scatter of the next.
const PIECE_TARGET: usize = 1 << 20;

/// Splits every rank's segment into the same number of element-aligned pieces of at most about
/// [`PIECE_TARGET`] bytes; returns the segments of each piece.
fn ring_pieces(segs: &[Range<usize>], elem: usize) -> Vec<Vec<Range<usize>>> {
    let longest = segs.iter().map(ExactSizeIterator::len).max().unwrap_or(0);
    let count = longest.div_ceil(PIECE_TARGET).max(1);
    let split: Vec<Vec<Range<usize>>> = segs
        .iter()
        .map(|seg| {
            even_segments(seg.len() / elem, elem, count)
                .into_iter()
                .map(|r| seg.start + r.start..seg.start + r.end)
                .collect()
        })
        .collect();
    (0..count)
        .map(|p| split.iter().map(|pieces| pieces[p].clone()).collect())
        .collect()
}

/// The ring reduce-scatter's blocks: step s sends segment rank-s-1 and reduces segment
/// rank-s-2 into place, so rank r ends with segment r fully reduced. The segment sent at step
/// s+1 forwards the one reduced at step s. Returns the index of the last (final) receive.
fn ring_reduce_scatter(
    segs: &[Range<usize>],
    rank: usize,
    sends: &mut Vec<SendBlock>,
    recvs: &mut Vec<RecvBlock>,
) -> usize {
    let size = segs.len();
    for s in 0..size - 1 {
        let after = if s == 0 {
            None
        } else {
            recvs.len().checked_sub(1)
        };
        sends.push(SendBlock {
            range: segs[back(rank, s + 1, size)].clone(),
            after,
        });
        recvs.push(RecvBlock {
            range: segs[back(rank, s + 2, size)].clone(),
            reduce: true,
        });
    }
    recvs.len() - 1
}

/// The ring allgather's blocks: step s sends segment rank-s (first its own, which waits for
/// receive `first_after` if given; then what it just received) and stores segment rank-s-1.
fn ring_allgather(
    segs: &[Range<usize>],
    rank: usize,
    first_after: Option<usize>,
    sends: &mut Vec<SendBlock>,
    recvs: &mut Vec<RecvBlock>,
) {
    let size = segs.len();
    for s in 0..size - 1 {
        let after = if s == 0 {
            first_after
        } else {
            recvs.len().checked_sub(1)
        };
        sends.push(SendBlock {
            range: segs[back(rank, s, size)].clone(),
            after,
        });
        recvs.push(RecvBlock {
            range: segs[back(rank, s + 1, size)].clone(),
            reduce: false,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::ReduceOp;

    fn desc(kind: OpKind, name: &str, dtype: DType, shape: &[i64]) -> OpDescriptor {
        OpDescriptor {
            dtype,
            shape: shape.to_vec(),
            op: Some(ReduceOp::Sum),
            ..OpDescriptor::new(kind, name)
        }
    }

    #[test]
    fn the_uniform_size_check_answers_as_on_every_members_copy() {
        let huge_rows = (MAX_TENSOR_BYTES / 4 / 3) as i64;
        let mut cases = vec![
            desc(OpKind::Allreduce, "a", DType::F32, &[4, 5]),
            desc(OpKind::Allreduce, "neg", DType::F32, &[-1]),
            desc(OpKind::Allgather, "g", DType::F32, &[3, 2]),
            desc(OpKind::Allgather, "big", DType::F32, &[huge_rows]),
            desc(OpKind::Allgather, "empty", DType::F32, &[0, 2]),
            desc(OpKind::Allgather, "scalar", DType::F32, &[]),
            desc(OpKind::Broadcast, "b", DType::F32, &[2]),
            desc(OpKind::Barrier, "x", DType::F32, &[]),
        ];
        let mut nan = desc(OpKind::Allreduce, "nan", DType::F32, &[1]);
        nan.prescale = f64::NAN;
        cases.push(nan);
        let mut root = desc(OpKind::Broadcast, "root", DType::F32, &[2]);
        root.root = 3;
        cases.push(root);
        for splits in [vec![1u64, 1, 1], vec![2, 0, 1], vec![1, 1], vec![1, 1, 2]] {
            let mut a2a = desc(OpKind::Alltoall, "t", DType::F32, &[3, 2]);
            a2a.splits = splits;
            cases.push(a2a);
        }
        let mut wide = desc(OpKind::Alltoall, "wide", DType::U8, &[huge_rows, 1]);
        wide.splits = vec![huge_rows as u64, 0, 0];
        cases.push(wide);
        let mut members = desc(OpKind::AddProcessSet, "ps", DType::U8, &[]);
        members.splits = vec![0, 2];
        cases.push(members);
        let mut found = 0;
        for d in &cases {
            for size in [1, 2, 3, 4, 5] {
                let expected = check_sizes(&vec![d.clone(); size]);
                found += usize::from(expected.is_some());
                assert_eq!(check_sizes_uniform(d, size), expected, "{d:?} x {size}");
            }
        }
        assert!(found > 20, "the cases include refusals ({found})");
    }

    fn mismatch(descs: &[OpDescriptor]) -> String {
        match check_agreement(descs, 0) {
            Err(Error::Mismatch(m)) => {
                // Every rank reports the same message.
                for me in 1..descs.len() {
                    match check_agreement(descs, me) {
                        Err(Error::Mismatch(other)) => assert_eq!(other, m),
                        other => panic!("rank {me}: {other:?}"),
                    }
                }
                m
            }
            other => panic!("expected a mismatch, got {other:?}"),
        }
    }

    #[test]
    fn mismatches_name_the_ranks_and_the_difference() {
        let a = desc(OpKind::Allreduce, "grad.3", DType::F32, &[4, 5]);
        let b = desc(OpKind::Allreduce, "grad.3", DType::F32, &[4, 6]);
        assert_eq!(
            mismatch(&[a.clone(), a.clone(), b.clone()]),
            "allreduce 'grad.3': rank 0 has float32 [4, 5] but rank 2 has float32 [4, 6]"
        );
        let renamed = desc(OpKind::Allreduce, "grad.4", DType::F32, &[4, 5]);
        assert!(mismatch(&[a.clone(), renamed])
            .contains("rank 0 called it 'grad.3' but rank 1 called it 'grad.4'"));
        let other_kind = desc(OpKind::Broadcast, "grad.3", DType::F32, &[4, 5]);
        assert!(mismatch(&[a.clone(), other_kind])
            .contains("rank 0 called allreduce 'grad.3' but rank 1 called broadcast"));
        let avg = OpDescriptor {
            op: Some(ReduceOp::Average),
            ..a.clone()
        };
        assert!(
            mismatch(&[a.clone(), avg]).contains("rank 0 uses op Sum but rank 1 uses op Average")
        );
        let scaled = OpDescriptor {
            prescale: 2.0,
            ..a.clone()
        };
        assert!(mismatch(&[a.clone(), scaled])
            .contains("prescale_factor 1 and postscale_factor 1 but rank 1 uses 2 and 1"));
        let rooted = OpDescriptor {
            root: 1,
            ..a.clone()
        };
        assert!(mismatch(&[a.clone(), rooted])
            .contains("rank 0 uses root rank 0 but rank 1 uses root rank 1"));
        let gathered = |rows| desc(OpKind::Allgather, "g", DType::I8, &[rows, 3]);
        assert!(check_agreement(&[gathered(1), gathered(0)], 1).is_ok());
        let wide = desc(OpKind::Allgather, "g", DType::I8, &[1, 4]);
        assert!(
            mismatch(&[gathered(1), wide]).contains("(all dimensions but the first must match)")
        );
    }

    #[test]
    fn an_invalid_rank_reports_its_own_error_and_the_others_a_mismatch() {
        let good = desc(OpKind::Allreduce, "x", DType::F32, &[2]);
        let bad = OpDescriptor {
            invalid: Some("allreduce 'x': bad buffer".into()),
            ..good.clone()
        };
        let descs = [good.clone(), bad, good];
        assert!(
            matches!(check_agreement(&descs, 1), Err(Error::InvalidArgument(m)) if m == "allreduce 'x': bad buffer")
        );
        assert!(
            matches!(check_agreement(&descs, 0), Err(Error::Mismatch(m)) if m.contains("rank 1 passed invalid arguments"))
        );
    }

    #[test]
    fn splits_and_segments() {
        assert_eq!(reducescatter_rows(7, 3), vec![3, 2, 2]);
        assert_eq!(reducescatter_rows(2, 3), vec![1, 1, 0]);
        assert_eq!(even_segments(5, 4, 2), vec![0..12, 12..20]);
        assert_eq!(row_segments(&[1, 0, 2], 3).unwrap(), vec![0..3, 3..3, 3..9]);
        assert!(row_segments(&[u64::MAX], 2).is_err());
        assert_eq!(element_count(&[]), Ok(1));
        assert!(element_count(&[2, -1]).is_err());
        assert!(element_count(&[i64::MAX, i64::MAX]).is_err());
        assert!(check_tensor("x", 7, &[2], DType::F32, "input")
            .unwrap_err()
            .contains("needs 8 bytes"));
    }

    #[test]
    fn ring_blocks_forward_earlier_receives() {
        for size in 2..6 {
            let segs = even_segments(100, 1, size);
            for rank in 0..size {
                let (mut sends, mut recvs) = (Vec::new(), Vec::new());
                let last = ring_reduce_scatter(&segs, rank, &mut sends, &mut recvs);
                assert_eq!(
                    recvs[last].range, segs[rank],
                    "rank {rank} ends owning its segment"
                );
                ring_allgather(&segs, rank, Some(last), &mut sends, &mut recvs);
                assert!(sends[0].after.is_none());
                for (i, send) in sends.iter().enumerate().skip(1) {
                    assert_eq!(send.after, Some(i - 1));
                    assert_eq!(
                        send.range,
                        recvs[i - 1].range,
                        "send {i} forwards receive {}",
                        i - 1
                    );
                }
            }
        }
    }

    #[test]
    fn ring_pieces_cover_each_segment_in_order() {
        let segs = even_segments((5 << 20) + 7, 4, 3);
        let pieces = ring_pieces(&segs, 4);
        assert!(pieces.len() > 1);
        for (j, seg) in segs.iter().enumerate() {
            let mut at = seg.start;
            for piece in &pieces {
                assert_eq!(piece[j].start, at);
                assert_eq!(piece[j].len() % 4, 0);
                assert!(piece[j].len() <= PIECE_TARGET);
                at = piece[j].end;
            }
            assert_eq!(at, seg.end);
        }
        assert_eq!(ring_pieces(&even_segments(10, 4, 2), 4).len(), 1);
    }
}

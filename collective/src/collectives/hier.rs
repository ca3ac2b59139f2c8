//! Hierarchical collectives for jobs on several hosts with several ranks each: shared memory
//! within each host, a TCP ring (or chain) among one leader per host (its lowest rank).
//!
//! - allreduce: shm allreduce within the host, ring (or, for small messages,
//!   recursive-doubling: [`super::algorithm`]) allreduce among the leaders, shm
//!   broadcast from the leader (reducescatter runs this and keeps its rows);
//! - allgather (when every host's ranks are contiguous): shm allgather within the host, ring
//!   allgather of the host blocks among the leaders, shm broadcast from the leader;
//! - broadcast: shm broadcast on the root's host, a chain among the leaders from the root's
//!   host, shm broadcast from the leader on the other hosts.
//!
//! alltoall and allgather over non-contiguous hosts stay on the TCP mesh.
//!
//! Horovod's `HOROVOD_HIERARCHICAL_ALLREDUCE` / `HOROVOD_HIERARCHICAL_ALLGATHER` (or the
//! `KOLO_` names; `kolorun --[no-]hierarchical-allreduce/allgather`) choose per operation:
//! `0` runs allreduce (allgather) as a flat TCP ring over every rank even on this layout;
//! unset or `1`, the hierarchical path.

use std::ops::Range;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

use super::allreduce::on_ring;
use super::scattered::Scattered;
use super::{AlignedBuf, Session};
use crate::dtype::{DType, ReduceOp};
use crate::error::Result;
use crate::transport::Hosts;
use crate::wire::OpKind;

/// The autotuner's choice per operation (see [`set_tuned`]): 0 none, 1 flat, 2 hierarchical.
static TUNED_ALLREDUCE: AtomicU8 = AtomicU8::new(0);
static TUNED_ALLGATHER: AtomicU8 = AtomicU8::new(0);

/// The autotuner's choices, which win over the variables (`None`: the variables decide). The
/// engine sets them at the same cycle on every rank, so every rank takes the same path.
pub(crate) fn set_tuned(choices: Option<(bool, bool)>) {
    let code = |on: Option<bool>| match on {
        None => 0,
        Some(false) => 1,
        Some(true) => 2,
    };
    TUNED_ALLREDUCE.store(code(choices.map(|c| c.0)), Ordering::Relaxed);
    TUNED_ALLGATHER.store(code(choices.map(|c| c.1)), Ordering::Relaxed);
}

/// Whether `kind` (allreduce or allgather) takes the hierarchical path on a hierarchical
/// layout: the autotuner's choice when it made one, else [`from_env`].
pub(crate) fn chosen(kind: OpKind) -> bool {
    let tuned = if kind == OpKind::Allgather {
        &TUNED_ALLGATHER
    } else {
        &TUNED_ALLREDUCE
    };
    match tuned.load(Ordering::Relaxed) {
        1 => return false,
        2 => return true,
        _ => {}
    }
    from_env(kind)
}

/// Whether `kind` takes the hierarchical path by its variable alone (read once per process;
/// logged at debug level then).
pub(crate) fn from_env(kind: OpKind) -> bool {
    static CHOICES: OnceLock<(bool, bool)> = OnceLock::new();
    let (allreduce, allgather) = *CHOICES.get_or_init(|| {
        let read = |suffix: &str| {
            let name = ["KOLO_", "HOROVOD_"]
                .map(|prefix| format!("{prefix}HIERARCHICAL_{suffix}"))
                .into_iter()
                .find(|name| std::env::var(name).is_ok_and(|v| !v.trim().is_empty()));
            let off = name.as_ref().is_some_and(|name| {
                let value = std::env::var(name).unwrap_or_default();
                matches!(
                    value.trim().to_ascii_lowercase().as_str(),
                    "0" | "false" | "no" | "off"
                )
            });
            let path = if off {
                "a flat TCP ring"
            } else {
                "hierarchical"
            };
            let why = name.unwrap_or_else(|| "the default".to_owned());
            log::debug!(
                "{} across hosts: {path} ({why})",
                suffix.to_ascii_lowercase()
            );
            !off
        };
        (read("ALLREDUCE"), read("ALLGATHER"))
    });
    if kind == OpKind::Allgather {
        allgather
    } else {
        allreduce
    }
}

/// This rank's host and whether it leads it.
fn place(session: &Session, hosts: &Hosts) -> (usize, bool) {
    let host = hosts.host_of[session.rank];
    (host, hosts.ranks[host][0] == session.rank)
}

#[expect(
    clippy::too_many_arguments,
    reason = "the allreduce's arguments plus the layout and the frame tag"
)]
pub(crate) fn allreduce(
    session: &mut Session,
    hosts: &Hosts,
    what: &str,
    tag: u32,
    buf: &mut [u8],
    dtype: DType,
    op: ReduceOp,
    factor: f64,
) -> Result<()> {
    let (host, leader) = place(session, hosts);
    session.on_node(what, |node| node.allreduce(buf, dtype, op, 1.0))?;
    if leader {
        let leaders = hosts.leaders();
        super::allreduce::among(session, &leaders, host, tag, what, buf, dtype, op, factor)?;
    }
    session.on_node(what, |node| node.broadcast(buf, 0))
}

/// [`allreduce`] of a tensor batch where its tensors are (see
/// [`super::allreduce_scattered`]): the node reduces and broadcasts straight from and into
/// the tensors; only the leader packs the node's result into `packed` for the TCP ring.
#[expect(
    clippy::too_many_arguments,
    reason = "the allreduce's arguments plus the layout, the frame tag and the leader's buffer"
)]
pub(crate) fn allreduce_scattered(
    session: &mut Session,
    hosts: &Hosts,
    what: &str,
    tag: u32,
    buf: &mut Scattered<'_>,
    dtype: DType,
    op: ReduceOp,
    factor: f64,
    packed: &mut AlignedBuf,
) -> Result<()> {
    let (host, leader) = place(session, hosts);
    session.on_node(what, |node| node.allreduce_scattered(buf, dtype, op, 1.0))?;
    if leader {
        let len = buf.len();
        let flat = packed.get(len);
        buf.gather(0..len, flat, false)?;
        let leaders = hosts.leaders();
        super::allreduce::among(session, &leaders, host, tag, what, flat, dtype, op, factor)?;
        buf.scatter(0..len, flat)?;
    }
    session.on_node(what, |node| node.broadcast_scattered(buf, 0))
}

pub(crate) fn allgather(
    session: &mut Session,
    hosts: &Hosts,
    what: &str,
    tag: u32,
    output: &mut [u8],
    segs: &[Range<usize>],
) -> Result<()> {
    let (host, leader) = place(session, hosts);
    let local: Vec<Range<usize>> = hosts.ranks[host].iter().map(|&r| segs[r].clone()).collect();
    session.on_node(what, |node| node.allgather(output, &local))?;
    if leader {
        let Some(ranges) = &hosts.ranges else {
            return Err(crate::error::Error::Internal(
                "hierarchical allgather over non-contiguous hosts".into(),
            ));
        };
        let blocks: Vec<Range<usize>> = ranges
            .iter()
            .map(|r| segs[r.start].start..segs[r.end - 1].end)
            .collect();
        on_ring(
            session,
            &hosts.leaders(),
            host,
            tag,
            what,
            |ring, mesh, _| ring.allgather(mesh, output, &blocks),
        )?;
    }
    session.on_node(what, |node| node.broadcast(output, 0))
}

pub(crate) fn broadcast(
    session: &mut Session,
    hosts: &Hosts,
    what: &str,
    tag: u32,
    buf: &mut [u8],
    root: usize,
) -> Result<()> {
    let (host, leader) = place(session, hosts);
    let root_host = hosts.host_of[root];
    if host == root_host {
        let root_local = hosts.ranks[host]
            .iter()
            .position(|&r| r == root)
            .unwrap_or(0);
        session.on_node(what, |node| node.broadcast(buf, root_local))?;
    }
    if leader {
        on_ring(
            session,
            &hosts.leaders(),
            host,
            tag,
            what,
            |ring, mesh, _| ring.broadcast(mesh, buf, root_host),
        )?;
    }
    if host != root_host {
        session.on_node(what, |node| node.broadcast(buf, 0))?;
    }
    Ok(())
}

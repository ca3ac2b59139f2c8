//! broadcast: a binomial tree for small messages and a pipelined chain from the root for large
//! ones over TCP ([`super::algorithm`] chooses); chunked through shared memory on one
//! host; hierarchical across hosts.

use super::algorithm::Algorithm;
use super::{check_tensor, invalid, label, Session};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::transport::Layout;
use crate::wire::{OpDescriptor, OpKind};

pub(crate) fn broadcast(
    session: &mut Session,
    name: &str,
    buf: &mut [u8],
    shape: &[i64],
    dtype: DType,
    root: usize,
) -> Result<()> {
    let kind = OpKind::Broadcast;
    let size = session.size;
    let mut desc = OpDescriptor {
        dtype,
        shape: shape.to_vec(),
        root: u32::try_from(root).unwrap_or(u32::MAX),
        ..OpDescriptor::new(kind, name)
    };
    let root_check = if root < size {
        Ok(())
    } else {
        Err(format!(
            "root rank {root} is out of range; the job has {size} ranks (0 to {})",
            size - 1
        ))
    };
    let algorithm = session.algorithm(kind, buf.len());
    desc.invalid = root_check
        .and_then(|()| algorithm.clone().map(|_| ()))
        .and_then(|()| check_tensor(name, buf.len(), shape, dtype, "tensor"))
        .err()
        .map(|m| invalid(kind, name, m));
    let tag = session.negotiate_tag(desc)?;
    if size == 1 {
        return Ok(());
    }
    let what = label(kind, name);
    match session.shm_layout() {
        Some(Layout::Flat) => session.on_node(&what, |node| node.broadcast(buf, root)),
        Some(Layout::Hierarchical(hosts)) => {
            super::hier::broadcast(session, &hosts, &what, tag, buf, root)
        }
        None => {
            let algorithm = algorithm.map_err(Error::Internal)?;
            session.run_algorithm(
                kind,
                algorithm,
                tag,
                &what,
                |ring, mesh, _, _| match algorithm {
                    Algorithm::BinomialTree => ring.tree_broadcast(mesh, buf, root),
                    _ => ring.broadcast(mesh, buf, root),
                },
            )
        }
    }
}

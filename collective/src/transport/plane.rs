//! Choosing the data plane at init: TCP only, shared memory among the ranks of one host
//! (flat), or shared memory within each host plus TCP among one leader per host
//! (hierarchical).

use std::io;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use super::poll;
use super::shm::{self, SegmentNames, ShmNode};
use super::{Failure, Mesh};
use crate::control::mac::MacKey;
use crate::error::{Error, Result};
use crate::wire::{FrameKind, Header, HEADER_LEN};

/// Environment variable: `tcp`, `shm` or `auto` (the default).
pub const TRANSPORT: &str = "KOLO_TRANSPORT";

/// The data plane asked for with [`TRANSPORT`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportChoice {
    /// TCP between every pair of ranks, even on one host.
    Tcp,
    /// Shared memory among all ranks; every rank must be on one host.
    Shm,
    /// Shared memory when all ranks share a host, hierarchical (shared memory within each
    /// host, TCP among hosts) when several hosts have several ranks, TCP otherwise.
    Auto,
}

impl TransportChoice {
    /// Reads [`TRANSPORT`] (unset or empty: `Auto`).
    pub fn from_env() -> Result<Self> {
        match std::env::var(TRANSPORT) {
            Ok(text) => Self::parse(&text),
            Err(_) => Ok(TransportChoice::Auto),
        }
    }

    /// Parses `tcp`, `shm` or `auto` (any case; empty means `auto`).
    pub fn parse(text: &str) -> Result<Self> {
        match text.trim().to_ascii_lowercase().as_str() {
            "tcp" => Ok(TransportChoice::Tcp),
            "shm" => Ok(TransportChoice::Shm),
            "auto" | "" => Ok(TransportChoice::Auto),
            _ => Err(Error::Config(format!(
                "{TRANSPORT}={text:?} is not a transport; use tcp, shm or auto"
            ))),
        }
    }
}

/// Where every rank runs, grouped by host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Hosts {
    /// Host index of every rank (hosts numbered by their lowest rank).
    pub host_of: Vec<usize>,
    /// Global ranks of every host, ascending; the first is the host's leader.
    pub ranks: Vec<Vec<usize>>,
    /// Each host's ranks as one range of global ranks, when every host's ranks are contiguous.
    pub ranges: Option<Vec<Range<usize>>>,
}

impl Hosts {
    /// Groups ranks by their host hash (`hashes[rank]`).
    pub(crate) fn new(hashes: &[String]) -> Hosts {
        let mut names: Vec<&str> = Vec::new();
        let mut ranks: Vec<Vec<usize>> = Vec::new();
        let mut host_of = Vec::with_capacity(hashes.len());
        for (rank, hash) in hashes.iter().enumerate() {
            let host = match names.iter().position(|n| *n == hash.as_str()) {
                Some(h) => h,
                None => {
                    names.push(hash);
                    ranks.push(Vec::new());
                    names.len() - 1
                }
            };
            ranks[host].push(rank);
            host_of.push(host);
        }
        let contiguous = ranks.iter().all(|r| r.windows(2).all(|w| w[1] == w[0] + 1));
        let ranges = contiguous.then(|| ranks.iter().map(|r| r[0]..r[r.len() - 1] + 1).collect());
        Hosts {
            host_of,
            ranks,
            ranges,
        }
    }

    /// The global rank of every host's leader, by host.
    pub(crate) fn leaders(&self) -> Vec<usize> {
        self.ranks.iter().map(|r| r[0]).collect()
    }
}

/// How the job's collectives use the shared-memory node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Layout {
    /// Every rank is on this host: everything runs over shared memory.
    Flat,
    /// Several hosts: shared memory within the host, TCP among the hosts' leaders.
    Hierarchical(Hosts),
}

/// The shared-memory node of this host and how collectives use it.
#[derive(Debug)]
pub(crate) struct ShmPlane {
    /// Shared with the engine's [`Watch`](super::Watch).
    pub node: Arc<ShmNode>,
    pub layout: Layout,
    /// Names the segments of process sets' own nodes ([`Mesh::setup_set_shm`]).
    key: MacKey,
}

/// Tags of the setup's synchronisation rounds (no collective has run yet, so no data frame
/// can carry them).
const SETUP_TAG: u32 = 0xFFFF_FF00;

/// The layout `choice` selects for ranks on `hosts`, or a config error.
pub(crate) fn choose(choice: TransportChoice, hosts: &Hosts) -> Result<Option<Layout>> {
    let size = hosts.host_of.len();
    let single_host = hosts.ranks.len() == 1;
    match choice {
        TransportChoice::Tcp => Ok(None),
        TransportChoice::Shm if !single_host => Err(Error::Config(format!(
            "{TRANSPORT}=shm needs every rank on one host, but the {size} ranks run on {} hosts; use \
             {TRANSPORT}=auto (shared memory within each host, TCP between hosts) or tcp",
            hosts.ranks.len()
        ))),
        _ if size < 2 => Ok(None),
        _ if single_host => Ok(Some(Layout::Flat)),
        TransportChoice::Shm => unreachable!("handled above"),
        TransportChoice::Auto => Ok(hosts
            .ranks
            .iter()
            .any(|r| r.len() > 1)
            .then(|| Layout::Hierarchical(hosts.clone()))),
    }
}

impl Mesh {
    /// Sets up the shared-memory plane `choice` selects for ranks whose host hashes are
    /// `hashes` (indexed by rank): creates, maps and unlinks the segments of this host's ranks
    /// (synchronising with them over TCP). Every rank must call it with the same arguments.
    pub(crate) fn setup_shm(
        &mut self,
        key: &MacKey,
        hashes: &[String],
        choice: TransportChoice,
    ) -> Result<()> {
        let hosts = Hosts::new(hashes);
        let Some(layout) = choose(choice, &hosts)? else {
            return Ok(());
        };
        let members = hosts.ranks[hosts.host_of[self.rank]].clone();
        let me = members
            .iter()
            .position(|&r| r == self.rank)
            .ok_or_else(|| Error::Internal("this rank is not on its own host".into()))?;
        let peers: Vec<usize> = members
            .iter()
            .copied()
            .filter(|&r| r != self.rank)
            .collect();
        let half = shm::half_bytes()?;
        let op_timeout = self.op_timeout;
        let dir = shm::dir();
        let names = SegmentNames {
            dir: &dir,
            key,
            set: 0,
        };
        let node = ShmNode::setup(names, members, me, half, op_timeout, |round| {
            self.exchange(
                "setting up shared memory",
                SETUP_TAG + round,
                &[],
                0,
                &peers,
            )
            .map(|_| ())
        })?;
        log::debug!(
            "rank {}: shared memory with {} local ranks ({} bytes per half), layout {}",
            self.rank,
            node.len(),
            half,
            match layout {
                Layout::Flat => "flat",
                Layout::Hierarchical(_) => "hierarchical",
            }
        );
        self.shm = Some(ShmPlane {
            node: Arc::new(node),
            layout,
            key: key.clone(),
        });
        Ok(())
    }

    /// A shared-memory node of its own for process set `set` when its `members` (global
    /// ranks in set order; this rank is `members[me]`) are some of this host's ranks on the
    /// plane; `None` when they are not (or there is no plane: TCP). Every member calls it at
    /// the same point, with three fresh tags of the set for the setup's synchronisation.
    pub(crate) fn setup_set_shm(
        &mut self,
        set: u32,
        members: &[usize],
        me: usize,
        tags: [u32; 3],
    ) -> Result<Option<Arc<ShmNode>>> {
        let Some(plane) = &self.shm else {
            return Ok(None);
        };
        let local = plane.node.members();
        if members.len() < 2 || !members.iter().all(|m| local.contains(m)) {
            return Ok(None);
        }
        let (key, half, op_timeout) = (plane.key.clone(), plane.node.half(), self.op_timeout);
        let peers: Vec<usize> = members
            .iter()
            .copied()
            .filter(|&r| r != self.rank)
            .collect();
        let dir = shm::dir();
        let names = SegmentNames {
            dir: &dir,
            key: &key,
            set,
        };
        let node = ShmNode::setup(names, members.to_vec(), me, half, op_timeout, |round| {
            self.exchange(
                "setting up shared memory for a process set",
                tags[round as usize],
                &[],
                0,
                &peers,
            )
            .map(|_| ())
        })?;
        log::debug!(
            "rank {}: process set {set} of ranks {members:?} runs on its own shared memory",
            self.rank
        );
        Ok(Some(Arc::new(node)))
    }

    /// The shared-memory plane, when collectives use one.
    pub(crate) fn shm(&self) -> Option<&ShmPlane> {
        self.shm.as_ref()
    }

    /// Checks, while waiting for `peer` (a global rank on this host) in shared memory, that
    /// the wait should go on: no abort, no shutdown, and the peer's TCP connection (idle while
    /// shared memory carries the data) shows neither end-of-stream nor a `Fail` frame.
    pub(crate) fn peer_alive(&self, peer: usize) -> Result<(), Failure> {
        self.check_interrupts()?;
        let link = self.link(peer)?;
        let fd = std::os::fd::AsRawFd::as_raw_fd(&link.stream);
        let ready = poll::wait_readable(&[fd], Duration::ZERO).map_err(Failure::Local)?;
        if !ready[0] {
            return Ok(());
        }
        let mut header = [0u8; HEADER_LEN];
        // SAFETY: peeks at most HEADER_LEN bytes into a buffer of that size.
        let got = unsafe {
            libc::recv(
                fd,
                header.as_mut_ptr().cast(),
                HEADER_LEN,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        match got {
            0 => Err(super::eof(peer)),
            n if n < 0 => {
                let error = io::Error::last_os_error();
                match error.kind() {
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(()),
                    _ => Err(Failure::Io {
                        peer,
                        source: error,
                    }),
                }
            }
            n if (n as usize) < HEADER_LEN => Ok(()),
            _ => match Header::decode(&header, &self.check) {
                Ok(h) if h.kind == FrameKind::Fail => {
                    let mut sink = [0u8; HEADER_LEN];
                    let _ = std::io::Read::read(&mut &link.stream, &mut sink);
                    let reason = Mesh::read_fail_reason(&link.stream, h.len);
                    Err(Failure::GaveUp { peer, reason })
                }
                // A frame of the next collective (the peer is ahead): it is alive.
                Ok(_) => Ok(()),
                Err(source) => Err(Failure::Frame { peer, source }),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hashes(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| (*n).to_owned()).collect()
    }

    #[test]
    fn hosts_group_ranks_and_know_contiguity() {
        let hosts = Hosts::new(&hashes(&["a", "a", "b", "b"]));
        assert_eq!(hosts.host_of, [0, 0, 1, 1]);
        assert_eq!(hosts.leaders(), [0, 2]);
        assert_eq!(hosts.ranges, Some(vec![0..2, 2..4]));
        let mixed = Hosts::new(&hashes(&["a", "b", "a"]));
        assert_eq!(mixed.ranks, [vec![0, 2], vec![1]]);
        assert_eq!(mixed.ranges, None);
    }

    #[test]
    fn the_choice_follows_the_hosts() {
        let one = Hosts::new(&hashes(&["a", "a"]));
        let two = Hosts::new(&hashes(&["a", "a", "b", "b"]));
        let spread = Hosts::new(&hashes(&["a", "b"]));
        assert_eq!(
            choose(TransportChoice::Auto, &one).unwrap(),
            Some(Layout::Flat)
        );
        assert_eq!(
            choose(TransportChoice::Shm, &one).unwrap(),
            Some(Layout::Flat)
        );
        assert_eq!(choose(TransportChoice::Tcp, &one).unwrap(), None);
        assert!(matches!(
            choose(TransportChoice::Auto, &two).unwrap(),
            Some(Layout::Hierarchical(_))
        ));
        assert_eq!(choose(TransportChoice::Auto, &spread).unwrap(), None);
        assert!(matches!(
            choose(TransportChoice::Shm, &spread),
            Err(Error::Config(m)) if m.contains("2 hosts")
        ));
        assert_eq!(
            choose(TransportChoice::Auto, &Hosts::new(&hashes(&["a"]))).unwrap(),
            None
        );
        assert!(TransportChoice::parse("SHM").is_ok());
        assert!(matches!(
            TransportChoice::parse("udp"),
            Err(Error::Config(_))
        ));
    }
}

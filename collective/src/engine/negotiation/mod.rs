//! How the members of a process set share their cycle messages each cycle, over any [`Links`]:
//! the engine drives it over the data plane (`SessionLinks`), the simulator ([`sim`]) over
//! in-memory channels with a modelled network, so both run the very same code.
//!
//! Two protocols produce the same result, a [`Digest`] of every member's message (each
//! distinct message once, with the ranks that sent it), from which every member runs the same
//! deterministic [`super::coordinator::Coordinator`]:
//! - [`Protocol::AllToAll`]: every member sends its message to every other (n − 1 messages per
//!   member per cycle, one round trip; today's design, fastest at small n).
//! - [`Protocol::Tree`]: a gather up a tree of [`TREE_FANOUT`] children per node, rooted at
//!   group rank 0, and a broadcast of the merged digest down it. Each member first pokes its
//!   children (so an idle child joins the cycle, as an all-to-all message wakes every idle
//!   rank), merges its children's digests with its own message, sends the result to its
//!   parent, and forwards the complete digest it gets back to its children: with fan-out k at
//!   most 1 + 2k sends and k + 2 receives per member per cycle, depth about log_k n, and k + 1
//!   peers per member. Members that send the same bytes merge into one entry, so the common
//!   cycle (same cache bits everywhere, or a step's identical descriptors) costs a
//!   constant-size message per hop however large the set.

mod digest;
mod session_links;
pub mod sim;
mod tree;

use std::io;

pub(crate) use digest::{normalize as normalize_ranges, Digest};
pub(crate) use session_links::SessionLinks;
use tree::Node;

use crate::error::{Error, Result};

/// `KOLO_NEGOTIATION`: how a process set's members share their cycle messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Negotiation {
    /// All-to-all below [`AUTO_TREE_FROM`] members, the tree from there on (default).
    #[default]
    Auto,
    /// Every member sends every other member its message (today's design).
    AllToAll,
    /// Gather up and broadcast down a tree of [`TREE_FANOUT`] children per node, rooted at
    /// group rank 0.
    Tree,
}

/// The set size from which [`Negotiation::Auto`] uses the tree. Measured with real processes on
/// one (loaded, 2-core) host, `kolorun -np N python bench/engine.py --counts 1 161
/// --skip-fusion`, protocols interleaved, medians of 3–6 jobs: a 1-tensor step took
/// 689/337 µs (all-to-all/tree) at 2 ranks, 2252/1350 µs at 4, 5031/4286 µs at 8; 161-tensor
/// steps were equal within noise. The tree is never slower here, but at 2 ranks that is the
/// shared-memory exchange losing under oversubscription, while across hosts all-to-all needs
/// one message latency per cycle and the tree two: 2-member sets keep all-to-all.
pub const AUTO_TREE_FROM: usize = 4;

/// Children per node of the negotiation tree (the same on every member: a constant, not a
/// knob). Measured in the simulator on a quiet host (`KOLO_SIM_FANOUT=2|4|8`, three runs each,
/// interleaved, docs/scale.md), the median rank agreed on the cached 161-tensor step at 1,024
/// ranks in 170–208 µs with fan-out 2, 124–139 µs with 4 (one run at 272 µs, when this host's
/// floor alone was 245 µs) and 132–141 µs with 8; at 256 ranks in 118–144, 97–108 (165) and
/// 83–111 µs. Half the depth of the binary tree halves the hops; 8 gains little more in the
/// simulator, which charges nothing for a send, while a real send costs a system call per child
/// (a parent sends each child a poke and the digest) and a rank would have 9 peers: 4 it is
/// (≤ 9 sends, ≤ 6 receives and 5 peers per member per cycle).
pub const TREE_FANOUT: usize = 4;

/// The protocol one process set runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// See [`Negotiation::AllToAll`].
    AllToAll,
    /// See [`Negotiation::Tree`].
    Tree,
}

impl Negotiation {
    /// Parses `auto`, `all_to_all` or `tree` (case-insensitive).
    pub fn parse(text: &str) -> Option<Negotiation> {
        match text.trim().to_ascii_lowercase().as_str() {
            "auto" => Some(Negotiation::Auto),
            "all_to_all" | "alltoall" => Some(Negotiation::AllToAll),
            "tree" => Some(Negotiation::Tree),
            _ => None,
        }
    }

    /// The protocol a set of `size` members runs.
    pub fn protocol(self, size: usize) -> Protocol {
        match self {
            Negotiation::AllToAll => Protocol::AllToAll,
            Negotiation::Tree => Protocol::Tree,
            Negotiation::Auto if size >= AUTO_TREE_FROM => Protocol::Tree,
            Negotiation::Auto => Protocol::AllToAll,
        }
    }
}

/// Point-to-point links among the members of one process set, addressed by group rank. Every
/// wait is bounded: a receive fails with a typed error (a timeout naming the peer) rather than
/// hang, and never accepts more than `max_len` bytes.
pub(crate) trait Links {
    /// This member's group rank.
    fn rank(&self) -> usize;
    /// The number of members.
    fn size(&self) -> usize;
    /// The global rank of group rank `peer` (for error messages).
    fn global(&self, peer: usize) -> usize {
        peer
    }
    /// Sends `bytes` to `peer`.
    fn send(&mut self, peer: usize, bytes: &[u8]) -> Result<()>;
    /// Receives the next message from `peer`, of at most `max_len` bytes.
    fn recv(&mut self, peer: usize, max_len: usize) -> Result<Vec<u8>>;
    /// Sends `payload` to every other member and receives one message from each; returns
    /// every member's message (this member's own included) as a digest.
    fn exchange_all(&mut self, payload: Vec<u8>, max_len: usize) -> Result<Digest> {
        let (me, size) = (self.rank(), self.size());
        for peer in (0..size).filter(|&p| p != me) {
            self.send(peer, &payload)?;
        }
        let mut all = Vec::with_capacity(size);
        for peer in 0..size {
            if peer == me {
                all.push(Vec::new());
            } else {
                all.push(self.recv(peer, max_len)?);
            }
        }
        all[me] = payload;
        Ok(Digest::from_payloads(all))
    }
}

/// Shares this member's encoded cycle message `payload` (at most `max_len` bytes, as every
/// peer's) with the other members by `protocol`; returns every member's message.
pub(crate) fn negotiate<L: Links>(
    links: &mut L,
    protocol: Protocol,
    payload: Vec<u8>,
    max_len: usize,
) -> Result<Digest> {
    negotiate_with(links, protocol, TREE_FANOUT, payload, max_len)
}

/// [`negotiate`] with a tree of `fanout` children per node (every member must pass the same;
/// the simulator measures other fan-outs with it).
pub(crate) fn negotiate_with<L: Links>(
    links: &mut L,
    protocol: Protocol,
    fanout: usize,
    payload: Vec<u8>,
    max_len: usize,
) -> Result<Digest> {
    let (me, size) = (links.rank(), links.size());
    if size <= 1 {
        return Ok(Digest::single(me, payload));
    }
    match protocol {
        Protocol::AllToAll => links.exchange_all(payload, max_len),
        Protocol::Tree => tree_round(links, fanout, payload, max_len),
    }
}

/// The largest digest a member accepts: every member's message at its limit is far above any
/// real cycle, so the digest is held to the same limit as one message.
fn digest_limit(max_len: usize) -> usize {
    max_len
}

fn tree_round<L: Links>(
    links: &mut L,
    fanout: usize,
    payload: Vec<u8>,
    max_len: usize,
) -> Result<Digest> {
    let (me, size) = (links.rank(), links.size());
    let node = Node::of(me, size, fanout);
    let limit = digest_limit(max_len);
    // The poke: an idle child wakes and joins the cycle (see the module docs).
    for &(child, _) in &node.children {
        links.send(child, &[])?;
    }
    let mut digest = Digest::single(me, payload);
    for &(child, end) in &node.children {
        let bytes = links.recv(child, limit)?;
        if digest.merge_same(&bytes, child, end) {
            continue;
        }
        let part = Digest::decode(&bytes, size, max_len)
            .and_then(|d| d.check_covers(child, end).map(|()| d))
            .map_err(|why| bad_peer(links, child, why))?;
        digest.merge(part);
    }
    let all = match node.parent {
        Some(parent) => {
            links.send(parent, &digest.encode())?;
            let poke = links.recv(parent, 0)?;
            if !poke.is_empty() {
                return Err(bad_peer(
                    links,
                    parent,
                    "the negotiation tree's poke carries bytes".into(),
                ));
            }
            let bytes = links.recv(parent, limit)?;
            // Forwarded before it is decoded, so decoding is off the path down the tree: each
            // child checks the bytes itself (and a bad digest fails this rank and its subtree
            // alike).
            for &(child, _) in &node.children {
                links.send(child, &bytes)?;
            }
            Digest::decode(&bytes, size, max_len)
                .and_then(|d| d.check_covers(0, size).map(|()| d))
                .map_err(|why| bad_peer(links, parent, why))?
        }
        None => {
            let down = digest.encode();
            for &(child, _) in &node.children {
                links.send(child, &down)?;
            }
            digest
        }
    };
    Ok(all)
}

fn bad_peer<L: Links>(links: &L, peer: usize, why: String) -> Error {
    Error::Peer {
        rank: links.global(peer),
        during: "the engine's negotiation".into(),
        source: io::Error::new(io::ErrorKind::InvalidData, why),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_knob_and_auto_switches_at_the_measured_size() {
        assert_eq!(Negotiation::parse("TREE"), Some(Negotiation::Tree));
        assert_eq!(
            Negotiation::parse("all_to_all"),
            Some(Negotiation::AllToAll)
        );
        assert_eq!(Negotiation::parse("auto"), Some(Negotiation::Auto));
        assert_eq!(Negotiation::parse("ring"), None);
        assert_eq!(Negotiation::Auto.protocol(2), Protocol::AllToAll);
        assert_eq!(Negotiation::Auto.protocol(AUTO_TREE_FROM), Protocol::Tree);
        assert_eq!(Negotiation::AllToAll.protocol(1024), Protocol::AllToAll);
        assert_eq!(Negotiation::Tree.protocol(2), Protocol::Tree);
    }
}

//! Which TCP algorithm a collective runs: chosen by message size and rank count (the same
//! inputs on every rank, so every rank chooses alike), or forced per collective with
//! `KOLO_ALLREDUCE_ALGORITHM`, `KOLO_ALLGATHER_ALGORITHM` and `KOLO_BROADCAST_ALGORITHM`
//! (NCCL's `NCCL_ALGO` is the model). The shared-memory and hierarchical paths are chosen
//! before this (by the mesh's layout); these algorithms run on the flat TCP mesh.
//!
//! The thresholds were measured on this project's 2-core CI machine with real rank processes
//! over loopback (`cargo bench -p kolo-collective --bench algorithms`; figures in
//! docs/scale.md): below them the O(log n)-latency algorithm wins, above them the
//! bandwidth-optimal one.

use std::fmt;

use crate::wire::OpKind;

/// Variable forcing the allreduce algorithm: `auto` (default), `ring` or `recursive_doubling`.
pub const ALLREDUCE_ALGORITHM: &str = "KOLO_ALLREDUCE_ALGORITHM";
/// Variable forcing the allgather algorithm: `auto` (default), `ring` or `recursive_doubling`.
pub const ALLGATHER_ALGORITHM: &str = "KOLO_ALLGATHER_ALGORITHM";
/// Variable forcing the broadcast algorithm: `auto` (default), `chain` or `binomial_tree`.
pub const BROADCAST_ALGORITHM: &str = "KOLO_BROADCAST_ALGORITHM";

/// Allreduces of at most this many bytes run recursive doubling (`auto`, any n ≥ 2), larger
/// ones the ring. Measured (ratio recursive doubling / ring, median of interleaved rounds):
/// 0.4–0.8 at 4 B … 256 KiB for n = 3, 4, 8, 16; 1.1–1.9 at 1 MiB and 3–6.6 at 4–64 MiB for
/// n = 3 … 16 (each rank sends the whole message log2 n times instead of 2(n-1)/n of it).
pub const ALLREDUCE_RECURSIVE_DOUBLING_MAX_BYTES: usize = 256 << 10;
/// Allgathers whose gathered result has at most this many bytes run recursive doubling
/// (`auto`, n ≥ 3), larger ones the ring, except on a power of two ≥ 4 ranks, where
/// recursive doubling moves exactly the ring's bytes in log2 n steps instead of n-1 and runs
/// at every size. Measured (ratio recursive doubling / ring): 0.45–0.95 at 4 B … 64 KiB for
/// n = 3, 4, 8, 16; beyond it 1.2–1.5 at n = 3 (the fold of a non-power of two costs a whole
/// extra result), 0.4–0.86 at n = 8 and 16 up to 4 MiB, 0.78–1.1 at n = 4 up to 64 MiB
/// (n = 2 is the same exchange either way).
pub const ALLGATHER_RECURSIVE_DOUBLING_MAX_BYTES: usize = 64 << 10;
/// Broadcasts of at most this many bytes on at least [`BROADCAST_TREE_MIN_RANKS`] ranks run
/// the binomial tree (`auto`), others the pipelined chain.
pub const BROADCAST_TREE_MAX_BYTES: usize = 64 << 10;
/// The fewest ranks on which broadcast uses the binomial tree: on 2 the tree is the chain,
/// and on 3 the chain measured 1.1 times faster (the root's two sends are serial; the
/// chain's two hops overlap). Measured (ratio tree / chain, ≤ 64 KiB): 0.76–1.08 at n = 4
/// (a tie), 0.52–0.77 at n = 8 (≤ 1 KiB; 0.95 to 1 MiB), 0.6–1.35 at n = 16 (noise: 16
/// processes on 2 cores make every hop a context switch, whatever the algorithm).
pub const BROADCAST_TREE_MIN_RANKS: usize = 4;

/// A TCP algorithm of one collective.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Algorithm {
    /// Ring reduce-scatter + ring allgather (allreduce), ring allgather (allgather):
    /// bandwidth-optimal, 2(n-1) (n-1) latency steps.
    Ring,
    /// Recursive doubling, with the ranks beyond the largest power of two folded into a
    /// partner first and sent the result last: ⌈log2 n⌉ (+2) steps, the whole message each.
    RecursiveDoubling,
    /// Broadcast: a pipelined chain from the root (n-1 hops, bandwidth-optimal).
    Chain,
    /// Broadcast: a binomial tree from the root (⌈log2 n⌉ rounds).
    BinomialTree,
}

impl Algorithm {
    /// The name the variables use.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Ring => "ring",
            Algorithm::RecursiveDoubling => "recursive_doubling",
            Algorithm::Chain => "chain",
            Algorithm::BinomialTree => "binomial_tree",
        }
    }

    /// The algorithms `kind` can run (over TCP).
    pub fn of(kind: OpKind) -> &'static [Algorithm] {
        match kind {
            OpKind::Allreduce | OpKind::Allgather => {
                &[Algorithm::Ring, Algorithm::RecursiveDoubling]
            }
            OpKind::Broadcast => &[Algorithm::Chain, Algorithm::BinomialTree],
            _ => &[],
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The forced algorithm of each collective; `None` chooses by size and rank count.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AlgorithmChoices {
    /// `KOLO_ALLREDUCE_ALGORITHM`.
    pub allreduce: Option<Algorithm>,
    /// `KOLO_ALLGATHER_ALGORITHM`.
    pub allgather: Option<Algorithm>,
    /// `KOLO_BROADCAST_ALGORITHM`.
    pub broadcast: Option<Algorithm>,
}

impl AlgorithmChoices {
    /// Reads the three variables (unset or empty: `auto`). An unknown value is an error
    /// message naming the variable and the values it takes.
    pub fn from_env() -> Result<Self, String> {
        let read = |var: &str, kind| match std::env::var(var) {
            Ok(text) => parse(var, kind, &text),
            Err(_) => Ok(None),
        };
        Ok(AlgorithmChoices {
            allreduce: read(ALLREDUCE_ALGORITHM, OpKind::Allreduce)?,
            allgather: read(ALLGATHER_ALGORITHM, OpKind::Allgather)?,
            broadcast: read(BROADCAST_ALGORITHM, OpKind::Broadcast)?,
        })
    }

    /// Forces `algorithm` for `kind` (`None`: auto), or says why `kind` cannot run it.
    pub fn force(&mut self, kind: OpKind, algorithm: Option<Algorithm>) -> Result<(), String> {
        if let Some(a) = algorithm {
            if !Algorithm::of(kind).contains(&a) {
                return Err(format!("{kind} cannot run the {a} algorithm"));
            }
        }
        match kind {
            OpKind::Allreduce => self.allreduce = algorithm,
            OpKind::Allgather => self.allgather = algorithm,
            OpKind::Broadcast => self.broadcast = algorithm,
            _ => return Err(format!("{kind} has no choice of algorithm")),
        }
        Ok(())
    }

    fn forced(&self, kind: OpKind) -> Option<Algorithm> {
        match kind {
            OpKind::Allreduce => self.allreduce,
            OpKind::Allgather => self.allgather,
            OpKind::Broadcast => self.broadcast,
            _ => None,
        }
    }
}

/// Parses `var`'s value `text` for `kind`: `auto` (or empty) is `None`.
fn parse(var: &str, kind: OpKind, text: &str) -> Result<Option<Algorithm>, String> {
    let wanted = text.trim().to_ascii_lowercase();
    if wanted.is_empty() || wanted == "auto" {
        return Ok(None);
    }
    let options = Algorithm::of(kind);
    options
        .iter()
        .find(|a| a.name() == wanted)
        .map(|a| Some(*a))
        .ok_or_else(|| {
            let names: Vec<&str> = options.iter().map(|a| a.name()).collect();
            format!(
                "{var}={text:?} is not a {kind} algorithm; use auto, {}",
                names.join(" or ")
            )
        })
}

/// The algorithm `kind` runs over TCP on `size` ranks for a message of `bytes` (the tensor
/// for allreduce and broadcast, the gathered result for allgather): the forced one, else by
/// the measured thresholds. Depends only on values every rank shares.
pub fn select(kind: OpKind, bytes: usize, size: usize, choices: &AlgorithmChoices) -> Algorithm {
    if let Some(forced) = choices.forced(kind) {
        return forced;
    }
    match kind {
        OpKind::Broadcast
            if size >= BROADCAST_TREE_MIN_RANKS && bytes <= BROADCAST_TREE_MAX_BYTES =>
        {
            Algorithm::BinomialTree
        }
        OpKind::Broadcast => Algorithm::Chain,
        OpKind::Allreduce if size >= 2 && bytes <= ALLREDUCE_RECURSIVE_DOUBLING_MAX_BYTES => {
            Algorithm::RecursiveDoubling
        }
        OpKind::Allgather
            if size > 2
                && (bytes <= ALLGATHER_RECURSIVE_DOUBLING_MAX_BYTES || size.is_power_of_two()) =>
        {
            Algorithm::RecursiveDoubling
        }
        _ => Algorithm::Ring,
    }
}

/// The group ranks that rank `rank` of `size` exchanges data with when `kind` runs
/// `algorithm` (rooted at `root` for broadcast), ascending: the connections it needs.
pub fn peers(
    kind: OpKind,
    algorithm: Algorithm,
    rank: usize,
    size: usize,
    root: usize,
) -> Vec<usize> {
    let mut out = match (kind, algorithm) {
        _ if size < 2 => Vec::new(),
        (_, Algorithm::Ring) => vec![(rank + 1) % size, (rank + size - 1) % size],
        (_, Algorithm::Chain) => {
            let position = (rank + size - root) % size;
            let mut p = Vec::new();
            if position > 0 {
                p.push((rank + size - 1) % size);
            }
            if position + 1 < size {
                p.push((rank + 1) % size);
            }
            p
        }
        (_, Algorithm::BinomialTree) => super::tree::binomial_peers(rank, size, root),
        (_, Algorithm::RecursiveDoubling) => super::tree::doubling_peers(rank, size),
    };
    out.sort_unstable();
    out.dedup();
    out
}

/// How many times this rank ran each algorithm of each collective over TCP.
#[derive(Debug, Default, Clone)]
pub(crate) struct AlgorithmRuns(Vec<(OpKind, Algorithm, u64)>);

impl AlgorithmRuns {
    pub(crate) fn count(&mut self, kind: OpKind, algorithm: Algorithm) {
        match self
            .0
            .iter_mut()
            .find(|(k, a, _)| *k == kind && *a == algorithm)
        {
            Some(entry) => entry.2 += 1,
            None => self.0.push((kind, algorithm, 1)),
        }
    }

    /// `("allreduce_ring", 3)` and the like, sorted by name.
    pub(crate) fn snapshot(&self) -> Vec<(String, u64)> {
        let mut out: Vec<(String, u64)> = self
            .0
            .iter()
            .map(|(k, a, n)| (format!("{}_{}", k.name(), a.name()), *n))
            .collect();
        out.sort();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variables_parse_and_refuse_unknown_names() {
        assert_eq!(parse("V", OpKind::Allreduce, " Auto "), Ok(None));
        assert_eq!(parse("V", OpKind::Allreduce, ""), Ok(None));
        assert_eq!(
            parse("V", OpKind::Allreduce, "recursive_doubling"),
            Ok(Some(Algorithm::RecursiveDoubling))
        );
        assert_eq!(
            parse("V", OpKind::Broadcast, "BINOMIAL_TREE"),
            Ok(Some(Algorithm::BinomialTree))
        );
        let err = parse("V", OpKind::Broadcast, "ring").unwrap_err();
        assert!(err.contains("use auto, chain or binomial_tree"), "{err}");
        let mut choices = AlgorithmChoices::default();
        assert!(choices
            .force(OpKind::Allreduce, Some(Algorithm::Chain))
            .is_err());
        choices
            .force(OpKind::Allreduce, Some(Algorithm::Ring))
            .unwrap();
        assert_eq!(select(OpKind::Allreduce, 4, 16, &choices), Algorithm::Ring);
    }

    #[test]
    fn auto_selection_follows_the_thresholds() {
        let auto = AlgorithmChoices::default();
        let t = ALLREDUCE_RECURSIVE_DOUBLING_MAX_BYTES;
        assert_eq!(
            select(OpKind::Allreduce, t, 8, &auto),
            Algorithm::RecursiveDoubling
        );
        assert_eq!(select(OpKind::Allreduce, t + 1, 8, &auto), Algorithm::Ring);
        assert_eq!(
            select(OpKind::Allreduce, 4, 2, &auto),
            Algorithm::RecursiveDoubling
        );
        assert_eq!(select(OpKind::Allgather, 4, 2, &auto), Algorithm::Ring);
        let g = ALLGATHER_RECURSIVE_DOUBLING_MAX_BYTES;
        assert_eq!(
            select(OpKind::Allgather, g, 6, &auto),
            Algorithm::RecursiveDoubling
        );
        assert_eq!(select(OpKind::Allgather, g + 1, 6, &auto), Algorithm::Ring);
        assert_eq!(
            select(OpKind::Allgather, 1 << 30, 8, &auto),
            Algorithm::RecursiveDoubling
        );
        let b = BROADCAST_TREE_MAX_BYTES;
        assert_eq!(
            select(OpKind::Broadcast, b, 4, &auto),
            Algorithm::BinomialTree
        );
        assert_eq!(select(OpKind::Broadcast, b, 3, &auto), Algorithm::Chain);
        assert_eq!(select(OpKind::Broadcast, b + 1, 4, &auto), Algorithm::Chain);
    }

    #[test]
    fn ring_and_chain_peers_are_the_neighbours() {
        assert_eq!(
            peers(OpKind::Allreduce, Algorithm::Ring, 0, 5, 0),
            vec![1, 4]
        );
        assert_eq!(peers(OpKind::Allreduce, Algorithm::Ring, 1, 2, 0), vec![0]);
        assert_eq!(peers(OpKind::Broadcast, Algorithm::Chain, 2, 5, 2), vec![3]);
        assert_eq!(peers(OpKind::Broadcast, Algorithm::Chain, 1, 5, 2), vec![0]);
        assert!(peers(OpKind::Broadcast, Algorithm::Chain, 0, 1, 0).is_empty());
    }
}

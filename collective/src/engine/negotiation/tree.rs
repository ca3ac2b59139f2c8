//! The negotiation tree: a binary tree over a process set's group ranks, rooted at group rank 0,
//! in which every subtree is a contiguous range of ranks (so a subtree's gathered messages name
//! their senders with one range each when they agree). Node `lo` of range `[lo, hi)` has the
//! children `lo + 1` (range `[lo + 1, mid)`) and `mid` (range `[mid, hi)`), `mid` splitting the
//! rest in halves: every rank talks to at most three peers and the depth is ⌈log2 n⌉.

/// One rank's place in the tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Node {
    /// The parent's group rank (`None` at the root).
    pub parent: Option<usize>,
    /// Each child's group rank and the end (exclusive) of its subtree `[child, end)`.
    pub children: Vec<(usize, usize)>,
    /// How many hops this rank is below the root.
    pub depth: usize,
}

impl Node {
    /// Group rank `rank`'s place in the tree of `size` ranks (`rank < size`).
    pub(crate) fn of(rank: usize, size: usize) -> Node {
        let (mut lo, mut hi) = (0, size);
        let mut parent = None;
        let mut depth = 0;
        loop {
            let (left, right) = split(lo, hi);
            if rank == lo {
                return Node {
                    parent,
                    children: [left, right].into_iter().flatten().collect(),
                    depth,
                };
            }
            parent = Some(lo);
            depth += 1;
            (lo, hi) = [left, right]
                .into_iter()
                .flatten()
                .find(|&(c, end)| (c..end).contains(&rank))
                .unwrap_or((rank, rank + 1));
        }
    }
}

/// The children's ranges of the node owning `[lo, hi)`.
/// A child's group rank and the end (exclusive) of its subtree.
type Child = (usize, usize);

fn split(lo: usize, hi: usize) -> (Option<Child>, Option<Child>) {
    let rest = hi.saturating_sub(lo + 1);
    if rest == 0 {
        return (None, None);
    }
    let mid = lo + 1 + rest.div_ceil(2);
    let right = (mid < hi).then_some((mid, hi));
    (Some((lo + 1, mid)), right)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rank_has_one_parent_subtrees_are_contiguous_and_depth_is_logarithmic() {
        for size in [1, 2, 3, 5, 8, 64, 100, 1024] {
            let nodes: Vec<Node> = (0..size).map(|r| Node::of(r, size)).collect();
            assert_eq!(nodes[0].parent, None);
            for (r, node) in nodes.iter().enumerate() {
                assert!(node.children.len() <= 2);
                for &(c, end) in &node.children {
                    assert_eq!(nodes[c].parent, Some(r), "size {size}: child {c} of {r}");
                    assert!(c < end && end <= size);
                    // The child's own children cover the rest of its range.
                    let covered: usize = nodes[c].children.iter().map(|&(g, e)| e - g).sum();
                    assert_eq!(covered, end - c - 1);
                }
                let depth_bound = usize::BITS - size.leading_zeros();
                assert!(node.depth <= depth_bound as usize, "size {size} rank {r}");
            }
        }
    }
}

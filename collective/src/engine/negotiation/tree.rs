//! The negotiation tree: a `fanout`-ary tree over a process set's group ranks, rooted at group
//! rank 0, in which every subtree is a contiguous range of ranks (so a subtree's gathered
//! messages name their senders with one range each when they agree). Node `lo` of range
//! `[lo, hi)` splits the rest, `[lo + 1, hi)`, into at most `fanout` contiguous children of
//! near-equal sizes (the first ones one larger): every rank talks to at most `fanout + 1`
//! peers and the depth is about log_fanout(n).

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
    /// Group rank `rank`'s place in the tree of `size` ranks (`rank < size`) in which every
    /// node has at most `fanout` (at least 2) children.
    pub(crate) fn of(rank: usize, size: usize, fanout: usize) -> Node {
        let (mut lo, mut hi) = (0, size);
        let mut parent = None;
        let mut depth = 0;
        loop {
            if rank == lo {
                return Node {
                    parent,
                    children: children(lo, hi, fanout).collect(),
                    depth,
                };
            }
            parent = Some(lo);
            depth += 1;
            (lo, hi) = children(lo, hi, fanout)
                .find(|&(c, end)| (c..end).contains(&rank))
                .unwrap_or((rank, rank + 1));
        }
    }
}

/// The children of the node owning `[lo, hi)`: each child's group rank and the end
/// (exclusive) of its subtree.
fn children(lo: usize, hi: usize, fanout: usize) -> impl Iterator<Item = (usize, usize)> {
    let rest = hi.saturating_sub(lo + 1);
    let parts = fanout.max(2).min(rest);
    let (base, extra) = (rest.checked_div(parts).unwrap_or(0), rest % parts.max(1));
    let mut start = lo + 1;
    (0..parts).map(move |i| {
        let end = start + base + usize::from(i < extra);
        let child = (start, end);
        start = end;
        child
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rank_has_one_parent_subtrees_are_contiguous_and_depth_is_logarithmic() {
        for fanout in [2, 3, 4, 8] {
            for size in [1, 2, 3, 5, 8, 64, 100, 1024] {
                let nodes: Vec<Node> = (0..size).map(|r| Node::of(r, size, fanout)).collect();
                assert_eq!(nodes[0].parent, None);
                for (r, node) in nodes.iter().enumerate() {
                    assert!(node.children.len() <= fanout);
                    for &(c, end) in &node.children {
                        assert_eq!(nodes[c].parent, Some(r), "size {size}: child {c} of {r}");
                        assert!(c < end && end <= size);
                        // The child's own children cover the rest of its range.
                        let covered: usize = nodes[c].children.iter().map(|&(g, e)| e - g).sum();
                        assert_eq!(covered, end - c - 1);
                    }
                    // ⌈log_fanout(size)⌉ + 1 bounds the depth.
                    let mut bound = 1;
                    let mut reach = 1usize;
                    while reach < size {
                        reach = reach.saturating_mul(fanout);
                        bound += 1;
                    }
                    assert!(node.depth <= bound, "fanout {fanout} size {size} rank {r}");
                }
            }
        }
    }

    #[test]
    fn the_binary_tree_keeps_its_shape() {
        // Rank 0 of 8: children 1 (1..5) and 5 (5..8); rank 5: children 6 and 7.
        assert_eq!(Node::of(0, 8, 2).children, vec![(1, 5), (5, 8)]);
        assert_eq!(Node::of(5, 8, 2).children, vec![(6, 7), (7, 8)]);
        assert_eq!(Node::of(6, 8, 2).parent, Some(5));
        assert!(Node::of(6, 8, 2).children.is_empty());
        assert_eq!(Node::of(0, 1024, 2).children.len(), 2);
        assert_eq!(
            Node::of(0, 1024, 4).children,
            vec![(1, 257), (257, 513), (513, 769), (769, 1024)]
        );
    }
}

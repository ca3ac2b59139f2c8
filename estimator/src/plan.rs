//! The balanced shard planner: which rows each rank reads in an epoch, and in which order.
//!
//! Rows carry a *global index*: files sorted by path, row groups in file order, rows in row-group
//! order. An epoch's plan is built from the row groups as ranges of global indices:
//!
//! 1. **Epoch sequence.** The row groups are permuted with an RNG seeded from `(seed, epoch)`
//!    (identity without shuffle) and concatenated into one sequence of `N` rows.
//! 2. **Shard.** Every rank gets the same number of rows: `floor(N / size)` with `drop_last`
//!    (the tail of the sequence is dropped) or `ceil(N / size)` without (the missing rows wrap
//!    around to the start of the sequence). Rank `r` takes the `r`-th contiguous run.
//! 3. **Windowed shuffle.** The rank's run is cut into windows of `W` rows; within a window the
//!    rows are permuted with an RNG seeded from `(seed, epoch, rank, window)`, and each block of
//!    `B` consecutive output positions (a batch, when `W` is a multiple of `B`) is put back in
//!    reading order: a batch is still a uniformly random subset of its window, but it is
//!    gathered with ascending reads, which is several times faster than random ones. Batches
//!    are consecutive `B`-row slices of the permuted windows. Since every window is addressable on
//!    its own, resuming at any offset decodes nothing before the window that holds it.
//!
//! Resuming with a different number of ranks ([`EpochPlan::new`] with a non-empty history)
//! collects the rows no old rank has delivered yet, and shards *those* over the new ranks the
//! same way.
//!
//! ```
//! use kolo_estimator::plan::{EpochPlan, PlanConfig};
//!
//! let row_groups = vec![0..100, 100..250, 250..300];
//! let config = PlanConfig { size: 2, batch_size: 32, seed: 7, shuffle: true, drop_last: true, window: 64 };
//! let plan = EpochPlan::new(&row_groups, &config, 0, &[]);
//! let rank0 = plan.rank(0);
//! assert_eq!(rank0.len(), 150);
//! assert_eq!(rank0.batches(), 4);
//! assert_eq!(rank0.delivered_rows(), 128);
//! ```

use std::ops::Range;

use serde::{Deserialize, Serialize};

/// Rows as ranges of global row indices, in reading order.
pub type Rows = Vec<Range<u64>>;

/// The knobs that decide a plan; equal configs give equal plans on every machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanConfig {
    /// Number of ranks.
    pub size: u32,
    /// Rows per batch.
    pub batch_size: u64,
    /// Seed of every shuffle.
    pub seed: u64,
    /// Whether row groups and rows within windows are shuffled.
    pub shuffle: bool,
    /// Drop the remainder (`true`) or wrap around to fill it (`false`).
    pub drop_last: bool,
    /// Rows per shuffle window (at least 1).
    pub window: u64,
}

/// One earlier part of an epoch that ran with another number of ranks (or batch size, window,
/// remainder policy): `size` ranks had each handed out `offset` rows (ranks train in
/// lockstep, so every rank's offset is the same).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resumed {
    /// The number of ranks then.
    pub size: u32,
    /// Rows each of those ranks had handed out.
    pub offset: u64,
    /// The shuffle window then.
    pub window: u64,
    /// The batch size then.
    pub batch_size: u64,
    /// The remainder policy then.
    pub drop_last: bool,
}

/// Number of rows in `rows`.
pub fn row_count(rows: &[Range<u64>]) -> u64 {
    rows.iter().map(|r| r.end - r.start).sum()
}

/// Rows every rank gets out of `total` with `size` ranks.
pub fn rows_per_rank(total: u64, size: u32, drop_last: bool) -> u64 {
    let size = u64::from(size.max(1));
    if drop_last {
        total / size
    } else {
        total.div_ceil(size)
    }
}

/// Batches of `batch_size` out of `rows` rows: whole batches only with `drop_last`, else the
/// last one may be partial.
pub fn batch_count(rows: u64, batch_size: u64, drop_last: bool) -> u64 {
    let batch_size = batch_size.max(1);
    if drop_last {
        rows / batch_size
    } else {
        rows.div_ceil(batch_size)
    }
}

/// The epoch's row order before sharding: row groups permuted by `(seed, epoch)` when
/// `shuffle`, kept in order otherwise.
pub fn epoch_sequence(row_groups: &[Range<u64>], seed: u64, epoch: u64, shuffle: bool) -> Rows {
    let mut order: Vec<usize> = (0..row_groups.len()).collect();
    if shuffle {
        let mut rng = SplitMix64::new(mix(&[SEQUENCE_STREAM, seed, epoch]));
        rng.shuffle(&mut order);
    }
    let mut rows = Vec::with_capacity(order.len());
    for index in order {
        push_merged(&mut rows, row_groups[index].clone());
    }
    rows
}

/// A sequence of rows with prefix sums, so positions map to global indices in `O(log n)`.
#[derive(Debug, Clone, Default)]
pub struct Sequence {
    ranges: Rows,
    starts: Vec<u64>,
    total: u64,
}

impl Sequence {
    /// Indexes `ranges` (empty ranges are dropped).
    pub fn new(ranges: Rows) -> Self {
        let mut starts = Vec::with_capacity(ranges.len());
        let mut kept = Vec::with_capacity(ranges.len());
        let mut total = 0;
        for range in ranges.into_iter().filter(|r| r.end > r.start) {
            starts.push(total);
            total += range.end - range.start;
            kept.push(range);
        }
        Self {
            ranges: kept,
            starts,
            total,
        }
    }

    /// Number of rows.
    pub fn len(&self) -> u64 {
        self.total
    }

    /// Whether the sequence holds no row.
    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// The ranges, in order.
    pub fn ranges(&self) -> &[Range<u64>] {
        &self.ranges
    }

    /// Global index of the row at `position` (`position < len`).
    pub fn at(&self, position: u64) -> u64 {
        let i = self.starts.partition_point(|&s| s <= position) - 1;
        self.ranges[i].start + (position - self.starts[i])
    }

    /// Rows at positions `[start, start + len)`, wrapping past the end back to position 0.
    pub fn slice_wrapped(&self, start: u64, len: u64) -> Rows {
        let mut out = Vec::new();
        if self.total == 0 {
            return out;
        }
        let mut position = start % self.total;
        let mut left = len;
        while left > 0 {
            let take = left.min(self.total - position);
            self.slice_into(position, position + take, &mut out);
            left -= take;
            position = 0;
        }
        out
    }

    /// Rows at positions `[start, end)` (`end <= len`).
    pub fn slice(&self, start: u64, end: u64) -> Rows {
        let mut out = Vec::new();
        self.slice_into(start, end, &mut out);
        out
    }

    fn slice_into(&self, start: u64, end: u64, out: &mut Rows) {
        if start >= end {
            return;
        }
        let mut i = self.starts.partition_point(|&s| s <= start) - 1;
        let mut position = start;
        while position < end {
            let range = &self.ranges[i];
            let from = range.start + (position - self.starts[i]);
            let to = range.end.min(from + (end - position));
            push_merged(out, from..to);
            position += to - from;
            i += 1;
        }
    }
}

/// The plan of one epoch for a given number of ranks (the epoch sequence, or after a resize the
/// rows left over, sharded).
#[derive(Debug, Clone)]
pub struct EpochPlan {
    sequence: Sequence,
    config: PlanConfig,
    epoch: u64,
    depth: u64,
}

impl EpochPlan {
    /// The plan of `epoch` over `row_groups` (global ranges in file order). `history` lists the
    /// parts of this epoch that already ran with other numbers of ranks, oldest first; the plan
    /// then covers only the rows none of them delivered.
    pub fn new(
        row_groups: &[Range<u64>],
        config: &PlanConfig,
        epoch: u64,
        history: &[Resumed],
    ) -> Self {
        let mut sequence = Sequence::new(epoch_sequence(
            row_groups,
            config.seed,
            epoch,
            config.shuffle,
        ));
        for (depth, earlier) in history.iter().enumerate() {
            let old = Self {
                sequence,
                config: PlanConfig {
                    size: earlier.size,
                    window: earlier.window,
                    drop_last: earlier.drop_last,
                    batch_size: earlier.batch_size,
                    ..config.clone()
                },
                epoch,
                depth: depth as u64,
            };
            let mut left = Vec::new();
            for rank in 0..earlier.size {
                for range in old.rank(rank).remaining(earlier.offset) {
                    push_merged(&mut left, range);
                }
            }
            sequence = Sequence::new(left);
        }
        Self {
            sequence,
            config: config.clone(),
            epoch,
            depth: history.len() as u64,
        }
    }

    /// Rows of the sequence this plan shards.
    pub fn total_rows(&self) -> u64 {
        self.sequence.len()
    }

    /// The plan of one rank.
    pub fn rank(&self, rank: u32) -> RankPlan {
        let per_rank = rows_per_rank(self.sequence.len(), self.config.size, self.config.drop_last);
        let rows = Sequence::new(
            self.sequence
                .slice_wrapped(u64::from(rank) * per_rank, per_rank),
        );
        let batches = batch_count(per_rank, self.config.batch_size, self.config.drop_last);
        let delivered = per_rank.min(batches * self.config.batch_size);
        RankPlan {
            rows,
            batches,
            delivered,
            window: self.config.window.max(1),
            block: self.config.batch_size.max(1) as usize,
            shuffle: self.config.shuffle,
            seed: mix(&[
                WINDOW_STREAM,
                self.config.seed,
                self.epoch,
                u64::from(rank),
                self.depth,
            ]),
        }
    }
}

/// One rank's part of an epoch: its rows (unshuffled order) and the windowed shuffle over them.
#[derive(Debug, Clone)]
pub struct RankPlan {
    rows: Sequence,
    batches: u64,
    delivered: u64,
    window: u64,
    block: usize,
    shuffle: bool,
    seed: u64,
}

impl RankPlan {
    /// The rank's rows in reading (unshuffled) order.
    pub fn rows(&self) -> &Sequence {
        &self.rows
    }

    /// Number of rows the rank reads.
    pub fn len(&self) -> u64 {
        self.rows.len()
    }

    /// Whether the rank reads nothing.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Batches the rank hands out.
    pub fn batches(&self) -> u64 {
        self.batches
    }

    /// Rows the rank hands out (`batches * batch_size`, or all rows without `drop_last`).
    pub fn delivered_rows(&self) -> u64 {
        self.delivered
    }

    /// Rows per shuffle window.
    pub fn window(&self) -> u64 {
        self.window
    }

    /// Number of windows over the rank's rows.
    pub fn window_count(&self) -> u64 {
        self.rows.len().div_ceil(self.window)
    }

    /// Positions `[start, end)` of window `index` in the rank's rows.
    pub fn window_bounds(&self, index: u64) -> Range<u64> {
        let start = index * self.window;
        start..(start + self.window).min(self.rows.len())
    }

    /// The order of window `index`: output position `i` of the window takes the window's row
    /// `permutation[i]` (identity without shuffle). Each block of `batch_size` positions is
    /// in ascending order.
    pub fn window_permutation(&self, index: u64) -> Vec<u32> {
        let bounds = self.window_bounds(index);
        let n = (bounds.end - bounds.start) as usize;
        let mut order: Vec<u32> = (0..n as u32).collect();
        if self.shuffle {
            SplitMix64::new(mix(&[self.seed, index])).shuffle(&mut order);
            sort_blocks(&mut order, self.block);
        }
        order
    }

    /// Global index of the row handed out at `position` of this rank's output.
    pub fn output_row(&self, position: u64) -> u64 {
        let index = position / self.window;
        let start = index * self.window;
        let permutation = self.window_permutation(index);
        self.rows
            .at(start + u64::from(permutation[(position - start) as usize]))
    }

    /// The rows of this rank not yet handed out after `offset` rows (including the ones
    /// `drop_last` would drop): the rest of the current window (sorted) and the later windows.
    pub fn remaining(&self, offset: u64) -> Rows {
        let len = self.rows.len();
        if offset >= len {
            return Vec::new();
        }
        let index = offset / self.window;
        let bounds = self.window_bounds(index);
        let permutation = self.window_permutation(index);
        let mut partial: Vec<u64> = permutation[(offset - bounds.start) as usize..]
            .iter()
            .map(|&i| self.rows.at(bounds.start + u64::from(i)))
            .collect();
        partial.sort_unstable();
        let mut out = Vec::new();
        for row in partial {
            push_merged(&mut out, row..row + 1);
        }
        for range in self.rows.slice(bounds.end, len) {
            push_merged(&mut out, range);
        }
        out
    }
}

/// Appends `range`, merging it into the last range when they touch.
fn push_merged(rows: &mut Rows, range: Range<u64>) {
    if range.start >= range.end {
        return;
    }
    if let Some(last) = rows.last_mut() {
        if last.end == range.start {
            last.end = range.end;
            return;
        }
    }
    rows.push(range);
}

const SEQUENCE_STREAM: u64 = 0x6b6f_6c6f_7365_7131;
const WINDOW_STREAM: u64 = 0x6b6f_6c6f_7769_6e31;

/// Mixes several words into one seed (SplitMix64 finaliser chained over the words); stable
/// across versions so saved loader states stay valid.
fn mix(words: &[u64]) -> u64 {
    words.iter().fold(0x9e37_79b9_7f4a_7c15, |h, &w| {
        SplitMix64::new(h ^ w.wrapping_mul(0xbf58_476d_1ce4_e5b9)).next_u64()
    })
}

/// SplitMix64: a small, fast generator whose output is fixed forever (unlike `rand`'s `StdRng`),
/// so plans stay reproducible across kolo versions.
#[derive(Debug)]
struct SplitMix64(u64);

/// Sorts every `block`-long chunk of the permutation `order` of `0..order.len()` in place,
/// in linear time: a row's chunk is its position's, and walking the rows in ascending order
/// fills each chunk in ascending order (a bucket pass; sorting each chunk cost as much as
/// gathering the window's columns).
fn sort_blocks(order: &mut [u32], block: usize) {
    let block = block.max(1);
    let mut chunk_of = vec![0u32; order.len()];
    // By block, not `position / block`: a division per row cost as much as the shuffle.
    for (chunk, rows) in order.chunks(block).enumerate() {
        for &row in rows {
            chunk_of[row as usize] = chunk as u32;
        }
    }
    let mut next: Vec<usize> = (0..order.len().div_ceil(block))
        .map(|c| c * block)
        .collect();
    for (row, &chunk) in chunk_of.iter().enumerate() {
        let slot = &mut next[chunk as usize];
        order[*slot] = row as u32;
        *slot += 1;
    }
}

impl SplitMix64 {
    fn new(seed: u64) -> Self {
        Self(seed)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, bound)` (Lemire's multiply-and-reject: a draw whose low half is under
    /// `2^64 mod bound` is drawn again).
    fn below(&mut self, bound: u64) -> u64 {
        let mut product = u128::from(self.next_u64()) * u128::from(bound);
        // The threshold is below `bound`, so only a low half under `bound` can be rejected:
        // the division that finds the threshold is paid once in a while, not on every draw.
        if (product as u64) < bound {
            let threshold = bound.wrapping_neg() % bound;
            while (product as u64) < threshold {
                product = u128::from(self.next_u64()) * u128::from(bound);
            }
        }
        (product >> 64) as u64
    }

    /// Fisher–Yates.
    fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            items.swap(i, j);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    fn groups(sizes: &[u64]) -> Rows {
        let mut start = 0;
        sizes
            .iter()
            .map(|&n| {
                let r = start..start + n;
                start += n;
                r
            })
            .collect()
    }

    const GOLDEN_ROWS: [u64; 12] = [902, 907, 912, 915, 916, 920, 939, 941, 900, 911, 921, 935];
    const GOLDEN_DRAWS: [u64; 6] = [
        6839728766377637708,
        1474913046063446145,
        2569641874231381929,
        8007990562831494533,
        3135310438806241003,
        5704490196125334488,
    ];

    fn config(size: u32, batch: u64, drop_last: bool, window: u64) -> PlanConfig {
        PlanConfig {
            size,
            batch_size: batch,
            seed: 11,
            shuffle: true,
            drop_last,
            window,
        }
    }

    /// Every row the rank hands out, in order.
    fn output(plan: &RankPlan, from: u64) -> Vec<u64> {
        (from..plan.delivered_rows())
            .map(|p| plan.output_row(p))
            .collect()
    }

    fn counts(rows: impl IntoIterator<Item = u64>) -> BTreeMap<u64, u64> {
        let mut map = BTreeMap::new();
        for row in rows {
            *map.entry(row).or_default() += 1;
        }
        map
    }

    fn expand(rows: &[Range<u64>]) -> Vec<u64> {
        rows.iter().flat_map(|r| r.clone()).collect()
    }

    #[test]
    fn drop_and_wrap_row_counts() {
        let rg = groups(&[10, 3, 7]);
        let drop = EpochPlan::new(&rg, &config(3, 4, true, 5), 0, &[]);
        let wrap = EpochPlan::new(&rg, &config(3, 4, false, 5), 0, &[]);
        for rank in 0..3 {
            assert_eq!(drop.rank(rank).len(), 6);
            assert_eq!(drop.rank(rank).batches(), 1);
            assert_eq!(drop.rank(rank).delivered_rows(), 4);
            assert_eq!(wrap.rank(rank).len(), 7);
            assert_eq!(wrap.rank(rank).batches(), 2);
            assert_eq!(wrap.rank(rank).delivered_rows(), 7);
        }
    }

    #[test]
    fn wrap_with_more_ranks_than_rows() {
        let rg = groups(&[2]);
        let plan = EpochPlan::new(&rg, &config(5, 1, false, 4), 0, &[]);
        let all: Vec<u64> = (0..5).flat_map(|r| output(&plan.rank(r), 0)).collect();
        assert_eq!(all.len(), 5);
        assert!(all.contains(&0) && all.contains(&1));
    }

    #[test]
    fn unshuffled_plan_is_in_order() {
        let rg = groups(&[4, 4]);
        let mut cfg = config(2, 2, true, 3);
        cfg.shuffle = false;
        let plan = EpochPlan::new(&rg, &cfg, 5, &[]);
        assert_eq!(output(&plan.rank(0), 0), vec![0, 1, 2, 3]);
        assert_eq!(output(&plan.rank(1), 0), vec![4, 5, 6, 7]);
    }

    #[test]
    fn same_seed_same_plan_other_epoch_other_plan() {
        let rg = groups(&[50; 20]);
        let cfg = config(2, 8, true, 64);
        let a = output(&EpochPlan::new(&rg, &cfg, 3, &[]).rank(1), 0);
        let b = output(&EpochPlan::new(&rg, &cfg, 3, &[]).rank(1), 0);
        let c = output(&EpochPlan::new(&rg, &cfg, 4, &[]).rank(1), 0);
        let mut other_seed = cfg.clone();
        other_seed.seed = 12;
        let d = output(&EpochPlan::new(&rg, &other_seed, 3, &[]).rank(1), 0);
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_ne!(a, d);
    }

    #[test]
    fn sorting_blocks_in_one_pass_equals_sorting_each_block() {
        for (n, block) in [
            (1000usize, 64usize),
            (1000, 1000),
            (1000, 1),
            (1001, 256),
            (0, 8),
        ] {
            let mut order: Vec<u32> = (0..n as u32).collect();
            SplitMix64::new(n as u64 + 7).shuffle(&mut order);
            let mut expected = order.clone();
            for chunk in expected.chunks_mut(block) {
                chunk.sort_unstable();
            }
            sort_blocks(&mut order, block);
            assert_eq!(order, expected, "n={n} block={block}");
        }
    }

    #[test]
    fn plans_are_the_same_in_every_version() {
        // Saved loader positions name rows by the plan: a change of generator, of its use or
        // of the shuffle would hand out other rows on resume. These are kolo 0.1's.
        let rg = groups(&[50; 20]);
        let plan = EpochPlan::new(&rg, &config(2, 8, true, 64), 3, &[]).rank(1);
        let rows: Vec<u64> = output(&plan, 0).into_iter().take(12).collect();
        assert_eq!(rows, GOLDEN_ROWS);
        // Bounds just over 2^63 reject half of the draws: the retry path is pinned too.
        let mut rng = SplitMix64::new(42);
        let draws: Vec<u64> = (0..6).map(|_| rng.below((1 << 63) + 3)).collect();
        assert_eq!(draws, GOLDEN_DRAWS);
    }

    #[test]
    fn shuffle_is_a_permutation() {
        let mut order: Vec<u32> = (0..1000).collect();
        SplitMix64::new(3).shuffle(&mut order);
        assert_ne!(order, (0..1000).collect::<Vec<_>>());
        order.sort_unstable();
        assert_eq!(order, (0..1000).collect::<Vec<_>>());
    }

    #[test]
    fn sequence_slices_wrap() {
        let seq = Sequence::new(vec![10..13, 20..22]);
        assert_eq!(seq.len(), 5);
        assert_eq!(seq.at(3), 20);
        assert_eq!(seq.slice_wrapped(4, 4), vec![21..22, 10..13]);
        assert_eq!(
            seq.slice_wrapped(0, 11),
            vec![10..13, 20..22, 10..13, 20..22, 10..11]
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        /// Without drop_last, every row appears at least once and all ranks have the same
        /// number of batches; with no remainder every row appears exactly once.
        #[test]
        fn wrap_covers_every_row(
            sizes in prop::collection::vec(1u64..40, 1..8),
            size in 1u32..6,
            batch in 1u64..9,
            window in 1u64..30,
            seed in any::<u64>(),
            epoch in 0u64..4,
        ) {
            let rg = groups(&sizes);
            let total: u64 = sizes.iter().sum();
            let mut cfg = config(size, batch, false, window);
            cfg.seed = seed;
            let plan = EpochPlan::new(&rg, &cfg, epoch, &[]);
            let batches: Vec<u64> = (0..size).map(|r| plan.rank(r).batches()).collect();
            prop_assert!(batches.iter().all(|&b| b == batches[0]));
            let all: Vec<u64> = (0..size).flat_map(|r| output(&plan.rank(r), 0)).collect();
            let seen = counts(all.iter().copied());
            prop_assert_eq!(seen.len() as u64, total);
            if total.is_multiple_of(u64::from(size)) {
                prop_assert!(seen.values().all(|&c| c == 1));
            }
        }

        /// With drop_last every rank hands out the same number of whole batches, no row twice.
        #[test]
        fn drop_last_is_balanced_and_unique(
            sizes in prop::collection::vec(1u64..40, 1..8),
            size in 1u32..6,
            batch in 1u64..9,
            window in 1u64..30,
            seed in any::<u64>(),
        ) {
            let rg = groups(&sizes);
            let total: u64 = sizes.iter().sum();
            let mut cfg = config(size, batch, true, window);
            cfg.seed = seed;
            let plan = EpochPlan::new(&rg, &cfg, 1, &[]);
            let expected = total / u64::from(size) / batch;
            for r in 0..size {
                prop_assert_eq!(plan.rank(r).batches(), expected);
                prop_assert_eq!(plan.rank(r).len(), total / u64::from(size));
            }
            let all: Vec<u64> = (0..size).flat_map(|r| output(&plan.rank(r), 0)).collect();
            prop_assert_eq!(all.len() as u64, expected * batch * u64::from(size));
            prop_assert!(counts(all).values().all(|&c| c == 1));
        }

        /// Resuming at any offset yields exactly the rest of the rank's output.
        #[test]
        fn resume_same_size_is_exact(
            sizes in prop::collection::vec(1u64..40, 1..8),
            size in 1u32..4,
            window in 1u64..30,
            seed in any::<u64>(),
            cut in 0.0f64..1.0,
        ) {
            let rg = groups(&sizes);
            let mut cfg = config(size, 3, false, window);
            cfg.seed = seed;
            let plan = EpochPlan::new(&rg, &cfg, 2, &[]).rank(size - 1);
            let offset = (plan.delivered_rows() as f64 * cut) as u64;
            let full = output(&plan, 0);
            let again = EpochPlan::new(&rg, &cfg, 2, &[]).rank(size - 1);
            prop_assert_eq!(&output(&again, offset)[..], &full[offset as usize..]);
            // The remaining rows are the multiset of the rest.
            let mut rest = full[offset as usize..].to_vec();
            rest.sort_unstable();
            let mut remaining = expand(&plan.remaining(offset));
            remaining.sort_unstable();
            prop_assert_eq!(remaining, rest);
        }

        /// Resuming with another number of ranks hands out exactly the rows not yet handed out
        /// (as a multiset, when the new plan has no remainder), balanced over the new ranks;
        /// resizing twice works the same way.
        #[test]
        fn resume_resized_is_the_remaining_multiset(
            sizes in prop::collection::vec(1u64..40, 1..8),
            old_size in 1u32..5,
            new_size in 1u32..5,
            third_size in 1u32..5,
            window in 1u64..30,
            seed in any::<u64>(),
            cut in 0.0f64..1.0,
            cut2 in 0.0f64..1.0,
        ) {
            let rg = groups(&sizes);
            let mut cfg = config(old_size, 2, false, window);
            cfg.seed = seed;
            let old = EpochPlan::new(&rg, &cfg, 0, &[]);
            let offset = (old.rank(0).delivered_rows() as f64 * cut) as u64;
            let mut expected = Vec::new();
            for r in 0..old_size {
                expected.extend(output(&old.rank(r), 0)[offset as usize..].iter().copied());
            }
            let history = [Resumed { size: old_size, offset, window, drop_last: false, batch_size: 2 }];
            let new_cfg = PlanConfig { size: new_size, ..cfg.clone() };
            let new = EpochPlan::new(&rg, &new_cfg, 0, &history);
            prop_assert_eq!(new.total_rows(), expected.len() as u64);
            let got: Vec<u64> = (0..new_size).flat_map(|r| output(&new.rank(r), 0)).collect();
            let batches: Vec<u64> = (0..new_size).map(|r| new.rank(r).batches()).collect();
            prop_assert!(batches.iter().all(|&b| b == batches[0]));
            if (expected.len() as u64).is_multiple_of(u64::from(new_size)) {
                prop_assert_eq!(counts(got), counts(expected.iter().copied()));
            } else {
                let want = counts(expected.iter().copied());
                let have = counts(got);
                prop_assert!(want.keys().all(|k| have.contains_key(k)));
                prop_assert!(have.keys().all(|k| want.contains_key(k)));
            }
            // A second resize from the middle of the resumed part.
            let offset2 = (new.rank(0).delivered_rows() as f64 * cut2) as u64;
            let mut expected2 = Vec::new();
            for r in 0..new_size {
                expected2.extend(output(&new.rank(r), 0)[offset2 as usize..].iter().copied());
            }
            let history2 = [history[0], Resumed { size: new_size, offset: offset2, window, drop_last: false, batch_size: 2 }];
            let third = EpochPlan::new(&rg, &PlanConfig { size: third_size, ..cfg }, 0, &history2);
            prop_assert_eq!(third.total_rows(), expected2.len() as u64);
        }
    }
}

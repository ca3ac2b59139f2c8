//! The deterministic train/validation split and the balanced file plan.

/// SplitMix64's finalizer: a fast, well-mixed 64-bit hash.
fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Decides, from the seed and a row's position in the scan order, whether a row goes to
/// validation: the row's hash, read as a number in [0, 1), is below `ratio`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RatioSplit {
    seed_hash: u64,
    threshold: u64,
}

impl RatioSplit {
    /// A split sending about `ratio` (in [0, 1)) of the rows to validation.
    pub(crate) fn new(ratio: f64, seed: u64) -> Self {
        // The 53-bit fraction of the hash is compared against ratio * 2^53, exactly.
        let threshold = (ratio * (1u64 << 53) as f64) as u64;
        Self {
            seed_hash: splitmix64(seed),
            threshold,
        }
    }

    /// Whether the row at `index` of the scan order is a validation row.
    pub(crate) fn is_validation(&self, index: u64) -> bool {
        (splitmix64(self.seed_hash ^ index) >> 11) < self.threshold
    }

    /// How many of the first `rows` rows are validation rows.
    pub(crate) fn count_validation(&self, rows: u64) -> u64 {
        (0..rows).filter(|&i| self.is_validation(i)).count() as u64
    }
}

/// Rows per output file: `rows` spread over `min(files, rows)` files, the first
/// `rows % files` files holding one row more than the rest.
pub(crate) fn balanced_plan(rows: u64, files: usize) -> Vec<u64> {
    let files = (files as u64).min(rows);
    if files == 0 {
        return Vec::new();
    }
    let base = rows / files;
    let extra = rows % files;
    (0..files).map(|i| base + u64::from(i < extra)).collect()
}

/// Horovod's rule for the validation file count: the train file count scaled by the
/// validation share of the rows, but at least one file per process.
pub(crate) fn validation_files(
    train_files: usize,
    num_processes: usize,
    val_rows: u64,
    total_rows: u64,
) -> usize {
    if total_rows == 0 {
        return num_processes;
    }
    let scaled = (train_files as u128 * u128::from(val_rows) / u128::from(total_rows)) as usize;
    scaled.max(num_processes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn same_seed_same_split_other_seed_other_split() {
        let a = RatioSplit::new(0.3, 7);
        let b = RatioSplit::new(0.3, 7);
        let c = RatioSplit::new(0.3, 8);
        let pick = |s: &RatioSplit| (0..1000).map(|i| s.is_validation(i)).collect::<Vec<_>>();
        assert_eq!(pick(&a), pick(&b));
        assert_ne!(pick(&a), pick(&c));
    }

    #[test]
    fn ratio_is_respected_roughly() {
        let split = RatioSplit::new(0.2, 42);
        let val = split.count_validation(100_000);
        assert!(
            (19_000..21_000).contains(&val),
            "{val} validation rows of 100000"
        );
        assert_eq!(RatioSplit::new(0.0, 1).count_validation(10_000), 0);
    }

    #[test]
    fn plan_is_balanced_and_complete() {
        assert_eq!(balanced_plan(10, 4), vec![3, 3, 2, 2]);
        assert_eq!(balanced_plan(3, 8), vec![1, 1, 1]);
        assert_eq!(balanced_plan(0, 8), Vec::<u64>::new());
        assert_eq!(balanced_plan(8, 8), vec![1; 8]);
    }

    #[test]
    fn validation_files_follow_horovod() {
        assert_eq!(validation_files(20, 2, 10, 100), 2);
        assert_eq!(validation_files(100, 2, 30, 100), 30);
        assert_eq!(validation_files(4, 4, 1, 1000), 4);
    }

    proptest! {
        #[test]
        fn plan_sums_to_rows_within_one(rows in 0u64..100_000, files in 1usize..500) {
            let plan = balanced_plan(rows, files);
            prop_assert_eq!(plan.iter().sum::<u64>(), rows);
            prop_assert_eq!(plan.len() as u64, rows.min(files as u64));
            if let (Some(max), Some(min)) = (plan.iter().max(), plan.iter().min()) {
                prop_assert!(max - min <= 1);
                prop_assert!(*min >= 1);
            }
        }
    }
}

//! Horovod's run layout under a store prefix: intermediate data sets, and one directory per
//! training run with its checkpoint and logs.
//!
//! ```
//! use kolo_store::layout;
//! assert_eq!(layout::train_data(Some(0)), "intermediate_train_data.0");
//! assert_eq!(layout::checkpoint("run_1"), "runs/run_1/checkpoint");
//! assert_eq!(layout::logs("run_1"), "runs/run_1/logs");
//! ```

/// Directory of the prepared training data.
pub const TRAIN_DATA: &str = "intermediate_train_data";
/// Directory of the prepared validation data.
pub const VAL_DATA: &str = "intermediate_val_data";
/// Directory of the prepared test data.
pub const TEST_DATA: &str = "intermediate_test_data";
/// Directory holding one directory per run.
pub const RUNS: &str = "runs";
/// File name of a run's checkpoint.
pub const CHECKPOINT: &str = "checkpoint";
/// Subdirectory of a run's logs.
pub const LOGS: &str = "logs";

/// `intermediate_train_data[.<idx>]`.
pub fn train_data(idx: Option<usize>) -> String {
    indexed(TRAIN_DATA, idx)
}

/// `intermediate_val_data[.<idx>]`.
pub fn val_data(idx: Option<usize>) -> String {
    indexed(VAL_DATA, idx)
}

/// `intermediate_test_data[.<idx>]`.
pub fn test_data(idx: Option<usize>) -> String {
    indexed(TEST_DATA, idx)
}

/// `runs/<run_id>`.
pub fn run(run_id: &str) -> String {
    format!("{RUNS}/{run_id}")
}

/// `runs/<run_id>/checkpoint`.
pub fn checkpoint(run_id: &str) -> String {
    format!("{RUNS}/{run_id}/{CHECKPOINT}")
}

/// `runs/<run_id>/logs`.
pub fn logs(run_id: &str) -> String {
    format!("{RUNS}/{run_id}/{LOGS}")
}

fn indexed(base: &str, idx: Option<usize>) -> String {
    match idx {
        Some(idx) => format!("{base}.{idx}"),
        None => base.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_horovod() {
        assert_eq!(train_data(None), "intermediate_train_data");
        assert_eq!(val_data(Some(3)), "intermediate_val_data.3");
        assert_eq!(test_data(Some(1)), "intermediate_test_data.1");
        assert_eq!(run("r"), "runs/r");
    }
}

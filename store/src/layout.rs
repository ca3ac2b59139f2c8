//! Horovod's run layout under a store prefix: intermediate data sets, and one directory per
//! training run with its checkpoint and logs.
//!
//! ```
//! use kolo_store::layout;
//! assert_eq!(layout::train_data(Some(0)), "intermediate_train_data.0");
//! assert_eq!(layout::checkpoint("run_1").unwrap(), "runs/run_1/checkpoint");
//! assert_eq!(layout::logs("run_1").unwrap(), "runs/run_1/logs");
//! assert!(layout::run("../other").is_err());
//! ```

use crate::error::Result;
use crate::key::check_run_id;

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

/// `runs/<run_id>`; [`crate::Error::InvalidRunId`] unless `run_id` passes [`check_run_id`].
pub fn run(run_id: &str) -> Result<String> {
    Ok(format!("{RUNS}/{}", check_run_id(run_id)?))
}

/// `runs/<run_id>/checkpoint` (`run_id` checked as by [`run`]).
pub fn checkpoint(run_id: &str) -> Result<String> {
    Ok(format!("{}/{CHECKPOINT}", run(run_id)?))
}

/// `runs/<run_id>/logs` (`run_id` checked as by [`run`]).
pub fn logs(run_id: &str) -> Result<String> {
    Ok(format!("{}/{LOGS}", run(run_id)?))
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
        assert_eq!(run("r").unwrap(), "runs/r");
        for bad in ["..", "../x", "a/../../b", "/abs", "a\0b", ""] {
            assert!(
                matches!(checkpoint(bad), Err(crate::Error::InvalidRunId { .. })),
                "{bad:?}"
            );
        }
    }
}

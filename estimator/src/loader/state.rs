//! The loader's position, as saved in checkpoints, and where a saved one resumes.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::plan::Resumed;

/// Version of the state format.
pub const STATE_VERSION: u32 = 1;

/// Where a loader stands: enough to continue exactly (same ranks and batch size) or to hand
/// out the rest of the epoch over another number of ranks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoaderState {
    /// Format version.
    pub version: u32,
    /// The current epoch.
    pub epoch: u64,
    /// Rows of this epoch this rank has handed to the caller (not merely prefetched).
    pub offset: u64,
    /// Seed of every shuffle.
    pub seed: u64,
    /// Number of ranks.
    pub size: u32,
    /// This rank.
    pub rank: u32,
    /// Rows per batch.
    pub batch_size: u64,
    /// Remainder policy.
    pub drop_last: bool,
    /// Whether rows are shuffled.
    pub shuffle: bool,
    /// Rows per shuffle window.
    pub shuffle_buffer_size: u64,
    /// The dataset's fingerprint.
    pub fingerprint: String,
    /// Earlier parts of this epoch that ran with other settings, oldest first.
    #[serde(default)]
    pub history: Vec<Resumed>,
}

/// A position in the stream of epochs.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Position {
    /// Epoch.
    pub epoch: u64,
    /// Rows handed out in it (of the plan `history` leads to).
    pub offset: u64,
    /// Earlier parts of the epoch.
    pub history: Vec<Resumed>,
}

/// The settings of the running loader that a state is resumed into.
#[derive(Debug, Clone)]
pub struct Current<'a> {
    /// Its seed.
    pub seed: u64,
    /// Its shuffle flag.
    pub shuffle: bool,
    /// Its number of ranks.
    pub size: u32,
    /// Its batch size.
    pub batch_size: u64,
    /// Its remainder policy.
    pub drop_last: bool,
    /// Its shuffle window.
    pub window: u64,
    /// Its dataset's fingerprint.
    pub fingerprint: &'a str,
    /// Its dataset's URL (for messages).
    pub url: &'a str,
}

impl LoaderState {
    /// The state as JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|e| unreachable!("a state serializes: {e}"))
    }

    /// A state from [`LoaderState::to_json`]'s output.
    pub fn from_json(json: &str) -> Result<LoaderState> {
        serde_json::from_str(json).map_err(|e| {
            Error::InvalidArgument(format!(
                "not a kolo loader state ({e}); pass what state_dict() returned"
            ))
        })
    }

    /// Where `self` continues in a loader with `current`'s settings: the same position when
    /// nothing that shapes the plan changed, else the rest of the epoch as a new part.
    pub fn resume_position(&self, current: &Current<'_>) -> Result<Position> {
        if self.version != STATE_VERSION {
            return Err(Error::InvalidArgument(format!(
                "loader state version {} is not supported (this kolo writes {STATE_VERSION})",
                self.version
            )));
        }
        if self.fingerprint != current.fingerprint {
            return Err(Error::DatasetChanged {
                url: current.url.to_string(),
                saved: self.fingerprint.clone(),
                current: current.fingerprint.to_string(),
            });
        }
        if self.seed != current.seed || self.shuffle != current.shuffle {
            return Err(Error::InvalidArgument(format!(
                "the loader state was saved with seed={} shuffle={}, but this loader has \
                 seed={} shuffle={}; create the loader with the saved seed and shuffle",
                self.seed, self.shuffle, current.seed, current.shuffle
            )));
        }
        if self.size == 0 || self.batch_size == 0 || self.shuffle_buffer_size == 0 {
            return Err(Error::InvalidArgument(
                "the loader state has size, batch_size or shuffle_buffer_size 0".into(),
            ));
        }
        let same = self.size == current.size
            && self.batch_size == current.batch_size
            && self.drop_last == current.drop_last
            && self.shuffle_buffer_size == current.window;
        if same || (self.offset == 0 && self.history.is_empty()) {
            return Ok(Position {
                epoch: self.epoch,
                offset: if same { self.offset } else { 0 },
                history: self.history.clone(),
            });
        }
        let mut history = self.history.clone();
        history.push(Resumed {
            size: self.size,
            offset: self.offset,
            window: self.shuffle_buffer_size,
            drop_last: self.drop_last,
            batch_size: self.batch_size,
        });
        Ok(Position {
            epoch: self.epoch,
            offset: 0,
            history,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> LoaderState {
        LoaderState {
            version: STATE_VERSION,
            epoch: 2,
            offset: 64,
            seed: 1,
            size: 2,
            rank: 0,
            batch_size: 32,
            drop_last: true,
            shuffle: true,
            shuffle_buffer_size: 1000,
            fingerprint: "ab".into(),
            history: vec![],
        }
    }

    fn current(size: u32) -> Current<'static> {
        Current {
            seed: 1,
            shuffle: true,
            size,
            batch_size: 32,
            drop_last: true,
            window: 1000,
            fingerprint: "ab",
            url: "file:///d",
        }
    }

    #[test]
    fn same_settings_continue_in_place() {
        let position = state().resume_position(&current(2)).unwrap();
        assert_eq!((position.epoch, position.offset), (2, 64));
        assert!(position.history.is_empty());
    }

    #[test]
    fn another_size_starts_a_new_part() {
        let position = state().resume_position(&current(3)).unwrap();
        assert_eq!(position.offset, 0);
        assert_eq!(
            position.history,
            vec![Resumed {
                size: 2,
                offset: 64,
                window: 1000,
                drop_last: true,
                batch_size: 32
            }]
        );
        let json = serde_json::to_string(&state()).unwrap();
        let back: LoaderState = serde_json::from_str(&json).unwrap();
        assert_eq!(back, state());
    }

    #[test]
    fn a_changed_dataset_or_seed_is_refused() {
        let mut other = current(2);
        other.fingerprint = "cd";
        let err = state().resume_position(&other).unwrap_err();
        assert!(matches!(err, Error::DatasetChanged { .. }), "{err}");
        let mut other = current(2);
        other.seed = 9;
        assert!(state().resume_position(&other).is_err());
    }
}

//! kolo-estimator: the data path for training (preparation, metadata, shard planning, loader).
#![warn(missing_docs)]

mod error;
pub mod loader;
pub mod metadata;
pub mod plan;
pub mod prepare;

pub use error::{Error, Result};

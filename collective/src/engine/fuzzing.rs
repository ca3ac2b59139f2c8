//! Entry points for the fuzz targets in `collective/fuzz` (compiled only with the `fuzzing`
//! feature): the engine's crate-private [`CycleMessage`](super::message::CycleMessage) codec,
//! exposed as it is and nothing more.

use super::message;
use crate::wire::{FrameError, OpDescriptor};

/// A decoded cycle message (see `engine/message.rs`).
#[derive(Debug, Clone, PartialEq)]
pub struct CycleMessage(message::CycleMessage);

impl CycleMessage {
    /// Decodes `bytes` as a message from a job of `world` ranks whose response cache has
    /// `capacity` entries (what the engine does with every peer's message).
    pub fn decode(bytes: &[u8], world: usize, capacity: usize) -> Result<Self, FrameError> {
        message::CycleMessage::decode(bytes, world, capacity).map(CycleMessage)
    }

    /// The message's bytes.
    pub fn encode(&self) -> Vec<u8> {
        self.0.encode()
    }

    /// The flag byte.
    pub fn flags(&self) -> u8 {
        self.0.flags
    }

    /// The cache bit words.
    pub fn bits(&self) -> &[u64] {
        &self.0.bits
    }

    /// The set cache bits, ascending.
    pub fn bit_indices(&self) -> Vec<usize> {
        self.0.bit_indices().collect()
    }

    /// The full descriptors.
    pub fn requests(&self) -> &[OpDescriptor] {
        &self.0.requests
    }
}

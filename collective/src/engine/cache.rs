//! The response cache: descriptors that ran before, each under a bit. Once a tensor ran, a
//! rank that submits it again with the same arguments sends only its bit; tensors whose bit
//! every rank sends run without negotiating. Every rank updates its cache from the same
//! responses in the same order, so the caches (and the bits) stay identical everywhere.
//!
//! Entries are shared (`Arc`): a tensor agreed through its bit is answered with the cached
//! descriptor itself, a pointer copy, never a copy of the descriptor.

use std::collections::HashMap;
use std::sync::Arc;

use crate::wire::{OpDescriptor, OpKind};

#[derive(Debug)]
struct Entry {
    desc: Arc<OpDescriptor>,
    used: u64,
}

/// A least-recently-used map from tensor name to descriptor, with a stable bit per entry.
#[derive(Debug)]
pub(crate) struct ResponseCache {
    capacity: usize,
    slots: Vec<Option<Entry>>,
    by_name: HashMap<String, usize>,
    clock: u64,
    /// Where the next look-up tries first: the bit after the last hit. A step's tensors are
    /// cached in the order they first ran, under consecutive bits, and submitted in the same
    /// order every step, so a step's look-ups compare one descriptor each instead of hashing
    /// its name. Only a guess: it never changes what a look-up returns.
    next_guess: usize,
}

impl ResponseCache {
    pub(crate) fn new(capacity: usize) -> Self {
        ResponseCache {
            capacity,
            slots: Vec::new(),
            by_name: HashMap::new(),
            clock: 0,
            next_guess: 0,
        }
    }

    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// Whether ops of `kind` are cached: those whose descriptor is the same on every rank.
    pub(crate) fn cacheable(kind: OpKind) -> bool {
        matches!(
            kind,
            OpKind::Allreduce | OpKind::Broadcast | OpKind::Reducescatter
        )
    }

    /// The bit of `desc` if the cache holds exactly it (same name, same arguments).
    pub(crate) fn lookup(&mut self, desc: &OpDescriptor) -> Option<usize> {
        // A name is under at most one bit, so the entry at the guessed bit being exactly
        // `desc` is the same answer the name's index would give.
        let holds = |slot: usize| matches!(self.slots.get(slot), Some(Some(e)) if *e.desc == *desc);
        let slot = Some(self.next_guess)
            .filter(|&guess| holds(guess))
            .or_else(|| {
                self.by_name
                    .get(&desc.name)
                    .copied()
                    .filter(|&slot| holds(slot))
            })?;
        self.next_guess = slot + 1;
        Some(slot)
    }

    /// The descriptor under `bit`.
    pub(crate) fn get(&self, bit: usize) -> Option<&Arc<OpDescriptor>> {
        self.slots.get(bit)?.as_ref().map(|e| &e.desc)
    }

    /// Records that `desc` ran (on every rank alike): inserts or refreshes it, evicting the
    /// least recently used entry when full.
    pub(crate) fn put(&mut self, desc: &Arc<OpDescriptor>) {
        if self.capacity == 0 || !Self::cacheable(desc.kind) || desc.name.is_empty() {
            return;
        }
        self.clock += 1;
        let used = self.clock;
        if let Some(&slot) = self.by_name.get(&desc.name) {
            self.slots[slot] = Some(Entry {
                desc: Arc::clone(desc),
                used,
            });
            return;
        }
        let slot = if self.slots.len() < self.capacity {
            self.slots.push(None);
            self.slots.len() - 1
        } else {
            let (slot, _) = self
                .slots
                .iter()
                .enumerate()
                .min_by_key(|(_, e)| e.as_ref().map_or(0, |e| e.used))
                .unwrap_or((0, &None));
            if let Some(old) = self.slots[slot].take() {
                self.by_name.remove(&old.desc.name);
            }
            slot
        };
        self.by_name.insert(desc.name.clone(), slot);
        self.slots[slot] = Some(Entry {
            desc: Arc::clone(desc),
            used,
        });
    }

    /// Marks the entry under `bit` used now.
    pub(crate) fn touch(&mut self, bit: usize) {
        self.clock += 1;
        if let Some(Some(entry)) = self.slots.get_mut(bit) {
            entry.used = self.clock;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;

    fn desc(name: &str, len: i64) -> OpDescriptor {
        OpDescriptor {
            dtype: DType::F32,
            shape: vec![len],
            ..OpDescriptor::new(OpKind::Allreduce, name)
        }
    }

    fn shared(name: &str, len: i64) -> Arc<OpDescriptor> {
        Arc::new(desc(name, len))
    }

    #[test]
    fn hits_need_identical_arguments_and_eviction_is_lru() {
        let mut c = ResponseCache::new(2);
        c.put(&shared("a", 1));
        c.put(&shared("b", 1));
        assert_eq!(c.lookup(&desc("a", 1)), Some(0));
        assert_eq!(c.lookup(&desc("a", 2)), None, "another shape is a miss");
        c.touch(0);
        c.put(&shared("c", 1));
        assert_eq!(c.lookup(&desc("b", 1)), None, "b was least recently used");
        assert_eq!(c.lookup(&desc("c", 1)), Some(1));
        c.put(&shared("a", 2));
        assert_eq!(
            c.lookup(&desc("a", 2)),
            Some(0),
            "a refreshed keeps its bit"
        );
        assert_eq!(c.get(1).map(|d| d.name.as_str()), Some("c"));
    }

    #[test]
    fn the_guessed_bit_answers_exactly_as_the_name_index() {
        let mut c = ResponseCache::new(8);
        for (i, name) in ["a", "b", "c", "d"].into_iter().enumerate() {
            c.put(&shared(name, i as i64));
        }
        // A step in cache order: each look-up hits the bit after the last.
        for (i, name) in ["a", "b", "c", "d"].into_iter().enumerate() {
            assert_eq!(c.lookup(&desc(name, i as i64)), Some(i));
        }
        // Out of order, the name index answers; a changed argument at the guessed bit (the
        // entry after `a` is `b`) misses whichever way it is found.
        assert_eq!(c.lookup(&desc("c", 2)), Some(2));
        assert_eq!(c.lookup(&desc("a", 0)), Some(0));
        assert_eq!(c.lookup(&desc("b", 7)), None, "another shape");
        let mut other_dtype = desc("b", 1);
        other_dtype.dtype = DType::F64;
        assert_eq!(c.lookup(&other_dtype), None, "another dtype");
        let mut other_op = desc("b", 1);
        other_op.op = Some(crate::dtype::ReduceOp::Max);
        assert_eq!(c.lookup(&other_op), None, "another reduction");
        assert_eq!(c.lookup(&desc("b", 1)), Some(1));
        // The cached entry is the shared descriptor itself.
        let d = shared("e", 9);
        c.put(&d);
        assert!(Arc::ptr_eq(c.get(4).unwrap(), &d));
    }

    #[test]
    fn capacity_zero_and_uncacheable_kinds_store_nothing() {
        let mut c = ResponseCache::new(0);
        c.put(&shared("a", 1));
        assert_eq!(c.lookup(&desc("a", 1)), None);
        let mut c = ResponseCache::new(4);
        let gather = OpDescriptor::new(OpKind::Allgather, "g");
        c.put(&Arc::new(gather.clone()));
        assert_eq!(c.lookup(&gather), None);
    }
}

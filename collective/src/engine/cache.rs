//! The response cache: descriptors that ran before, each under a bit. Once a tensor ran, a
//! rank that submits it again with the same arguments sends only its bit; tensors whose bit
//! every rank sends run without negotiating. Every rank updates its cache from the same
//! responses in the same order, so the caches (and the bits) stay identical everywhere.

use std::collections::HashMap;

use crate::wire::{OpDescriptor, OpKind};

#[derive(Debug)]
struct Entry {
    desc: OpDescriptor,
    used: u64,
}

/// A least-recently-used map from tensor name to descriptor, with a stable bit per entry.
#[derive(Debug)]
pub(crate) struct ResponseCache {
    capacity: usize,
    slots: Vec<Option<Entry>>,
    by_name: HashMap<String, usize>,
    clock: u64,
}

impl ResponseCache {
    pub(crate) fn new(capacity: usize) -> Self {
        ResponseCache {
            capacity,
            slots: Vec::new(),
            by_name: HashMap::new(),
            clock: 0,
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

    /// The bit of `desc` if the cache holds exactly it.
    pub(crate) fn lookup(&self, desc: &OpDescriptor) -> Option<usize> {
        let &slot = self.by_name.get(&desc.name)?;
        let entry = self.slots[slot].as_ref()?;
        (entry.desc == *desc).then_some(slot)
    }

    /// The descriptor under `bit`.
    pub(crate) fn get(&self, bit: usize) -> Option<&OpDescriptor> {
        self.slots.get(bit)?.as_ref().map(|e| &e.desc)
    }

    /// Records that `desc` ran (on every rank alike): inserts or refreshes it, evicting the
    /// least recently used entry when full.
    pub(crate) fn put(&mut self, desc: &OpDescriptor) {
        if self.capacity == 0 || !Self::cacheable(desc.kind) || desc.name.is_empty() {
            return;
        }
        self.clock += 1;
        let used = self.clock;
        if let Some(&slot) = self.by_name.get(&desc.name) {
            self.slots[slot] = Some(Entry {
                desc: desc.clone(),
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
            desc: desc.clone(),
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

    #[test]
    fn hits_need_identical_arguments_and_eviction_is_lru() {
        let mut c = ResponseCache::new(2);
        c.put(&desc("a", 1));
        c.put(&desc("b", 1));
        assert_eq!(c.lookup(&desc("a", 1)), Some(0));
        assert_eq!(c.lookup(&desc("a", 2)), None, "another shape is a miss");
        c.touch(0);
        c.put(&desc("c", 1));
        assert_eq!(c.lookup(&desc("b", 1)), None, "b was least recently used");
        assert_eq!(c.lookup(&desc("c", 1)), Some(1));
        c.put(&desc("a", 2));
        assert_eq!(
            c.lookup(&desc("a", 2)),
            Some(0),
            "a refreshed keeps its bit"
        );
        assert_eq!(c.get(1).map(|d| d.name.as_str()), Some("c"));
    }

    #[test]
    fn capacity_zero_and_uncacheable_kinds_store_nothing() {
        let mut c = ResponseCache::new(0);
        c.put(&desc("a", 1));
        assert_eq!(c.lookup(&desc("a", 1)), None);
        let mut c = ResponseCache::new(4);
        let gather = OpDescriptor::new(OpKind::Allgather, "g");
        c.put(&gather);
        assert_eq!(c.lookup(&gather), None);
    }
}

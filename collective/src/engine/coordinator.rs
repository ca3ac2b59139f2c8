//! Agreement on what runs. Every member of a process set sees every member's
//! [`CycleMessage`] each cycle and runs the same deterministic decision on them, so all ranks
//! reach the same [`Decision`] without a second round trip: which tensors are now submitted
//! everywhere (or by every rank that has not joined), in which order, and which disagree.
//! Rank 0's copy also feeds the stall inspector.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::cache::ResponseCache;
use super::message::{CycleMessage, FLAG_JOINED, FLAG_SHUTDOWN, FLAG_STALL_ABORT};
use crate::collectives::{check_sizes, difference, label};
use crate::wire::{OpDescriptor, OpKind};

/// What one agreed entry does.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Response {
    /// Run the collective: every member's descriptor (joined members get one that contributes
    /// nothing), or a single descriptor that is every member's (a tensor agreed through the
    /// cache). `cached`: agreed through the cache bits alone.
    Run {
        descs: Vec<OpDescriptor>,
        cached: bool,
    },
    /// The ranks disagree (or the op cannot run now): fail it everywhere.
    Fail { name: String, message: String },
    /// Stalled past the shutdown time: fail it everywhere with a timeout.
    Stalled { name: String, message: String },
    /// Every member has joined; `last` joined last.
    Join { last: usize },
}

/// The outcome of one cycle, identical on every member.
#[derive(Debug, Default)]
pub(crate) struct Decision {
    pub responses: Vec<Response>,
    /// A member asked to shut down (the lowest such rank).
    pub shutdown_by: Option<usize>,
}

/// Members (group ranks, ascending) that sent the same message.
#[derive(Debug, Clone)]
pub(crate) struct Senders {
    pub msg: CycleMessage,
    pub ranks: Vec<usize>,
}

#[derive(Debug)]
struct Pending {
    seq: u64,
    descs: Vec<Option<OpDescriptor>>,
    since: Instant,
    /// Every rank so far sent only its cache bit (no full descriptor).
    from_bits: bool,
}

/// One process set's agreement state (the same on every member).
#[derive(Debug)]
pub(crate) struct Coordinator {
    size: usize,
    pub(crate) cache: ResponseCache,
    table: HashMap<String, Pending>,
    next_seq: u64,
    joined: Vec<bool>,
    last_joined: usize,
}

impl Coordinator {
    pub(crate) fn new(size: usize, cache_capacity: usize) -> Self {
        Coordinator {
            size,
            cache: ResponseCache::new(cache_capacity),
            table: HashMap::new(),
            next_seq: 0,
            joined: vec![false; size],
            last_joined: 0,
        }
    }

    /// Decides the cycle from every member's message (indexed by group rank).
    #[cfg(test)]
    pub(crate) fn decide(&mut self, msgs: &[CycleMessage], now: Instant) -> Decision {
        let groups: Vec<Senders> = msgs
            .iter()
            .enumerate()
            .map(|(r, m)| Senders {
                msg: m.clone(),
                ranks: vec![r],
            })
            .collect();
        self.decide_grouped(&groups, now)
    }

    /// Decides the cycle from every member's message, members that sent the same message
    /// grouped (every group rank in exactly one group). The same decision as from the messages
    /// one by one, at a cost that grows with the distinct messages and the tensors, not with
    /// the members, when the messages agree.
    pub(crate) fn decide_grouped(&mut self, groups: &[Senders], now: Instant) -> Decision {
        let mut decision = Decision {
            shutdown_by: groups
                .iter()
                .filter(|g| g.msg.has(FLAG_SHUTDOWN))
                .filter_map(|g| g.ranks.iter().copied().min())
                .min(),
            ..Decision::default()
        };
        let mut newly: Vec<usize> = groups
            .iter()
            .filter(|g| g.msg.has(FLAG_JOINED))
            .flat_map(|g| g.ranks.iter().copied())
            .filter(|&r| r < self.size && !self.joined[r])
            .collect();
        newly.sort_unstable();
        for &r in &newly {
            self.joined[r] = true;
        }
        if let Some(&last) = newly.last() {
            self.last_joined = last;
        }

        // Cache bits: those every active member sent run at once; the rest wait in the table.
        let any_joined = self.joined.iter().any(|&j| j);
        let active = self.joined.iter().filter(|&&j| !j).count();
        let mut counts: HashMap<usize, usize> = HashMap::new();
        for g in groups {
            let senders = if any_joined {
                g.ranks.iter().filter(|&&r| !self.joined[r]).count()
            } else {
                g.ranks.len()
            };
            if senders == 0 {
                continue;
            }
            for bit in g.msg.bit_indices() {
                *counts.entry(bit).or_default() += senders;
            }
        }
        let mut everywhere: Vec<usize> = counts
            .iter()
            .filter(|&(&bit, &n)| {
                n == active
                    && self
                        .cache
                        .get(bit)
                        .is_some_and(|d| !self.table.contains_key(&d.name))
            })
            .map(|(&bit, _)| bit)
            .collect();
        everywhere.sort_unstable();
        // Members whose message needs per-member work (bits that wait, descriptors), in rank
        // order: the table's entries are numbered in the order of the first sender.
        let mut order: Vec<(usize, usize)> = groups
            .iter()
            .enumerate()
            .filter(|(_, g)| {
                !g.msg.requests.is_empty()
                    || g.msg
                        .bit_indices()
                        .any(|bit| everywhere.binary_search(&bit).is_err())
            })
            .flat_map(|(i, g)| g.ranks.iter().map(move |&r| (r, i)))
            .collect();
        order.sort_unstable();
        for &(r, i) in &order {
            for bit in groups[i].msg.bit_indices() {
                if everywhere.binary_search(&bit).is_err() {
                    if let Some(desc) = self.cache.get(bit).cloned() {
                        self.insert(r, desc, now, true);
                    }
                }
            }
        }
        for &bit in &everywhere {
            if let Some(desc) = self.cache.get(bit).cloned() {
                // Every member announced the cached descriptor: it agreed everywhere and
                // passed `check_sizes` when it was cached, so nothing is compared again.
                self.cache.touch(bit);
                // One descriptor stands for every member's (see `Response::Run`): copying it
                // per member would cost O(n) per tensor per cycle on every rank.
                decision.responses.push(Response::Run {
                    descs: vec![desc],
                    cached: true,
                });
            }
        }

        for &(r, i) in &order {
            for desc in &groups[i].msg.requests {
                self.insert(r, desc.clone(), now, false);
            }
        }
        let mut ready: Vec<(u64, String)> = self
            .table
            .iter()
            .filter(|(_, p)| {
                p.descs
                    .iter()
                    .zip(&self.joined)
                    .all(|(d, &joined)| d.is_some() || joined)
            })
            .map(|(name, p)| (p.seq, name.clone()))
            .collect();
        ready.sort_unstable();
        for (_, name) in ready {
            if let Some(pending) = self.table.remove(&name) {
                let response = self.finish(pending.descs);
                decision.responses.push(match response {
                    Response::Run { descs, .. } => Response::Run {
                        descs,
                        cached: pending.from_bits,
                    },
                    other => other,
                });
            }
        }

        let first = groups.iter().find(|g| g.ranks.contains(&0));
        if first.is_some_and(|g| g.msg.has(FLAG_STALL_ABORT)) {
            let report = self.stall_report(now, Duration::ZERO);
            for (name, missing) in report {
                self.table.remove(&name);
                decision.responses.push(Response::Stalled {
                    message: format!(
                        "waiting for ranks {missing:?} to submit '{name}'; the stall inspector gave up on it \
                         (KOLO_STALL_SHUTDOWN_TIME_SECONDS); check that every rank runs the same collectives"
                    ),
                    name,
                });
            }
        }
        if self.joined.iter().all(|&j| j) {
            decision.responses.push(Response::Join {
                last: self.last_joined,
            });
            self.joined.iter_mut().for_each(|j| *j = false);
        }
        decision
    }

    fn insert(&mut self, rank: usize, desc: OpDescriptor, now: Instant, from_bit: bool) {
        let size = self.size;
        let seq = &mut self.next_seq;
        let pending = self.table.entry(desc.name.clone()).or_insert_with(|| {
            *seq += 1;
            Pending {
                seq: *seq,
                descs: vec![None; size],
                since: now,
                from_bits: true,
            }
        });
        pending.from_bits &= from_bit;
        pending.descs[rank] = Some(desc);
    }

    /// Turns the descriptors of an entry that every active member submitted into its
    /// response, and records it in the cache.
    fn finish(&mut self, descs: Vec<Option<OpDescriptor>>) -> Response {
        let Some((first, reference)) = descs
            .iter()
            .enumerate()
            .find_map(|(r, d)| d.clone().map(|d| (r, d)))
        else {
            return Response::Fail {
                name: String::new(),
                message: "an entry without descriptors (this is a bug in kolo)".into(),
            };
        };
        let name = reference.name.clone();
        let what = || label(reference.kind, &reference.name);
        for (j, d) in descs.iter().enumerate() {
            let Some(d) = d else { continue };
            let mut message = difference(&reference, first, d, j);
            let member_list = matches!(
                reference.kind,
                OpKind::AddProcessSet | OpKind::RemoveProcessSet
            );
            if message.is_none() && member_list && d.splits != reference.splits {
                message = Some(format!(
                    "{}: rank {first} passes {:?} but rank {j} passes {:?}; every rank must pass the same \
                     process set",
                    what(),
                    reference.splits, d.splits
                ));
            }
            if let Some(message) = message {
                return Response::Fail { name, message };
            }
        }
        let joined: Vec<usize> = (0..self.size)
            .filter(|&r| descs[r].is_none() && self.joined[r])
            .collect();
        // As in Horovod 0.28.1 (`Controller::ConstructResponse`): only allreduce (joined ranks
        // stand in with zeros) and barrier run while some ranks have joined; anything else
        // fails on the ranks that called it, which then join too.
        if !joined.is_empty() && !matches!(reference.kind, OpKind::Allreduce | OpKind::Barrier) {
            let hint = if reference.kind == OpKind::Allgather {
                " (a DistributedOptimizer with sparse gradients allgathers them: pass \
                 sparse_as_dense=True)"
            } else {
                ""
            };
            return Response::Fail {
                name,
                message: format!(
                    "{} is not supported while ranks {joined:?} have joined (hvd.join()), as in \
                     Horovod; only allreduce and barrier are{hint}",
                    what()
                ),
            };
        }
        let all: Vec<OpDescriptor> = descs
            .into_iter()
            .map(|d| d.unwrap_or_else(|| reference.clone()))
            .collect();
        // Sizes a peer announced are checked here, alike on every rank, before any rank
        // computes or allocates with them (a bad one fails the op everywhere, like a mismatch).
        if let Some(message) = check_sizes(&all) {
            return Response::Fail { name, message };
        }
        if all.iter().all(|d| *d == all[0]) {
            self.cache.put(&all[0]);
        }
        Response::Run {
            descs: all,
            cached: false,
        }
    }

    /// Entries waiting longer than `older_than`, with the ranks that have not submitted them,
    /// oldest first.
    pub(crate) fn stall_report(
        &self,
        now: Instant,
        older_than: Duration,
    ) -> Vec<(String, Vec<usize>)> {
        let mut stalled: Vec<(u64, String, Vec<usize>)> = self
            .table
            .iter()
            .filter(|(_, p)| now.saturating_duration_since(p.since) >= older_than)
            .map(|(name, p)| {
                let missing = (0..self.size)
                    .filter(|&r| p.descs[r].is_none() && !self.joined[r])
                    .collect();
                (p.seq, name.clone(), missing)
            })
            .collect();
        stalled.sort_unstable();
        stalled.into_iter().map(|(_, n, m)| (n, m)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::{DType, ReduceOp};

    fn desc(name: &str, len: i64) -> OpDescriptor {
        OpDescriptor {
            dtype: DType::F32,
            shape: vec![len],
            op: Some(ReduceOp::Sum),
            ..OpDescriptor::new(OpKind::Allreduce, name)
        }
    }

    fn full(descs: &[OpDescriptor]) -> CycleMessage {
        CycleMessage {
            requests: descs.to_vec(),
            ..CycleMessage::default()
        }
    }

    fn names(d: &Decision) -> Vec<String> {
        d.responses
            .iter()
            .map(|r| match r {
                Response::Run { descs, .. } => descs[0].name.clone(),
                Response::Fail { name, .. } | Response::Stalled { name, .. } => format!("!{name}"),
                Response::Join { last } => format!("join{last}"),
            })
            .collect()
    }

    #[test]
    fn runs_what_every_rank_submitted_in_submission_order() {
        let mut c = Coordinator::new(2, 8);
        let now = Instant::now();
        let d = c.decide(
            &[full(&[desc("a", 1), desc("b", 1)]), full(&[desc("b", 1)])],
            now,
        );
        assert_eq!(names(&d), ["b"]);
        let d = c.decide(&[full(&[]), full(&[desc("a", 1)])], now);
        assert_eq!(names(&d), ["a"]);
    }

    #[test]
    fn cached_tensors_agree_through_bits() {
        let mut c = Coordinator::new(2, 8);
        let now = Instant::now();
        c.decide(&[full(&[desc("a", 1)]), full(&[desc("a", 1)])], now);
        let bit = c.cache.lookup(&desc("a", 1)).expect("cached after running");
        let mut m = CycleMessage::default();
        m.set_bit(bit);
        let d = c.decide(&[m.clone(), m.clone()], now);
        assert!(matches!(
            &d.responses[..],
            [Response::Run { cached: true, .. }]
        ));
        // A bit from one rank waits for the other's.
        assert!(c
            .decide(&[m.clone(), CycleMessage::default()], now)
            .responses
            .is_empty());
        let d = c.decide(&[CycleMessage::default(), m], now);
        assert!(
            matches!(&d.responses[..], [Response::Run { cached: true, .. }]),
            "agreed through bits sent in different cycles: still a cache hit"
        );
        // A full descriptor from one rank makes it a miss.
        let mut bits = CycleMessage::default();
        bits.set_bit(bit);
        c.decide(&[bits, CycleMessage::default()], now);
        let d = c.decide(&[CycleMessage::default(), full(&[desc("a", 1)])], now);
        assert!(matches!(
            &d.responses[..],
            [Response::Run { cached: false, .. }]
        ));
    }

    #[test]
    fn a_changed_shape_against_a_cached_one_is_a_mismatch_on_every_rank() {
        let mut c = Coordinator::new(2, 8);
        let now = Instant::now();
        c.decide(&[full(&[desc("a", 1)]), full(&[desc("a", 1)])], now);
        let mut bits = CycleMessage::default();
        bits.set_bit(c.cache.lookup(&desc("a", 1)).unwrap());
        let d = c.decide(&[bits, full(&[desc("a", 2)])], now);
        match &d.responses[..] {
            [Response::Fail { message, .. }] => {
                assert!(message.contains("rank 0 has float32 [1] but rank 1 has float32 [2]"))
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn joined_ranks_count_as_ready_for_allreduce_only_and_join_completes_when_all_joined() {
        let mut c = Coordinator::new(3, 0);
        let now = Instant::now();
        let joined = CycleMessage {
            flags: FLAG_JOINED,
            ..CycleMessage::default()
        };
        let d = c.decide(
            &[full(&[desc("a", 4)]), joined.clone(), full(&[desc("a", 4)])],
            now,
        );
        assert_eq!(names(&d), ["a"]);
        let gather = OpDescriptor {
            shape: vec![3, 2],
            ..OpDescriptor::new(OpKind::Allgather, "g")
        };
        let d = c.decide(
            &[
                full(std::slice::from_ref(&gather)),
                joined.clone(),
                joined.clone(),
            ],
            now,
        );
        match &d.responses[..] {
            [Response::Fail { message, .. }] => {
                assert!(message.contains("not supported while ranks [1, 2] have joined"))
            }
            other => panic!("{other:?}"),
        }
        let scatter = OpDescriptor {
            shape: vec![3],
            op: Some(ReduceOp::Sum),
            ..OpDescriptor::new(OpKind::Reducescatter, "r")
        };
        assert_eq!(
            names(&c.decide(&[full(&[scatter]), joined.clone(), joined.clone()], now)),
            ["!r"]
        );
        let d = c.decide(&[joined.clone(), joined.clone(), joined], now);
        assert_eq!(names(&d), ["join0"], "rank 0 joined last");
    }

    #[test]
    fn the_stall_report_names_missing_ranks_and_abort_fails_them() {
        let mut c = Coordinator::new(3, 0);
        let start = Instant::now();
        c.decide(
            &[full(&[desc("x", 1)]), full(&[]), full(&[desc("x", 1)])],
            start,
        );
        let later = start + Duration::from_secs(5);
        assert_eq!(
            c.stall_report(later, Duration::from_secs(2)),
            vec![("x".to_owned(), vec![1])]
        );
        assert!(c.stall_report(later, Duration::from_secs(10)).is_empty());
        let abort = CycleMessage {
            flags: FLAG_STALL_ABORT,
            ..CycleMessage::default()
        };
        let d = c.decide(&[abort, full(&[]), full(&[])], later);
        assert_eq!(names(&d), ["!x"]);
        assert!(c.stall_report(later, Duration::ZERO).is_empty());
    }
}

//! Agreement on what runs. Every member of a process set sees every member's
//! [`CycleMessage`] each cycle and runs the same deterministic decision on them, so all ranks
//! reach the same [`Decision`] without a second round trip: which tensors are now submitted
//! everywhere (or by every rank that has not joined), in which order, and which disagree.
//! Rank 0's copy also feeds the stall inspector.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::cache::ResponseCache;
use super::message::{CycleMessage, FLAG_JOINED, FLAG_SHUTDOWN, FLAG_STALL_ABORT};
use super::negotiation::normalize_ranges;
use crate::collectives::{check_sizes, check_sizes_uniform, difference, label};
use crate::wire::{OpDescriptor, OpKind};

/// What one agreed entry does.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Response {
    /// Run the collective: every member's descriptor (joined members get one that contributes
    /// nothing), or a single descriptor that is every member's (whenever all members' are
    /// equal, e.g. a tensor agreed through the cache). `cached`: agreed through the cache bits
    /// alone. Shared: a cached tensor's is the cache's own descriptor (a pointer copy).
    Run {
        descs: Vec<Arc<OpDescriptor>>,
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

/// Members that sent the same message.
#[derive(Debug, Clone)]
pub(crate) struct Senders {
    pub msg: CycleMessage,
    /// Disjoint ranges of group ranks, ascending (a digest's ranges, never expanded rank by
    /// rank: a cached cycle costs the same whatever the set's size).
    pub ranks: Vec<Range<usize>>,
}

impl Senders {
    fn members(&self) -> impl Iterator<Item = usize> + '_ {
        self.ranks.iter().flat_map(|r| r.clone())
    }

    fn count(&self) -> usize {
        self.ranks.iter().map(|r| r.len()).sum()
    }

    fn first(&self) -> Option<usize> {
        self.ranks.iter().map(|r| r.start).min()
    }

    fn contains(&self, rank: usize) -> bool {
        self.ranks.iter().any(|r| r.contains(&rank))
    }
}

/// Members that submitted one shared descriptor of an entry.
#[derive(Debug)]
struct Part {
    desc: Arc<OpDescriptor>,
    /// Disjoint, ascending ranges of group ranks.
    ranks: Vec<Range<usize>>,
}

impl Part {
    fn first(&self) -> Option<usize> {
        self.ranks.first().map(|r| r.start)
    }
}

#[derive(Debug)]
struct Pending {
    seq: u64,
    /// Who submitted which descriptor: one shared descriptor per message group (or cache
    /// bit) with the ranges of members that sent it, so a step's entries cost O(distinct
    /// messages) whatever the set's size, and comparing members is a pointer check.
    parts: Vec<Part>,
    /// Members with a descriptor so far (each counted once).
    submitted: usize,
    since: Instant,
    /// Every rank so far sent only its cache bit (no full descriptor).
    from_bits: bool,
}

impl Pending {
    /// Records that the members `ranks` submitted `desc` (replacing what they submitted
    /// before, as a member's later descriptor of a name replaces its earlier one).
    fn add(&mut self, desc: Arc<OpDescriptor>, ranks: &[Range<usize>]) {
        for part in &mut self.parts {
            self.submitted -= subtract(&mut part.ranks, ranks);
        }
        self.parts.retain(|p| !p.ranks.is_empty());
        if ranks.is_empty() {
            return;
        }
        self.submitted += ranks.iter().map(|r| r.len()).sum::<usize>();
        match self.parts.iter_mut().find(|p| Arc::ptr_eq(&p.desc, &desc)) {
            Some(part) => {
                part.ranks.extend(ranks.iter().cloned());
                normalize_ranges(&mut part.ranks);
            }
            None => self.parts.push(Part {
                desc,
                ranks: ranks.to_vec(),
            }),
        }
    }

    /// Each member's descriptor (`None`: not submitted), indexed by group rank.
    fn by_member(&self, size: usize) -> Vec<Option<&Arc<OpDescriptor>>> {
        by_member(&self.parts, size)
    }

    /// The members that have neither submitted nor joined.
    fn missing(&self, joined: &[bool]) -> Vec<usize> {
        self.by_member(joined.len())
            .iter()
            .zip(joined)
            .enumerate()
            .filter(|(_, (d, &j))| d.is_none() && !j)
            .map(|(r, _)| r)
            .collect()
    }

    /// Every member submitted or joined (`any_joined`: some member has joined).
    fn is_ready(&self, joined: &[bool], any_joined: bool) -> bool {
        self.submitted == joined.len() || (any_joined && self.missing(joined).is_empty())
    }
}

/// Each member's descriptor in `parts` (`None`: not submitted), indexed by group rank.
fn by_member(parts: &[Part], size: usize) -> Vec<Option<&Arc<OpDescriptor>>> {
    let mut out = vec![None; size];
    for part in parts {
        for r in part.ranks.iter().flat_map(|r| r.clone()) {
            if let Some(slot) = out.get_mut(r) {
                *slot = Some(&part.desc);
            }
        }
    }
    out
}

/// Removes `cut` from `ranges` (both disjoint and ascending); returns how many ranks it removed.
fn subtract(ranges: &mut Vec<Range<usize>>, cut: &[Range<usize>]) -> usize {
    let overlaps = |r: &Range<usize>| cut.iter().any(|c| c.start < r.end && r.start < c.end);
    if !ranges.iter().any(overlaps) {
        return 0;
    }
    let before: usize = ranges.iter().map(|r| r.len()).sum();
    let mut out = Vec::with_capacity(ranges.len() + cut.len());
    for r in ranges.drain(..) {
        let mut pieces = vec![r];
        for c in cut {
            pieces = pieces
                .into_iter()
                .flat_map(|p| [p.start..p.end.min(c.start), p.start.max(c.end)..p.end])
                .filter(|p| !p.is_empty())
                .collect();
        }
        out.extend(pieces);
    }
    *ranges = out;
    before - ranges.iter().map(|r| r.len()).sum::<usize>()
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
                ranks: std::iter::once(r..r + 1).collect(),
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
                .filter_map(Senders::first)
                .min(),
            ..Decision::default()
        };
        let mut newly: Vec<usize> = groups
            .iter()
            .filter(|g| g.msg.has(FLAG_JOINED))
            .flat_map(Senders::members)
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
        // How many active members sent each bit, indexed by bit (the longest message's words
        // hold every bit; bits are below the cache's capacity, checked when it was decoded).
        let words = groups.iter().map(|g| g.msg.bits.len()).max().unwrap_or(0);
        let mut counts: Vec<usize> = vec![0; words * 64];
        for g in groups {
            let senders = if any_joined {
                g.members().filter(|&r| !self.joined[r]).count()
            } else {
                g.count()
            };
            if senders == 0 {
                continue;
            }
            for bit in g.msg.bit_indices() {
                counts[bit] += senders;
            }
        }
        let everywhere: Vec<usize> = counts
            .iter()
            .enumerate()
            .filter(|&(bit, &n)| {
                n == active
                    && self
                        .cache
                        .get(bit)
                        .is_some_and(|d| self.table.is_empty() || !self.table.contains_key(&d.name))
            })
            .map(|(bit, _)| bit)
            .collect();
        decision.responses.reserve(everywhere.len());
        // Groups whose message needs more than the bits every member sent (bits that wait,
        // descriptors), in the order of their first member: the table's entries are numbered
        // in the order of the first sender.
        let mut order: Vec<usize> = (0..groups.len())
            .filter(|&i| {
                let g = &groups[i];
                !g.msg.requests.is_empty()
                    || g.msg
                        .bit_indices()
                        .any(|bit| everywhere.binary_search(&bit).is_err())
            })
            .collect();
        order.sort_by_key(|&i| groups[i].first());
        // One shared descriptor per cache bit (the cache's own) and per group's request, however
        // many members sent it, recorded once per group with the group's ranges.
        for &i in &order {
            for bit in groups[i].msg.bit_indices() {
                if everywhere.binary_search(&bit).is_err() {
                    if let Some(desc) = self.cache.get(bit).map(Arc::clone) {
                        self.insert(&groups[i].ranks, desc, now, true);
                    }
                }
            }
        }
        for &bit in &everywhere {
            if let Some(desc) = self.cache.get(bit).map(Arc::clone) {
                // Every member announced the cached descriptor: it agreed everywhere and
                // passed `check_sizes` when it was cached, so nothing is compared again.
                self.cache.touch(bit);
                // One descriptor stands for every member's (see `Response::Run`), and it is the
                // cache's: copying it per member would cost O(n) per tensor per cycle on every
                // rank, copying it at all one allocation per tensor per cycle.
                decision.responses.push(Response::Run {
                    descs: vec![desc],
                    cached: true,
                });
            }
        }

        for &i in &order {
            for desc in &groups[i].msg.requests {
                self.insert(&groups[i].ranks, Arc::new(desc.clone()), now, false);
            }
        }
        let mut ready: Vec<(u64, String)> = self
            .table
            .iter()
            .filter(|(_, p)| p.is_ready(&self.joined, any_joined))
            .map(|(name, p)| (p.seq, name.clone()))
            .collect();
        ready.sort_unstable();
        for (_, name) in ready {
            if let Some(pending) = self.table.remove(&name) {
                let response = self.finish(pending.parts);
                decision.responses.push(match response {
                    Response::Run { descs, .. } => Response::Run {
                        descs,
                        cached: pending.from_bits,
                    },
                    other => other,
                });
            }
        }

        let first = groups.iter().find(|g| g.contains(0));
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

    /// Records that the members `ranks` submitted `desc`.
    fn insert(
        &mut self,
        ranks: &[Range<usize>],
        desc: Arc<OpDescriptor>,
        now: Instant,
        from_bit: bool,
    ) {
        let pending = match self.table.get_mut(&desc.name) {
            Some(pending) => pending,
            None => {
                self.next_seq += 1;
                self.table.entry(desc.name.clone()).or_insert(Pending {
                    seq: self.next_seq,
                    parts: Vec::new(),
                    submitted: 0,
                    since: now,
                    from_bits: true,
                })
            }
        };
        pending.from_bits &= from_bit;
        let size = self.size;
        let inside: Vec<Range<usize>> = ranks
            .iter()
            .map(|r| r.start.min(size)..r.end.min(size))
            .filter(|r| !r.is_empty())
            .collect();
        pending.add(desc, &inside);
    }

    /// Turns the descriptors of an entry that every active member submitted into its
    /// response, and records it in the cache.
    fn finish(&mut self, parts: Vec<Part>) -> Response {
        let Some((first, reference)) = parts
            .iter()
            .filter_map(|p| p.first().map(|f| (f, Arc::clone(&p.desc))))
            .min_by_key(|&(f, _)| f)
        else {
            return Response::Fail {
                name: String::new(),
                message: "an entry without descriptors (this is a bug in kolo)".into(),
            };
        };
        let name = reference.name.clone();
        let what = || label(reference.kind, &reference.name);
        // Every member's descriptor equals the reference (then one stands for all). Members
        // of one part share a descriptor, so a part is compared once, at its first member:
        // the failure reported is the one of the lowest-ranked member that differs.
        let mut uniform = true;
        let mut failure: Option<(usize, String)> = None;
        for part in &parts {
            let Some(j) = part.first() else { continue };
            let d = &part.desc;
            if Arc::ptr_eq(d, &reference) {
                continue;
            }
            uniform &= **d == *reference;
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
                if failure.as_ref().is_none_or(|(at, _)| j < *at) {
                    failure = Some((j, message));
                }
            }
        }
        if let Some((_, message)) = failure {
            return Response::Fail { name, message };
        }
        let submitted: usize = parts
            .iter()
            .flat_map(|p| p.ranks.iter().map(|r| r.len()))
            .sum();
        let joined: Vec<usize> = if submitted < self.size {
            let by_member = by_member(&parts, self.size);
            (0..self.size)
                .filter(|&r| by_member[r].is_none() && self.joined[r])
                .collect()
        } else {
            Vec::new()
        };
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
        // Sizes a peer announced are checked here, alike on every rank, before any rank
        // computes or allocates with them (a bad one fails the op everywhere, like a mismatch).
        // Joined members stand in with the reference, so they keep the set uniform.
        if uniform {
            if let Some(message) = check_sizes_uniform(&reference, self.size) {
                return Response::Fail { name, message };
            }
            self.cache.put(&reference);
            return Response::Run {
                descs: vec![reference],
                cached: false,
            };
        }
        let all: Vec<Arc<OpDescriptor>> = by_member(&parts, self.size)
            .into_iter()
            .map(|d| Arc::clone(d.unwrap_or(&reference)))
            .collect();
        if let Some(message) = check_sizes(&all) {
            return Response::Fail { name, message };
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
                let missing = p.missing(&self.joined);
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
    fn equal_descriptors_agree_as_one_that_stands_for_every_member() {
        let mut c = Coordinator::new(1024, 8);
        let now = Instant::now();
        let step = full(&[desc("a", 3), desc("b", 5)]);
        let d = c.decide_grouped(
            &[Senders {
                msg: step.clone(),
                ranks: std::iter::once(0..1024).collect(),
            }],
            now,
        );
        match &d.responses[..] {
            [Response::Run {
                descs: a,
                cached: false,
            }, Response::Run {
                descs: b,
                cached: false,
            }] => {
                assert_eq!(a, &vec![Arc::new(desc("a", 3))]);
                assert_eq!(b, &vec![Arc::new(desc("b", 5))]);
            }
            other => panic!("{other:?}"),
        }
        assert!(c.cache.lookup(&desc("a", 3)).is_some(), "cached");
        // Equal descriptors from different message groups still make one.
        let other = full(&[desc("c", 1), desc("x", 1)]);
        let third = full(&[desc("c", 1)]);
        let d = c.decide_grouped(
            &[
                Senders {
                    msg: other,
                    ranks: vec![0..1, 2..1024],
                },
                Senders {
                    msg: third,
                    ranks: std::iter::once(1..2).collect(),
                },
            ],
            now,
        );
        assert!(matches!(&d.responses[..], [Response::Run { descs, .. }] if descs.len() == 1));
        assert_eq!(
            c.stall_report(now, Duration::ZERO),
            vec![("x".to_owned(), vec![1])]
        );
    }

    #[test]
    fn allgather_with_different_first_dims_keeps_every_members_shape() {
        let mut c = Coordinator::new(3, 8);
        let now = Instant::now();
        let g = |rows| OpDescriptor {
            shape: vec![rows, 2],
            ..OpDescriptor::new(OpKind::Allgather, "g")
        };
        let d = c.decide(&[full(&[g(1)]), full(&[g(1)]), full(&[g(4)])], now);
        match &d.responses[..] {
            [Response::Run { descs, .. }] => {
                assert_eq!(descs, &[g(1), g(1), g(4)].map(Arc::new).to_vec())
            }
            other => panic!("{other:?}"),
        }
        assert!(
            c.cache.lookup(&g(1)).is_none(),
            "not cached: the shapes differ"
        );
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
        match &d.responses[..] {
            [Response::Run {
                descs,
                cached: true,
            }] => assert!(
                descs.len() == 1 && Arc::ptr_eq(&descs[0], c.cache.get(bit).unwrap()),
                "the cached response is the cache's descriptor, not a copy"
            ),
            other => panic!("{other:?}"),
        }
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

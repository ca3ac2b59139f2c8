//! Which slots an elastic job runs on after a change of hosts: pure logic over the usable
//! hosts (discovered, not blacklisted; oldest first), the live tasks and `--min-np`/`--max-np`.
//!
//! Horovod (`ElasticDriver._update_host_assignments` over `hosts.get_host_assignments`) fills
//! slots host by host in order up to `max_np`, keeps the workers already on a chosen
//! `(host, slot)`, starts workers on the others, and fails when no previous host remains (no
//! one could send the state). kolo does the same with one difference: when `max_np` cuts,
//! live tasks are kept before free slots are filled, so a healthy rank is never stopped to
//! start a new one in its place. New tasks get task indices from `next_task_index` upwards;
//! an index is never reused.
//!
//! ```
//! use kolo_collective::launcher::planner::{plan, LiveTask, Plan, PlanRequest};
//! use kolo_collective::launcher::HostSlots;
//!
//! let hosts = [HostSlots { host: "a".into(), slots: 2 }, HostSlots { host: "b".into(), slots: 2 }];
//! let live = [LiveTask { task_index: 0, host: "a".into(), slot: 0 }];
//! let request = PlanRequest { hosts: &hosts, live: &live, min_num_proc: 2, max_num_proc: Some(3), next_task_index: 1 };
//! let Plan::Ready(slots) = plan(&request).unwrap() else { panic!() };
//! assert_eq!(slots.size(), 3);
//! assert_eq!(slots.start.iter().map(|t| t.task_index).collect::<Vec<_>>(), [1, 2]);
//! ```

use super::hosts::HostSlots;
use crate::error::{Error, Result};

/// A running task of the job: its task index and the `(host, slot)` it occupies.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LiveTask {
    /// Its task index (never reused within a job).
    pub task_index: u32,
    /// The host entry it runs on.
    pub host: String,
    /// Its slot on that host (0-based, below the host's slot count).
    pub slot: usize,
}

/// The input of [`plan`].
#[derive(Debug, Clone, Copy)]
pub struct PlanRequest<'a> {
    /// The hosts that may get tasks, oldest first (discovery's order without the blacklisted
    /// ones: [`crate::launcher::blacklist::Blacklist::usable`]).
    pub hosts: &'a [HostSlots],
    /// The tasks running now (each `(host, slot)` once).
    pub live: &'a [LiveTask],
    /// `--min-np`: fewer slots than this means wait.
    pub min_num_proc: usize,
    /// `--max-np`: at most this many tasks (`None`: every usable slot).
    pub max_num_proc: Option<usize>,
    /// The first task index a new task may get (above every index ever used).
    pub next_task_index: u32,
}

/// The slots of the next round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotPlan {
    /// Live tasks that keep running, by host order then slot.
    pub keep: Vec<LiveTask>,
    /// New tasks to start, by host order then slot, with increasing task indices.
    pub start: Vec<LiveTask>,
    /// Live tasks that are not in the next round (their host is gone or blacklisted, its slot
    /// count shrank below their slot, or `max_num_proc` leaves no room): stop them.
    pub gone: Vec<LiveTask>,
    /// The first task index free after this plan.
    pub next_task_index: u32,
}

impl SlotPlan {
    /// The job size of the next round.
    pub fn size(&self) -> usize {
        self.keep.len() + self.start.len()
    }
}

/// What [`plan`] decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// Enough slots: run this round.
    Ready(SlotPlan),
    /// Fewer usable slots than `min_num_proc`: wait for more (at most the elastic timeout).
    Wait {
        /// Usable slots now (capped at `max_num_proc`).
        available: usize,
        /// `min_num_proc`.
        needed: usize,
    },
    /// Tasks were running but none of them is on a usable slot any more: nobody is left to
    /// send the training state to new tasks (Horovod: "No hosts from previous set remaining,
    /// unable to broadcast state"); the job fails.
    NoSurvivor {
        /// The tasks that were running.
        lost: Vec<LiveTask>,
    },
}

/// Decides the next round's slots (see the module docs). An `Internal` error for inconsistent
/// input (a `(host, slot)` or task index twice, an index at or above `next_task_index`).
pub fn plan(request: &PlanRequest<'_>) -> Result<Plan> {
    check_input(request)?;
    let max = request.max_num_proc.unwrap_or(usize::MAX);
    let position = |host: &str| request.hosts.iter().position(|h| h.host == host);
    // Live tasks on a usable slot, oldest host first, then by slot.
    let mut placeable: Vec<&LiveTask> = request
        .live
        .iter()
        .filter(|t| position(&t.host).is_some_and(|at| t.slot < request.hosts[at].slots))
        .collect();
    placeable.sort_by_key(|t| (position(&t.host), t.slot));
    let keep: Vec<LiveTask> = placeable.into_iter().take(max).cloned().collect();
    let mut start = Vec::new();
    let mut next = request.next_task_index;
    'hosts: for host in request.hosts {
        for slot in 0..host.slots {
            if keep.len() + start.len() >= max {
                break 'hosts;
            }
            if keep.iter().any(|t| t.host == host.host && t.slot == slot) {
                continue;
            }
            start.push(LiveTask {
                task_index: next,
                host: host.host.clone(),
                slot,
            });
            next = next
                .checked_add(1)
                .ok_or_else(|| Error::Internal("elastic planner: task indices exhausted".into()))?;
        }
    }
    // No survivor is final, so it is reported before a wait that could not help.
    if !request.live.is_empty() && keep.is_empty() {
        return Ok(Plan::NoSurvivor {
            lost: request.live.to_vec(),
        });
    }
    let available = keep.len() + start.len();
    if available < request.min_num_proc {
        return Ok(Plan::Wait {
            available,
            needed: request.min_num_proc,
        });
    }
    let mut gone: Vec<LiveTask> = request
        .live
        .iter()
        .filter(|t| !keep.contains(t))
        .cloned()
        .collect();
    gone.sort();
    // Kept tasks are reported in host order then slot, as new ones.
    let mut keep = keep;
    keep.sort_by_key(|t| (position(&t.host), t.slot));
    Ok(Plan::Ready(SlotPlan {
        keep,
        start,
        gone,
        next_task_index: next,
    }))
}

fn check_input(request: &PlanRequest<'_>) -> Result<()> {
    for (i, task) in request.live.iter().enumerate() {
        let earlier = &request.live[..i];
        if task.task_index >= request.next_task_index {
            return Err(Error::Internal(format!(
                "elastic planner: live task {} is not below next_task_index {}",
                task.task_index, request.next_task_index
            )));
        }
        if earlier.iter().any(|t| t.task_index == task.task_index) {
            return Err(Error::Internal(format!(
                "elastic planner: task index {} is live twice",
                task.task_index
            )));
        }
        if earlier
            .iter()
            .any(|t| t.host == task.host && t.slot == task.slot)
        {
            return Err(Error::Internal(format!(
                "elastic planner: slot {} of {} holds two live tasks",
                task.slot, task.host
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::launcher::blacklist::{Blacklist, ManualClock};

    use crate::launcher::hosts::hs;

    fn task(task_index: u32, host: &str, slot: usize) -> LiveTask {
        LiveTask {
            task_index,
            host: host.into(),
            slot,
        }
    }

    fn ready(
        hosts: &[HostSlots],
        live: &[LiveTask],
        min: usize,
        max: Option<usize>,
        next: u32,
    ) -> SlotPlan {
        let request = PlanRequest {
            hosts,
            live,
            min_num_proc: min,
            max_num_proc: max,
            next_task_index: next,
        };
        match plan(&request).unwrap() {
            Plan::Ready(slots) => slots,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_first_round_fills_hosts_in_order_up_to_max_np() {
        let hosts = [hs("a", 2), hs("b", 2), hs("c", 2)];
        let slots = ready(&hosts, &[], 2, Some(5), 0);
        assert!(slots.keep.is_empty() && slots.gone.is_empty());
        assert_eq!(
            slots.start,
            [
                task(0, "a", 0),
                task(1, "a", 1),
                task(2, "b", 0),
                task(3, "b", 1),
                task(4, "c", 0)
            ]
        );
        assert_eq!(slots.next_task_index, 5);
        assert_eq!(ready(&hosts, &[], 2, None, 0).size(), 6);
    }

    #[test]
    fn scale_up_to_max_np_starts_new_indices_and_keeps_every_live_task() {
        let live = [task(0, "a", 0), task(1, "a", 1)];
        // A task index that ended earlier (2) is not reused: new ones start at 3.
        let slots = ready(&[hs("a", 2), hs("b", 4)], &live, 2, Some(4), 3);
        assert_eq!(slots.keep, live);
        assert_eq!(slots.start, [task(3, "b", 0), task(4, "b", 1)]);
        assert!(slots.gone.is_empty());
        assert_eq!((slots.size(), slots.next_task_index), (4, 5));
        // At max_np already: nothing to start.
        let full = ready(&[hs("a", 2), hs("b", 4)], &live, 2, Some(2), 3);
        assert!(full.start.is_empty() && full.gone.is_empty());
        assert_eq!(full.next_task_index, 3);
    }

    #[test]
    fn scale_down_stops_tasks_of_removed_hosts_and_shrunken_slots() {
        let live = [
            task(0, "a", 0),
            task(1, "a", 1),
            task(2, "b", 0),
            task(3, "b", 1),
            task(4, "c", 0),
        ];
        // c is gone, b has one slot left.
        let slots = ready(&[hs("a", 2), hs("b", 1)], &live, 2, None, 5);
        assert_eq!(
            slots.keep,
            [task(0, "a", 0), task(1, "a", 1), task(2, "b", 0)]
        );
        assert!(slots.start.is_empty());
        assert_eq!(slots.gone, [task(3, "b", 1), task(4, "c", 0)]);
        assert_eq!(slots.next_task_index, 5);
    }

    #[test]
    fn max_np_keeps_live_tasks_before_free_slots() {
        // a (older) has a free slot, b's two tasks are live; max 3: Horovod would fill a's
        // free slot and stop one of b's; kolo keeps all three live tasks.
        let live = [task(0, "a", 0), task(1, "b", 0), task(2, "b", 1)];
        let slots = ready(&[hs("a", 2), hs("b", 2)], &live, 1, Some(3), 3);
        assert_eq!(slots.keep, live);
        assert!(slots.start.is_empty() && slots.gone.is_empty());
        // A lower max drops the newest host's last slots first.
        let slots = ready(&[hs("a", 2), hs("b", 2)], &live, 1, Some(2), 3);
        assert_eq!(slots.keep, [task(0, "a", 0), task(1, "b", 0)]);
        assert_eq!(slots.gone, [task(2, "b", 1)]);
    }

    #[test]
    fn a_host_removed_with_live_ranks_is_replaced_on_new_slots() {
        let live = [task(0, "a", 0), task(1, "b", 0), task(2, "b", 1)];
        let slots = ready(&[hs("a", 1), hs("c", 2)], &live, 3, Some(3), 3);
        assert_eq!(slots.keep, [task(0, "a", 0)]);
        assert_eq!(slots.start, [task(3, "c", 0), task(4, "c", 1)]);
        assert_eq!(slots.gone, [task(1, "b", 0), task(2, "b", 1)]);
    }

    #[test]
    fn a_blacklisted_host_is_skipped_until_its_cooldown_ends() {
        let clock = ManualClock::new();
        let range = crate::launcher::CooldownRange::new(1, 10).unwrap();
        let mut blacklist =
            Blacklist::with_clock(Some(range), Box::new(clock.clone()), Box::new(|| 0.0));
        let discovered = [hs("a", 1), hs("b", 1), hs("c", 1)];
        let live = [task(0, "a", 0), task(1, "b", 0), task(2, "c", 0)];
        blacklist.blacklist("b");
        let usable = blacklist.usable(&discovered);
        let slots = ready(&usable, &live, 2, None, 3);
        assert_eq!(slots.keep, [task(0, "a", 0), task(2, "c", 0)]);
        assert_eq!(slots.gone, [task(1, "b", 0)]);
        assert!(slots.start.is_empty());
        let live = slots.keep;
        clock.advance(std::time::Duration::from_secs(2));
        let back = blacklist.whitelist_resurrected(discovered.iter().map(|h| h.host.as_str()));
        assert_eq!(back, ["b"]);
        let slots = ready(&blacklist.usable(&discovered), &live, 2, None, 3);
        assert_eq!(slots.start, [task(3, "b", 0)]);
    }

    #[test]
    fn too_few_slots_means_wait_and_no_survivor_means_fail() {
        let request = PlanRequest {
            hosts: &[hs("a", 1)],
            live: &[task(0, "a", 0)],
            min_num_proc: 2,
            max_num_proc: None,
            next_task_index: 1,
        };
        assert_eq!(
            plan(&request).unwrap(),
            Plan::Wait {
                available: 1,
                needed: 2
            }
        );
        let live = [task(0, "a", 0), task(1, "a", 1)];
        let request = PlanRequest {
            hosts: &[hs("b", 2)],
            live: &live,
            min_num_proc: 2,
            max_num_proc: None,
            next_task_index: 2,
        };
        assert_eq!(
            plan(&request).unwrap(),
            Plan::NoSurvivor {
                lost: live.to_vec()
            }
        );
        // Even with too few slots to continue: waiting could not bring the state back.
        let request = PlanRequest {
            hosts: &[],
            ..request
        };
        assert!(matches!(plan(&request).unwrap(), Plan::NoSurvivor { .. }));
    }

    #[test]
    fn inconsistent_input_is_an_internal_error() {
        let hosts = [hs("a", 2)];
        for (live, next) in [
            (vec![task(0, "a", 0), task(0, "a", 1)], 2),
            (vec![task(0, "a", 0), task(1, "a", 0)], 2),
            (vec![task(2, "a", 0)], 2),
        ] {
            let request = PlanRequest {
                hosts: &hosts,
                live: &live,
                min_num_proc: 1,
                max_num_proc: None,
                next_task_index: next,
            };
            assert!(
                matches!(plan(&request), Err(Error::Internal(_))),
                "{live:?}"
            );
        }
    }

    /// Hosts `h0..hN` with 1..4 slots, a live task on some of their slots and on hosts that
    /// are gone, with indices below `next`.
    fn arbitrary_round() -> impl proptest::strategy::Strategy<
        Value = (Vec<HostSlots>, Vec<LiveTask>, usize, Option<usize>, u32),
    > {
        use proptest::prelude::*;
        (
            proptest::collection::vec(1usize..4, 0..5),
            proptest::collection::vec((0usize..7, 0usize..4, any::<bool>()), 0..12),
            0usize..8,
            proptest::option::of(1usize..10),
            0u32..5,
        )
            .prop_map(|(slots, candidates, min, max, spare)| {
                let hosts: Vec<HostSlots> = slots
                    .iter()
                    .enumerate()
                    .map(|(i, s)| hs(&format!("h{i}"), *s))
                    .collect();
                let mut live: Vec<LiveTask> = Vec::new();
                for (host, slot, _) in candidates {
                    let host = format!("h{host}");
                    if !live.iter().any(|t| t.host == host && t.slot == slot) {
                        let index = live.len() as u32 * 2;
                        live.push(task(index, &host, slot));
                    }
                }
                let next = live.len() as u32 * 2 + spare;
                (hosts, live, min, max, next)
            })
    }

    proptest::proptest! {
        #[test]
        fn a_plan_never_reuses_indices_overfills_or_drops_a_placeable_task(
            (hosts, live, min, max, next) in arbitrary_round()
        ) {
            let request = PlanRequest {
                hosts: &hosts,
                live: &live,
                min_num_proc: min,
                max_num_proc: max,
                next_task_index: next,
            };
            let slots_of = |host: &str| hosts.iter().find(|h| h.host == host).map(|h| h.slots);
            let placeable = live
                .iter()
                .filter(|t| slots_of(&t.host).is_some_and(|s| t.slot < s))
                .count();
            let capacity: usize = hosts.iter().map(|h| h.slots).sum();
            let size = capacity.min(max.unwrap_or(usize::MAX));
            match plan(&request).unwrap() {
                Plan::Ready(round) => {
                    proptest::prop_assert!(round.size() >= min);
                    proptest::prop_assert_eq!(round.size(), size);
                    // Every live task is kept or gone, once.
                    let mut all: Vec<LiveTask> = round.keep.iter().chain(&round.gone).cloned().collect();
                    all.sort();
                    let mut expected = live.clone();
                    expected.sort();
                    proptest::prop_assert_eq!(all, expected);
                    // Live tasks are kept as far as max allows.
                    proptest::prop_assert_eq!(round.keep.len(), placeable.min(size));
                    // New tasks: fresh increasing indices on free, existing slots.
                    for (i, new) in round.start.iter().enumerate() {
                        proptest::prop_assert_eq!(new.task_index, next + i as u32);
                        proptest::prop_assert!(new.slot < slots_of(&new.host).unwrap());
                    }
                    proptest::prop_assert_eq!(round.next_task_index, next + round.start.len() as u32);
                    let mut taken: Vec<(String, usize)> = round
                        .keep
                        .iter()
                        .chain(&round.start)
                        .map(|t| (t.host.clone(), t.slot))
                        .collect();
                    taken.sort();
                    taken.dedup();
                    proptest::prop_assert_eq!(taken.len(), round.size());
                }
                Plan::Wait { available, needed } => {
                    proptest::prop_assert!(available < needed && needed == min);
                    proptest::prop_assert_eq!(available, size);
                }
                Plan::NoSurvivor { lost } => {
                    proptest::prop_assert!(!live.is_empty() && placeable == 0 || size == 0);
                    proptest::prop_assert_eq!(lost, live.clone());
                }
            }
        }
    }
}

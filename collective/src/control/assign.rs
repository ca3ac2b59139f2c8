//! Rank assignment from `(task index, host hash)` pairs, as Horovod's `get_host_assignments`:
//! each host's ranks are consecutive, the host of task 0 comes first.

/// One task's place in the job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Assignment {
    /// The task index the assignment belongs to.
    pub task_index: u32,
    /// The global rank, `0..size`.
    pub rank: u32,
    /// The number of ranks in the job.
    pub size: u32,
    /// Position among the ranks on the same host.
    pub local_rank: u32,
    /// Number of ranks on the same host.
    pub local_size: u32,
    /// Ordinal of this host among the hosts that have a rank with this `local_rank`.
    pub cross_rank: u32,
    /// Number of hosts that have a rank with this `local_rank`.
    pub cross_size: u32,
}

/// Assigns ranks to `tasks` (`(task_index, host_hash)`, in any order; task indices distinct).
///
/// Hosts are ordered by their first appearance in task-index order (so the host of the lowest
/// task index gets rank 0); each host's ranks are consecutive, its tasks in task-index order;
/// `local_rank` is the position on the host; `cross_rank` is the host's ordinal among the hosts
/// that have that `local_rank`. The result is in the order of `tasks`.
///
/// ```
/// use kolo_collective::control::assign_ranks;
///
/// let tasks = [(0, "a".to_string()), (1, "b".to_string()), (2, "a".to_string())];
/// let ranks: Vec<u32> = assign_ranks(&tasks).iter().map(|a| a.rank).collect();
/// assert_eq!(ranks, [0, 2, 1]);
/// ```
pub fn assign_ranks(tasks: &[(u32, String)]) -> Vec<Assignment> {
    assign_ranks_in_host_order(tasks, &[])
}

/// [`assign_ranks`] for an elastic job's later rounds (Horovod's `_update_host_assignments`):
/// hosts listed in `host_order` keep that order, the others follow in first-appearance order;
/// within a host, tasks in task-index order (its slots). With an empty `host_order` this is
/// [`assign_ranks`].
///
/// ```
/// use kolo_collective::control::assign::assign_ranks_in_host_order;
///
/// // Host b joined first, so it keeps ranks 0.. even though task 0 (host a) is lower.
/// let tasks = [(0, "a".to_string()), (5, "b".to_string())];
/// let ranks: Vec<u32> = assign_ranks_in_host_order(&tasks, &["b".to_string()])
///     .iter()
///     .map(|a| a.rank)
///     .collect();
/// assert_eq!(ranks, [1, 0]);
/// ```
pub fn assign_ranks_in_host_order(
    tasks: &[(u32, String)],
    host_order: &[String],
) -> Vec<Assignment> {
    let mut order: Vec<usize> = (0..tasks.len()).collect();
    let position = |hash: &str| host_order.iter().position(|h| h == hash);
    // Known hosts by their position, then unknown ones; ties (same host, or unknown hosts) by
    // task index, which keeps unknown hosts in first-appearance order.
    order.sort_by_key(|&i| {
        let known = position(&tasks[i].1);
        (known.is_none(), known, tasks[i].0)
    });

    // Hosts in first-appearance order, each with its tasks (positions in `tasks`) in order.
    let mut hosts: Vec<(&str, Vec<usize>)> = Vec::new();
    for &i in &order {
        let hash = tasks[i].1.as_str();
        match hosts.iter_mut().find(|(h, _)| *h == hash) {
            Some((_, members)) => members.push(i),
            None => hosts.push((hash, vec![i])),
        }
    }

    let size = to_u32(tasks.len());
    let mut result: Vec<Option<Assignment>> = vec![None; tasks.len()];
    let mut next_rank = 0u32;
    for (host_ordinal, (_, members)) in hosts.iter().enumerate() {
        let local_size = to_u32(members.len());
        for (local_rank, &i) in members.iter().enumerate() {
            // Hosts before this one that also have this local rank, and all such hosts.
            let having = |(_, m): &&(&str, Vec<usize>)| m.len() > local_rank;
            let cross_rank = to_u32(hosts[..host_ordinal].iter().filter(having).count());
            let cross_size = to_u32(hosts.iter().filter(having).count());
            result[i] = Some(Assignment {
                task_index: tasks[i].0,
                rank: next_rank,
                size,
                local_rank: to_u32(local_rank),
                local_size,
                cross_rank,
                cross_size,
            });
            next_rank += 1;
        }
    }
    result.into_iter().flatten().collect()
}

fn to_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use proptest::prelude::*;

    use super::*;

    fn tasks(hosts: &[&str]) -> Vec<(u32, String)> {
        hosts
            .iter()
            .enumerate()
            .map(|(i, h)| (i as u32, h.to_string()))
            .collect()
    }

    #[test]
    fn three_tasks_two_hosts() {
        // Task 0 on a, task 1 on b, task 2 on a: a gets ranks 0,1; b gets rank 2.
        let got = assign_ranks(&tasks(&["a", "b", "a"]));
        let summary: Vec<_> = got
            .iter()
            .map(|a| {
                (
                    a.task_index,
                    a.rank,
                    a.local_rank,
                    a.local_size,
                    a.cross_rank,
                    a.cross_size,
                )
            })
            .collect();
        assert_eq!(
            summary,
            [(0, 0, 0, 2, 0, 2), (1, 2, 0, 1, 1, 2), (2, 1, 1, 2, 0, 1)]
        );
        assert!(got.iter().all(|a| a.size == 3));
    }

    #[test]
    fn input_order_is_kept_and_empty_is_empty() {
        let got = assign_ranks(&[(1, "b".into()), (0, "a".into())]);
        assert_eq!((got[0].task_index, got[0].rank), (1, 1));
        assert_eq!((got[1].task_index, got[1].rank), (0, 0));
        assert!(assign_ranks(&[]).is_empty());
    }

    fn job() -> impl Strategy<Value = Vec<(u32, String)>> {
        proptest::collection::vec(0u8..5, 1..40).prop_flat_map(|hosts| {
            let n = hosts.len() as u32;
            (
                Just(hosts),
                Just((0..n).collect::<Vec<u32>>()).prop_shuffle(),
            )
                .prop_map(|(hosts, indices)| {
                    indices
                        .into_iter()
                        .zip(hosts)
                        .map(|(i, h)| (i, format!("host{h}")))
                        .collect()
                })
        })
    }

    proptest! {
        #[test]
        fn assignment_invariants(tasks in job()) {
            let got = assign_ranks(&tasks);
            let n = tasks.len();
            prop_assert_eq!(got.len(), n);
            // Same order as the input.
            for (a, t) in got.iter().zip(&tasks) {
                prop_assert_eq!(a.task_index, t.0);
                prop_assert_eq!(a.size as usize, n);
            }
            // Ranks are a permutation of 0..n.
            let ranks: BTreeSet<u32> = got.iter().map(|a| a.rank).collect();
            prop_assert_eq!(ranks, (0..n as u32).collect::<BTreeSet<u32>>());
            // The host of task 0 gets rank 0.
            let first = tasks.iter().position(|t| t.0 == 0).unwrap();
            let zero = got.iter().position(|a| a.rank == 0).unwrap();
            prop_assert_eq!(&tasks[first].1, &tasks[zero].1);
            prop_assert_eq!(first, zero);
            // Per host: consecutive ranks, local ranks 0..local_size in task-index order.
            let mut by_host: BTreeMap<&str, Vec<(u32, &Assignment)>> = BTreeMap::new();
            for (a, t) in got.iter().zip(&tasks) {
                by_host.entry(t.1.as_str()).or_default().push((t.0, a));
            }
            let mut host_first_rank: BTreeMap<&str, u32> = BTreeMap::new();
            for (host, members) in &mut by_host {
                members.sort_by_key(|(task, _)| *task);
                let base = members[0].1.rank;
                host_first_rank.insert(host, base);
                for (position, (_, a)) in members.iter().enumerate() {
                    prop_assert_eq!(a.rank, base + position as u32);
                    prop_assert_eq!(a.local_rank, position as u32);
                    prop_assert_eq!(a.local_size as usize, members.len());
                }
            }
            // Cross: among hosts having local rank l (ordered by their first rank), the
            // cross ranks are 0..cross_size in that order.
            let max_local = got.iter().map(|a| a.local_size).max().unwrap();
            for l in 0..max_local {
                let mut holders: Vec<&Assignment> = got.iter().filter(|a| a.local_rank == l).collect();
                holders.sort_by_key(|a| a.rank);
                for (ordinal, a) in holders.iter().enumerate() {
                    prop_assert_eq!(a.cross_rank, ordinal as u32);
                    prop_assert_eq!(a.cross_size as usize, holders.len());
                }
            }
        }
    }
}

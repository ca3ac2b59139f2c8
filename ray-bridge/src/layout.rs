//! Rank layout of placed actors: consecutive task indices (so ranks) per node, local ranks,
//! and each node's `CUDA_VISIBLE_DEVICES`.

use std::collections::HashMap;

/// Where one worker actor landed, as it reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActorLocation {
    /// The Ray node id (the host identity).
    pub node_id: String,
    /// The GPU ids Ray assigned to the actor (`ray.get_gpu_ids()`), empty without GPUs.
    pub gpu_ids: Vec<String>,
}

/// What one worker actor is told before it registers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerLayout {
    /// Its task index, which the driver's host-hash assignment turns into the same rank
    /// (nodes in order of first appearance, a node's task indices consecutive).
    pub task_index: u32,
    /// The node's ordinal (order of first appearance among the actors).
    pub node_index: u32,
    /// Its position among the actors of its node.
    pub local_rank: u32,
    /// How many actors its node has.
    pub local_size: u32,
    /// The union of its node's GPUs, ordered by local rank (so `local_rank` indexes its own
    /// GPU when each worker has one); `None` without GPUs.
    pub cuda_visible_devices: Option<String>,
}

/// Orders GPU ids numerically when they are numbers.
fn gpu_key(ids: &[String]) -> (u64, String) {
    let first = ids.first().cloned().unwrap_or_default();
    (first.parse().unwrap_or(u64::MAX), first)
}

/// Lays out the actors (in the order they were created): nodes in order of first appearance,
/// a node's actors by their first GPU id (else creation order), task indices consecutive over
/// that order. Returns one layout per actor, in the input order.
pub fn layout(actors: &[ActorLocation]) -> Vec<WorkerLayout> {
    let mut nodes: Vec<&str> = Vec::new();
    let mut members: HashMap<&str, Vec<usize>> = HashMap::new();
    for (index, actor) in actors.iter().enumerate() {
        let node = actor.node_id.as_str();
        members
            .entry(node)
            .or_insert_with(|| {
                nodes.push(node);
                Vec::new()
            })
            .push(index);
    }
    let mut out: Vec<Option<WorkerLayout>> = vec![None; actors.len()];
    let mut next_task = 0u32;
    for (node_index, node) in nodes.iter().enumerate() {
        let mut group = members.remove(node).unwrap_or_default();
        group.sort_by_key(|&index| gpu_key(&actors[index].gpu_ids));
        let mut devices: Vec<&str> = Vec::new();
        for &index in &group {
            for id in &actors[index].gpu_ids {
                if !devices.contains(&id.as_str()) {
                    devices.push(id);
                }
            }
        }
        let cuda = (!devices.is_empty()).then(|| devices.join(","));
        let local_size = group.len() as u32;
        for (local_rank, index) in group.into_iter().enumerate() {
            out[index] = Some(WorkerLayout {
                task_index: next_task,
                node_index: node_index as u32,
                local_rank: local_rank as u32,
                local_size,
                cuda_visible_devices: cuda.clone(),
            });
            next_task += 1;
        }
    }
    out.into_iter().flatten().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn actor(node: &str, gpus: &[&str]) -> ActorLocation {
        ActorLocation {
            node_id: node.to_owned(),
            gpu_ids: gpus.iter().map(|id| (*id).to_owned()).collect(),
        }
    }

    #[test]
    fn interleaved_actors_get_consecutive_tasks_per_node() {
        let actors = [
            actor("a", &[]),
            actor("b", &[]),
            actor("a", &[]),
            actor("b", &[]),
        ];
        let out = layout(&actors);
        let tasks: Vec<u32> = out.iter().map(|w| w.task_index).collect();
        assert_eq!(tasks, vec![0, 2, 1, 3]);
        let locals: Vec<u32> = out.iter().map(|w| w.local_rank).collect();
        assert_eq!(locals, vec![0, 0, 1, 1]);
        assert!(out.iter().all(|w| w.local_size == 2));
        assert!(out.iter().all(|w| w.cuda_visible_devices.is_none()));
        assert_eq!(out[1].node_index, 1);
    }

    #[test]
    fn gpus_union_per_node_indexed_by_local_rank() {
        // Ray handed node a's GPUs out of order; node b has one worker on GPU 3.
        let actors = [
            actor("a", &["2"]),
            actor("a", &["0"]),
            actor("b", &["3"]),
            actor("a", &["10"]),
        ];
        let out = layout(&actors);
        for (worker, location) in out.iter().zip(&actors) {
            let devices: Vec<String> = worker
                .cuda_visible_devices
                .as_deref()
                .unwrap()
                .split(',')
                .map(str::to_owned)
                .collect();
            assert_eq!(devices[worker.local_rank as usize], location.gpu_ids[0]);
        }
        assert_eq!(out[0].cuda_visible_devices.as_deref(), Some("0,2,10"));
        assert_eq!(out[2].cuda_visible_devices.as_deref(), Some("3"));
        let tasks: Vec<u32> = out.iter().map(|w| w.task_index).collect();
        assert_eq!(tasks, vec![1, 0, 3, 2]);
    }

    #[test]
    fn several_gpus_per_worker_stay_in_blocks() {
        let actors = [actor("a", &["2", "3"]), actor("a", &["0", "1"])];
        let out = layout(&actors);
        assert_eq!(out[0].cuda_visible_devices.as_deref(), Some("0,1,2,3"));
        assert_eq!((out[0].local_rank, out[1].local_rank), (1, 0));
    }

    proptest! {
        #[test]
        fn tasks_are_a_permutation_and_consecutive_per_node(nodes in proptest::collection::vec(0u8..4, 1..24)) {
            let actors: Vec<ActorLocation> =
                nodes.iter().map(|n| actor(&format!("node-{n}"), &[])).collect();
            let out = layout(&actors);
            let mut tasks: Vec<u32> = out.iter().map(|w| w.task_index).collect();
            tasks.sort_unstable();
            prop_assert_eq!(tasks, (0..actors.len() as u32).collect::<Vec<_>>());
            let mut by_task: Vec<(u32, &str, u32)> = out
                .iter()
                .zip(&actors)
                .map(|(w, a)| (w.task_index, a.node_id.as_str(), w.local_rank))
                .collect();
            by_task.sort_unstable();
            // A node's tasks are one run, with local ranks 0, 1, ... in task order.
            let mut seen: Vec<&str> = Vec::new();
            for (position, (_, node, local_rank)) in by_task.iter().enumerate() {
                if position == 0 || by_task[position - 1].1 != *node {
                    prop_assert!(!seen.contains(node));
                    seen.push(node);
                    prop_assert_eq!(*local_rank, 0);
                } else {
                    prop_assert_eq!(*local_rank, by_task[position - 1].2 + 1);
                }
            }
        }
    }
}

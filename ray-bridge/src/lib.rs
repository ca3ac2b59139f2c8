//! `kolo-ray-bridge`: the Rust side of `kolo.ray.RayExecutor` — placement planning for Ray
//! actors.
//!
//! - [`PlacementPlan::new`] checks the executor's arguments as Horovod does and plans the
//!   placement group: `num_workers` gives one bundle per worker with `PACK`;
//!   `num_hosts × num_workers_per_host` gives one bundle per node with `STRICT_SPREAD`.
//! - [`layout`] turns where the actors landed (Ray node id, assigned GPUs) into task indices
//!   that are consecutive per node (the job driver's host-hash assignment then gives the same
//!   ranks), local ranks, and each node's `CUDA_VISIBLE_DEVICES`: the union of the node's GPUs,
//!   ordered so that `local_rank` indexes the worker's own GPU.
//!
//! Registration, the driver service and fail-fast are the launcher-neutral pieces of
//! `kolo_collective::control` (`launch::LaunchDriver`) and `kolo_collective::worker`
//! (`session::WorkerSession`), shared with the Spark launcher.
//!
//! ```
//! use kolo_ray_bridge::{layout, ActorLocation, PlacementPlan, PlacementRequest, Strategy};
//!
//! let plan = PlacementPlan::new(&PlacementRequest {
//!     num_hosts: Some(2),
//!     num_workers_per_host: 2,
//!     ..PlacementRequest::default()
//! })
//! .unwrap();
//! assert_eq!(plan.strategy, Strategy::StrictSpread);
//! assert_eq!(plan.worker_bundles, vec![0, 0, 1, 1]);
//!
//! let actors: Vec<ActorLocation> = ["n1", "n2", "n1", "n2"]
//!     .iter()
//!     .map(|node| ActorLocation { node_id: (*node).into(), gpu_ids: vec![] })
//!     .collect();
//! let ranks: Vec<u32> = layout(&actors).iter().map(|w| w.task_index).collect();
//! assert_eq!(ranks, vec![0, 2, 1, 3]);
//! ```
#![warn(missing_docs)]

mod error;
pub mod layout;
pub mod placement;

pub use error::{Error, Result};
pub use layout::{layout, ActorLocation, WorkerLayout};
pub use placement::{Bundle, PlacementPlan, PlacementRequest, Strategy};

//! Placement-group plans: how many bundles of which resources, with which strategy, and which
//! bundle each worker actor goes to.

use std::fmt;

use crate::error::{Error, Result};

/// The placement-group strategy of a plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// `num_workers`: one bundle per worker, packed onto as few nodes as possible.
    Pack,
    /// `num_hosts × num_workers_per_host`: one bundle per node, every bundle on its own node.
    StrictSpread,
}

impl Strategy {
    /// Ray's name for the strategy (`"PACK"`, `"STRICT_SPREAD"`).
    pub fn as_ray(self) -> &'static str {
        match self {
            Self::Pack => "PACK",
            Self::StrictSpread => "STRICT_SPREAD",
        }
    }
}

/// What `RayExecutor(...)` asks for (Horovod's arguments).
#[derive(Debug, Clone, PartialEq)]
pub struct PlacementRequest {
    /// `num_workers`: this many workers wherever they fit (PACK).
    pub num_workers: Option<u32>,
    /// `num_hosts`: this many nodes with `num_workers_per_host` workers each (STRICT_SPREAD).
    pub num_hosts: Option<u32>,
    /// Workers per node with `num_hosts`.
    pub num_workers_per_host: u32,
    /// CPUs each worker actor reserves.
    pub cpus_per_worker: f64,
    /// Whether workers reserve GPUs.
    pub use_gpu: bool,
    /// GPUs each worker reserves (default 1 with `use_gpu`).
    pub gpus_per_worker: Option<f64>,
}

impl Default for PlacementRequest {
    fn default() -> Self {
        Self {
            num_workers: None,
            num_hosts: None,
            num_workers_per_host: 1,
            cpus_per_worker: 1.0,
            use_gpu: false,
            gpus_per_worker: None,
        }
    }
}

/// The resources of one placement-group bundle.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bundle {
    /// `CPU`.
    pub cpus: f64,
    /// `GPU` (0 means the bundle has no GPU entry).
    pub gpus: f64,
}

impl fmt::Display for Bundle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{{CPU: {}", self.cpus)?;
        if self.gpus > 0.0 {
            write!(f, ", GPU: {}", self.gpus)?;
        }
        write!(f, "}}")
    }
}

/// A placement group to create and where each worker actor goes in it.
#[derive(Debug, Clone, PartialEq)]
pub struct PlacementPlan {
    /// PACK or STRICT_SPREAD.
    pub strategy: Strategy,
    /// The bundles, in order.
    pub bundles: Vec<Bundle>,
    /// The bundle index of each worker actor (workers of one bundle share its node).
    pub worker_bundles: Vec<usize>,
    /// CPUs each worker actor reserves.
    pub cpus_per_worker: f64,
    /// GPUs each worker actor reserves (0 without `use_gpu`).
    pub gpus_per_worker: f64,
}

fn check_positive(name: &str, value: Option<u32>) -> Result<()> {
    match value {
        Some(0) => Err(Error::InvalidArgument(format!(
            "`{name}` must be at least 1, got 0"
        ))),
        _ => Ok(()),
    }
}

impl PlacementPlan {
    /// Checks `request` as Horovod does (same messages) and plans the placement group.
    pub fn new(request: &PlacementRequest) -> Result<Self> {
        let invalid = |message: String| Err(Error::InvalidArgument(message));
        match (request.num_workers, request.num_hosts) {
            (None, None) => {
                return invalid("Either `num_workers` or `num_hosts` must be set.".into())
            }
            (Some(_), Some(_)) => {
                return invalid("Only one of `num_workers` and `num_hosts` must be set.".into())
            }
            _ => {}
        }
        check_positive("num_workers", request.num_workers)?;
        check_positive("num_hosts", request.num_hosts)?;
        check_positive("num_workers_per_host", Some(request.num_workers_per_host))?;
        if request.gpus_per_worker.is_some() && !request.use_gpu {
            return invalid(
                "gpus_per_worker is set, but use_gpu is False. use_gpu must be True if \
                 gpus_per_worker is set."
                    .into(),
            );
        }
        let gpus = if request.use_gpu {
            request.gpus_per_worker.unwrap_or(1.0)
        } else {
            0.0
        };
        if request.use_gpu && !(gpus.is_finite() && gpus > 0.0) {
            return invalid(format!("gpus_per_worker must be > 0: Got {gpus}."));
        }
        let cpus = request.cpus_per_worker;
        if !(cpus.is_finite() && cpus >= 0.0) || (cpus == 0.0 && gpus == 0.0) {
            return invalid(format!(
                "cpus_per_worker must be a positive number (or 0 with GPUs): Got {cpus}."
            ));
        }
        let plan = match (request.num_workers, request.num_hosts) {
            (Some(workers), None) => Self {
                strategy: Strategy::Pack,
                bundles: vec![Bundle { cpus, gpus }; workers as usize],
                worker_bundles: (0..workers as usize).collect(),
                cpus_per_worker: cpus,
                gpus_per_worker: gpus,
            },
            (None, Some(hosts)) => {
                let per_host = request.num_workers_per_host as usize;
                let scale = f64::from(request.num_workers_per_host);
                Self {
                    strategy: Strategy::StrictSpread,
                    bundles: vec![
                        Bundle {
                            cpus: cpus * scale,
                            gpus: gpus * scale,
                        };
                        hosts as usize
                    ],
                    worker_bundles: (0..hosts as usize * per_host)
                        .map(|worker| worker / per_host)
                        .collect(),
                    cpus_per_worker: cpus,
                    gpus_per_worker: gpus,
                }
            }
            _ => return Err(Error::Internal("placement request not checked".into())),
        };
        Ok(plan)
    }

    /// How many worker actors the plan places.
    pub fn num_workers(&self) -> usize {
        self.worker_bundles.len()
    }

    /// The resources of every bundle together.
    pub fn total(&self) -> Bundle {
        self.bundles.iter().fold(
            Bundle {
                cpus: 0.0,
                gpus: 0.0,
            },
            |sum, bundle| Bundle {
                cpus: sum.cpus + bundle.cpus,
                gpus: sum.gpus + bundle.gpus,
            },
        )
    }

    /// What the plan asks for, for messages: `4 bundles of {CPU: 1} (PACK), {CPU: 4} in all`.
    pub fn describe(&self) -> String {
        let first = self.bundles.first().copied().unwrap_or(Bundle {
            cpus: 0.0,
            gpus: 0.0,
        });
        let extra = match self.strategy {
            Strategy::Pack => String::new(),
            Strategy::StrictSpread => ", each on its own node".to_owned(),
        };
        format!(
            "{} bundles of {first} ({}{extra}), {} in all",
            self.bundles.len(),
            self.strategy.as_ray(),
            self.total()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(workers: Option<u32>, hosts: Option<u32>) -> PlacementRequest {
        PlacementRequest {
            num_workers: workers,
            num_hosts: hosts,
            ..PlacementRequest::default()
        }
    }

    #[test]
    fn num_workers_packs_one_bundle_per_worker() {
        let plan = PlacementPlan::new(&request(Some(3), None)).unwrap();
        assert_eq!(plan.strategy, Strategy::Pack);
        assert_eq!(
            plan.bundles,
            vec![
                Bundle {
                    cpus: 1.0,
                    gpus: 0.0
                };
                3
            ]
        );
        assert_eq!(plan.worker_bundles, vec![0, 1, 2]);
        assert_eq!(
            plan.describe(),
            "3 bundles of {CPU: 1} (PACK), {CPU: 3} in all"
        );
    }

    #[test]
    fn num_hosts_spreads_one_bundle_per_node() {
        let plan = PlacementPlan::new(&PlacementRequest {
            num_workers_per_host: 2,
            cpus_per_worker: 2.0,
            use_gpu: true,
            ..request(None, Some(3))
        })
        .unwrap();
        assert_eq!(plan.strategy, Strategy::StrictSpread);
        assert_eq!(
            plan.bundles,
            vec![
                Bundle {
                    cpus: 4.0,
                    gpus: 2.0
                };
                3
            ]
        );
        assert_eq!(plan.worker_bundles, vec![0, 0, 1, 1, 2, 2]);
        assert_eq!(plan.gpus_per_worker, 1.0);
        assert!(plan
            .describe()
            .contains("STRICT_SPREAD, each on its own node"));
        assert!(plan.describe().ends_with("{CPU: 12, GPU: 6} in all"));
    }

    #[test]
    fn arguments_are_checked_as_horovod_does() {
        let message =
            |request: PlacementRequest| PlacementPlan::new(&request).unwrap_err().to_string();
        assert_eq!(
            message(request(None, None)),
            "Either `num_workers` or `num_hosts` must be set."
        );
        assert_eq!(
            message(request(Some(2), Some(2))),
            "Only one of `num_workers` and `num_hosts` must be set."
        );
        assert!(message(PlacementRequest {
            gpus_per_worker: Some(1.0),
            ..request(Some(2), None)
        })
        .starts_with("gpus_per_worker is set, but use_gpu is False"));
        assert!(message(PlacementRequest {
            use_gpu: true,
            gpus_per_worker: Some(0.0),
            ..request(Some(2), None)
        })
        .contains("gpus_per_worker must be > 0"));
        assert!(message(request(Some(0), None)).contains("`num_workers` must be at least 1"));
        assert!(message(PlacementRequest {
            num_workers_per_host: 0,
            ..request(None, Some(1))
        })
        .contains("`num_workers_per_host`"));
        assert!(message(PlacementRequest {
            cpus_per_worker: -1.0,
            ..request(Some(1), None)
        })
        .contains("cpus_per_worker"));
    }
}

//! A cluster: a number of identical GPUs described by one profile, filling whole
//! nodes (or dividing one).

use super::HardwareProfile;
use crate::error::InputError;

/// A set of identical GPUs described by one profile.
#[derive(Debug, Clone, PartialEq)]
pub struct Cluster {
    pub profile: HardwareProfile,
    pub gpus: u64,
    /// Let tensor parallelism span more than one NVLink domain (off by default:
    /// TP's per-layer collectives need NVLink bandwidth).
    pub allow_tp_beyond_nvlink: bool,
    /// The profile's own NVLink domain, where the job sees a segment of it
    /// ([`Cluster::job_domain`], in `profile.node.nvlink_domain`).
    pub profile_domain: u64,
}

/// Largest cluster Sextant reasons about.
pub const MAX_GPUS: u64 = 1 << 24;

impl Cluster {
    /// Checks the GPU count against the node size.
    pub fn new(profile: HardwareProfile, gpus: u64) -> Result<Cluster, InputError> {
        let per_node = profile.node.gpus_per_node;
        if per_node == 0 {
            return Err(InputError::Profile {
                profile: profile.name.clone(),
                field: "node.gpus_per_node".into(),
                problem: "0 must be between 1 and 1024".into(),
            });
        }
        if gpus == 0 {
            return Err(InputError::Workload("--gpus must be at least 1".into()));
        }
        if gpus > MAX_GPUS {
            return Err(InputError::Workload(format!(
                "{gpus} GPUs is more than Sextant models (at most {MAX_GPUS})"
            )));
        }
        let ok = if gpus < per_node {
            per_node.is_multiple_of(gpus)
        } else {
            gpus.is_multiple_of(per_node)
        };
        if !ok {
            // The nearest counts below and above that fill nodes (or part of one).
            let (lower, upper) = if gpus < per_node {
                let below = (1..=gpus)
                    .rev()
                    .find(|d| per_node.is_multiple_of(*d))
                    .unwrap_or(1);
                (below, Cluster::fitting_count(gpus, per_node))
            } else {
                (
                    gpus / per_node * per_node,
                    Cluster::fitting_count(gpus, per_node),
                )
            };
            let how = if gpus < per_node {
                format!("use a divisor of {per_node} for part of one node (e.g. {lower} or {upper}), or whole nodes")
            } else {
                format!("use a multiple of {per_node} (e.g. {lower} or {upper}), or a divisor of {per_node} for part of one node")
            };
            return Err(InputError::Workload(format!(
                "{gpus} GPUs do not fill {} nodes of {per_node} GPUs: {how}",
                profile.name,
            )));
        }
        let mut profile = profile;
        let profile_domain = profile.node.nvlink_domain;
        profile.node.nvlink_domain = Cluster::job_domain(&profile, gpus);
        Ok(Cluster {
            profile,
            gpus,
            allow_tp_beyond_nvlink: false,
            profile_domain,
        })
    }

    /// The NVLink domain a job of `gpus` GPUs sees. Where one domain spans several
    /// nodes (a GB200 NVL72 rack of 18 four-GPU trays), a job larger than one node
    /// is placed in equal segments of whole nodes, the largest that divide its node
    /// count and fit in a domain: Megatron-Bridge's launcher passes Slurm that
    /// `--segment` for GB200 jobs beyond one rack (scripts/performance/utils/
    /// executors.py:103-108 at 28437fb), so that a 512-GPU job runs 8 segments of
    /// 64 GPUs rather than ranks laid out over racks of 72, where 7 of every 8
    /// 64-rank groups would straddle two racks. A job that fills whole domains uses
    /// them whole. Nodes that are their own domain are unchanged.
    pub fn job_domain(profile: &HardwareProfile, gpus: u64) -> u64 {
        let (per_node, domain) = (
            profile.node.gpus_per_node.max(1),
            profile.node.nvlink_domain,
        );
        if domain <= per_node || gpus <= per_node {
            return domain;
        }
        let nodes = gpus / per_node;
        let segment = (1..=(domain / per_node).min(nodes))
            .rev()
            .find(|d| nodes.is_multiple_of(*d))
            .unwrap_or(1);
        segment * per_node
    }

    /// The smallest GPU count of at least `at_least` that [`Cluster::new`] accepts
    /// on nodes of `per_node`: a divisor of `per_node` inside one node, else whole
    /// nodes.
    pub fn fitting_count(at_least: u64, per_node: u64) -> u64 {
        let per_node = per_node.max(1);
        let at_least = at_least.max(1);
        if at_least <= per_node {
            (at_least..=per_node)
                .find(|d| per_node.is_multiple_of(*d))
                .unwrap_or(per_node)
        } else {
            at_least.div_ceil(per_node).saturating_mul(per_node)
        }
    }

    pub fn nodes(&self) -> u64 {
        self.gpus.div_ceil(self.profile.node.gpus_per_node)
    }
}

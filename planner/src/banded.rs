//! Estimates with their error band: the cost model's price, the pipeline
//! simulation and the error band composed here, so that [`crate::cost`] and
//! [`crate::uncertainty`] do not import each other.
//!
//! The cost model prices a configuration without a band
//! ([`cost::estimate_with`]) and simulates its pipeline by returning a new
//! estimate ([`cost::simulate`]); [`uncertainty::band_for`] draws the band of an
//! estimate. Whatever shows, stores or ranks by a band prices through here; the
//! search's screening and the sensitivity table, which read only the step time
//! and memory, call the cost model directly.

use crate::config::{ParallelConfig, Rejection, Workload};
use crate::cost::{self, Assumptions, Estimate};
use crate::hardware::Cluster;
use crate::model::ModelSpec;
use crate::uncertainty;

/// [`estimate_with`] under the default assumptions.
pub fn estimate(
    model: &ModelSpec,
    cluster: &Cluster,
    w: &Workload,
    cfg: &ParallelConfig,
) -> Result<Estimate, Rejection> {
    estimate_with(model, cluster, w, cfg, Assumptions::default())
}

/// The cost model's estimate (closed-form pipeline) with its band: the model's
/// errors on comparable runs, widened where `cfg` is outside them, its dominant
/// term named.
pub fn estimate_with(
    model: &ModelSpec,
    cluster: &Cluster,
    w: &Workload,
    cfg: &ParallelConfig,
    a: Assumptions,
) -> Result<Estimate, Rejection> {
    let mut e = cost::estimate_with(model, cluster, w, cfg, a)?;
    e.band = uncertainty::band_for(cluster, cfg, model.moe.is_some(), a.framework, &e);
    Ok(e)
}

/// `e` with its pipeline simulated ([`cost::simulate`]), or `e` unchanged where
/// it cannot be. A band is a relative error of the step time, so its ends scale
/// with the step (by the old step over the new), and its attribution is drawn
/// again from the simulated estimate's shares.
pub fn simulated(e: Estimate, cfg: &ParallelConfig) -> Estimate {
    let Some(mut s) = cost::simulate(&e, cfg) else {
        return e;
    };
    if s.band.is_some() {
        let ratio = e.step_secs / s.step_secs;
        let moe = s.stages.iter().any(|st| st.moe_layers > 0);
        let attribution = uncertainty::attribution_of(&s, moe);
        if let Some(b) = &mut s.band {
            b.low_secs /= ratio;
            b.high_secs /= ratio;
            b.attribution = attribution;
        }
    }
    s
}

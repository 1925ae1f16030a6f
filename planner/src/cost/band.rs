//! The error band an [`Estimate`](super::Estimate) carries: its values only.
//!
//! The cost model does not draw bands: a band comes from the model's errors on
//! comparable measured runs and from how far a plan reaches beyond them, both
//! judged above the cost model. [`crate::banded`] draws it on an estimate and
//! rescales it when the pipeline is simulated; the types live here so that the
//! estimate can hold them without the cost model importing what draws them.

/// An interval on the step time, with where it comes from.
#[derive(Debug, Clone, PartialEq)]
pub struct Band {
    /// Probability that the measured step time falls inside, if the comparable
    /// runs' errors are exchangeable with this one's: the nominal coverage (80%)
    /// from 9 runs up, less below (the band then spans all of them), and
    /// (m - 1) / (m + 1) where it was widened to the range of m errors of a wider
    /// pool.
    pub coverage: f64,
    pub low_secs: f64,
    pub high_secs: f64,
    /// Which runs it is drawn from, e.g. "17 h100-sxm dense runs".
    pub basis: String,
    pub samples: usize,
    /// Which term dominates the predicted error (absent when the validation set carries
    /// no term shares).
    pub attribution: Option<Attribution>,
    /// The axes on which the plan is outside the validated runs, each of which
    /// widened the band ([`crate::reach`]); empty inside.
    pub outside: Vec<Outside>,
}

/// How much each term contributes to the expected error of one prediction.
#[derive(Debug, Clone, PartialEq)]
pub struct Attribution {
    /// The term with the largest share of the error variance.
    pub dominant: String,
    /// (term, fraction of the predicted error variance), largest first.
    pub variance_shares: Vec<(String, f64)>,
    /// Each term's relative error (one standard deviation) fitted on the published
    /// runs: error^2 ~ sum over terms of (share x sigma)^2, sigma^2 >= 0.
    pub term_sigmas: Vec<(String, f64)>,
}

/// One axis on which a plan is outside the validated region.
#[derive(Debug, Clone, PartialEq)]
pub struct Outside {
    pub axis: String,
    /// The plan's value (for the schedule: 0, with its name in `axis`).
    pub value: f64,
    /// The largest value among the validated runs.
    pub validated: f64,
    /// Doublings beyond it (for the HBM fraction: halvings of the free memory;
    /// for a schedule no validated run used: 1).
    pub doublings: f64,
    pub per_doubling: f64,
}

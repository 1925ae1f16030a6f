//! The roofline every cost is built from: `Ctx` (the inputs one estimate shares),
//! one GEMM's time and its backward's (`Pass`), element-wise traffic, collectives,
//! and where each parallel group's members sit for the rank order.

use crate::comm::{collective_secs, Collective, Placement};
use crate::config::{ParallelConfig, Workload};
use crate::hardware::HardwareProfile;
use crate::model::ModelSpec;

use super::{Assumptions, RankOrder};

/// Forward and backward time of one GEMM (or a sum of them).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Pass {
    pub(super) fwd: f64,
    /// Input gradient plus weight gradient.
    pub(super) bwd: f64,
    /// The weight-gradient part of `bwd` (what ZB-H1 and DualPipe defer as W).
    pub(super) wgrad: f64,
}

impl std::ops::Add for Pass {
    type Output = Pass;
    fn add(self, o: Pass) -> Pass {
        Pass {
            fwd: self.fwd + o.fwd,
            bwd: self.bwd + o.bwd,
            wgrad: self.wgrad + o.wgrad,
        }
    }
}

impl std::ops::Mul<Pass> for f64 {
    type Output = Pass;
    fn mul(self, p: Pass) -> Pass {
        Pass {
            fwd: self * p.fwd,
            bwd: self * p.bwd,
            wgrad: self * p.wgrad,
        }
    }
}

/// Shared inputs of one estimate.
pub(super) struct Ctx<'a> {
    pub(super) model: &'a ModelSpec,
    pub(super) hw: &'a HardwareProfile,
    pub(super) w: &'a Workload,
    pub(super) cfg: &'a ParallelConfig,
    pub(super) a: Assumptions,
    /// Tokens of one micro-batch on one CP rank (before SP sharding).
    pub(super) tokens: f64,
    pub(super) fp8: bool,
    pub(super) domain: u64,
}

impl<'a> Ctx<'a> {
    /// The inputs of one estimate of `cfg` on `hw`.
    pub(super) fn new(
        model: &'a ModelSpec,
        hw: &'a HardwareProfile,
        w: &'a Workload,
        cfg: &'a ParallelConfig,
        a: Assumptions,
    ) -> Ctx<'a> {
        Ctx {
            model,
            hw,
            w,
            cfg,
            a,
            tokens: (cfg.mbs * w.seq / cfg.cp) as f64,
            fp8: w.precision.is_fp8() && hw.gpu.peak_tflops.fp8 > 0.0,
            domain: hw.node.nvlink_domain,
        }
    }
    pub(super) fn gemm(&self, m: f64, n: f64, k: f64, fp8: bool) -> f64 {
        if m <= 0.0 || n <= 0.0 || k <= 0.0 {
            return 0.0;
        }
        let e = &self.hw.efficiency;
        let (peak, eff, elem) = if fp8 && self.fp8 {
            (self.hw.peak_flops(true), e.gemm_fp8, 1.0)
        } else {
            (self.hw.peak_flops(false), e.gemm_bf16, 2.0)
        };
        // A measured curve gives the shape's efficiency relative to the best shape,
        // launch and fill/drain included; without one, a fixed cost per call.
        let (shape, overhead) = match self.hw.gemm_shape_factor(fp8 && self.fp8, m, n, k) {
            Some(s) => (s, 0.0),
            None => (1.0, e.gemm_overhead_us * 1e-6),
        };
        let compute = 2.0 * m * n * k / (peak * eff * shape);
        let bytes = elem * (m * k + k * n) + 2.0 * m * n;
        let memory = bytes / self.hbm_bw();
        compute.max(memory) + overhead
    }
    /// `Y[m,n] = X[m,k] W[k,n]` and its backward: the input gradient
    /// `dX[m,k] = dY W^T` and the weight gradient `dW[k,n] = X^T dY`, each at its own
    /// shape (with a measured curve, a short-`m` GEMM's weight gradient reduces over
    /// few rows and runs less efficiently than its forward).
    pub(super) fn pass(&self, m: f64, n: f64, k: f64, fp8: bool) -> Pass {
        let wgrad = self.gemm(k, n, m, fp8);
        Pass {
            fwd: self.gemm(m, n, k, fp8),
            bwd: self.gemm(m, k, n, fp8) + wgrad,
            wgrad,
        }
    }
    pub(super) fn hbm_bw(&self) -> f64 {
        self.hw.gpu.hbm_tbytes_per_s * 1e12 * self.hw.efficiency.hbm
    }
    pub(super) fn mem(&self, bytes: f64) -> f64 {
        bytes / self.hbm_bw()
    }
    pub(super) fn coll(&self, c: Collective, bytes: f64, p: Placement) -> f64 {
        collective_secs(self.hw, c, bytes, p)
    }
    pub(super) fn tp_group(&self) -> Placement {
        Placement::new(self.cfg.tp, 1, self.domain)
    }
    pub(super) fn cp_group(&self) -> Placement {
        Placement::new(self.cfg.cp, self.cfg.tp, self.domain)
    }
    /// DP x CP group of dense parameters (ranks with the same TP and PP index).
    /// Megatron's order keeps CP and DP adjacent (one stride); ScaleTorch's puts PP
    /// between them, so its DP members sit TP x CP x PP apart.
    pub(super) fn dp_group(&self) -> Placement {
        let c = self.cfg;
        match self.a.rank_order {
            RankOrder::Megatron => Placement::new(c.dp * c.cp, c.tp, self.domain),
            RankOrder::ScaleTorch => Placement::nested(
                Placement::new(c.cp, c.tp, self.domain),
                Placement::new(c.dp, c.tp * c.ep * c.cp * c.pp, self.domain),
            ),
        }
    }
    /// Expert order is etp-ep-edp-pp: EP stride is ETP, EDP stride is ETP x EP.
    pub(super) fn ep_group(&self) -> Placement {
        Placement::new(self.cfg.ep, self.cfg.etp, self.domain)
    }
    pub(super) fn etp_group(&self) -> Placement {
        Placement::new(self.cfg.etp, 1, self.domain)
    }
    pub(super) fn edp_group(&self) -> Placement {
        Placement::new(self.cfg.edp(), self.cfg.etp * self.cfg.ep, self.domain)
    }
    /// Neighbouring stages: PP's stride in the rank order.
    pub(super) fn pp_group(&self) -> Placement {
        let c = self.cfg;
        let stride = match self.a.rank_order {
            RankOrder::Megatron => c.tp * c.cp * c.dp,
            RankOrder::ScaleTorch => c.tp * c.ep * c.cp,
        };
        Placement::new(2, stride, self.domain)
    }
}

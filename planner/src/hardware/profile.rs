//! Reading a profile: [`HardwareProfile::from_json`] and the checks a profile must
//! pass, every number against its physical range ([`super::ranges`]) and the rules
//! between fields, each error naming the field.

use super::ranges;
use super::{HardwareProfile, MAX_GPUS, PROFILE_SCHEMA_VERSION};
use crate::error::InputError;

impl HardwareProfile {
    /// Parses and checks a profile. Errors name the field.
    pub fn from_json(text: &str) -> Result<HardwareProfile, InputError> {
        let p: HardwareProfile = crate::json::from_str_known(text, "hardware profile")?;
        if p.schema_version != PROFILE_SCHEMA_VERSION {
            return Err(InputError::SchemaVersion {
                what: "hardware profile".into(),
                found: p.schema_version,
                supported: PROFILE_SCHEMA_VERSION,
            });
        }
        p.validate()?;
        Ok(p)
    }

    /// Checks every number against its physical range ([`ranges`]) and the rules
    /// between fields; the error names the field. A profile that passes gives finite
    /// estimates (no NaN, no infinity).
    pub fn validate(&self) -> Result<(), InputError> {
        self.check_numbers()?;
        self.check_collective_points()?;
        self.check_network_points()?;
        self.check_curves()?;
        self.check_node()
    }

    /// The error for `field` of this profile.
    fn field_error(&self, field: &str, problem: String) -> Result<(), InputError> {
        Err(InputError::Profile {
            profile: self.name.clone(),
            field: field.into(),
            problem,
        })
    }

    /// Every number in its range, and a reserve smaller than the HBM.
    fn check_numbers(&self) -> Result<(), InputError> {
        let err = |field: &str, problem: String| self.field_error(field, problem);
        use ranges::*;
        let (g, n, w, e, m) = (
            &self.gpu,
            &self.node,
            &self.network,
            &self.efficiency,
            &self.memory,
        );
        let checks: [(&str, f64, Range); 26] = [
            ("gpu.peak_tflops.bf16", g.peak_tflops.bf16, PEAK_TFLOPS),
            ("gpu.peak_tflops.fp16", g.peak_tflops.fp16, PEAK_TFLOPS),
            (
                "gpu.peak_tflops.fp8",
                g.peak_tflops.fp8,
                FP8_PEAK_TFLOPS.or_zero(),
            ),
            ("gpu.hbm_gib", g.hbm_gib, HBM_GIB),
            ("gpu.hbm_tbytes_per_s", g.hbm_tbytes_per_s, HBM_TBYTES_PER_S),
            (
                "node.nvlink_gbytes_per_s",
                n.nvlink_gbytes_per_s,
                NVLINK_GBYTES_PER_S,
            ),
            (
                "network.nic_gbytes_per_s",
                w.nic_gbytes_per_s,
                NIC_GBYTES_PER_S,
            ),
            ("network.latency_us", w.latency_us, LATENCY_US),
            ("efficiency.gemm_bf16", e.gemm_bf16, EFFICIENCY),
            (
                "efficiency.gemm_bf16_bare",
                e.gemm_bf16_bare,
                EFFICIENCY.or_zero(),
            ),
            ("efficiency.gemm_fp8", e.gemm_fp8, EFFICIENCY.or_zero()),
            (
                "efficiency.gemm_overhead_us",
                e.gemm_overhead_us,
                GEMM_OVERHEAD_US,
            ),
            ("efficiency.attention_fwd", e.attention_fwd, EFFICIENCY),
            ("efficiency.attention_bwd", e.attention_bwd, EFFICIENCY),
            ("efficiency.hbm", e.hbm, EFFICIENCY),
            ("efficiency.nvlink_busbw", e.nvlink_busbw, NVLINK_BUSBW),
            (
                "efficiency.nvls_busbw",
                e.nvls_busbw,
                NVLINK_BUSBW.or_zero(),
            ),
            (
                "efficiency.nvlink_latency_us",
                e.nvlink_latency_us,
                LATENCY_US,
            ),
            ("efficiency.network_busbw", e.network_busbw, NETWORK_BUSBW),
            (
                "efficiency.overlap_slowdown",
                e.overlap_slowdown,
                OVERLAP_SLOWDOWN,
            ),
            ("efficiency.host_op_us", e.host_op_us, HOST_US),
            ("efficiency.host_kernel_us", e.host_kernel_us, HOST_US),
            (
                "efficiency.host_layer_kernel_us",
                e.host_layer_kernel_us,
                HOST_US,
            ),
            ("memory.reserve_gib", m.reserve_gib, RESERVE_GIB),
            ("memory.fragmentation", m.fragmentation, FRAGMENTATION),
            ("memory.headroom", m.headroom, HEADROOM),
        ];
        for (field, v, range) in checks {
            if let Err(problem) = range.check(v) {
                return err(field, problem.to_string());
            }
        }
        // The bare GEMM level (stated, or the BF16 curve's best point) is what a
        // calibration's measured GEMMs are read against: within the peak, and at
        // least what a training stack sustains.
        if let Some(b) = self.bare_gemm_bf16() {
            let field = if e.gemm_bf16_bare > 0.0 {
                "efficiency.gemm_bf16_bare"
            } else {
                "gemm_curves"
            };
            if b > EFFICIENCY.hi {
                return err(
                    field,
                    format!(
                        "a bare BF16 GEMM at {} of the BF16 peak is above the peak",
                        show(b)
                    ),
                );
            }
            if b < e.gemm_bf16 {
                return err(
                    field,
                    format!(
                        "a bare BF16 GEMM at {} of the BF16 peak is below efficiency.gemm_bf16 ({}): a bare GEMM is at least as fast as a training stack's",
                        show(b),
                        show(e.gemm_bf16)
                    ),
                );
            }
        }
        if self.memory.reserve_gib >= self.gpu.hbm_gib {
            return err(
                "memory.reserve_gib",
                format!(
                    "reserve {} GiB leaves nothing of {} GiB HBM",
                    self.memory.reserve_gib, self.gpu.hbm_gib
                ),
            );
        }
        Ok(())
    }

    /// The published collective measurements: ranks, bytes, bus bandwidth, tier.
    fn check_collective_points(&self) -> Result<(), InputError> {
        let err = |field: &str, problem: String| self.field_error(field, problem);
        use ranges::*;
        for (i, c) in self.collective_points.iter().enumerate() {
            let field = |f: &str| format!("collective_points[{i}].{f}");
            if !(1..=MAX_GPUS).contains(&c.ranks) {
                return err(
                    &field("ranks"),
                    format!("{} must be between 1 and {MAX_GPUS}", c.ranks),
                );
            }
            for (f, v, range) in [
                ("bytes", c.bytes, COLLECTIVE_BYTES),
                (
                    "busbw_gbytes_per_s",
                    c.busbw_gbytes_per_s,
                    MEASURED_BUSBW_GBYTES_PER_S,
                ),
            ] {
                if let Err(problem) = range.check(v) {
                    return err(&field(f), problem.to_string());
                }
            }
            if !matches!(c.tier.as_str(), "nvlink" | "nvls" | "network") {
                return err(
                    &field("tier"),
                    format!(
                        "'{}' is not one of nvlink, nvls, network",
                        c.tier.escape_debug()
                    ),
                );
            }
        }
        Ok(())
    }

    /// The network's points by node count: 2 domains or more, in increasing order,
    /// each figure in the range of the one it stands in for.
    fn check_network_points(&self) -> Result<(), InputError> {
        let err = |field: &str, problem: String| self.field_error(field, problem);
        use ranges::*;
        let pts = &self.network.by_domains;
        for (i, p) in pts.iter().enumerate() {
            let field = |f: &str| format!("network.by_domains[{i}].{f}");
            if !(2..=MAX_GPUS).contains(&p.domains) {
                return err(
                    &field("domains"),
                    format!(
                        "{} must be between 2 and {MAX_GPUS} (one domain is NVLink's)",
                        p.domains
                    ),
                );
            }
            if i > 0 && p.domains <= pts[i - 1].domains {
                return err(
                    &field("domains"),
                    format!(
                        "{} does not follow {}: list the points by increasing domains, one per count",
                        p.domains,
                        pts[i - 1].domains
                    ),
                );
            }
            for (f, v, range) in [
                ("busbw", p.busbw, NETWORK_BUSBW),
                ("latency_us", p.latency_us, LATENCY_US),
            ] {
                if let Err(problem) = range.check(v) {
                    return err(&field(f), problem.to_string());
                }
            }
        }
        Ok(())
    }

    /// At most one GEMM curve per data type and one attention curve per pass and mask.
    fn check_curves(&self) -> Result<(), InputError> {
        let err = |field: &str, problem: String| self.field_error(field, problem);
        for (i, c) in self.gemm_curves.iter().enumerate() {
            if self.gemm_curves[..i].iter().any(|d| d.dtype == c.dtype) {
                return err(
                    "gemm_curves",
                    format!("two curves for {:?}; give one per data type", c.dtype),
                );
            }
        }
        for (i, c) in self.attention_curves.iter().enumerate() {
            if self.attention_curves[..i]
                .iter()
                .any(|d| d.pass == c.pass && d.causal == c.causal)
            {
                return err(
                    "attention_curves",
                    format!(
                        "two curves for the {:?} pass with causal = {}; give one per pass and mask",
                        c.pass, c.causal
                    ),
                );
            }
        }
        Ok(())
    }

    /// Features and their efficiencies agree; the node and NVLink domain sizes.
    fn check_node(&self) -> Result<(), InputError> {
        let err = |field: &str, problem: String| self.field_error(field, problem);
        use ranges::*;
        if self.gpu.peak_tflops.fp8 > 0.0 && self.efficiency.gemm_fp8 <= 0.0 {
            return err(
                "efficiency.gemm_fp8",
                "the GPU has FP8 peak throughput but no FP8 GEMM efficiency".into(),
            );
        }
        if self.node.nvls && self.efficiency.nvls_busbw == 0.0 {
            return err(
                "efficiency.nvls_busbw",
                format!(
                    "0 with node.nvls true: give the NVLS all-reduce bus bandwidth as a fraction of the link ({} to {})",
                    NVLINK_BUSBW.lo, NVLINK_BUSBW.hi
                ),
            );
        }
        if self.node.gpus_per_node == 0 || self.node.gpus_per_node > 1024 {
            return err(
                "node.gpus_per_node",
                format!("{} must be between 1 and 1024", self.node.gpus_per_node),
            );
        }
        if self.node.nvlink_domain == 0
            || !self
                .node
                .nvlink_domain
                .is_multiple_of(self.node.gpus_per_node)
            || self.node.nvlink_domain > 1 << 16
        {
            return err(
                "node.nvlink_domain",
                format!(
                    "{} must be a positive multiple of gpus_per_node ({})",
                    self.node.nvlink_domain, self.node.gpus_per_node
                ),
            );
        }
        Ok(())
    }
}

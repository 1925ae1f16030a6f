use super::fit::fit_gemms;
use super::*;

#[test]
fn two_term_fit_recovers_slope_and_intercept() {
    // y = 2 x1 + 0.5 x2 exactly.
    let rows: Vec<(f64, f64, f64, f64)> = (1..8)
        .map(|i| {
            (
                i as f64,
                (i % 3 + 1) as f64,
                2.0 * i as f64 + 0.5 * (i % 3 + 1) as f64,
                1.0,
            )
        })
        .collect();
    let (a, b) = fit_two(&rows).unwrap();
    assert!((a - 2.0).abs() < 1e-9 && (b - 0.5).abs() < 1e-9, "{a} {b}");
    // A negative intercept is not physical: falls back to a line through 0.
    let rows = [
        (1.0, 1.0, 0.5, 1.0),
        (2.0, 1.0, 1.5, 1.0),
        (4.0, 1.0, 3.5, 1.0),
    ];
    let (a, b) = fit_two(&rows).unwrap();
    assert!(a > 0.0 && b == 0.0);
    assert!(fit_two(&[]).is_none());
}

/// For the executor's own runs, a measured GEMM fit replaces the profile's public
/// shape curve; an overlay without one leaves it.
#[test]
fn measured_gemms_replace_the_shape_curve() {
    let h100 = crate::hardware::builtin_profile("h100-sxm").unwrap();
    assert!(!h100.gemm_curves.is_empty());
    let mut o = Overlay {
        schema_version: OVERLAY_SCHEMA_VERSION,
        profile: h100.name.clone(),
        backend: "cuda".into(),
        device: "test".into(),
        runs: vec![],
        gemm_bf16: None,
        attention: None,
        nvlink_busbw: Some(0.7),
        network_busbw: None,
        gemm_overhead_us: None,
        nvlink_latency_us: None,
        network_latency_us: None,
        hbm: None,
        gemm_curve: None,
        benchmarks: vec![],
        gemm_points: vec![],
        collective_points: vec![],
        gemm_scale: None,
        attention_scale: None,
        comm_scale: None,
        log_points: vec![],
    };
    assert_eq!(
        apply(&h100, &o, Target::Executor).unwrap().gemm_curves,
        h100.gemm_curves
    );
    o.gemm_bf16 = Some(0.7);
    o.gemm_overhead_us = Some(6.0);
    let p = apply(&h100, &o, Target::Executor).unwrap();
    assert!(p.gemm_curves.is_empty() && p.efficiency.gemm_bf16 == 0.7);
    assert!(p.gemm_shape_factor(false, 256.0, 256.0, 256.0).is_none());
    // Likewise a measured attention level replaces the public attention curves.
    assert_eq!(p.attention_curves, h100.attention_curves);
    o.attention = Some(0.5);
    let p = apply(&h100, &o, Target::Executor).unwrap();
    assert!(
        p.attention_curves.is_empty()
            && p.attention_factor(crate::hardware::AttentionPass::Fwd, 128.0, 4096.0)
                .is_none()
    );
}

/// A measured network figure replaces the profile's figure by node count as well
/// as its single one, and only that figure (a measured latency keeps the
/// bandwidth curve); a log fit's communication scale multiplies both.
#[test]
fn measured_network_replaces_the_points_by_node_count() {
    let mut prof = crate::hardware::builtin_profile("h100-sxm").unwrap();
    prof.network.by_domains = vec![crate::hardware::NetworkPoint {
        domains: 2,
        busbw: 0.5,
        latency_us: 20.0,
    }];
    let mut o = Overlay {
        schema_version: OVERLAY_SCHEMA_VERSION,
        profile: prof.name.clone(),
        backend: "cuda".into(),
        device: "test".into(),
        runs: vec![],
        gemm_bf16: None,
        attention: None,
        nvlink_busbw: None,
        network_busbw: None,
        gemm_overhead_us: None,
        nvlink_latency_us: None,
        network_latency_us: None,
        hbm: None,
        gemm_curve: None,
        benchmarks: vec![],
        gemm_points: vec![],
        collective_points: vec![],
        gemm_scale: None,
        attention_scale: None,
        comm_scale: Some(0.8),
        log_points: vec![],
    };
    let p = apply(&prof, &o, Target::Stack).unwrap();
    assert!((p.network.by_domains[0].busbw - 0.4).abs() < 1e-12);
    assert!((p.efficiency.network_busbw - 0.72).abs() < 1e-12);
    o.comm_scale = None;
    o.network_latency_us = Some(8.0);
    let p = apply(&prof, &o, Target::Stack).unwrap();
    assert_eq!(p.network_collective(2), (0.5, 8.0));
    o.network_latency_us = None;
    o.network_busbw = Some(0.7);
    let p = apply(&prof, &o, Target::Stack).unwrap();
    assert_eq!(p.network_collective(4), (0.7, 20.0));
    o.network_latency_us = Some(8.0);
    let p = apply(&prof, &o, Target::Stack).unwrap();
    assert_eq!(p.network_collective(4), (0.7, 8.0));
}

/// A GPU overlay's numbers take the profile's ranges, a CPU one's only need to be
/// finite and positive, and no other backend is read.
#[test]
fn overlay_numbers_take_their_backends_ranges() {
    let h100 = crate::hardware::builtin_profile("h100-sxm").unwrap();
    let mut o = Overlay {
        schema_version: OVERLAY_SCHEMA_VERSION,
        profile: h100.name.clone(),
        backend: "cuda".into(),
        device: "test".into(),
        runs: vec![],
        gemm_bf16: Some(5e-5),
        attention: None,
        nvlink_busbw: None,
        network_busbw: None,
        gemm_overhead_us: None,
        nvlink_latency_us: None,
        network_latency_us: None,
        hbm: None,
        gemm_curve: None,
        benchmarks: vec![],
        gemm_points: vec![],
        collective_points: vec![],
        gemm_scale: None,
        attention_scale: None,
        comm_scale: None,
        log_points: vec![],
    };
    // A CPU's GEMM efficiency against a GPU's peak, labelled as a GPU overlay.
    let e = apply(&h100, &o, Target::Executor).unwrap_err().to_string();
    assert!(e.contains("gemm_bf16 = 5e-5 is out of range"), "{e}");
    o.backend = "cpu".into();
    let cpu = apply(&h100, &o, Target::Executor).unwrap();
    assert_eq!(cpu.efficiency.gemm_bf16, 5e-5);
    // A CPU run's op times hold their issuing: no host terms on top.
    assert!(h100.efficiency.host_layer_kernel_us > 0.0 && h100.efficiency.host_op_us > 0.0);
    let e = &cpu.efficiency;
    assert_eq!(
        (e.host_layer_kernel_us, e.host_op_us, e.host_kernel_us),
        (0.0, 0.0, 0.0)
    );
    for x in [f64::NAN, f64::INFINITY, 0.0, -1.0, 1e308] {
        o.gemm_bf16 = Some(x);
        let e = apply(&h100, &o, Target::Executor).unwrap_err().to_string();
        assert!(e.contains("gemm_bf16 = "), "{e}");
    }
    o.backend = "tpu".into();
    o.gemm_bf16 = Some(0.7);
    assert!(apply(&h100, &o, Target::Executor)
        .unwrap_err()
        .to_string()
        .contains("not one of cpu, cuda"));
    // What a GPU overlay makes is a valid profile, so a plan made with it is one
    // that `export` reads back.
    o.backend = "cuda".into();
    o.nvlink_busbw = Some(1.05);
    o.network_latency_us = Some(0.0);
    apply(&h100, &o, Target::Executor)
        .unwrap()
        .validate()
        .unwrap();
}

#[test]
fn gemm_fit_inverts_the_cost_models_form() {
    let peak = 1e15;
    let (eff, over) = (0.6, 7.0);
    let pts: Vec<GemmPoint> = [
        (1024u64, 1024u64, 1024u64),
        (4096, 4096, 4096),
        (8192, 1024, 4096),
        (256, 256, 256),
    ]
    .iter()
    .map(|&(m, n, k)| {
        let secs = 2.0 * (m * n * k) as f64 / (peak * eff) + over * 1e-6;
        GemmPoint {
            class: "mlp".into(),
            m,
            n,
            k,
            dtype: "bf16".into(),
            calls: 3,
            median_secs: secs,
            tflops: 0.0,
        }
    })
    .collect();
    let refs: Vec<&GemmPoint> = pts.iter().collect();
    let (e, o) = fit_gemms(&refs, peak).unwrap();
    assert!((e - eff).abs() < 1e-6 && (o - over).abs() < 1e-6, "{e} {o}");
}

/// A bare overlay (executor run or `sextant bench`) with every large GEMM at
/// `slow` x the time the profile gives it at its bare level.
fn bare_overlay(p: &HardwareProfile, slow: f64) -> Overlay {
    let bare = p.bare_gemm_bf16().unwrap();
    let peak = p.peak_flops(false);
    let shapes = [
        ("mlp", 2048u64, 9216u64, 2304u64),
        ("attention_proj", 4096, 2048, 4096),
        ("moe_experts", 1024, 2880, 2880),
        // Small and batched products take no part in the ratio.
        ("attention_core", 4096, 128, 4096),
        ("router", 4096, 128, 2048),
    ];
    let gemm_points = shapes
        .iter()
        .map(|&(class, m, n, k)| {
            let f = 2.0 * (m * n * k) as f64;
            let reference = match p.gemm_shape_factor(false, m as f64, n as f64, k as f64) {
                Some(shape) => f / (peak * bare * shape),
                None => f / (peak * bare) + p.efficiency.gemm_overhead_us * 1e-6,
            };
            let big = !matches!(class, "attention_core" | "router");
            let secs = if big {
                slow * reference
            } else {
                // Far off the reference: counted, it would move the ratio.
                50.0 * f / (peak * bare)
            };
            GemmPoint {
                class: class.into(),
                m,
                n,
                k,
                dtype: "bf16".into(),
                calls: 4,
                median_secs: secs,
                tflops: f / secs / 1e12,
            }
        })
        .collect();
    Overlay {
        schema_version: OVERLAY_SCHEMA_VERSION,
        profile: p.name.clone(),
        backend: "cuda".into(),
        device: "test".into(),
        runs: vec![],
        gemm_bf16: Some(0.78),
        attention: Some(0.24),
        nvlink_busbw: None,
        network_busbw: None,
        gemm_overhead_us: Some(6.0),
        nvlink_latency_us: None,
        network_latency_us: None,
        hbm: Some(0.89),
        gemm_curve: None,
        benchmarks: vec![],
        gemm_points,
        collective_points: vec![],
        gemm_scale: None,
        attention_scale: None,
        comm_scale: None,
        log_points: vec![],
    }
}

/// For planning a training stack, bare GEMMs measured 10% slower than the
/// profile's bare level take 10% off its fitted GEMM efficiencies (FP8 too), keep
/// its curves, per-call cost and attention, and carry nothing of the executor's
/// batched-GEMM attention; bare quantities (HBM) are replaced. For the
/// executor's own runs the measured levels replace the profile's.
#[test]
fn planning_moves_the_fitted_levels_by_the_bare_ratio() {
    for name in ["h100-sxm", "a100-80g"] {
        let p = crate::hardware::builtin_profile(name).unwrap();
        let o = bare_overlay(&p, 1.0 / 0.9);
        let r = bare_gemm_ratio(&p, &o.gemm_points).unwrap();
        assert!((r - 0.9).abs() < 1e-9, "{name}: {r}");
        let s = apply(&p, &o, Target::Stack).unwrap();
        let (e, e0) = (&s.efficiency, &p.efficiency);
        for (x, x0) in [(e.gemm_bf16, e0.gemm_bf16), (e.gemm_fp8, e0.gemm_fp8)] {
            assert!((x - 0.9 * x0).abs() < 1e-12, "{name}: {x} against {x0}");
        }
        assert_eq!(
            (e.attention_fwd, e.attention_bwd),
            (e0.attention_fwd, e0.attention_bwd)
        );
        assert_eq!(e.gemm_overhead_us, e0.gemm_overhead_us);
        assert_eq!(e.hbm, 0.89);
        assert_eq!(s.gemm_curves, p.gemm_curves);
        assert_eq!(s.attention_curves, p.attention_curves);
        assert!(s.sources["efficiency.gemm_bf16"].contains("x0.9000"));
        s.validate().unwrap();
        let x = apply(&p, &o, Target::Executor).unwrap();
        assert_eq!(
            (x.efficiency.gemm_bf16, x.efficiency.attention_fwd),
            (0.78, 0.24)
        );
        assert!(x.gemm_curves.is_empty());
    }
}

/// Without a bare level to read them against (no `gemm_bf16_bare`, no BF16 curve),
/// or without a large BF16 GEMM, bare measurements do not go into a plan: one
/// error, while the executor's own comparison still takes them.
#[test]
fn planning_needs_a_bare_reference() {
    let mut p = crate::hardware::builtin_profile("h100-sxm").unwrap();
    let o = bare_overlay(&p, 1.0);
    p.gemm_curves.clear();
    p.efficiency.gemm_bf16_bare = 0.0;
    assert!(p.bare_gemm_bf16().is_none());
    let e = apply(&p, &o, Target::Stack).unwrap_err().to_string();
    assert!(e.contains("states no bare GEMM level"), "{e}");
    apply(&p, &o, Target::Executor).unwrap();
    let p = crate::hardware::builtin_profile("h100-sxm").unwrap();
    let mut o = bare_overlay(&p, 1.0);
    o.gemm_points.retain(|g| g.class == "attention_core");
    let e = apply(&p, &o, Target::Stack).unwrap_err().to_string();
    assert!(e.contains("holds no timed large BF16 GEMM"), "{e}");
    // A log fit alone holds no bare measurement: it needs no reference.
    let mut logs = bare_overlay(&p, 1.0);
    (
        logs.gemm_bf16,
        logs.attention,
        logs.gemm_overhead_us,
        logs.hbm,
    ) = (None, None, None, None);
    logs.gemm_points.clear();
    logs.gemm_scale = Some(0.9);
    let s = apply(&p, &logs, Target::Stack).unwrap();
    assert!((s.efficiency.gemm_bf16 - 0.9 * p.efficiency.gemm_bf16).abs() < 1e-12);
}

/// Levels are multiplied, so a profile that carries a calibration (a plan made
/// with --calibration) takes no second one; GEMMs faster than the profile's bare
/// level by more than its fitted level allows are refused, naming the profile;
/// an overlay of HBM alone needs no bare level.
#[test]
fn planning_refuses_a_second_calibration_and_impossible_speed() {
    let p = crate::hardware::builtin_profile("h100-sxm").unwrap();
    let o = bare_overlay(&p, 1.0 / 0.9);
    let once = apply(&p, &o, Target::Stack).unwrap();
    assert!(once.calibrated && !p.calibrated);
    // The flag, or (plan files from before it) the source notes, refuse it alike.
    let mut flag_only = once.clone();
    flag_only.sources.clear();
    let mut notes_only = once.clone();
    notes_only.calibrated = false;
    for (profile, target) in [
        (&flag_only, Target::Stack),
        (&notes_only, Target::Stack),
        (&flag_only, Target::Executor),
    ] {
        let e = apply(profile, &o, target).unwrap_err().to_string();
        assert!(e.contains("carries a calibration already"), "{e}");
    }
    // The overlay's device line reaches plan files escaped and cut.
    let mut hostile = o.clone();
    hostile.device = format!("\u{1b}[2J{}", "x".repeat(10_000));
    let s = apply(&p, &hostile, Target::Stack).unwrap();
    let note = &s.sources["efficiency.gemm_bf16"];
    assert!(
        !note.contains('\u{1b}') && note.len() < p.sources["efficiency.gemm_bf16"].len() + 400,
        "{note}"
    );
    // 2x the bare level: 0.644 x 2 is above the peak.
    let e = apply(&p, &bare_overlay(&p, 0.5), Target::Stack)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("ran 2.000x the bare-GEMM level of profile 'h100-sxm'"),
        "{e}"
    );
    // HBM alone, on a profile with no bare level.
    let mut bare_less = p.clone();
    bare_less.gemm_curves.clear();
    let mut hbm = bare_overlay(&p, 1.0);
    (hbm.gemm_bf16, hbm.attention, hbm.gemm_overhead_us) = (None, None, None);
    hbm.gemm_points.clear();
    let s = apply(&bare_less, &hbm, Target::Stack).unwrap();
    assert_eq!(s.efficiency.hbm, 0.89);
    assert_eq!(s.efficiency.gemm_bf16, p.efficiency.gemm_bf16);
}

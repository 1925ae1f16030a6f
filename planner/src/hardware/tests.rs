use super::builtin::BUILTIN;
use super::*;

#[test]
fn builtin_profiles_parse_and_cite_sources() {
    let all = builtin_profiles();
    assert_eq!(all.len(), BUILTIN.len());
    for p in &all {
        for field in SOURCED_FIELDS {
            assert!(
                p.sources.keys().any(|k| k == field),
                "profile {} gives no source for {field}",
                p.name
            );
        }
        assert!(
            p.network.by_domains.is_empty() || p.sources.contains_key("network.by_domains"),
            "profile {} gives no source for network.by_domains",
            p.name
        );
    }
}

/// h100-sxm with the network's figures at 2, 8 and 32 domains.
fn with_network_points() -> HardwareProfile {
    let mut p = builtin_profile("h100-sxm").unwrap();
    p.network.by_domains = [(2, 0.6, 20.0), (8, 0.3, 10.0), (32, 0.1, 10.0)]
        .into_iter()
        .map(|(domains, busbw, latency_us)| NetworkPoint {
            domains,
            busbw,
            latency_us,
        })
        .collect();
    p
}

#[test]
fn network_points_interpolate_in_log_domains_and_hold_at_the_ends() {
    // Without points: the profile's single figures at every count.
    let p = builtin_profile("h100-sxm").unwrap();
    for d in [1, 2, 3, 64, 1 << 20] {
        assert_eq!(p.network_collective(d), (0.9, 5.0));
    }
    let p = with_network_points();
    assert_eq!(p.network_collective(2), (0.6, 20.0));
    assert_eq!(p.network_collective(8), (0.3, 10.0));
    // 4 is halfway from 2 to 8 in log2.
    let (b, l) = p.network_collective(4);
    assert!(
        (b - 0.45).abs() < 1e-12 && (l - 15.0).abs() < 1e-12,
        "{b} {l}"
    );
    // Outside the points: the nearest one's figures.
    assert_eq!(p.network_collective(1), (0.6, 20.0));
    assert_eq!(p.network_collective(1024), (0.1, 10.0));
    // Round trip through the file form; a profile without points writes none.
    let back = HardwareProfile::from_json(&serde_json::to_string(&p).unwrap()).unwrap();
    assert_eq!(back, p);
    let plain = serde_json::to_string(&builtin_profile("h100-sxm").unwrap()).unwrap();
    assert!(!plain.contains("by_domains"), "{plain}");
}

#[test]
fn network_points_are_checked_and_named() {
    let bad = |edit: fn(&mut HardwareProfile)| {
        let mut p = with_network_points();
        edit(&mut p);
        HardwareProfile::from_json(&serde_json::to_string(&p).unwrap())
            .unwrap_err()
            .to_string()
    };
    let e = bad(|p| p.network.by_domains[0].domains = 1);
    assert!(e.contains("network.by_domains[0].domains"), "{e}");
    let e = bad(|p| p.network.by_domains[2].domains = 8);
    assert!(
        e.contains("network.by_domains[2].domains") && e.contains("increasing"),
        "{e}"
    );
    let e = bad(|p| p.network.by_domains[1].busbw = 0.0);
    assert!(e.contains("network.by_domains[1].busbw"), "{e}");
    let e = bad(|p| p.network.by_domains[1].latency_us = -1.0);
    assert!(e.contains("network.by_domains[1].latency_us"), "{e}");
}

#[test]
fn lookup_by_alias_and_suggestion() {
    assert_eq!(builtin_profile("h100").unwrap().name, "h100-sxm");
    let e = builtin_profile("h10").unwrap_err().to_string();
    assert!(e.contains("h100"), "{e}");
}

#[test]
fn wrong_profile_names_the_field() {
    let text = include_str!("../../../hwprofiles/h100-sxm.json");
    let mut v: serde_json::Value = serde_json::from_str(text).unwrap();
    v["efficiency"]["gemm_bf16"] = serde_json::json!(1.7);
    let e = HardwareProfile::from_json(&v.to_string())
        .unwrap_err()
        .to_string();
    assert!(e.contains("efficiency.gemm_bf16"), "{e}");
    v["efficiency"]["gemm_bf16"] = serde_json::json!(0.7);
    v["node"]["gpus_per_node"] = serde_json::json!(0);
    let e = HardwareProfile::from_json(&v.to_string())
        .unwrap_err()
        .to_string();
    assert!(e.contains("gpus_per_node"), "{e}");
    v["node"].as_object_mut().unwrap().remove("gpus_per_node");
    let e = HardwareProfile::from_json(&v.to_string())
        .unwrap_err()
        .to_string();
    assert!(e.contains("gpus_per_node"), "{e}");
}

fn curve(points: serde_json::Value) -> Result<GemmCurve, serde_json::Error> {
    serde_json::from_value(
        serde_json::json!({"dtype": "bf16", "source": "test grid", "points": points}),
    )
}

/// A 2x2x2 grid whose throughput is 100 * m * n * k / 1024^3 TFLOP/s.
fn cube() -> GemmCurve {
    let mut pts = Vec::new();
    for m in [256.0, 1024.0] {
        for n in [256.0, 1024.0] {
            for k in [256.0, 1024.0] {
                pts.push(serde_json::json!([
                    m,
                    n,
                    k,
                    100.0 * m * n * k / 1024f64.powi(3)
                ]));
            }
        }
    }
    curve(serde_json::Value::Array(pts)).unwrap()
}

#[test]
fn gemm_curve_interpolates_in_log_space_and_saturates() {
    let c = cube();
    // At the grid points: the ratio to the best point.
    assert!((c.shape_factor(1024.0, 1024.0, 1024.0) - 1.0).abs() < 1e-12);
    assert!((c.shape_factor(256.0, 1024.0, 1024.0) - 0.25).abs() < 1e-12);
    // Between them: log-linear, so a power law is reproduced exactly.
    assert!((c.shape_factor(512.0, 1024.0, 1024.0) - 0.5).abs() < 1e-12);
    assert!((c.shape_factor(512.0, 512.0, 512.0) - 0.125).abs() < 1e-12);
    // Above the grid: the edge value, never above 1.
    assert_eq!(c.shape_factor(65536.0, 1e6, 4096.0), 1.0);
    // Below the grid: the smallest GEMM's time, so throughput falls with the size.
    let s = c.shape_factor(64.0, 1024.0, 1024.0);
    assert!((s - 0.25 * 64.0 / 256.0).abs() < 1e-12, "{s}");
    // Round trip through the file form.
    let back: GemmCurve = serde_json::from_str(&serde_json::to_string(&c).unwrap()).unwrap();
    assert_eq!(back, c);
}

#[test]
fn gemm_curve_rejects_holes_duplicates_and_bad_values() {
    let e = curve(serde_json::json!([
        [256, 256, 256, 5.0],
        [256, 256, 512, 9.0],
        [256, 512, 256, 9.0]
    ]))
    .unwrap_err()
    .to_string();
    assert!(e.contains("one point for every (m, n, k)"), "{e}");
    let e = curve(serde_json::json!([[256, 256, 256, -5.0]]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("tflops 0.01 to 50000"), "{e}");
    // A point near 0 would make a shape factor 0 and a GEMM's time infinite.
    let e = curve(serde_json::json!([[256, 256, 256, 1e-300]]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("tflops 0.01 to 50000"), "{e}");
    let e = curve(serde_json::json!([[0.5, 256, 256, 5.0]]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("m, n, k must be 1 to 1e7"), "{e}");
    let mut pts: Vec<serde_json::Value> = Vec::new();
    for m in [256, 512] {
        for n in [256, 512] {
            for k in [256, 512] {
                pts.push(serde_json::json!([m, n, k, 1.0]));
            }
        }
    }
    pts[7] = pts[0].clone();
    let e = curve(serde_json::Value::Array(pts))
        .unwrap_err()
        .to_string();
    assert!(e.contains("m=256 n=256 k=256 twice"), "{e}");
    // Two curves of one data type in a profile.
    let text = include_str!("../../../hwprofiles/h100-sxm.json");
    let mut v: serde_json::Value = serde_json::from_str(text).unwrap();
    let first = v["gemm_curves"][0].clone();
    v["gemm_curves"].as_array_mut().unwrap().push(first);
    let e = HardwareProfile::from_json(&v.to_string())
        .unwrap_err()
        .to_string();
    assert!(e.contains("gemm_curves"), "{e}");
}

/// The built-in curves: published points, and what they say about shapes that
/// training runs use.
#[test]
fn builtin_gemm_curves() {
    let h100 = builtin_profile("h100-sxm").unwrap();
    let s = |m: f64, n: f64, k: f64| h100.gemm_shape_factor(false, m, n, k).unwrap();
    // A GPT-3 175B TP-8 QKV GEMM runs near the best shape; a 256-row GEMM does not.
    assert!(s(8192.0, 4608.0, 12288.0) > 0.97);
    assert!(s(256.0, 4096.0, 4096.0) < 0.6);
    // More rows, columns or depth never make a GEMM less efficient per FLOP by
    // much (the table has measurement noise of a few percent).
    for (m, n, k) in [
        (1024.0, 1024.0, 1024.0),
        (2048.0, 512.0, 4096.0),
        (4096.0, 2048.0, 1024.0),
    ] {
        assert!(
            s(2.0 * m, n, k) > 0.95 * s(m, n, k)
                && s(m, 2.0 * n, k) > 0.95 * s(m, n, k)
                && s(m, n, 2.0 * k) > 0.95 * s(m, n, k)
        );
    }
    // FP8 GEMMs on Hopper use the BF16 shape (its FP8 entries are above the peak).
    assert_eq!(
        h100.gemm_shape_factor(true, 1024.0, 2048.0, 4096.0),
        h100.gemm_shape_factor(false, 1024.0, 2048.0, 4096.0)
    );
    let b200 = builtin_profile("b200").unwrap();
    assert_ne!(
        b200.gemm_shape_factor(true, 1024.0, 2048.0, 4096.0),
        b200.gemm_shape_factor(false, 1024.0, 2048.0, 4096.0)
    );
    assert!(builtin_profile("a100-80g")
        .unwrap()
        .gemm_shape_factor(false, 256.0, 256.0, 256.0)
        .is_none());
}

fn attention_curve(
    pass: &str,
    causal: bool,
    points: serde_json::Value,
) -> Result<AttentionCurve, serde_json::Error> {
    serde_json::from_value(
        serde_json::json!({"pass": pass, "causal": causal, "source": "test grid", "points": points}),
    )
}

/// Grid points are exact, between them the curve is log-linear in head width and
/// sequence length, and outside the grid it holds the nearest edge.
#[test]
fn attention_curve_interpolates_and_holds_its_edges() {
    let c = attention_curve(
        "fwd",
        true,
        serde_json::json!([
            [64, 1024, 100],
            [64, 4096, 200],
            [128, 1024, 200],
            [128, 4096, 400]
        ]),
    )
    .unwrap();
    let near = |a: f64, b: f64| (a - b).abs() < 1e-12;
    assert!(near(c.factor(128.0, 4096.0), 1.0) && near(c.factor(64.0, 1024.0), 0.25));
    // 2048 tokens sit halfway between 1024 and 4096 on a log axis: the geometric
    // mean; a head width of sqrt(64 x 128) likewise between the two widths.
    assert!(near(
        c.factor(128.0, 2048.0),
        (200.0f64 * 400.0).sqrt() / 400.0
    ));
    assert!(near(
        c.factor((64.0f64 * 128.0).sqrt(), 4096.0),
        (200.0f64 * 400.0).sqrt() / 400.0
    ));
    assert!(near(c.factor(256.0, 65536.0), 1.0) && near(c.factor(32.0, 256.0), 0.25));
    let back: AttentionCurve = serde_json::from_str(&serde_json::to_string(&c).unwrap()).unwrap();
    assert_eq!(back, c);
    for (points, why) in [
        (
            serde_json::json!([[64, 1024, 100], [64, 4096, 200], [128, 1024, 200]]),
            "one point for every (head_dim, seq)",
        ),
        (
            serde_json::json!([[64, 1024, 100], [64, 1024, 200]]),
            "at least two sequence lengths",
        ),
        (
            serde_json::json!([[64, 1024, 100], [64, 4096, -2]]),
            "tflops 0.01 to 50000",
        ),
    ] {
        let e = attention_curve("bwd", false, points)
            .unwrap_err()
            .to_string();
        assert!(e.contains(why), "{e}");
    }
    let mut v: serde_json::Value =
        serde_json::from_str(include_str!("../../../hwprofiles/h100-sxm.json")).unwrap();
    let first = v["attention_curves"][0].clone();
    v["attention_curves"].as_array_mut().unwrap().push(first);
    let e = HardwareProfile::from_json(&v.to_string())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("attention_curves") && e.contains("two curves"),
        "{e}"
    );
}

/// The built-in H100 curves (cuDNN's fused attention in FlashAttention-3's
/// benchmark): 64-wide heads and short sequences run well below the best point;
/// the backward, measured only without a mask, stands in for the causal one.
#[test]
fn builtin_attention_curves() {
    let h100 = builtin_profile("h100-sxm").unwrap();
    let f = |pass, d: f64, s: f64| h100.attention_factor(pass, d, s).unwrap();
    assert!((f(AttentionPass::Fwd, 128.0, 4096.0) - 518.0 / 539.0).abs() < 1e-12);
    assert!((f(AttentionPass::Bwd, 128.0, 4096.0) - 499.0 / 518.0).abs() < 1e-12);
    assert!(f(AttentionPass::Fwd, 64.0, 4096.0) < 0.7 && f(AttentionPass::Fwd, 128.0, 512.0) < 0.6);
    for pass in [AttentionPass::Fwd, AttentionPass::Bwd] {
        for d in [64.0, 128.0] {
            assert!(
                f(pass, d, 1024.0) < f(pass, d, 4096.0)
                    && f(pass, 64.0, 4096.0) < f(pass, 128.0, 4096.0)
            );
        }
    }
    assert!(builtin_profile("b200")
        .unwrap()
        .attention_factor(AttentionPass::Fwd, 128.0, 4096.0)
        .is_none());
}

#[test]
fn gpu_counts_must_fill_nodes() {
    let p = builtin_profile("h100-sxm").unwrap();
    assert!(Cluster::new(p.clone(), 128).is_ok());
    assert!(Cluster::new(p.clone(), 1).is_ok());
    assert!(Cluster::new(p.clone(), 4).is_ok());
    let e = Cluster::new(p.clone(), 7).unwrap_err().to_string();
    assert!(e.contains("7 GPUs"), "{e}");
    assert!(Cluster::new(p.clone(), 12).is_err());
    assert!(Cluster::new(p, 0).is_err());
}

/// A job on a multi-node NVLink domain (GB200 NVL72: 18 trays of 4) sees equal
/// segments of whole trays, the largest that divide its tray count and fit in a
/// rack (Megatron-Bridge's `--segment`); a job inside one rack sees itself; a job
/// of whole racks sees racks; one-node domains are unchanged.
#[test]
fn jobs_on_rack_scale_domains_are_placed_in_segments() {
    let gb200 = builtin_profile("gb200").unwrap();
    let domain = |gpus| {
        Cluster::new(gb200.clone(), gpus)
            .unwrap()
            .profile
            .node
            .nvlink_domain
    };
    assert_eq!(domain(4), 72);
    assert_eq!(domain(8), 8);
    assert_eq!(domain(64), 64);
    assert_eq!(domain(72), 72);
    assert_eq!(domain(256), 64);
    assert_eq!(domain(512), 64);
    assert_eq!(domain(576), 72);
    assert_eq!(domain(4 * 17 * 2), 68);
    // A prime tray count above a rack: one tray per segment.
    assert_eq!(domain(4 * 19), 4);
    let c = Cluster::new(gb200.clone(), 512).unwrap();
    assert_eq!(c.profile_domain, 72);
    // Re-reading a plan's profile gives the same segments.
    assert_eq!(
        Cluster::new(c.profile.clone(), 512)
            .unwrap()
            .profile
            .node
            .nvlink_domain,
        64
    );
    let h100 = builtin_profile("h100-sxm").unwrap();
    assert_eq!(
        Cluster::new(h100, 512).unwrap().profile.node.nvlink_domain,
        8
    );
}

/// The bare GEMM level a calibration is read against lies within the peak and at
/// or above the fitted training-stack level, whether stated or taken from the
/// BF16 curve's best point; every built-in profile satisfies it.
#[test]
fn bare_gemm_level_is_within_peak_and_above_the_fitted_level() {
    for p in builtin_profiles() {
        let b = p.bare_gemm_bf16().unwrap();
        assert!(b <= 1.0 && b >= p.efficiency.gemm_bf16, "{}: {b}", p.name);
    }
    let h100 = builtin_profile("h100-sxm").unwrap();
    let mut fast = serde_json::to_value(&h100).unwrap();
    for c in fast["gemm_curves"].as_array_mut().unwrap() {
        for pt in c["points"].as_array_mut().unwrap() {
            pt[3] = serde_json::json!(5000.0);
        }
    }
    let e = HardwareProfile::from_json(&fast.to_string())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("'gemm_curves'") && e.contains("above the peak"),
        "{e}"
    );
    let mut low = h100.clone();
    low.efficiency.gemm_bf16_bare = 0.3;
    let e = low.validate().unwrap_err().to_string();
    assert!(
        e.contains("'efficiency.gemm_bf16_bare'") && e.contains("below efficiency.gemm_bf16"),
        "{e}"
    );
}

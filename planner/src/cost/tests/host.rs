//! The host's share: MoE layers waiting for the host to issue them, and the CUDA
//! graph scopes that shorten the wait.

use super::*;

/// A mixture-of-experts layer whose forward blocks the host waits for the host
/// when issuing it takes longer than running it: Qwen3-30B-A3B at micro-batch 1
/// with 16 local experts is host-bound on an H100; a larger micro-batch, CUDA
/// graphs over the attention and router, a profile without host costs, a
/// full-iteration graph and a dense model are not (or less). The breakdown still
/// sums to the step.
#[test]
fn host_wait_bounds_fine_grained_moe_layers() {
    let m = resolve("qwen3-30b-a3b").unwrap().spec;
    let c = Cluster::new(builtin_profile("h100-sxm").unwrap(), 8).unwrap();
    let k = |mbs| ParallelConfig {
        ep: 8,
        dp: 8,
        mbs,
        zero: Zero::DistOpt,
        ..cfg(1, 1, 1, 8)
    };
    let w = wl(4096, 512);
    let run = |k: &ParallelConfig, a: Assumptions, c: &Cluster| evaluate(&m, c, &w, k, a).unwrap();
    let eager = run(&k(1), Assumptions::default(), &c);
    assert!(eager.time.host_wait > 0.0, "{:?}", eager.time);
    // The breakdown sums to the step.
    let t = &eager.time;
    let parts = t.compute.total()
        + t.recompute
        + t.exposed_comm
        + t.bubble
        + t.optimizer
        + t.overlap_slowdown
        + t.host_wait;
    assert!(
        (parts - eager.step_secs).abs() < 1e-6 * eager.step_secs,
        "{parts} vs {}",
        eager.step_secs
    );
    // Four times the tokens per micro-batch: more GPU time to hide the host behind.
    let big = run(&k(4), Assumptions::default(), &c);
    assert!(
        big.time.host_wait < 0.5 * eager.time.host_wait,
        "{} vs {}",
        big.time.host_wait,
        eager.time.host_wait
    );
    // Graphed scopes cost the host one launch each.
    let graphs = |g: &str| Assumptions {
        cuda_graphs: CudaGraphs::parse(g).unwrap(),
        ..Assumptions::default()
    };
    let partial = run(&k(1), graphs("attn moe_router moe_preprocess"), &c);
    assert!(partial.time.host_wait < eager.time.host_wait);
    assert!(partial.step_secs < eager.step_secs);
    let full = run(&k(1), graphs("full_iteration"), &c);
    assert_eq!(full.time.host_wait, 0.0);
    // A profile that prices no host time.
    let mut quiet = builtin_profile("h100-sxm").unwrap();
    quiet.efficiency.host_op_us = 0.0;
    quiet.efficiency.host_kernel_us = 0.0;
    let quiet = Cluster::new(quiet, 8).unwrap();
    let none = run(&k(1), Assumptions::default(), &quiet);
    assert_eq!(none.time.host_wait, 0.0);
    assert!(close(
        eager.step_secs - eager.time.host_wait,
        none.step_secs
    ));
    // Drop-and-pad routing has fixed shapes and no sync; other frameworks' MoE
    // layers are not priced with Megatron's counts.
    let padded = Workload {
        moe_capacity: Some(crate::routing::Capacity {
            factor: 1.25,
            pad: true,
        }),
        ..w.clone()
    };
    let pad = evaluate(&m, &c, &padded, &k(1), Assumptions::default()).unwrap();
    assert_eq!(pad.time.host_wait, 0.0);
    let titan = Assumptions {
        framework: Framework::Torchtitan,
        ..Assumptions::default()
    };
    assert_eq!(run(&k(1), titan, &c).time.host_wait, 0.0);
    // Recomputing the expert activation replays one checkpointed call, not one per
    // expert: a few hundred microseconds per layer at most.
    let moe_act = ParallelConfig {
        recompute: Recompute::Selective,
        recompute_modules: crate::config::RecomputeModules::MOE_ACT,
        ..k(1)
    };
    let act = run(&moe_act, Assumptions::default(), &c);
    let layers = m.moe_layers() as f64 * moe_act.micro_batches(&w) as f64;
    assert!(
        act.time.host_wait - eager.time.host_wait < layers * 400e-6,
        "{} vs {}",
        act.time.host_wait,
        eager.time.host_wait
    );
    // Dense layers do not block the host.
    let dense = resolve("llama3-8b").unwrap().spec;
    let d = evaluate(&dense, &c, &w, &cfg(1, 1, 1, 8), Assumptions::default()).unwrap();
    assert_eq!(d.time.host_wait, 0.0);
}

#[test]
fn cuda_graph_scopes_parse_and_print() {
    let g = CudaGraphs::parse("attn,moe_router+moe_preprocess").unwrap();
    assert!(g.attn && g.moe_router && g.moe_preprocess && !g.full_iteration);
    assert_eq!(g.to_string(), "attn moe_router moe_preprocess");
    assert_eq!(CudaGraphs::parse(&g.to_string()).unwrap(), g);
    assert!(CudaGraphs::parse("none").unwrap().is_none());
    assert!(CudaGraphs::parse("").unwrap().is_none());
    assert_eq!(CudaGraphs::default().to_string(), "none");
    let e = CudaGraphs::parse("attn mlp").unwrap_err().to_string();
    assert!(e.contains("'mlp'") && e.contains("moe_preprocess"), "{e}");
    let e = CudaGraphs::parse("full_iteration attn")
        .unwrap_err()
        .to_string();
    assert!(e.contains("alone"), "{e}");
    let e = CudaGraphs::parse("none,attn").unwrap_err().to_string();
    assert!(e.contains("one or the other"), "{e}");
    let e = CudaGraphs::parse(&"attn ".repeat(1000))
        .unwrap_err()
        .to_string();
    assert!(e.contains("5000 characters") && e.len() < 200, "{e}");
    assert!(CudaGraphs::parse("attn\nmoe_router").is_err());
}

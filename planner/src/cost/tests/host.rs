//! The host's share: MoE and small dense layers waiting for the host to issue
//! them, and the CUDA graph scopes that shorten the wait.

use super::*;

/// The breakdown, the host's wait included, sums to the step.
fn sums_to_the_step(e: &Estimate) {
    let t = &e.time;
    let parts = t.compute.total()
        + t.recompute
        + t.exposed_comm
        + t.bubble
        + t.optimizer
        + t.overlap_slowdown
        + t.host_wait;
    assert!(
        (parts - e.step_secs).abs() < 1e-6 * e.step_secs,
        "{parts} vs {}",
        e.step_secs
    );
}

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
    sums_to_the_step(&eager);
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
    // A dense layer with this much work per micro-batch keeps the GPU ahead of
    // the host.
    let dense = resolve("llama3-8b").unwrap().spec;
    let d = evaluate(&dense, &c, &w, &cfg(1, 1, 1, 8), Assumptions::default()).unwrap();
    assert_eq!(d.time.host_wait, 0.0);
}

/// A dense layer too small to keep the GPU busy costs its kernels at the host's
/// rate: SC'21's GPT 1.7B (hidden 2,304) at TP 8 and micro-batch 1, on the
/// 2021 Megatron stack (unfused softmax) with full recomputation, takes at least
/// its counted kernels per layer and micro-batch (14 forward; 28 backward, 12
/// gradient hooks and the replayed 14; 4 all-reduces and 2 replayed) at
/// `host_layer_kernel_us`. More work per micro-batch, a full-iteration graph, a
/// profile without the figure and a stack whose kernels are not counted shrink
/// or remove the wait; the breakdown still sums to the step.
#[test]
fn dense_host_wait_is_the_counted_kernels_at_the_host_rate() {
    let m = resolve("gpt-1.7b").unwrap().spec;
    let hw = builtin_profile("a100-80g").unwrap();
    let us = hw.efficiency.host_layer_kernel_us;
    assert!(us > 0.0);
    let c = Cluster::new(hw, 8).unwrap();
    let w = wl(2048, 64);
    let legacy = Assumptions {
        flash_attention: false,
        ..Assumptions::default()
    };
    let k = |mbs| ParallelConfig {
        mbs,
        recompute: Recompute::Full,
        ..cfg(8, 1, 1, 1)
    };
    let run = |k: &ParallelConfig, a: Assumptions, c: &Cluster| evaluate(&m, c, &w, k, a).unwrap();
    let small = run(&k(1), legacy, &c);
    assert!(small.time.host_wait > 0.0, "{:?}", small.time);
    let kernels = 14.0 + (28.0 + 12.0 + 14.0) + 4.0 + 2.0;
    let per_layer_mb = small.step_secs / (m.layers * small.micro_batches) as f64;
    assert!(
        per_layer_mb >= kernels * us * 1e-6,
        "{per_layer_mb} s per layer and micro-batch, below {kernels} kernels at {us} us"
    );
    sums_to_the_step(&small);
    // Eight times the tokens per micro-batch: the GPU outlasts the host.
    let big = run(&k(8), legacy, &c);
    assert!(big.time.host_wait < 0.25 * small.time.host_wait);
    // Megatron-Core with Transformer Engine issues fewer kernels per layer.
    let te = run(&k(1), Assumptions::default(), &c);
    assert!(te.time.host_wait < small.time.host_wait);
    // Nothing to wait for under a full-iteration graph, without the figure, or
    // for a stack whose kernels are not counted.
    let full = Assumptions {
        cuda_graphs: CudaGraphs::parse("full_iteration").unwrap(),
        ..legacy
    };
    assert_eq!(run(&k(1), full, &c).time.host_wait, 0.0);
    let titan = Assumptions {
        framework: Framework::Torchtitan,
        ..Assumptions::default()
    };
    assert_eq!(run(&k(1), titan, &c).time.host_wait, 0.0);
    let mut quiet = builtin_profile("a100-80g").unwrap();
    quiet.efficiency.host_layer_kernel_us = 0.0;
    let quiet = Cluster::new(quiet, 8).unwrap();
    let none = run(&k(1), legacy, &quiet);
    assert_eq!(none.time.host_wait, 0.0);
    assert!(close(
        small.step_secs - small.time.host_wait,
        none.step_secs
    ));
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

//! Communication terms and group placement: TP and SP collectives, the DP, PP, CP
//! and EP terms by hand, MoE dispatch and its overlap, rank orders.

use super::*;

/// ScaleTorch's grid `[DP, PP, CP, EP, TP]` puts a pipeline inside each
/// data-parallel replica: with TP 2, PP 4, DP 8 on 8-GPU nodes its stages are
/// neighbours on NVLink and its DP group has one member per node, the reverse
/// of Megatron's `tp-cp-ep-dp-pp`.
#[test]
fn scaletorch_order_places_pp_inside_and_dp_across_nodes() {
    let model = resolve("8b").unwrap().spec;
    let h100 = builtin_profile("h100-sxm").unwrap();
    let w = wl(4096, 256);
    let k = cfg(2, 4, 1, 8);
    let ctx = |rank_order| Ctx {
        model: &model,
        hw: &h100,
        w: &w,
        cfg: &k,
        a: Assumptions {
            rank_order,
            ..Assumptions::default()
        },
        tokens: 4096.0,
        fp8: false,
        domain: 8,
    };
    let (mega, st) = (ctx(RankOrder::Megatron), ctx(RankOrder::ScaleTorch));
    assert_eq!(mega.pp_group().tier(), Tier::Network);
    assert_eq!(st.pp_group().tier(), Tier::Nvlink);
    assert_eq!(
        (mega.dp_group().per_domain, mega.dp_group().domains),
        (4, 2)
    );
    assert_eq!((st.dp_group().per_domain, st.dp_group().domains), (1, 8));
    // Same groups for TP and CP.
    assert_eq!(mega.tp_group(), st.tp_group());
    assert_eq!(mega.cp_group(), st.cp_group());
}

/// Megatron's all-to-all dispatcher sorts the received tokens by local expert and
/// back (8h bytes per routed token beyond the permute and un-permute); with one
/// expert per rank, or DeepEP-style dispatch, it does not.
#[test]
fn all_to_all_dispatch_sorts_chunks_by_local_expert() {
    let model = resolve("gpt-oss-120b").unwrap().spec;
    let h100 = builtin_profile("h100-sxm").unwrap();
    let w = wl(4096, 64);
    let elementwise = |ep: u64, d: Dispatcher| {
        let k = ParallelConfig {
            ep,
            moe_dispatcher: d,
            ..cfg(1, 1, 1, 8)
        };
        layer_cost(
            &Ctx {
                model: &model,
                hw: &h100,
                w: &w,
                cfg: &k,
                a: Assumptions::default(),
                tokens: 4096.0,
                fp8: false,
                domain: 8,
            },
            LayerKind::Moe,
        )
        .fwd
        .elementwise
    };
    let c = Ctx {
        model: &model,
        hw: &h100,
        w: &w,
        cfg: &cfg(1, 1, 1, 8),
        a: Assumptions::default(),
        tokens: 4096.0,
        fp8: false,
        domain: 8,
    };
    // 4096 tokens x top-4 routed rows of 2880 BF16 values.
    let sort = c.mem(4096.0 * 4.0 * 8.0 * 2880.0);
    assert!(close(
        elementwise(8, Dispatcher::AllToAll) - elementwise(8, Dispatcher::Deduplicated),
        sort
    ));
    // 128 experts on 128 ranks: one local expert, nothing to sort.
    assert!(close(
        elementwise(128, Dispatcher::AllToAll),
        elementwise(128, Dispatcher::Deduplicated)
    ));
}

/// EP all-to-all overlap: hidden behind the partner pass's compute where
/// Megatron allows it (interleaved or no pipeline, no full recomputation) and
/// under DualPipe by construction; never elsewhere.
#[test]
fn ep_all_to_all_overlap_follows_megatrons_rules() {
    let m = resolve("qwen3-235b-a22b").unwrap().spec;
    let c = Cluster::new(builtin_profile("h100-sxm").unwrap(), 256).unwrap();
    let w = wl(4096, 1024);
    let base = ParallelConfig {
        tp: 2,
        pp: 8,
        vpp: 4,
        ep: 32,
        dp: 16,
        sp: true,
        zero: Zero::DistOpt,
        schedule: Schedule::Interleaved,
        moe_dispatcher: Dispatcher::Deduplicated,
        layout: Layout::AccountEmbeddingLoss,
        ..cfg(2, 8, 1, 16)
    };
    let on = |k: &ParallelConfig| ParallelConfig {
        overlap: Overlap {
            ep_comm: true,
            ..k.overlap
        },
        ..k.clone()
    };
    // The overlap's own mechanics, without the host: at micro-batch 1 this layer is
    // host-bound (`super::host`), and hiding its all-to-all then gains nothing.
    let mut quiet = c.profile.clone();
    quiet.efficiency.host_op_us = 0.0;
    quiet.efficiency.host_kernel_us = 0.0;
    let c = Cluster::new(quiet, 256).unwrap();
    let run = |k: &ParallelConfig| evaluate(&m, &c, &w, k, Assumptions::default()).unwrap();
    let (off_e, on_e) = (run(&base), run(&on(&base)));
    let (t_off, t_on) = (term(&off_e, CommKind::Ep), term(&on_e, CommKind::Ep));
    assert!(
        close(t_off.total_secs, t_on.total_secs),
        "the bytes do not change"
    );
    assert!(close(t_off.exposed_secs, t_off.total_secs));
    assert!(
        t_on.exposed_secs < 0.5 * t_off.exposed_secs && t_on.overlapped_secs > 0.0,
        "{t_on:?}"
    );
    assert!(on_e.step_secs < off_e.step_secs);
    // Paired fraction: 64 micro-batches x 4 chunks less the warm-up 7 + 3 x 8.
    assert_eq!(base.micro_batches(&w), 64);
    let f = on(&base).ep_overlap(&w).unwrap();
    assert!(close(f, (256.0 - 31.0) / 256.0), "{f}");
    // Megatron refuses the overlap with full recomputation and with a
    // non-interleaved pipeline: nothing changes there.
    for k in [
        ParallelConfig {
            recompute: Recompute::Full,
            ..on(&base)
        },
        ParallelConfig {
            vpp: 1,
            schedule: Schedule::OneFOneB,
            layout: Layout::Even,
            ..on(&base)
        },
    ] {
        assert_eq!(k.ep_overlap(&w), None);
    }
    // Without a pipeline every micro-batch but the first forward has a partner.
    let flat = ParallelConfig {
        pp: 1,
        vpp: 1,
        dp: 128,
        schedule: Schedule::OneFOneB,
        layout: Layout::Even,
        ..on(&base)
    };
    let mb = flat.micro_batches(&w) as f64;
    assert!(close(flat.ep_overlap(&w).unwrap(), (mb - 1.0) / mb));
    // DualPipe overlaps without the flag.
    let dual = ParallelConfig {
        vpp: 1,
        schedule: Schedule::DualPipe,
        layout: Layout::Even,
        ..base.clone()
    };
    assert!(dual.ep_overlap(&w).is_some() && base.ep_overlap(&w).is_none());
}

#[test]
fn tp_all_reduce_and_sp_collectives_per_layer() {
    let m = gpt("g", "test", 4, 4096, 32);
    let c = Cluster::new(builtin_profile("h100-sxm").unwrap(), 8).unwrap();
    let w = wl(2048, 4);
    let e = estimate(&m, &c, &w, &cfg(8, 1, 1, 1)).unwrap();
    let bytes = 2048.0 * 4096.0 * 2.0;
    let g = Placement::new(8, 1, 8);
    let ar = collective_secs(&c.profile, Collective::AllReduce, bytes, g);
    // 4 micro-batches x (4 layers x 4 all-reduces + 2 for the output layer).
    let t = term(&e, CommKind::Tp);
    assert!(
        close(t.total_secs, 4.0 * (4.0 * 4.0 + 2.0) * ar),
        "{} vs {}",
        t.total_secs,
        4.0 * 18.0 * ar
    );
    assert!(
        close(t.exposed_secs, t.total_secs),
        "TP is exposed without --tp-comm-overlap"
    );
    // With SP: an all-gather and a reduce-scatter in place of each all-reduce.
    let mut k = cfg(8, 1, 1, 1);
    k.sp = true;
    let e = estimate(&m, &c, &w, &k).unwrap();
    let agrs = collective_secs(&c.profile, Collective::AllGather, bytes, g)
        + collective_secs(&c.profile, Collective::ReduceScatter, bytes, g);
    assert!(close(term(&e, CommKind::Tp).total_secs, 4.0 * 18.0 * agrs));
    // Overlap hides some of it.
    k.overlap.tp_comm = true;
    let e2 = estimate(&m, &c, &w, &k).unwrap();
    assert!(term(&e2, CommKind::Tp).exposed_secs < term(&e, CommKind::Tp).exposed_secs);
}

#[test]
fn dp_pp_cp_and_ep_terms_are_hand_computable() {
    let c = Cluster::new(builtin_profile("h100-sxm").unwrap(), 16).unwrap();
    let hw = &c.profile;
    // DP all-reduce of FP32 gradients, in 40M-parameter buckets, over 16 GPUs.
    let m = resolve("llama3-8b").unwrap().spec;
    let mut k = cfg(1, 1, 1, 16);
    k.overlap.grad_reduce = false;
    let w = wl(4096, 32);
    let e = evaluate(&m, &c, &w, &k, Assumptions::default()).unwrap();
    let params = e.stages[0].memory.params;
    let buckets = (params / BUCKET_PARAMS).ceil();
    let g = Placement::new(16, 1, 8);
    let expect = buckets * collective_secs(hw, Collective::AllReduce, params * 4.0 / buckets, g);
    let t = term(&e, CommKind::DpGrad);
    assert!(close(t.total_secs, expect), "{} vs {expect}", t.total_secs);
    assert!(close(t.exposed_secs, expect), "no overlap requested");

    // PP: 2 (m v + p - 1) transfers of tokens x h x 2 / tp bytes between nodes.
    let k = cfg(8, 2, 1, 1);
    let e = estimate(&m, &c, &wl(4096, 8), &k).unwrap();
    let bytes = 4096.0 * 4096.0 * 2.0 / 8.0;
    let one = collective_secs(hw, Collective::SendRecv, bytes, Placement::new(2, 8, 8));
    let t = term(&e, CommKind::Pp);
    assert!(close(t.total_secs, 2.0 * (8.0 + 1.0) * one));
    assert_eq!(t.tier, Tier::Network);

    // CP: (cp - 1) ring steps of this rank's K and V, 3 passes (fwd, and K/V +
    // their gradients in bwd), per layer and micro-batch.
    let k = cfg(1, 1, 2, 8);
    let e = evaluate(&m, &c, &wl(8192, 8), &k, Assumptions::default()).unwrap();
    let kv = 4096.0 * 2.0 * (8.0 * 128.0) * 2.0;
    let step = collective_secs(hw, Collective::SendRecv, kv, Placement::new(2, 1, 8));
    let t = term(&e, CommKind::Cp);
    assert!(
        close(t.total_secs, 1.0 * 32.0 * 3.0 * step),
        "{} vs {}",
        t.total_secs,
        96.0 * step
    );

    // EP: dispatch + combine, forward and backward, of tokens/tp x top-k x h x 2.
    let m = resolve("mixtral-8x7b").unwrap().spec;
    let mut k = cfg(1, 1, 1, 16);
    k.ep = 8;
    k.zero = Zero::DistOpt;
    // Communication only: whether it fits does not matter here.
    let e = evaluate(&m, &c, &wl(4096, 16), &k, Assumptions::default()).unwrap();
    let bytes = 4096.0 * 2.0 * 4096.0 * 2.0;
    let a2a = collective_secs(hw, Collective::AllToAll, bytes, Placement::new(8, 1, 8));
    let t = term(&e, CommKind::Ep);
    assert!(close(t.total_secs, 1.0 * 32.0 * 4.0 * a2a));
    assert_eq!(t.tier, Tier::Nvlink);
    // Expert gradients reduce over the expert-DP group: 16 / 8 = 2 ranks.
    assert_eq!(term(&e, CommKind::EdpGrad).group.size, 2);

    // A deduplicating dispatcher sends fewer bytes over the network when the
    // EP group spans nodes: Qwen3-30B-A3B (128 experts, top-8) over 16 ranks
    // on 2 nodes.
    let m = resolve("qwen3-30b-a3b").unwrap().spec;
    k.ep = 16;
    k.dp = 16;
    let a2a = evaluate(&m, &c, &wl(4096, 16), &k, Assumptions::default()).unwrap();
    k.moe_dispatcher = Dispatcher::Deduplicated;
    let dedup = evaluate(&m, &c, &wl(4096, 16), &k, Assumptions::default()).unwrap();
    let (ta, td) = (
        term(&a2a, CommKind::Ep).total_secs,
        term(&dedup, CommKind::Ep).total_secs,
    );
    assert!(td < ta, "dedup {td} vs all-to-all {ta}");
}

/// Sharded data parallelism by layer, gathers and reductions per step: ZeRO-3
/// gathers before every pass and reduces after every backward; torchtitan's
/// ZeRO-2 without a pipeline gathers before every forward only (FSDP2 keeps the
/// parameters through the backward, then reshards); in a pipeline stage
/// torch.distributed.pipelining holds the gradients to the last micro-batch,
/// ZeRO-3 gathering before every backward and every warm-up forward, ZeRO-2 once.
#[test]
fn sharded_gathers_and_reductions_per_step_follow_the_framework() {
    let c = Cluster::new(builtin_profile("h100-sxm").unwrap(), 64).unwrap();
    let m = resolve("llama3-8b").unwrap().spec;
    let titan = Assumptions {
        framework: Framework::Torchtitan,
        ..Assumptions::default()
    };
    let counts = |zero: Zero, pp: u64, a: Assumptions| {
        let mut k = cfg(1, pp, 1, 64 / pp);
        k.zero = zero;
        let w = wl(4096, 8 * 64 / pp);
        let e = evaluate(&m, &c, &w, &k, a).unwrap();
        let layers = e.stages[0].layers as f64;
        let mb = 8.0;
        (
            term(&e, CommKind::DpParam).calls_per_step / layers / mb,
            term(&e, CommKind::DpGrad).calls_per_step / layers / mb,
        )
    };
    // Megatron-FSDP and FSDP2 resharding after the forward: 2 gathers and 1
    // reduction per micro-batch.
    assert_eq!(counts(Zero::Zero3, 1, Assumptions::default()), (2.0, 1.0));
    assert_eq!(counts(Zero::Zero3, 1, titan), (2.0, 1.0));
    assert_eq!(counts(Zero::Zero2, 1, titan), (1.0, 1.0));
    // Pipelined: 8 micro-batches, gradients reduced once.
    // ZeRO-3 regathers for every backward and for each warm-up forward before
    // the first stage's first backward (2 on 2 stages): 2 + 8 per 8 micro-batches.
    assert_eq!(counts(Zero::Zero3, 2, titan), (10.0 / 8.0, 1.0 / 8.0));
    assert_eq!(counts(Zero::Zero2, 2, titan), (1.0 / 8.0, 1.0 / 8.0));
    // Megatron-FSDP's optim_grads keeps the parameters whole: bucketed, one
    // gather per step after the optimizer, a reduction per micro-batch.
    let mut k = cfg(1, 1, 1, 64);
    k.zero = Zero::Zero2;
    let e = evaluate(&m, &c, &wl(4096, 8 * 64), &k, Assumptions::default()).unwrap();
    let buckets = (e.stages[0].memory.params / BUCKET_PARAMS).ceil();
    assert_eq!(term(&e, CommKind::DpParam).calls_per_step, buckets);
}

#[test]
fn expected_remote_domains_by_hand() {
    // 8 experts on 2 domains, top-2: the other domain is missed with
    // probability C(4,2)/C(8,2) = 6/28.
    assert!((expected_remote_domains(8, 2, 2) - (1.0 - 6.0 / 28.0)).abs() < 1e-12);
    // One domain: nothing crosses the network.
    assert_eq!(expected_remote_domains(256, 8, 1), 0.0);
    // Top-k of all experts reaches every domain.
    assert!((expected_remote_domains(8, 8, 4) - 3.0).abs() < 1e-12);
}

/// Every kind's record name parses back to it, and each communicates over the
/// rank-map group it always has: data-parallel reductions over DP x CP, expert
/// ones over EDP, the rest over the group of their own name.
#[test]
fn comm_kinds_name_their_records_and_groups() {
    for k in CommKind::ALL {
        assert_eq!(CommKind::from_key(k.key()), Some(k));
    }
    assert_eq!(CommKind::from_key("dp_cp"), None);
    let groups: Vec<(&str, &str)> = CommKind::ALL
        .iter()
        .map(|k| (k.key(), k.group().name()))
        .collect();
    assert_eq!(
        groups,
        [
            ("tp", "tp"),
            ("cp", "cp"),
            ("ep", "ep"),
            ("etp", "etp"),
            ("pp", "pp"),
            ("dp_grad", "dp_cp"),
            ("dp_param", "dp_cp"),
            ("edp_grad", "edp"),
            ("edp_param", "edp")
        ]
    );
}

/// Aleph Alpha's `scaling` synchronises after the last backward and overlaps
/// nothing: an FP32 all-reduce of every gradient in 500M-element buckets, then,
/// under its ZeRO-1, a BF16 all-gather of the parameters. The same plan priced as
/// Megatron-Core hides most of its reduce-scatter and gather behind the backward
/// and the forward. In a pipeline the later stages' drain may hide their
/// all-reduce, never the gather, which follows the step-wide gradient norm.
#[test]
fn scaling_synchronises_after_the_backward_in_fp32() {
    let c = Cluster::new(builtin_profile("a100-80g").unwrap(), 64).unwrap();
    let hw = &c.profile;
    let m = resolve("llama2-13b").unwrap().spec;
    let mut k = cfg(1, 1, 1, 64);
    k.zero = Zero::DistOpt;
    k.recompute = Recompute::Full;
    k.overlap.grad_reduce = true;
    k.overlap.param_gather = true;
    let w = wl(2048, 512);
    let scaling = Assumptions {
        framework: Framework::Scaling,
        ..Assumptions::default()
    };
    let e = evaluate(&m, &c, &w, &k, scaling).unwrap();
    let params = e.stages[0].memory.params;
    let buckets = (params / crate::memory::SCALING_BUCKET_ELEMENTS).ceil();
    assert!(buckets > 1.0, "13B parameters fill more than one bucket");
    let g = Placement::new(64, 1, 8);
    let reduce = buckets * collective_secs(hw, Collective::AllReduce, params * 4.0 / buckets, g);
    let gather = buckets * collective_secs(hw, Collective::AllGather, params * 2.0 / buckets, g);
    let (r, a) = (term(&e, CommKind::DpGrad), term(&e, CommKind::DpParam));
    assert_eq!(r.collective, Collective::AllReduce);
    assert!(close(r.total_secs, reduce), "{} vs {reduce}", r.total_secs);
    assert!(close(a.total_secs, gather), "{} vs {gather}", a.total_secs);
    assert!(close(r.exposed_secs, r.total_secs) && close(a.exposed_secs, a.total_secs));
    // Megatron-Core on the same plan: overlapped, so far less of it waits.
    let mcore = evaluate(&m, &c, &w, &k, Assumptions::default()).unwrap();
    let exposed = |e: &Estimate| {
        term(e, CommKind::DpGrad).exposed_secs + term(e, CommKind::DpParam).exposed_secs
    };
    assert!(exposed(&e) > 5.0 * exposed(&mcore));
    assert!(e.step_secs > mcore.step_secs);
    // The bucket copies and the whole stage's norm are optimizer passes, not
    // communication: more than Megatron-Core's shard-only step.
    assert!(e.time.optimizer > mcore.time.optimizer);
    // Without its ZeRO-1 there is no gather.
    let mut k0 = k.clone();
    k0.zero = Zero::None;
    let e0 = evaluate(&m, &c, &w, &k0, scaling).unwrap();
    assert!(e0.comm.iter().all(|t| t.kind != CommKind::DpParam));
    assert_eq!(
        term(&e0, CommKind::DpGrad).collective,
        Collective::AllReduce
    );
    // Two stages: the gather stays whole, whatever the drain hides.
    let mut k2 = k.clone();
    k2.pp = 2;
    k2.dp = 32;
    let e2 = evaluate(&m, &c, &w, &k2, scaling).unwrap();
    let a2 = term(&e2, CommKind::DpParam);
    assert!(close(a2.exposed_secs, a2.total_secs));
}

/// `scaling`'s language-model head gathers its logits over TP and every TP rank
/// computes the loss on the whole vocabulary: one all-gather of the BF16 logits
/// per micro-batch joins the TP term, and the last stage holds the whole
/// vocabulary's logits (4 bytes each: the gathered logits and the saved
/// log-softmax), where Megatron-Core holds its 1/TP share.
#[test]
fn scaling_gathers_the_logits_and_takes_the_loss_on_every_tp_rank() {
    let c = Cluster::new(builtin_profile("a100-80g").unwrap(), 64).unwrap();
    let hw = &c.profile;
    let m = resolve("llama2-13b").unwrap().spec;
    let mut k = cfg(8, 1, 1, 8);
    k.zero = Zero::DistOpt;
    k.recompute = Recompute::Full;
    let w = wl(2048, 64);
    let at = |k: &ParallelConfig, framework| {
        let a = Assumptions {
            framework,
            ..Assumptions::default()
        };
        evaluate(&m, &c, &w, k, a).unwrap()
    };
    let (s, mc) = (at(&k, Framework::Scaling), at(&k, Framework::MegatronCore));
    let tokens = 2048.0;
    let vocab = m.vocab as f64;
    let gather = collective_secs(
        hw,
        Collective::AllGather,
        tokens * vocab * 2.0,
        Placement::new(8, 1, 8),
    );
    let mb = s.micro_batches as f64;
    let (ts, tm) = (term(&s, CommKind::Tp), term(&mc, CommKind::Tp));
    assert!(
        close(ts.total_secs, tm.total_secs + mb * gather),
        "{} vs {} + {}",
        ts.total_secs,
        tm.total_secs,
        mb * gather
    );
    assert!(close(s.stages[0].memory.logits, tokens * vocab * 4.0));
    assert!(close(
        mc.stages[0].memory.logits,
        tokens * vocab / 8.0 * 6.0
    ));
    // Without TP nothing is gathered.
    k.tp = 1;
    k.dp = 64;
    let s1 = at(&k, Framework::Scaling);
    assert!(s1.comm.iter().all(|t| t.kind != CommKind::Tp));
}

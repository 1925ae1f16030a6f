use super::*;

#[test]
fn divisors_are_complete_and_sorted() {
    assert_eq!(divisors(12), vec![1, 2, 3, 4, 6, 12]);
    assert_eq!(divisors(1), vec![1]);
    assert_eq!(divisors(16), vec![1, 2, 4, 8, 16]);
}

fn cfg(pp: u64, vpp: u64, layout: Layout) -> ParallelConfig {
    ParallelConfig {
        tp: 1,
        pp,
        vpp,
        cp: 1,
        ep: 1,
        etp: 1,
        dp: 1,
        sp: false,
        mbs: 1,
        zero: Zero::None,
        recompute: Recompute::None,
        layout,
        overlap: Overlap::default(),
        bf16_grads: false,
        bf16_moments: false,
        recompute_modules: Default::default(),
        moe_dispatcher: Dispatcher::AllToAll,
        schedule: Schedule::default_for(vpp),
    }
}

#[test]
fn layouts_split_layers() {
    assert_eq!(
        cfg(4, 2, Layout::Even).stage_layers(80).unwrap(),
        vec![10; 8]
    );
    // Llama 3.1 405B, 126 layers on pp 8 x vpp 8 with embedding and loss counted.
    let v = cfg(8, 8, Layout::AccountEmbeddingLoss)
        .stage_layers(126)
        .unwrap();
    assert_eq!(v.len(), 64);
    assert_eq!(v.iter().sum::<u64>(), 126);
    assert_eq!((v[0], v[1], v[63]), (1, 2, 1));
    // One unit per virtual stage would leave the first and last without a layer:
    // said so, not "128 is not a multiple of 128".
    let e = cfg(16, 8, Layout::AccountEmbeddingLoss)
        .stage_layers(126)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("without a transformer layer") && e.contains("at most 64 virtual stages"),
        "{e}"
    );
    assert_eq!(
        cfg(
            4,
            1,
            Layout::FirstLast {
                first: 30,
                last: 30
            }
        )
        .stage_layers(126)
        .unwrap(),
        vec![30, 33, 33, 30]
    );
    assert!(cfg(16, 1, Layout::Even).stage_layers(126).is_err());
    assert!(cfg(
        4,
        1,
        Layout::FirstLast {
            first: 30,
            last: 31
        }
    )
    .stage_layers(126)
    .is_err());
}

#[test]
fn megatron_layout_strings() {
    // Megatron-Bridge's DeepSeek-V3 layout for pp 8 x vpp 2 (and pp 4 x vpp 4).
    let l = Layout::from_megatron("Et*4|(t*4|)*14tmL", 8).unwrap();
    let mut want = vec![4u64; 16];
    want[15] = 1;
    assert_eq!(
        (l.layout.clone(), l.vpp, l.mtp_layers),
        (
            Layout::Explicit {
                layers: want.clone()
            },
            2,
            1
        )
    );
    assert_eq!(cfg(8, 2, l.layout).stage_layers(61).unwrap(), want);
    assert_eq!(
        Layout::from_megatron("Et*4|(t*4|)*14tmL", 4).unwrap().vpp,
        4
    );
    // Megatron's docstring example: commas are cosmetic, an MTP-and-loss-only
    // last stage is allowed.
    let l = Layout::from_megatron("Ettt|(tt|)*29,m|L", 1);
    assert!(l.unwrap_err().to_string().contains("last virtual stage"));
    let l = Layout::from_megatron("Et|(tt|)*30mL", 8).unwrap();
    assert_eq!((l.vpp, l.mtp_layers), (4, 1));
    let Layout::Explicit { layers } = &l.layout else {
        panic!()
    };
    assert_eq!(
        (
            layers.len(),
            layers[0],
            layers[31],
            layers.iter().sum::<u64>()
        ),
        (32, 1, 0, 61)
    );
    // Nested groups expand; no MTP.
    let l = Layout::from_megatron("E((t|)*2)*2tL", 5).unwrap();
    assert_eq!(
        (l.layout, l.vpp, l.mtp_layers),
        (
            Layout::Explicit {
                layers: vec![1, 1, 1, 1, 1]
            },
            1,
            0
        )
    );
    for (bad, why) in [
        ("", "empty"),
        ("tt|ttL", "start with the embedding"),
        ("Ett|tt", "end with the loss"),
        ("Ett|tLL", "end with the loss"),
        ("Etx|tL", "'x' is not a pipeline layout character"),
        ("Et|mtL", "before the MTP layers"),
        ("Et|t|tL", "not a multiple of pp = 2"),
        ("E(t|tL", "never closed"),
        ("Et)|tL", "unmatched ')'"),
        ("E(t|)t|L", "needs a repeat count"),
        (
            format!("E{}tL", "(".repeat(50_000)).as_str(),
            "more than 16 deep",
        ),
        ("E*2t|tL", "start with the embedding"),
        ("Et*|tL", "whole repeat count"),
        ("Et*99999999999999|tL", "more than"),
        ("E|L", "no decoder layer"),
    ] {
        let e = Layout::from_megatron(bad, 2).unwrap_err().to_string();
        assert!(e.contains(why), "{bad}: {e}");
    }
}

#[test]
fn schedule_rules_and_files_without_a_schedule() {
    // A file written before the field existed reads as Megatron-LM's choice.
    for (vpp, expect) in [(1u64, Schedule::OneFOneB), (2, Schedule::Interleaved)] {
        let mut v = serde_json::to_value(cfg(4, vpp, Layout::Even)).unwrap();
        v.as_object_mut().unwrap().remove("schedule");
        let back: ParallelConfig = serde_json::from_value(v).unwrap();
        assert_eq!(back.schedule, expect);
        assert_eq!(back, cfg(4, vpp, Layout::Even));
    }
    let w = |gbs: u64| Workload {
        seq: 4096,
        global_batch: gbs,
        precision: Precision::Bf16,
        moe_imbalance: 1.0,
        moe_capacity: None,
    };
    let with = |pp: u64, vpp: u64, s: Schedule| ParallelConfig {
        schedule: s,
        ..cfg(pp, vpp, Layout::Even)
    };
    let why = |c: ParallelConfig, gbs: u64| {
        c.check_schedule(&w(gbs))
            .err()
            .map(|r| r.to_string())
            .unwrap_or_default()
    };
    assert!(why(with(4, 1, Schedule::Interleaved), 8).contains("needs vpp > 1"));
    assert!(why(with(4, 2, Schedule::OneFOneB), 8).contains("use vpp 1"));
    assert!(why(with(4, 2, Schedule::DualPipe), 8).contains("use vpp 1"));
    assert!(why(with(1, 1, Schedule::ZbH1), 8).contains("needs pipeline parallel size > 1"));
    assert!(why(with(3, 1, Schedule::DualPipe), 12).contains("even pipeline parallel size"));
    assert!(why(with(4, 1, Schedule::DualPipe), 6).contains("at least 2 x pp = 8"));
    assert!(why(with(4, 1, Schedule::DualPipe), 9).contains("even number of micro-batches"));
    assert_eq!(with(4, 1, Schedule::DualPipe).check_schedule(&w(8)), Ok(()));
    assert!(why(with(4, 1, Schedule::ZbH1), 3).contains("at least pp = 4 micro-batches"));
    assert_eq!(with(4, 1, Schedule::ZbH1).check_schedule(&w(4)), Ok(()));
    // Megatron-Core's interleaving: micro-batches in groups of pp.
    assert!(why(with(4, 2, Schedule::Interleaved), 2).contains("multiple of it"));
    assert!(why(with(4, 2, Schedule::Interleaved), 6).contains("multiple of it"));
    assert_eq!(
        with(4, 2, Schedule::Interleaved).check_schedule(&w(8)),
        Ok(())
    );
    assert_eq!(with(1, 1, Schedule::OneFOneB).check_schedule(&w(3)), Ok(()));
    assert_eq!(
        with(3, 1, Schedule::DualPipe)
            .check_schedule(&w(12))
            .unwrap_err()
            .kind(),
        RejectKind::Schedule
    );
}

/// Module names parse in Megatron's spelling, serialise as a list, and a plan
/// file written before the field existed reads Megatron's default; Megatron's
/// rules reject modules the model has nothing to replay for.
#[test]
fn recompute_modules_parse_serialise_and_check() {
    let m = RecomputeModules::parse("mla_up_proj, mlp").unwrap();
    assert!(
        m.contains(RecomputeModules::MLP)
            && m.contains(RecomputeModules::MLA_UP_PROJ)
            && !m.contains(RecomputeModules::CORE_ATTN)
    );
    assert_eq!(
        serde_json::to_string(&m).unwrap(),
        r#"["mla_up_proj","mlp"]"#
    );
    assert_eq!(
        serde_json::from_str::<RecomputeModules>(r#"["mlp","mla_up_proj"]"#).unwrap(),
        m
    );
    assert!(RecomputeModules::parse("attn")
        .unwrap_err()
        .to_string()
        .contains("unknown recompute module 'attn'"));
    assert!(RecomputeModules::parse(" , ").is_err());
    let mut v = serde_json::to_value(cfg(2, 1, Layout::Even)).unwrap();
    v.as_object_mut().unwrap().remove("recompute_modules");
    v.as_object_mut().unwrap().remove("bf16_moments");
    let old: ParallelConfig = serde_json::from_value(v).unwrap();
    assert_eq!(
        (old.recompute_modules, old.bf16_moments),
        (RecomputeModules::DEFAULT, false)
    );

    let dense = crate::presets::resolve("llama3-8b").unwrap().spec;
    let ds = crate::presets::resolve("deepseek-v3").unwrap().spec;
    let sel = |m: &str| ParallelConfig {
        recompute: Recompute::Selective,
        recompute_modules: RecomputeModules::parse(m).unwrap(),
        ..cfg(1, 1, Layout::Even)
    };
    assert!(sel("mla_up_proj")
        .check_recompute_modules(&dense)
        .unwrap_err()
        .to_string()
        .contains("multi-latent attention"));
    assert!(sel("moe_act").check_recompute_modules(&dense).is_err());
    assert!(sel("mla_up_proj,mlp,moe_act,layernorm,shared_experts")
        .check_recompute_modules(&ds)
        .is_ok());
    let not_selective = ParallelConfig {
        recompute: Recompute::Full,
        ..sel("mlp")
    };
    assert!(not_selective
        .check_recompute_modules(&ds)
        .unwrap_err()
        .to_string()
        .contains("needs selective"));
    // Megatron refuses the all-to-all overlap with "moe" recomputed.
    let ep = ParallelConfig {
        ep: 2,
        overlap: Overlap {
            ep_comm: true,
            ..Overlap::default()
        },
        ..sel("moe_act")
    };
    let w = Workload {
        seq: 4096,
        global_batch: 8,
        precision: Precision::Bf16,
        moe_imbalance: 1.0,
        moe_capacity: None,
    };
    assert!(ep.ep_overlap(&w).is_some());
    assert!(ParallelConfig {
        recompute_modules: RecomputeModules::parse("moe").unwrap(),
        ..ep
    }
    .ep_overlap(&w)
    .is_none());
}

#[test]
fn layer_counts_that_wrap_around_u64_are_refused() {
    // u64::MAX + 33 wraps to 32: a plan file could pass the sum check and then
    // index past the model's layers.
    let explicit = Layout::Explicit {
        layers: vec![u64::MAX, 33],
    };
    assert!(cfg(2, 1, explicit).stage_layers(32).is_err());
    let first_last = Layout::FirstLast {
        first: u64::MAX,
        last: 2,
    };
    assert!(cfg(3, 1, first_last).stage_layers(32).is_err());
    // The same counts without the wrap still split.
    let ok = Layout::Explicit {
        layers: vec![16, 16],
    };
    assert_eq!(cfg(2, 1, ok).stage_layers(32).unwrap(), vec![16, 16]);
}

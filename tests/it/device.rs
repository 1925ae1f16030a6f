//! The device program (what the CUDA backend issues, rank by rank) checked on the
//! CPU: every plan shape pairs up without a hang, its GEMM work is what the
//! planner's walk counts, and a broken program is caught with the ranks named.

use sextant_executor::program::{plan_hash, prepare, Options, Setup};
use sextant_executor::trace::{check, programs, tally, Op};
use sextant_planner::plan::PlanFile;
use sextant_planner::ranks::{GroupKind, RankMap};

use crate::common::{fails_with_one_line, sextant, stderr, stdout, TempDir};
use crate::exec::plan;

/// A plan from `sextant estimate`, prepared at its real sizes with `layers` layers
/// and `micro` micro-batches.
fn setup(
    dir: &TempDir,
    name: &str,
    args: &[&str],
    layers: Option<u64>,
    micro: Option<u64>,
) -> (String, Setup, RankMap) {
    let path = plan(dir, name, args);
    let text = std::fs::read_to_string(&path).unwrap();
    let opts = Options {
        full_size: true,
        scale_layers: layers,
        micro_batches: micro,
        ..Options::default()
    };
    let s = prepare(
        &PlanFile::from_json(&text).unwrap(),
        plan_hash(text.as_bytes()),
        &opts,
    )
    .unwrap();
    let map = s.rank_map().unwrap();
    (path, s, map)
}

#[test]
fn device_programs_pair_up_for_every_schedule_and_parallel_dimension() {
    let dir = TempDir::new("device-pairs");
    let dense = ["--model", "8b", "--gpus", "8"];
    let moe = ["--model", "30b-a3b", "--gpu", "b200", "--gpus", "8"];
    let cases: Vec<(&str, Vec<&str>)> = vec![
        (
            "tp2pp2dp2",
            [&dense[..], &["--tp", "2", "--pp", "2", "--sp", "false"]].concat(),
        ),
        (
            "cp2sp",
            [
                &dense[..],
                &[
                    "--tp", "2", "--cp", "2", "--pp", "2", "--sp", "true", "--zero", "1",
                ],
            ]
            .concat(),
        ),
        (
            "vpp",
            [
                &dense[..],
                &[
                    "--tp",
                    "2",
                    "--pp",
                    "4",
                    "--vpp",
                    "2",
                    "--sp",
                    "true",
                    "--recompute",
                    "selective",
                ],
            ]
            .concat(),
        ),
        (
            "zb",
            [
                &dense[..],
                &[
                    "--tp",
                    "2",
                    "--pp",
                    "4",
                    "--sp",
                    "true",
                    "--schedule",
                    "zb-h1",
                ],
            ]
            .concat(),
        ),
        (
            "gpipe",
            [
                &dense[..],
                &[
                    "--pp",
                    "8",
                    "--schedule",
                    "gpipe",
                    "--global-batch",
                    "32",
                    "--recompute",
                    "full",
                ],
            ]
            .concat(),
        ),
        (
            "dualpipe",
            [
                &dense[..],
                &[
                    "--tp",
                    "2",
                    "--pp",
                    "4",
                    "--sp",
                    "true",
                    "--schedule",
                    "dualpipe",
                    "--global-batch",
                    "32",
                ],
            ]
            .concat(),
        ),
        (
            "zero3",
            [
                &dense[..],
                &[
                    "--tp", "2", "--pp", "2", "--vpp", "2", "--sp", "true", "--zero", "3",
                ],
            ]
            .concat(),
        ),
        (
            "ep",
            [
                &moe[..],
                &[
                    "--tp",
                    "2",
                    "--pp",
                    "2",
                    "--ep",
                    "2",
                    "--sp",
                    "true",
                    "--recompute",
                    "full",
                ],
            ]
            .concat(),
        ),
        (
            "etp",
            [
                &moe[..],
                &["--tp", "2", "--ep", "2", "--etp", "2", "--sp", "true"],
            ]
            .concat(),
        ),
        (
            "etp-zero3",
            [
                &moe[..],
                &[
                    "--tp", "2", "--pp", "2", "--ep", "1", "--etp", "2", "--sp", "true", "--zero",
                    "3",
                ],
            ]
            .concat(),
        ),
    ];
    for (name, args) in cases {
        let (_, s, map) = setup(&dir, &format!("{name}.json"), &args, None, Some(16));
        let progs = programs(&s, &map);
        let c = check(&progs, &map).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(c.ops > 0 && c.total_flops > 0.0, "{name}: {c:?}");
        // Every rank starts the step together and holds no activations at its end.
        for (r, p) in progs.iter().enumerate() {
            assert_eq!(
                p.iter().filter(|o| matches!(o, Op::Barrier)).count(),
                1,
                "{name} rank {r}"
            );
            let kept = p.iter().filter(|o| matches!(o, Op::Keep { .. })).count();
            let freed = p.iter().filter(|o| matches!(o, Op::Free { .. })).count();
            assert_eq!(
                kept, freed,
                "{name} rank {r}: every kept activation is freed"
            );
        }
        if s.cfg.pp > 1 {
            assert!(c.p2p > 0, "{name}: a pipeline sends");
        }
        if s.cfg.tp > 1 || s.cfg.dp > 1 {
            assert!(
                c.collectives > 0,
                "{name}: groups of more than one rank communicate"
            );
        }
    }
}

/// Few micro-batches: with as many as pipeline stages, the interleaved schedule's
/// first ranks hold every forward in their warm-up (Megatron's
/// `are_all_microbatches_in_warmup`) while the last ones still run a steady state.
/// The programs pair up at every count a plan may carry, for every schedule:
/// `plan` ranked PP 4 VPP 6 with 4 micro-batches first, and its device programs
/// used to hang.
#[test]
fn device_programs_pair_up_at_few_micro_batches() {
    let dir = TempDir::new("device-few");
    let base = ["--model", "8b", "--gpus", "8", "--sp", "false"];
    let cases: [(&str, &[&str]); 5] = [
        ("i4x2", &["--pp", "4", "--vpp", "2", "--tp", "2"]),
        ("i4x4", &["--pp", "4", "--vpp", "4", "--tp", "2"]),
        ("i8x2", &["--pp", "8", "--vpp", "2"]),
        ("f4", &["--pp", "4", "--tp", "2", "--schedule", "1f1b"]),
        ("z4", &["--pp", "4", "--tp", "2", "--schedule", "zb-h1"]),
    ];
    for (name, extra) in cases {
        let args = [&base[..], extra].concat();
        let pp: u64 = extra[1].parse().unwrap();
        for m in [pp, 2 * pp, 3 * pp] {
            let (_, s, map) = setup(&dir, &format!("{name}-{m}.json"), &args, None, Some(m));
            check(&programs(&s, &map), &map).unwrap_or_else(|e| panic!("{name} m {m}: {e}"));
        }
    }
}

/// GEMM FLOPs of one step summed over every rank, from the executed sizes alone:
/// per token and layer, 6x the linear weights (forward, input and weight
/// gradients; the executed MLP's matrices) and the causal attention core (forward
/// 4 * seq/2 * head_dim * heads, backward 2.5x that, a selective replay 1x more).
fn model_flops(s: &Setup, replays: f64) -> f64 {
    let d = &s.dims;
    let (h, q, kv) = (
        d.hidden as f64,
        (d.heads * d.head_dim) as f64,
        (d.kv_heads * d.head_dim) as f64,
    );
    let mats = s.model.mlp.matrices() as f64;
    let linear = h * (q + 2.0 * kv) + q * h + mats * d.ffn as f64 * h;
    let attention = 4.0 * (d.seq / 2) as f64 * d.head_dim as f64 * d.heads as f64;
    let tokens = (d.seq * d.mbs) as f64 * (s.micro_batches * s.cfg.dp) as f64;
    tokens * d.layers as f64 * (6.0 * linear + (3.5 + replays) * attention)
}

#[test]
fn device_program_gemm_work_is_the_walks() {
    let dir = TempDir::new("device-flops");
    for (name, extra, replays) in [
        (
            "plain",
            vec![
                "--tp",
                "2",
                "--cp",
                "2",
                "--pp",
                "2",
                "--sp",
                "true",
                "--recompute",
                "none",
            ],
            0.0,
        ),
        (
            "selective",
            vec![
                "--tp",
                "4",
                "--pp",
                "2",
                "--sp",
                "true",
                "--recompute",
                "selective",
            ],
            1.0,
        ),
    ] {
        let args = [&["--model", "8b", "--gpus", "8"][..], &extra].concat();
        let (_, s, map) = setup(&dir, &format!("{name}.json"), &args, Some(8), Some(8));
        let c = check(&programs(&s, &map), &map).unwrap();
        // The executed sizes alone (the plan through `Setup::walk`), and the walk's
        // own tally, with the selective replay on top of the first run.
        let want = model_flops(&s, replays);
        let err = (c.total_flops - want).abs() / want;
        assert!(
            err < 1e-9,
            "{name}: programs {:.6e} FLOP vs sizes {want:.6e}",
            c.total_flops
        );
        let t = tally(&s, &map);
        assert!(
            (t.total_flops() - want).abs() / want < 1e-9,
            "{name}: walk tally"
        );
        let core: f64 = t.flops["attention_core"];
        let replayed: f64 = t.recompute_flops.values().sum();
        assert!(
            (replayed - replays * core / 3.5).abs() <= 1e-9 * core,
            "{name}: replayed {replayed:.6e} FLOP, core {core:.6e}"
        );
        // Balanced ranks: every one does an equal share.
        let per = want / map.world_size as f64;
        assert!(
            (c.max_rank_flops - per).abs() / per < 1e-9,
            "{name}: busiest rank {:.6e} vs share {per:.6e}",
            c.max_rank_flops
        );
    }
}

#[test]
fn a_broken_device_program_is_caught_with_the_ranks_named() {
    let dir = TempDir::new("device-broken");
    let (_, s, map) = setup(
        &dir,
        "p.json",
        &[
            "--model", "8b", "--gpus", "8", "--tp", "2", "--pp", "2", "--sp", "true",
        ],
        Some(4),
        Some(4),
    );
    let good = programs(&s, &map);
    // A pipeline receive that never happens: its sender waits forever.
    let mut lost = good.clone();
    let i = lost[2]
        .iter()
        .position(|o| matches!(o, Op::P2p { recvs, .. } if !recvs.is_empty()))
        .unwrap();
    lost[2].remove(i);
    let e = check(&lost, &map).unwrap_err().to_string();
    assert!(e.contains("would hang") && e.contains("rank 0"), "{e}");
    // Two TP collectives issued in the other order on one rank.
    let mut swapped = good.clone();
    let tp: Vec<usize> = swapped[0]
        .iter()
        .enumerate()
        .filter(|(_, o)| matches!(o, Op::Coll { .. }))
        .map(|(i, _)| i)
        .take(2)
        .collect();
    swapped[0].swap(tp[0], tp[1]);
    let e = check(&swapped, &map).unwrap_err().to_string();
    assert!(
        e.contains("different collectives") && e.contains("rank 0") && e.contains("rank 1"),
        "{e}"
    );
    // A transfer of the wrong size.
    let mut sized = good;
    let j = sized[0]
        .iter()
        .position(|o| matches!(o, Op::P2p { sends, .. } if !sends.is_empty()))
        .unwrap();
    if let Op::P2p { sends, .. } = &mut sized[0][j] {
        sends[0].1 += 2;
    }
    let e = check(&sized, &map).unwrap_err().to_string();
    assert!(e.contains("bytes"), "{e}");
}

#[test]
fn dry_run_prints_the_check_and_refuses_bad_input() {
    let dir = TempDir::new("device-dry");
    let (path, _, _) = setup(
        &dir,
        "p.json",
        &[
            "--model", "8b", "--gpus", "8", "--tp", "2", "--pp", "4", "--vpp", "2", "--sp", "true",
        ],
        None,
        None,
    );
    let o = sextant(&["exec", &path, "--dry-run", "--micro-batches", "8"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("pair up") && out.contains("no hang") && out.contains("Interleaved"),
        "{out}"
    );
    fails_with_one_line(
        &["exec", &path, "--dry-run", "--micro-batches", "6"],
        "use --micro-batches 8",
    );
    // The rank count is the plan's, with or without --dry-run.
    fails_with_one_line(
        &["exec", &path, "--dry-run", "--ranks", "3"],
        "but --ranks 3 was given: use --ranks 8",
    );
    // Each bound of the message tags names the flag that crosses it.
    fails_with_one_line(
        &["exec", &path, "--dry-run", "--max-steps", "5000"],
        "--max-steps 5000 with --warmup 1",
    );
    fails_with_one_line(
        &["exec", &path, "--dry-run", "--micro-batches", "2000000"],
        "give --micro-batches 1048575 or fewer",
    );
    // A count past the bounds gets the bound, not a wrapped interleaving hint.
    fails_with_one_line(
        &[
            "exec",
            &path,
            "--dry-run",
            "--micro-batches",
            &u64::MAX.to_string(),
        ],
        "give --micro-batches 1048575 or fewer",
    );
    fails_with_one_line(
        &["exec", &path, "--dry-run", "--micro-batches", "1048575"],
        "use --micro-batches 1048572",
    );
    fails_with_one_line(
        &["exec", &path, "--dry-run", "--warmup", "5000"],
        "--warmup 5000 with --max-steps 2: the executor numbers at most 4095 steps in all, warm-up included; use --warmup 4093 or fewer",
    );
    fails_with_one_line(
        &[
            "exec",
            &path,
            "--dry-run",
            "--max-steps",
            "4000",
            "--warmup",
            "100",
        ],
        "use --max-steps 3995 or fewer",
    );
    // The advice given is taken: 4093 warm-up steps and 2 timed ones are numbered.
    let o = sextant(&[
        "exec",
        &path,
        "--dry-run",
        "--warmup",
        "4093",
        "--micro-batches",
        "8",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    fails_with_one_line(
        &["exec", &path, "--dry-run", "--ranks", "0"],
        "--ranks 0: give the plan's 8 ranks",
    );
    // A dry run starts no process: a plan beyond the local launcher's 256 ranks is
    // checked with --ranks at its own count, and only the launch refuses it.
    let (big, _, _) = setup(
        &dir,
        "big.json",
        &[
            "--model", "8b", "--gpus", "512", "--tp", "8", "--pp", "4", "--sp", "true",
        ],
        Some(4),
        Some(4),
    );
    let o = sextant(&[
        "exec",
        &big,
        "--dry-run",
        "--ranks",
        "512",
        "--scale-layers",
        "4",
        "--micro-batches",
        "4",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("Device programs of 512 ranks"),
        "{}",
        stdout(&o)
    );
    fails_with_one_line(
        &["exec", &big, "--ranks", "512"],
        "the plan needs 512 ranks, more than the 256 local processes --ranks starts",
    );
    fails_with_one_line(
        &["exec", &path, "--dry-run", "--scale-layers", "3"],
        "--scale-layers 3",
    );
    // Too many ops is refused from a count, before any program is held; far too
    // many from two short walks (the step's ops grow linearly with its
    // micro-batches), before the long one.
    fails_with_one_line(
        &["exec", &path, "--dry-run", "--micro-batches", "100000"],
        "would hold at least",
    );
    fails_with_one_line(
        &["exec", &path, "--dry-run", "--micro-batches", "40000"],
        "more than 60000000",
    );
    // Hostile plan files: stage counts that wrap around u64 to the right total, and
    // a sequence and micro-batch each in range whose product is not.
    let text = std::fs::read_to_string(&path).unwrap();
    let mut plan: serde_json::Value = serde_json::from_str(&text).unwrap();
    plan["plans"][0]["config"]["layout"] =
        serde_json::json!({"kind": "explicit", "layers": [u64::MAX, 1, 1, 1, 1, 1, 1, 26]});
    let wrapped = dir.path("wrapped.json");
    std::fs::write(&wrapped, plan.to_string()).unwrap();
    fails_with_one_line(
        &["exec", wrapped.to_str().unwrap(), "--dry-run"],
        "summing to more than 2^64",
    );
    let mut plan: serde_json::Value = serde_json::from_str(&text).unwrap();
    plan["workload"]["seq"] = serde_json::json!(1u64 << 24);
    plan["workload"]["global_batch"] = serde_json::json!(1u64 << 26);
    plan["plans"][0]["config"]["mbs"] = serde_json::json!(1u64 << 24);
    let huge = dir.path("huge.json");
    std::fs::write(&huge, plan.to_string()).unwrap();
    fails_with_one_line(
        &[
            "exec",
            huge.to_str().unwrap(),
            "--dry-run",
            "--micro-batches",
            "8",
        ],
        "exceed 2^50 bytes",
    );
}

#[test]
fn device_program_state_and_activations_match_the_plan() {
    use sextant_executor::trace::{footprint, peaks};
    use sextant_planner::schedule::{simulate_schedule, PassCosts, Schedule};
    let dir = TempDir::new("device-state");
    for (name, extra) in [
        (
            "1f1b",
            vec!["--tp", "2", "--pp", "2", "--sp", "true", "--zero", "1"],
        ),
        (
            "vpp",
            vec![
                "--tp", "2", "--pp", "4", "--vpp", "2", "--sp", "true", "--zero", "1",
            ],
        ),
    ] {
        let args = [&["--model", "8b", "--gpus", "8"][..], &extra].concat();
        let (_, s, map) = setup(&dir, &format!("{name}.json"), &args, None, Some(16));
        let d = &s.dims;
        let (h, q, kv) = (
            d.hidden as u64,
            (d.heads * d.head_dim) as u64,
            (d.kv_heads * d.head_dim) as u64,
        );
        let per_layer = (h * (q + 2 * kv) + q * h + 2 * d.ffn as u64 * h) / s.cfg.tp;
        let v = if s.schedule == Schedule::Interleaved {
            s.cfg.vpp
        } else {
            1
        };
        let costs = PassCosts {
            forward: vec![1.0; s.cfg.pp as usize],
            backward: vec![2.0; s.cfg.pp as usize],
            weight: vec![0.0; s.cfg.pp as usize],
        };
        let sim = simulate_schedule(s.schedule, s.cfg.pp, v, s.micro_batches, &costs, 0.0).unwrap();
        for r in 0..map.world_size {
            let e = &map.ranks[r as usize];
            let layers: u64 = (0..s.stage_layers.len())
                .filter(|&vs| vs as u64 % s.cfg.pp == e.pp)
                .map(|vs| s.stage_layers[vs] as u64)
                .sum();
            let params = layers * per_layer;
            let (w, g, o) = footprint(&s, &map, r);
            assert_eq!(w, 2 * params, "{name} rank {r}: BF16 weights");
            assert_eq!(g, 4 * params, "{name} rank {r}: FP32 gradients");
            // The distributed optimizer shards 12 bytes per parameter over dp x cp.
            assert_eq!(
                o,
                12 * params / (s.cfg.dp * s.cfg.cp),
                "{name} rank {r}: optimizer state"
            );
            let (live, bytes) = peaks(&programs(&s, &map)[r as usize]);
            assert_eq!(
                live,
                (sim.peak_in_flight[e.pp as usize] * v as f64).round() as u64,
                "{name} rank {r}: chunks in flight"
            );
            assert!(bytes > 0);
        }
    }
}

#[test]
fn device_timings_are_booked_like_the_cpu_backend() {
    use sextant_executor::record::RankStats;
    use sextant_executor::trace::{book, Scratch};
    let dir = TempDir::new("device-book");
    let (_, s, map) = setup(
        &dir,
        "p.json",
        &[
            "--model",
            "8b",
            "--gpus",
            "8",
            "--tp",
            "2",
            "--pp",
            "2",
            "--sp",
            "true",
            "--recompute",
            "full",
        ],
        Some(4),
        Some(4),
    );
    let prog = &programs(&s, &map)[0];
    let size = |k: GroupKind| map.group_of(0, k).len() as u64;
    let mut st = RankStats::default();
    for op in prog {
        book(&mut st, op, 1e-3, size);
    }
    let gemm_ops = prog.iter().filter(|o| matches!(o, Op::Gemm { .. })).count() as f64;
    let classes = ["attention_proj", "attention_core", "mlp"];
    let booked: f64 = classes
        .iter()
        .map(|c| st.components.get(*c).copied().unwrap_or(0.0))
        .sum();
    assert!(
        (booked - gemm_ops * 1e-3).abs() < 1e-9,
        "{booked} vs {gemm_ops} GEMM ops"
    );
    let replayed = prog
        .iter()
        .filter(|o| {
            matches!(
                o,
                Op::Gemm {
                    recompute: true,
                    ..
                } | Op::Memory {
                    recompute: true,
                    ..
                }
            )
        })
        .count() as f64;
    assert!(replayed > 0.0 && (st.components["recompute"] - replayed * 1e-3).abs() < 1e-9);
    let calls: u64 = prog
        .iter()
        .map(|o| {
            if let Op::Gemm { batch, count, .. } = o {
                batch * count
            } else {
                0
            }
        })
        .sum();
    assert_eq!(st.gemms.values().map(|x| x.calls).sum::<u64>(), calls);
    // SP all-gathers of one micro-batch's rows over the 2 TP ranks: "kind op ranks bytes".
    let t = (s.dims.mbs * s.dims.seq) as u64;
    assert!(
        st.comms
            .contains_key(&format!("tp all_gather 2 {}", t * s.dims.hidden as u64 * 2)),
        "{:?}",
        st.comms.keys().collect::<Vec<_>>()
    );
    assert!(st.comms.keys().any(|k| k.starts_with("pp send_recv 2 ")));
    // Scratch holds the largest operand of each side.
    let sc = Scratch::of(prog, size);
    let biggest_out = prog
        .iter()
        .map(|o| {
            if let Op::Gemm { m, n, batch, .. } = o {
                m * n * batch * 2
            } else {
                0
            }
        })
        .max()
        .unwrap();
    assert_eq!(sc.c, biggest_out);
    assert!(sc.a >= t * s.dims.hidden as u64 && sc.b >= t * s.dims.hidden as u64 * 2);
}

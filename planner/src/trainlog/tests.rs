use super::*;

/// A Megatron-LM iteration line as `training_log` formats it.
fn megatron(iter: u64, ms: f64, gbs: u64) -> String {
    format!(
        " [2026-08-20 10:00:{:02}.123456] iteration {iter:8}/{:8} | consumed samples: {:12} | elapsed time per iteration (ms): {ms:.1} | throughput per GPU (TFLOP/s/GPU): {:.1} | learning rate: 3.000000E-04 | global batch size: {gbs:5} | lm loss: 7.123456E+00 | loss scale: 1.0 | grad norm: 1.234 | number of skipped iterations:   0 | number of nan iterations:   0 |",
        iter % 60,
        100,
        iter * gbs,
        400_000.0 / ms
    )
}

#[test]
fn megatron_lines_memory_and_arguments_are_read() {
    let mut text = String::from(
        "------------------------ arguments ------------------------\n  global_batch_size ............................... 256\n  micro_batch_size ................................ 1\n  num_layers ...................................... 32\n  pipeline_model_parallel_size .................... 2\n  seq_length ...................................... 4096\n  tensor_model_parallel_size ...................... 2\n  world_size ...................................... 8\n-------------------- end of arguments ---------------------\nusing world size: 8, data-parallel size: 2, context-parallel size: 1, hierarchical context-parallel sizes: None, tensor-model-parallel size: 2, pipeline-model-parallel size: 2\n",
    );
    for i in 1..=30 {
        text += &megatron(i, if i <= 2 { 5000.0 } else { 1000.0 + i as f64 }, 256);
        text.push('\n');
        if i == 2 {
            // Two ranks' memory reports written into one line.
            text += "[Rank 0] (after 2 iterations) memory (MB) | allocated: 20000.50 | max allocated: 40000.25 | reserved: 42000.00 | max reserved: 44000.00[Rank 4] (after 2 iterations) memory (MB) | allocated: 21000.00 | max allocated: 50000.00 | reserved: 52000.00 | max reserved: 54000.00\n";
        }
    }
    let log = parse(&text).unwrap();
    assert_eq!(log.format, LogFormat::Megatron);
    assert_eq!(log.iterations.len(), 30);
    assert_eq!(log.unreadable_lines, 0);
    let s = &log.stated;
    assert_eq!(
        (
            s.world_size,
            s.tp,
            s.pp,
            s.dp,
            s.cp,
            s.mbs,
            s.global_batch,
            s.seq
        ),
        (
            Some(8),
            Some(2),
            Some(2),
            Some(2),
            Some(1),
            Some(1),
            Some(256),
            Some(4096)
        )
    );
    // Rank 0's last field is cut by rank 4's report: its max reserved is not read.
    assert_eq!(log.memory[&0].max_reserved_bytes, None);
    assert_eq!(
        log.memory[&0].max_allocated_bytes,
        Some(40000.25 * 1048576.0)
    );
    let (alloc, _) = log.peak_memory_bytes();
    assert_eq!(alloc, Some(50000.0 * 1048576.0));
    // Warm-up: iterations 1..=10 dropped, the median of 11..=30 kept.
    let sum = log.summary(10).unwrap();
    assert_eq!((sum.kept, sum.warmup, sum.rampup), (20, 10, 0));
    assert!((sum.step_secs - 1.0205).abs() < 1e-9, "{}", sum.step_secs);
    assert_eq!(sum.global_batch, Some(256));
    assert!(sum.tflops_per_gpu.unwrap() > 0.0);
    // Without the warm-up rule the two slow lines are kept (the median barely moves).
    assert_eq!(log.summary(0).unwrap().kept, 30);
    let e = log.summary(100).unwrap_err().to_string();
    assert!(
        e.contains("all 30 iteration line(s) fall in the warm-up"),
        "{e}"
    );
}

#[test]
fn truncated_and_garbled_lines_are_skipped_not_misread() {
    let mut text = String::new();
    for i in 1..=20 {
        text += &megatron(i, 2000.0, 128);
        text.push('\n');
    }
    // Cut in the middle of the time: "elapsed time per iteration (ms): 20" of 2000.0.
    let full = megatron(21, 2000.0, 128);
    let cut = &full[..full.find("(ms): 2").unwrap() + "(ms): 20".len()];
    text += cut;
    text.push('\n');
    // Another process's output written into the number.
    text += &megatron(22, 2000.0, 128).replace("2000.0 |", "20[rank3]: warning 00.0 |");
    text.push('\n');
    // Cut before the time field.
    text += &full[..full.find("elapsed").unwrap()];
    text.push('\n');
    // The file ends inside the last line's time.
    let last = megatron(23, 2000.0, 128);
    text += &last[..last.find("(ms): 2").unwrap() + "(ms): 200".len()];
    let log = parse(&text).unwrap();
    assert_eq!(log.iterations.len(), 20);
    assert_eq!(log.unreadable_lines, 4);
    assert_eq!(log.summary(10).unwrap().step_secs, 2.0);
}

#[test]
fn a_batch_size_rampup_is_dropped() {
    let mut text = String::new();
    for i in 1..=40 {
        text += &megatron(
            i,
            if i < 20 { 500.0 } else { 1000.0 },
            if i < 20 { 64 } else { 128 },
        );
        text.push('\n');
    }
    let s = parse(&text).unwrap().summary(10).unwrap();
    assert_eq!((s.kept, s.rampup, s.global_batch), (21, 9, Some(128)));
    assert_eq!(s.step_secs, 1.0);
}

#[test]
fn bridge_memory_and_nemo2_lines_are_read() {
    // Megatron-Bridge: the same iteration line (timestamp without fraction),
    // its own step-time line and a memory report in GB.
    let mut text = String::new();
    for i in 1..=15 {
        text += &format!(" [2026-08-20 10:00:00] iteration {i:8}/{:8} | consumed samples: {:12} | elapsed time per iteration (ms): 3000.0 | throughput per GPU (TFLOP/s/GPU): 400.0 | learning rate: 1.000000E-04 | global batch size:    64 | lm loss: 9.000000E+00 | loss scale: 1.0 | number of skipped iterations:   0 | number of nan iterations:   0 |\nStep Time : 3.00s GPU utilization: 400.0MODEL_TFLOP/s/GPU\n", 15, i * 64);
    }
    text += "[Rank 0] (after 2 iterations) memory (GB) | mem-allocated-gigabytes: 20.5 | mem-active-gigabytes: 20.5 | mem-inactive-gigabytes: 1.0 | mem-reserved-gigabytes: 30.0 | mem-max-allocated-gigabytes: 60.25 | mem-max-active-gigabytes: 60.25 | mem-max-inactive-gigabytes: 2.0 | mem-max-reserved-gigabytes: 70.0 | mem-alloc-retires: 0 | mem-allocated-count: 1234\n";
    let log = parse(&text).unwrap();
    assert_eq!(log.format, LogFormat::Megatron);
    assert_eq!(log.summary(10).unwrap().step_secs, 3.0);
    assert_eq!(log.peak_memory_bytes(), (Some(60.25e9), Some(70.0e9)));

    // NeMo 2: Lightning's progress printer; its last field has no `|`.
    let mut text = String::from("Initializing distributed: GLOBAL_RANK: 0, MEMBER: 1/16\nInitializing distributed: GLOBAL_RANK: 3, MEMBER: 4/16\n");
    for i in 0..20 {
        text += &format!("Training epoch 0, iteration {i}/99 | lr: 1.961e-06 | global_batch_size: 256 | global_step: {i} | reduced_train_loss: 1.315 | train_step_timing in s: {} | consumed_samples: {}\n", if i < 3 { "9.126" } else { "2.5" }, (i + 1) * 256);
    }
    text += "Validation: iteration 5/10\n";
    // A last line cut after its time: the unterminated last field is not read.
    text += "Training epoch 0, iteration 20/99 | lr: 1.961e-06 | global_batch_size: 256 | global_step: 20 | reduced_train_loss: 1.315 | train_step_timing in s: 2.5";
    let log = parse(&text).unwrap();
    assert_eq!(log.format, LogFormat::Nemo2);
    assert_eq!(log.stated.world_size, Some(16));
    assert_eq!((log.iterations.len(), log.unreadable_lines), (20, 1));
    let s = log.summary(10).unwrap();
    assert_eq!((s.step_secs, s.global_batch, s.kept), (2.5, Some(256), 10));
}

#[test]
fn foreign_mixed_and_contradictory_logs_are_refused() {
    let pip = "Collecting torch\n  Downloading torch-2.9.0-cp312-cp312-manylinux_2_28_x86_64.whl (899.7 MB)\nSuccessfully installed torch-2.9.0\n";
    let e = parse(pip).unwrap_err().to_string();
    assert!(e.contains("no training iteration line in 3 line(s)"), "{e}");
    assert!(parse("")
        .unwrap_err()
        .to_string()
        .contains("no training iteration line"));
    let json = "{\"traceEvents\": [{\"name\": \"iteration 5/10 |\"}]}";
    let e = parse(json).unwrap_err().to_string();
    assert!(
        e.contains("1 line(s) start one but hold no readable time"),
        "{e}"
    );
    let mixed = format!(
        "{}\nTraining epoch 0, iteration 1/9 | global_batch_size: 8 | train_step_timing in s: 1.0\n",
        megatron(1, 1000.0, 8)
    );
    assert!(parse(&mixed)
        .unwrap_err()
        .to_string()
        .contains("mixes Megatron-LM"));
    let two = format!(
        "  world_size ...... 8\n{}\n  world_size ...... 16\n",
        megatron(1, 1000.0, 8)
    );
    let e = parse(&two).unwrap_err().to_string();
    assert!(e.contains("states world size 8 and 16"), "{e}");
    // Times that are no step time are counted apart from unreadable lines.
    for bad in [0.0, -5.0, f64::NAN, f64::INFINITY, 2e9] {
        let e = parse(&megatron(1, bad, 8)).unwrap_err().to_string();
        assert!(
            e.contains("no usable step time in 1 line(s): 1 iteration line(s) read, but their time is no step time between 1 us and 1e6 s"),
            "{e}"
        );
        assert!(
            !e.contains("no readable") && !e.contains("is this a training log"),
            "{e}"
        );
    }
    // A time under 1 us, written out in full.
    let tiny = megatron(1, 1.0, 8).replace("(ms): 1.0 |", "(ms): 0.0004 |");
    let e = parse(&tiny).unwrap_err().to_string();
    assert!(e.contains("no usable step time"), "{e}");
}

/// Lines spliced from the formats' own pieces, numbers and junk: reading them
/// never panics, and every step it keeps is a sane time.
mod prop {
    use super::super::*;
    use proptest::prelude::*;

    fn piece() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("iteration ".to_string()),
            Just(" | ".to_string()),
            Just("|".to_string()),
            Just("/".to_string()),
            Just(": ".to_string()),
            Just("elapsed time per iteration (ms): ".to_string()),
            Just("train_step_timing in s: ".to_string()),
            Just("global batch size: ".to_string()),
            Just("global_batch_size: ".to_string()),
            Just("throughput per GPU (TFLOP/s/GPU): ".to_string()),
            Just("[Rank ".to_string()),
            Just("] (after ".to_string()),
            Just(" iterations) memory (".to_string()),
            Just("MB)".to_string()),
            Just("GB)".to_string()),
            Just("max allocated: ".to_string()),
            Just("  world_size ....... ".to_string()),
            Just("using world size: ".to_string()),
            Just("MEMBER: ".to_string()),
            Just("Initializing distributed: GLOBAL_RANK: ".to_string()),
            any::<u64>().prop_map(|n| n.to_string()),
            any::<f64>().prop_map(|x| x.to_string()),
            "[0-9.eE+-]{1,12}",
            "\\PC{0,6}",
        ]
    }

    proptest! {
        #[test]
        fn spliced_lines_never_panic(lines in proptest::collection::vec(
            (proptest::collection::vec(piece(), 0..24), any::<bool>()), 0..40)
        ) {
            let mut r = LogReader::new();
            for (parts, complete) in &lines {
                r.line(&parts.concat(), *complete);
            }
            if let Ok(log) = r.finish() {
                for l in &log.iterations {
                    prop_assert!((STEP_SECS.0..=STEP_SECS.1).contains(&l.step_secs));
                }
                for w in [0, 10, u64::MAX] {
                    if let Ok(s) = log.summary(w) {
                        prop_assert!(s.step_secs.is_finite() && s.kept > 0);
                    }
                }
                let _ = log.peak_memory_bytes();
            }
        }
    }
}

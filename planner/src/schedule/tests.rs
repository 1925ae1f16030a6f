use super::*;

fn uniform(p: u64, f: f64, b: f64, w: f64) -> PassCosts {
    PassCosts {
        forward: vec![f; p as usize],
        backward: vec![b; p as usize],
        weight: vec![w; p as usize],
    }
}

/// Identical stages, free communication: the bubble equals the closed form
/// (p-1)/m for 1F1B and GPipe and (p-1)/(v m) interleaved, relative to the ideal
/// m (t_f + t_b).
#[test]
fn bubble_matches_closed_form() {
    for (s, p, v, m) in [
        (Schedule::OneFOneB, 4u64, 1u64, 8u64),
        (Schedule::OneFOneB, 8, 1, 32),
        (Schedule::Gpipe, 4, 1, 8),
        (Schedule::Interleaved, 4, 2, 8),
        (Schedule::Interleaved, 8, 4, 16),
        (Schedule::Interleaved, 2, 3, 4),
    ] {
        let costs = uniform(p, 1.0 / v as f64, 2.0 / v as f64, 0.0);
        let tl = simulate_schedule(s, p, v, m, &costs, 0.0).unwrap();
        assert_eq!(tl.tasks.len() as u64, 2 * p * v * m);
        let ideal = m as f64 * 3.0;
        let bubble = (tl.makespan - ideal) / ideal;
        let closed = (p - 1) as f64 / (v * m) as f64;
        assert!(
            (bubble - closed).abs() <= 0.005 * closed,
            "{s:?} p{p} v{v} m{m}: simulated {bubble}, closed form {closed}"
        );
    }
}

/// ZB-H1's bubble is (p-1)(T_F + T_B - T_W) (Qi et al. 2023), a third of
/// 1F1B's (p-1)(T_F + T_B + T_W) when the three passes cost the same; its peak
/// in-flight count (on the first stage) is 1F1B's.
#[test]
fn zero_bubble_h1() {
    for (p, m, f, b, w) in [
        (4u64, 8u64, 1.0, 1.0, 1.0),
        (4, 16, 1.0, 1.0, 1.0),
        (8, 24, 1.0, 1.2, 0.8),
        (2, 4, 1.0, 1.0, 0.5),
    ] {
        let costs = uniform(p, f, b, w);
        let zb = simulate_schedule(Schedule::ZbH1, p, 1, m, &costs, 0.0).unwrap();
        let fb = simulate_schedule(Schedule::OneFOneB, p, 1, m, &costs, 0.0).unwrap();
        let work = m as f64 * (f + b + w);
        let (pm1, eps) = ((p - 1) as f64, 1e-9);
        assert!(
            (zb.makespan - (work + pm1 * (f + b - w))).abs() < eps,
            "p{p} m{m}: ZB-H1 makespan {}",
            zb.makespan
        );
        assert!(
            (fb.makespan - (work + pm1 * (f + b + w))).abs() < eps,
            "p{p} m{m}: 1F1B makespan {}",
            fb.makespan
        );
        assert_eq!(zb.peak_in_flight[0], fb.peak_in_flight[0]);
    }
}

#[test]
fn in_flight_micro_batches_per_stage() {
    let (p, m) = (4u64, 8u64);
    let costs = uniform(p, 1.0, 2.0, 0.0);
    let fb = simulate_schedule(Schedule::OneFOneB, p, 1, m, &costs, 0.0).unwrap();
    assert_eq!(fb.peak_in_flight, vec![4.0, 3.0, 2.0, 1.0]);
    let gp = simulate_schedule(Schedule::Gpipe, p, 1, m, &costs, 0.0).unwrap();
    assert!(gp.peak_in_flight.iter().all(|&x| x == m as f64));
    // Interleaved: p + (p-1)/v stage-worths on the first rank (Korthikanti et al.).
    let il = simulate_schedule(
        Schedule::Interleaved,
        p,
        2,
        m,
        &uniform(p, 0.5, 1.0, 0.0),
        0.0,
    )
    .unwrap();
    assert_eq!(il.peak_in_flight[0], 4.0 + 3.0 / 2.0);
}

#[test]
fn no_rank_overlaps_itself_and_dependencies_hold() {
    let costs = PassCosts {
        forward: vec![1.0, 1.2, 1.0, 0.9],
        backward: vec![2.0, 2.1, 2.0, 2.4],
        weight: vec![0.0; 4],
    };
    let tasks = simulate_schedule(Schedule::Interleaved, 4, 2, 8, &costs, 0.05)
        .unwrap()
        .tasks;
    for r in 0..4 {
        let mut mine: Vec<&Task> = tasks.iter().filter(|t| t.rank == r).collect();
        mine.sort_by(|a, b| a.start.total_cmp(&b.start));
        for w in mine.windows(2) {
            assert!(w[0].end <= w[1].start + 1e-12);
        }
    }
    for t in tasks.iter().filter(|t| t.pass == Pass::Backward) {
        let f = tasks
            .iter()
            .find(|f| {
                f.pass == Pass::Forward
                    && f.rank == t.rank
                    && f.chunk == t.chunk
                    && f.micro_batch == t.micro_batch
            })
            .unwrap();
        assert!(f.end <= t.start + 1e-12);
    }
    assert!(
        simulate(4, 2, 6, &[1.0; 4], &[2.0; 4], 0.0).is_none(),
        "m not a multiple of p with interleaving"
    );
}

/// DualPipe's bubble in DeepSeek-V3's Table 2 (and the DualPipe README):
/// (PP/2 - 1)(F&B + B - 3W), with B the full backward (input and weight
/// gradient) and F&B the time of an overlapped forward-backward pair. With
/// identical stages and free communication, every rank does the same work, so
/// the bubble is each rank's idle time; the paper's expression is the largest
/// of them (the middle ranks'). It holds exactly when the input-gradient pass
/// costs what the forward does (T_B,input = T_F, as the paper's figure draws
/// them) and T_W <= T_F, for any overlap of the pair; other ratios move the
/// critical path off the paper's count.
#[test]
fn dualpipe_bubble_matches_paper() {
    for (p, m) in [
        (2u64, 4u64),
        (4, 8),
        (4, 20),
        (6, 12),
        (8, 16),
        (8, 20),
        (8, 32),
        (12, 30),
        (16, 32),
        (16, 48),
    ] {
        for (f, w) in [(1.0, 1.0), (1.0, 0.5), (1.0, 0.0), (0.7, 0.3)] {
            for overlap in [0.0, 0.5, 1.0] {
                let b = f;
                let costs = uniform(p, f, b, w);
                let tl = simulate_schedule_with(Schedule::DualPipe, p, 1, m, &costs, 0.0, overlap)
                    .unwrap();
                let full_b = b + w;
                let f_and_b = f + full_b - overlap * f64::min(f, full_b);
                let paper = (p as f64 / 2.0 - 1.0) * (f_and_b + full_b - 3.0 * w);
                let bubble = tl.idle_per_rank.iter().copied().fold(0.0, f64::max);
                assert!((bubble - paper).abs() < 1e-9, "p{p} m{m} f{f} w{w} overlap {overlap}: simulated bubble {bubble}, paper {paper}");
            }
        }
    }
    // Against 1F1B's (p-1)(F+B) and ZB-H1's (p-1)(F+B-2W) (full B) at the same
    // per-stage costs, pairs back to back: p = 8, F = B = W = 1 gives 6 vs 21 vs 7.
    let costs = uniform(8, 1.0, 1.0, 1.0);
    let bubble = |s: Schedule| {
        let tl = simulate_schedule(s, 8, 1, 32, &costs, 0.0).unwrap();
        tl.idle_per_rank.iter().copied().fold(0.0, f64::max)
    };
    assert!((bubble(Schedule::DualPipe) - 6.0).abs() < 1e-9);
    assert!((bubble(Schedule::OneFOneB) - 21.0).abs() < 1e-9);
    assert!((bubble(Schedule::ZbH1) - 7.0).abs() < 1e-9);
}

/// Every (p, m) DualPipe accepts simulates without a cycle, with uneven stages
/// and a transfer cost; each micro-batch passes every stage once forward and
/// once backward, in its own direction, and the dependencies hold.
#[test]
fn dualpipe_never_deadlocks() {
    for p in [2u64, 4, 6, 8, 10, 12, 16] {
        for m in [
            2 * p,
            2 * p + 2,
            2 * p + 4,
            3 * p + (3 * p) % 2,
            4 * p,
            4 * p + 6,
            8 * p,
        ] {
            let costs = PassCosts {
                forward: (0..p).map(|s| 1.0 + 0.1 * (s % 3) as f64).collect(),
                backward: (0..p).map(|s| 1.1 + 0.2 * (s % 2) as f64).collect(),
                weight: (0..p).map(|s| 0.6 + 0.05 * s as f64).collect(),
            };
            for overlap in [0.0, 0.7] {
                let tl = simulate_schedule_with(Schedule::DualPipe, p, 1, m, &costs, 0.05, overlap)
                    .unwrap_or_else(|| panic!("p{p} m{m}: deadlock"));
                for r in 0..p {
                    let mine: Vec<&Task> = tl.tasks.iter().filter(|t| t.rank == r).collect();
                    assert_eq!(
                        mine.iter().filter(|t| t.pass == Pass::Forward).count() as u64,
                        m
                    );
                    assert_eq!(
                        mine.iter().filter(|t| t.pass == Pass::Backward).count() as u64,
                        m
                    );
                    let mut sorted = mine.clone();
                    sorted.sort_by(|a, b| a.start.total_cmp(&b.start));
                    for w in sorted.windows(2) {
                        assert!(
                            w[0].end <= w[1].start + 1e-9,
                            "p{p} m{m}: rank {r} overlaps itself"
                        );
                    }
                }
                let find = |pass: Pass, stage: u64, mb: u64| {
                    let (r, c) = locate(Schedule::DualPipe, p, m, stage, mb);
                    tl.tasks
                        .iter()
                        .find(|t| {
                            t.pass == pass && t.rank == r && t.chunk == c && t.micro_batch == mb
                        })
                        .unwrap_or_else(|| {
                            panic!("p{p} m{m}: no {pass:?} of micro-batch {mb} at stage {stage}")
                        })
                };
                for mb in 0..m {
                    assert_eq!(find(Pass::Forward, 0, mb).chunk, u64::from(mb >= m / 2));
                    for s in 1..p {
                        assert!(
                            find(Pass::Forward, s, mb).start
                                >= find(Pass::Forward, s - 1, mb).end + 0.05 - 1e-9
                        );
                        assert!(
                            find(Pass::Backward, s - 1, mb).start
                                >= find(Pass::Backward, s, mb).end + 0.05 - 1e-9
                        );
                    }
                    assert!(
                        find(Pass::Backward, p - 1, mb).start
                            >= find(Pass::Forward, p - 1, mb).end - 1e-9
                    );
                }
            }
        }
    }
    let costs = uniform(4, 1.0, 1.0, 1.0);
    assert!(
        simulate_schedule(Schedule::DualPipe, 4, 1, 6, &costs, 0.0).is_none(),
        "m < 2p"
    );
    assert!(
        simulate_schedule(Schedule::DualPipe, 4, 1, 9, &costs, 0.0).is_none(),
        "odd m"
    );
    assert!(
        simulate_schedule(
            Schedule::DualPipe,
            3,
            1,
            12,
            &uniform(3, 1.0, 1.0, 1.0),
            0.0
        )
        .is_none(),
        "odd p"
    );
}

/// DeepSeek-V3 Table 2: DualPipe keeps 2x the parameters (each rank holds
/// stages r and p-1-r, so every stage sits on two ranks) and PP+1 stages'
/// worth of activations per rank, against 1F1B's 1x and PP (first stage).
#[test]
fn dualpipe_memory_relation() {
    for (p, m) in [(2u64, 4u64), (4, 8), (4, 16), (8, 16), (8, 40), (16, 32)] {
        let mut copies = vec![0u64; p as usize];
        for r in 0..p {
            for c in 0..Schedule::DualPipe.chunks_per_rank(1) {
                copies[virtual_stage(Schedule::DualPipe, p, r, c) as usize] += 1;
            }
        }
        assert!(copies.iter().all(|&n| n == 2), "p{p}: {copies:?}");
        let costs = uniform(p, 1.0, 1.0, 0.8);
        let dp = simulate_schedule(Schedule::DualPipe, p, 1, m, &costs, 0.0).unwrap();
        assert!(
            dp.peak_in_flight.iter().all(|&x| x == (p + 1) as f64),
            "p{p} m{m}: {:?}",
            dp.peak_in_flight
        );
        let fb = simulate_schedule(Schedule::OneFOneB, p, 1, m, &costs, 0.0).unwrap();
        assert_eq!(fb.peak_in_flight[0], p as f64);
    }
}

#[test]
fn virtual_stages_and_overlapped_pairs() {
    assert_eq!(virtual_stage(Schedule::Interleaved, 4, 1, 1), 5);
    assert_eq!(virtual_stage(Schedule::OneFOneB, 4, 3, 0), 3);
    assert_eq!(
        (
            virtual_stage(Schedule::DualPipe, 8, 2, 0),
            virtual_stage(Schedule::DualPipe, 8, 2, 1)
        ),
        (2, 5)
    );
    for s in Schedule::ALL {
        assert_eq!(Schedule::parse(s.name()), Some(s));
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(serde_json::from_str::<Schedule>(&json).unwrap(), s);
    }
    // Only DualPipe overlaps pairs; its pairs are a forward then a backward of
    // the other direction, and the order holds every pass once.
    assert!(overlapped_with_next(Schedule::ZbH1, 4, 1, 8, 0)
        .iter()
        .all(|&x| !x));
    let (p, m) = (8u64, 20u64);
    for r in 0..p {
        let order = rank_order(Schedule::DualPipe, p, 1, m, r);
        let fused = overlapped_with_next(Schedule::DualPipe, p, 1, m, r);
        assert_eq!(order.len(), fused.len());
        let pairs = fused.iter().filter(|&&x| x).count() as u64;
        let middle = r == p / 2 - 1 || r == p / 2;
        let outer = p / 2 - r.min(p - 1 - r) - 1;
        assert_eq!(
            pairs,
            2 * (m / 2 + r.min(p - 1 - r) + 1 - p) + outer - u64::from(middle),
            "rank {r}"
        );
        for (i, _) in fused.iter().enumerate().filter(|(_, &x)| x) {
            let (a, b) = (order[i], order[i + 1]);
            assert!(
                a.0 == Pass::Forward && b.0 == Pass::Backward && a.1 != b.1,
                "rank {r}: {a:?} with {b:?}"
            );
        }
        let mut seen = std::collections::HashSet::new();
        assert!(
            order.iter().all(|op| seen.insert(*op)),
            "rank {r} repeats a pass"
        );
    }
}

//! Search speed on the two cases the planner-core issue names: Llama 3 70B on 128
//! H100s (target: the whole command under 1 s) and Llama 3.1 405B on 16384 H100s
//! (target: under 5 s on a 2-core machine). Each benchmark also checks its result.

use criterion::{criterion_group, criterion_main, Criterion};
use sextant_planner::config::{Precision, Workload};
use sextant_planner::hardware::{builtin_profile, Cluster};
use sextant_planner::presets::resolve;
use sextant_planner::search::{search, SearchSpace};

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("search");
    g.sample_size(10);
    for (model, gpus) in [("70b", 128u64), ("405b", 16384), ("deepseek-v3", 2048)] {
        let m = resolve(model).unwrap().spec;
        let cl = Cluster::new(builtin_profile("h100-sxm").unwrap(), gpus).unwrap();
        let w = Workload { seq: 4096, global_batch: 1024, precision: Precision::Bf16, moe_imbalance: 1.0 };
        let space = SearchSpace::default();
        let r = search(&m, &cl, &w, &space, 10);
        assert!(r.valid > 0 && r.top.len() == 10, "{model} on {gpus}: no plan");
        g.bench_function(format!("{model}-{gpus}gpus-{}configs", r.enumerated), |b| b.iter(|| search(&m, &cl, &w, &space, 10)));
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);

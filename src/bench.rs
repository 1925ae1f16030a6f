//! `sextant bench gemm|hbm|nccl|p2p`: microbenchmarks of this machine's GPUs,
//! written in the benchmark format (`sextant_planner::bench`) with the device, the
//! driver and library versions and the date. The measuring is the executor's CUDA
//! backend (`--features cuda`); this module reads the arguments, the plan, the
//! clock and `/proc`, and writes the file.
//! Without the feature the executor's benchmark functions are stand-ins with the
//! same types (candle's dummy backend), so this module has no `cfg` of its own
//! beyond `cmd_bench`'s early one-line refusal.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{anyhow, bail, Result};
use clap::{Args, Subcommand};
use sextant_planner::bench::{BenchFile, BenchGemm};

use crate::io::{check_outputs, read_text, write_new};

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(subcommand)]
    which: Which,
}

#[derive(Subcommand, Debug)]
enum Which {
    /// BF16 GEMM TFLOP/s (cuBLAS) over a grid of shapes, and a plan's GEMM shapes with
    /// --plan: a hardware profile's measured GEMM curve.
    Gemm(GemmArgs),
    /// HBM bandwidth: device-to-device copies and memsets of large buffers.
    Hbm(HbmArgs),
    /// NCCL all-reduce, all-gather and reduce-scatter bus bandwidth over this
    /// machine's GPUs (one process, one rank per GPU; on one GPU, NCCL's one-rank copy).
    Nccl(NcclArgs),
    /// Copy bandwidth between two GPUs, both ways (cuMemcpyPeerAsync).
    P2p(P2pArgs),
}

#[derive(Args, Debug)]
struct Common {
    /// CUDA device (the first NCCL rank's; the first of the two for p2p).
    #[arg(long, default_value_t = 0)]
    device: usize,
    /// Where to write the results [default: sextant-bench-KIND.json]; an existing
    /// file is replaced only with --force.
    #[arg(short = 'o', long = "output")]
    output: Option<String>,
    /// Replace the output file if it exists.
    #[arg(long)]
    force: bool,
    /// Timed calls per point [default: 30 for gemm, 20 for the others].
    #[arg(long)]
    iters: Option<u32>,
    /// Untimed calls before each point's timed ones.
    #[arg(long, default_value_t = 3)]
    warmup: u32,
}

#[derive(Args, Debug)]
struct GemmArgs {
    #[command(flatten)]
    common: Common,
    /// The values of m, n and k (every combination is timed: a full grid, as a
    /// profile's curve needs).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "256,512,1024,2048,4096,8192,16384"
    )]
    sizes: Vec<u64>,
    /// Also time the distinct GEMM shapes of this plan's layers, as
    /// `exec --backend cuda` issues them (batched attention included).
    #[arg(long)]
    plan: Option<String>,
    /// Which ranked plan of the file.
    #[arg(long = "plan-rank", default_value_t = 1)]
    plan_rank: usize,
}

#[derive(Args, Debug)]
struct HbmArgs {
    #[command(flatten)]
    common: Common,
    /// Buffer sizes in bytes (suffixes K, M, G: powers of 1024).
    #[arg(long, value_delimiter = ',', default_value = "16M,64M,256M,1G,4G")]
    bytes: Vec<String>,
}

#[derive(Args, Debug)]
struct NcclArgs {
    #[command(flatten)]
    common: Common,
    /// GPUs (one NCCL rank each), from --device on [default: every visible GPU from
    /// --device].
    #[arg(long)]
    ranks: Option<usize>,
    /// Collectives: all_reduce, all_gather, reduce_scatter.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "all_reduce,all_gather,reduce_scatter"
    )]
    ops: Vec<String>,
    /// Sizes in bytes in nccl-tests' convention (the all-reduce's buffer, the
    /// all-gather's output, the reduce-scatter's input), rounded down to whole BF16
    /// elements per GPU; suffixes K, M, G.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "64K,256K,1M,4M,16M,64M,256M,1G,4G"
    )]
    bytes: Vec<String>,
}

#[derive(Args, Debug)]
struct P2pArgs {
    #[command(flatten)]
    common: Common,
    /// The other GPU.
    #[arg(long, default_value_t = 1)]
    peer: usize,
    /// Copy sizes in bytes; suffixes K, M, G.
    #[arg(long, value_delimiter = ',', default_value = "1M,4M,16M,64M,256M,1G")]
    bytes: Vec<String>,
}

/// Most values per size list, and GEMM grid values (16^3 = 4,096 shapes).
const MAX_VALUES: usize = 16;
/// The GEMM grid's values: below 64 a GEMM is all launch and falls under the
/// profile curves' 0.01 TFLOP/s floor; above 65,536 one operand alone is 8 GiB.
const GEMM_DIMS: (u64, u64) = (64, 65_536);
/// The largest buffer a size list may name: 1 TiB.
const MAX_BUFFER: u64 = 1 << 40;
/// The most distinct GEMM shapes taken from a plan.
const MAX_PLAN_SHAPES: usize = 256;
/// The most NCCL ranks on one machine.
const MAX_RANKS: usize = 64;

/// One GEMM shape to time.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Shape {
    pub class: String,
    pub m: u64,
    pub n: u64,
    pub k: u64,
    pub batch: u64,
}

/// A benchmark, its arguments checked.
#[derive(Debug)]
enum Job {
    Gemm {
        sizes: Vec<u64>,
        /// The plan file and which of its plans, and (once read) its shapes.
        plan: Option<(String, usize)>,
        shapes: Vec<Shape>,
    },
    Hbm {
        sizes: Vec<u64>,
    },
    Nccl {
        ranks: Option<usize>,
        ops: Vec<String>,
        sizes: Vec<u64>,
    },
    P2p {
        peer: usize,
        sizes: Vec<u64>,
    },
}

impl Job {
    fn name(&self) -> &'static str {
        match self {
            Job::Gemm { .. } => "gemm",
            Job::Hbm { .. } => "hbm",
            Job::Nccl { .. } => "nccl",
            Job::P2p { .. } => "p2p",
        }
    }
}

/// A size in bytes: digits with an optional K, M or G (powers of 1024).
pub fn parse_bytes(flag: &str, s: &str) -> Result<u64> {
    let t = s.trim();
    let (digits, scale) = match t.char_indices().last() {
        Some((i, c @ ('K' | 'k' | 'M' | 'm' | 'G' | 'g'))) => (
            &t[..i],
            match c.to_ascii_uppercase() {
                'K' => 1u64 << 10,
                'M' => 1 << 20,
                _ => 1 << 30,
            },
        ),
        _ => (t, 1),
    };
    let v = digits
        .parse::<u64>()
        .ok()
        .and_then(|v| v.checked_mul(scale))
        .filter(|v| (1..=MAX_BUFFER).contains(v));
    v.ok_or_else(|| {
        anyhow!(
            "{flag} '{}': give sizes in bytes from 1 to 1T, as digits with an optional K, M or G (e.g. 64K,1G)",
            s.escape_debug()
        )
    })
}

fn sizes(flag: &str, list: &[String]) -> Result<Vec<u64>> {
    if list.is_empty() || list.len() > MAX_VALUES {
        bail!("{flag}: give 1 to {MAX_VALUES} sizes");
    }
    let mut v = list
        .iter()
        .map(|s| parse_bytes(flag, s))
        .collect::<Result<Vec<u64>>>()?;
    v.sort_unstable();
    v.dedup();
    Ok(v)
}

/// Checks the arguments; returns the job, its common options and the output path.
fn job(a: BenchArgs) -> Result<(Job, Common, String)> {
    let (job, common) = match a.which {
        Which::Gemm(g) => {
            let mut s = g.sizes.clone();
            s.sort_unstable();
            s.dedup();
            if s.len() < 2 || s.len() > MAX_VALUES {
                bail!("--sizes: give 2 to {MAX_VALUES} distinct values (a curve is a grid with at least two values per axis)");
            }
            if let Some(x) = s.iter().find(|x| !(GEMM_DIMS.0..=GEMM_DIMS.1).contains(*x)) {
                bail!(
                    "--sizes {x}: GEMM dimensions must be {} to {} (smaller GEMMs time the launch, not the GEMM)",
                    GEMM_DIMS.0,
                    GEMM_DIMS.1
                );
            }
            if g.plan.is_none() && g.plan_rank != 1 {
                bail!("--plan-rank needs --plan");
            }
            (
                Job::Gemm {
                    sizes: s,
                    plan: g.plan.map(|p| (p, g.plan_rank)),
                    shapes: Vec::new(),
                },
                g.common,
            )
        }
        Which::Hbm(h) => (
            Job::Hbm {
                sizes: sizes("--bytes", &h.bytes)?,
            },
            h.common,
        ),
        Which::Nccl(n) => {
            if let Some(r) = n.ranks {
                if r == 0 || r > MAX_RANKS {
                    bail!("--ranks {r}: give 1 to {MAX_RANKS} GPUs");
                }
            }
            let mut ops = Vec::new();
            for o in &n.ops {
                let o = o.trim().to_ascii_lowercase().replace('-', "_");
                if !matches!(o.as_str(), "all_reduce" | "all_gather" | "reduce_scatter") {
                    bail!(
                        "--ops '{}' is not one of all_reduce, all_gather, reduce_scatter",
                        o.escape_debug()
                    );
                }
                if !ops.contains(&o) {
                    ops.push(o);
                }
            }
            if ops.is_empty() {
                bail!("--ops: give at least one of all_reduce, all_gather, reduce_scatter");
            }
            (
                Job::Nccl {
                    ranks: n.ranks,
                    ops,
                    sizes: sizes("--bytes", &n.bytes)?,
                },
                n.common,
            )
        }
        Which::P2p(p) => {
            if p.peer == p.common.device {
                bail!(
                    "--peer {} is --device too: a peer copy needs two different GPUs",
                    p.peer
                );
            }
            (
                Job::P2p {
                    peer: p.peer,
                    sizes: sizes("--bytes", &p.bytes)?,
                },
                p.common,
            )
        }
    };
    let iters = common.iters.unwrap_or(if matches!(job, Job::Gemm { .. }) {
        30
    } else {
        20
    });
    if iters == 0 || iters > 10_000 || common.warmup > 10_000 {
        bail!("--iters {iters} --warmup {}: use 1 to 10000 timed calls and at most 10000 warm-up calls per point", common.warmup);
    }
    let out = common
        .output
        .clone()
        .unwrap_or_else(|| format!("sextant-bench-{}.json", job.name()));
    Ok((
        job,
        Common {
            iters: Some(iters),
            ..common
        },
        out,
    ))
}

/// The distinct GEMM shapes of a plan's layers as the CUDA backend issues them
/// (one rank per pipeline stage: the others repeat its shapes).
fn plan_shapes(path: &str, plan_rank: usize) -> Result<Vec<Shape>> {
    use sextant_executor::program::{self, Options};
    use sextant_executor::trace::{program as rank_program, Op};
    let text = read_text(Path::new(path), "plan")?;
    let plan =
        sextant_planner::plan::PlanFile::from_json(&text).map_err(|e| anyhow!("'{path}': {e}"))?;
    crate::check_plan_target(path, &plan)?;
    let opts = Options {
        plan_rank,
        full_size: true,
        ..Options::default()
    };
    let setup = program::prepare(&plan, program::plan_hash(text.as_bytes()), &opts)
        .map_err(|e| anyhow!("'{path}': {e}"))?;
    let map = setup.rank_map().map_err(|e| anyhow!("'{path}': {e}"))?;
    let mut stages = Vec::new();
    let mut shapes: Vec<Shape> = Vec::new();
    for r in &map.ranks {
        if stages.contains(&r.pp) {
            continue;
        }
        stages.push(r.pp);
        for op in rank_program(&setup, &map, r.rank) {
            if let Op::Gemm {
                class,
                m,
                n,
                k,
                batch,
                ..
            } = op
            {
                let s = Shape {
                    class: class.to_string(),
                    m,
                    n,
                    k,
                    batch,
                };
                if !shapes.contains(&s) {
                    shapes.push(s);
                }
            }
        }
    }
    if shapes.len() > MAX_PLAN_SHAPES {
        bail!(
            "'{path}': its layers have {} distinct GEMM shapes; the benchmark times at most {MAX_PLAN_SHAPES}",
            shapes.len()
        );
    }
    shapes.sort();
    Ok(shapes)
}

pub fn cmd_bench(a: BenchArgs) -> Result<()> {
    let (mut job, common, out) = job(a)?;
    if !cfg!(feature = "cuda") {
        bail!(
            "this sextant was built without CUDA support, so `sextant bench {}` cannot run: rebuild with `cargo build --release --features cuda`",
            job.name()
        );
    }
    let inputs: Vec<(&str, &str)> = match &job {
        Job::Gemm {
            plan: Some((p, _)), ..
        } => vec![("--plan", p.as_str())],
        _ => Vec::new(),
    };
    check_outputs(&[("--output", out.as_str())], &inputs, common.force)?;
    if let Job::Gemm {
        plan: Some((path, rank)),
        shapes,
        ..
    } = &mut job
    {
        *shapes = plan_shapes(path, *rank)?;
    }
    let file = measure(&job, &common, utc_now())?;
    file.validate()
        .map_err(|e| anyhow!("the measurements do not make a valid benchmark file: {e}"))?;
    let json = serde_json::to_string_pretty(&file).expect("a benchmark file serialises");
    write_new(Path::new(&out), &json, common.force)?;
    print_summary(&file);
    println!("Results written to {out}");
    Ok(())
}

/// Runs the benchmark and builds its file (without the `cuda` feature the
/// executor's stand-ins refuse at the first call; `cmd_bench` says so before).
fn measure(job: &Job, c: &Common, date: String) -> Result<BenchFile> {
    use sextant_executor::bench as b;
    use sextant_executor::culibs::Lib;
    use sextant_planner::bench::{
        BenchCollective, BenchDevice, BenchVersions, MemoryPoint, P2pPoint, BENCH_SCHEMA_VERSION,
    };
    use sextant_planner::hardware::{ranges, CollectivePoint, GemmCurve, GemmDtype};
    let t = b::Timing {
        warmup: c.warmup,
        iters: c.iters.unwrap_or(20),
    };
    let info = b::device_info(c.device).map_err(for_bench)?;
    let mut versions = BenchVersions {
        driver: read_driver_version(),
        cuda: cuda_version(info.cuda_version),
        ..BenchVersions::default()
    };
    let mut ordinals = vec![c.device as u64];
    let timed = format!(
        "median of {} calls, each between its own pair of CUDA events, queued behind a host gate in batches of 64 (so the events time the GPU, not launch gaps), after {} warm-up calls",
        t.iters, t.warmup
    );
    let gpu = format!("{} (device {})", info.name, c.device);
    let mut file = BenchFile {
        schema_version: BENCH_SCHEMA_VERSION,
        generator: format!("sextant {}", env!("CARGO_PKG_VERSION")),
        benchmark: job.name().into(),
        date: date.clone(),
        device: BenchDevice {
            name: info.name.clone(),
            ordinals: Vec::new(),
            visible: info.visible,
            memory_bytes: info.memory_bytes,
            sms: info.sms,
            compute_capability: format!(
                "{}.{}",
                info.compute_capability.0, info.compute_capability.1
            ),
        },
        versions: BenchVersions::default(),
        method: String::new(),
        warmup: t.warmup,
        iters: t.iters,
        gemm_curves: vec![],
        gemms: vec![],
        memory: vec![],
        collective_points: vec![],
        collectives: vec![],
        p2p: vec![],
    };
    let mut libs = vec![Lib::Driver];
    match job {
        Job::Gemm {
            sizes,
            shapes: plan,
            ..
        } => {
            libs.push(Lib::Cublas);
            let mut shapes = Vec::new();
            for &m in sizes {
                for &n in sizes {
                    for &k in sizes {
                        shapes.push(b::GemmShape {
                            class: "sweep".into(),
                            m,
                            n,
                            k,
                            batch: 1,
                        });
                    }
                }
            }
            shapes.extend(plan.iter().map(|s| b::GemmShape {
                class: s.class.clone(),
                m: s.m,
                n: s.n,
                k: s.k,
                batch: s.batch,
            }));
            let r = b::gemms(c.device, &shapes, t).map_err(for_bench)?;
            versions.cublas = Some(cublas_version(r.cublas_version));
            file.method = format!("BF16 cublasGemmEx (cublasGemmStridedBatchedEx for batch > 1), row-major C[m,n] = A[m,k] B[k,n], FP32 accumulation, default algorithm, operands of pseudo-random values in [-1, 1); {timed}");
            for (s, secs) in r.points {
                let flops = 2.0 * s.m as f64 * s.n as f64 * s.k as f64 * s.batch as f64;
                file.gemms.push(BenchGemm {
                    class: s.class,
                    m: s.m,
                    n: s.n,
                    k: s.k,
                    batch: s.batch,
                    calls: t.iters as u64,
                    median_secs: secs,
                    tflops: if secs > 0.0 { flops / secs / 1e12 } else { 0.0 },
                });
            }
            let points = sextant_planner::bench::sweep_points(&file.gemms);
            let source = format!(
                "sextant bench gemm on {gpu} at {date}: driver {}, CUDA {}, cuBLAS {}; {}",
                versions.driver.as_deref().unwrap_or("unknown"),
                versions.cuda,
                versions.cublas.as_deref().unwrap_or("unknown"),
                file.method
            );
            let curve = GemmCurve::from_points(GemmDtype::Bf16, source, points)
                .map_err(|e| anyhow!("the GEMM sweep does not make a profile curve: {e}"))?;
            file.gemm_curves.push(curve);
        }
        Job::Hbm { sizes } => {
            let r = b::memory(c.device, sizes, t).map_err(for_bench)?;
            file.method = format!("cuMemcpyDtoDAsync within the device (a copy reads and writes its bytes: 2 x bytes of traffic) and cuMemsetD8Async (writes them) from one stream-ordered pool allocation per buffer; {timed}");
            for (op, bytes, secs) in r {
                let traffic = match op {
                    b::MemOp::Copy => 2 * bytes,
                    b::MemOp::Memset => bytes,
                } as f64;
                file.memory.push(MemoryPoint {
                    op: op.label().into(),
                    bytes,
                    calls: t.iters as u64,
                    median_secs: secs,
                    gbytes_per_s: if secs > 0.0 {
                        traffic / secs / 1e9
                    } else {
                        0.0
                    },
                });
            }
        }
        Job::Nccl { ranks, ops, sizes } => {
            libs.push(Lib::Nccl);
            let n = match ranks {
                Some(r) => *r,
                None => (info.visible as usize).saturating_sub(c.device).max(1),
            };
            let devs: Vec<usize> = (c.device..c.device + n).collect();
            let last = *devs.last().expect("one device at least");
            if last as u64 >= info.visible {
                bail!(
                    "--ranks {n} from --device {} needs devices {}..={last}, but {} device(s) are visible",
                    c.device,
                    c.device,
                    info.visible
                );
            }
            let unit = 2 * n as u64;
            let mut rounded: Vec<u64> = sizes.iter().map(|b| b / unit * unit).collect();
            rounded.dedup();
            if rounded.contains(&0) {
                bail!(
                    "--bytes: over {n} GPUs every size must be at least {unit} bytes (one BF16 element per GPU)"
                );
            }
            let coll: Vec<b::CollOp> = ops
                .iter()
                .map(|o| match o.as_str() {
                    "all_reduce" => b::CollOp::AllReduce,
                    "all_gather" => b::CollOp::AllGather,
                    _ => b::CollOp::ReduceScatter,
                })
                .collect();
            let r = b::collectives(&devs, &coll, &rounded, t).map_err(for_bench)?;
            versions.nccl = Some(nccl_version(r.nccl_version));
            ordinals = devs.iter().map(|&d| d as u64).collect();
            let what = if n == 1 {
                "one rank on one GPU: NCCL's one-rank path, a copy within the device (no link is crossed, so the bus bandwidth is 0 by nccl-tests' convention; the time is NCCL's fixed cost plus a device copy)".to_string()
            } else {
                format!("{n} ranks on GPUs {}..={last} of one node, one communicator driven from one thread with NCCL group calls", c.device)
            };
            file.method = format!("NCCL BF16 out-of-place collectives (sum), {what}; sizes and bus bandwidth in nccl-tests' conventions; per call the slowest GPU's time; {timed}");
            for (op, bytes, secs) in r.points {
                let factor = sextant_planner::bench::busbw_factor(op.label(), n as u64);
                let algbw = if secs > 0.0 {
                    bytes as f64 / secs / 1e9
                } else {
                    0.0
                };
                let point = BenchCollective {
                    op: op.label().into(),
                    ranks: n as u64,
                    bytes,
                    tier: "nvlink".into(),
                    calls: t.iters as u64,
                    median_secs: secs,
                    algbw_gbytes_per_s: algbw,
                    busbw_gbytes_per_s: algbw * factor,
                };
                if n > 1 && ranges::MEASURED_BUSBW_GBYTES_PER_S.contains(point.busbw_gbytes_per_s) {
                    file.collective_points.push(CollectivePoint {
                        collective: point.op.clone(),
                        ranks: n as u64,
                        bytes: bytes as f64,
                        busbw_gbytes_per_s: point.busbw_gbytes_per_s,
                        tier: "nvlink".into(),
                        source: format!("sextant bench nccl on {n} x {} at {date}", info.name),
                    });
                }
                file.collectives.push(point);
            }
        }
        Job::P2p { peer, sizes } => {
            if *peer as u64 >= info.visible {
                bail!(
                    "p2p needs two GPUs: --device {} and --peer {peer}, but {} device(s) are visible",
                    c.device,
                    info.visible
                );
            }
            let r = b::peer_copies(c.device, *peer, sizes, t).map_err(for_bench)?;
            ordinals = vec![c.device as u64, *peer as u64];
            file.method = format!("cuMemcpyPeerAsync between cuMemAlloc buffers on the source's stream, peer access enabled where the devices allow it ({} -> {}: {}, {} -> {}: {}); {timed}", c.device, peer, r.peer_access[0], peer, c.device, r.peer_access[1]);
            for (src, dst, bytes, secs) in r.points {
                file.p2p.push(P2pPoint {
                    src: src as u64,
                    dst: dst as u64,
                    peer_access: r.peer_access[if src == c.device { 0 } else { 1 }],
                    bytes,
                    calls: t.iters as u64,
                    median_secs: secs,
                    gbytes_per_s: if secs > 0.0 {
                        bytes as f64 / secs / 1e9
                    } else {
                        0.0
                    },
                });
            }
        }
    }
    for (lib, from) in b::library_files(&libs).map_err(for_bench)? {
        let name = lib.names()[0];
        let path = match from {
            Some(p) => p.display().to_string(),
            None => mapped_path(name)
                .map(|p| format!("{p} (system loader)"))
                .unwrap_or_else(|| "system loader".into()),
        };
        versions.libraries.insert(lib.label().to_string(), path);
    }
    file.versions = versions;
    file.device.ordinals = ordinals;
    Ok(file)
}

/// An error of the CUDA layer, without the remedy that only `exec` has
/// (`--backend cpu`): a benchmark needs the GPU.
fn for_bench(e: sextant_executor::error::BenchError) -> anyhow::Error {
    anyhow!(
        "{}",
        e.to_string()
            .replace(", or use --backend cpu", "")
            .replace("; or use --backend cpu", "")
    )
}

/// Where the running process has a library mapped whose file name starts with
/// `soname`'s stem (`libcuda.so`), from `/proc/self/maps`.
fn mapped_path(soname: &str) -> Option<String> {
    let stem = soname.split(".so").next()?.to_string() + ".so";
    let maps =
        crate::io::read_text_capped(Path::new("/proc/self/maps"), "memory map", 16 << 20).ok()?;
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| {
            Path::new(p)
                .file_name()
                .is_some_and(|f| f.to_string_lossy().starts_with(&stem))
        })
        .map(str::to_string)
}

/// The NVIDIA kernel module's version from `/proc/driver/nvidia/version`, where the
/// machine has it.
fn read_driver_version() -> Option<String> {
    let text = crate::io::read_text_capped(
        Path::new("/proc/driver/nvidia/version"),
        "driver version",
        64 << 10,
    )
    .ok()?;
    driver_version(&text)
}

/// The first `N.N` or `N.N.N` word of the first line: the version in
/// "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build ...".
pub fn driver_version(text: &str) -> Option<String> {
    text.lines().next()?.split_whitespace().find_map(|w| {
        let parts: Vec<&str> = w.split('.').collect();
        ((2..=3).contains(&parts.len())
            && parts
                .iter()
                .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit())))
        .then(|| w.to_string())
    })
}

/// `cuDriverGetVersion`'s code (13000) as "13.0".
pub fn cuda_version(code: i32) -> String {
    format!("{}.{}", code / 1000, code % 1000 / 10)
}

/// `cublasGetVersion`'s code (major x 10000 + minor x 100 + patch) as "13.0.0".
pub fn cublas_version(code: i32) -> String {
    format!("{}.{}.{}", code / 10000, code % 10000 / 100, code % 100)
}

/// `ncclGetVersion`'s code as "2.28.0": major x 10000 + minor x 100 + patch from
/// NCCL 2.9 on, major x 1000 + minor x 100 + patch before.
pub fn nccl_version(code: i32) -> String {
    if code >= 10000 {
        format!("{}.{}.{}", code / 10000, code % 10000 / 100, code % 100)
    } else {
        format!("{}.{}.{}", code / 1000, code % 1000 / 100, code % 100)
    }
}

/// Now, UTC, RFC 3339 to the second.
fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    rfc3339(secs)
}

/// Seconds since 1970-01-01T00:00:00Z as `YYYY-MM-DDTHH:MM:SSZ` (proleptic
/// Gregorian calendar).
pub fn rfc3339(secs: u64) -> String {
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Days since 0000-03-01, in 400-year eras of 146,097 days; March-based years
    // put the leap day last.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

fn print_summary(f: &BenchFile) {
    let d = &f.device;
    let v = &f.versions;
    println!(
        "{} (device {}, {:.1} GiB, {} SMs, compute capability {}; {} visible); driver {}, CUDA {}{}{}",
        d.name,
        d.ordinals.first().copied().unwrap_or(0),
        d.memory_bytes as f64 / (1u64 << 30) as f64,
        d.sms,
        d.compute_capability,
        d.visible,
        v.driver.as_deref().unwrap_or("version unknown"),
        v.cuda,
        v.cublas
            .as_ref()
            .map(|b| format!(", cuBLAS {b}"))
            .unwrap_or_default(),
        v.nccl
            .as_ref()
            .map(|n| format!(", NCCL {n}"))
            .unwrap_or_default(),
    );
    let libs: BTreeMap<&String, &String> = v.libraries.iter().collect();
    for (lib, path) in libs {
        println!("  {lib}: {path}");
    }
    match f.benchmark.as_str() {
        "gemm" => {
            let sweep: Vec<&BenchGemm> = f.gemms.iter().filter(|g| g.class == "sweep").collect();
            let by = |best: bool| {
                sweep
                    .iter()
                    .copied()
                    .reduce(|a, b| if (b.tflops > a.tflops) == best { b } else { a })
            };
            if let (Some(hi), Some(lo)) = (by(true), by(false)) {
                println!(
                    "GEMM sweep, {} shapes (BF16): best {:.1} TFLOP/s at {}x{}x{}, worst {:.2} TFLOP/s at {}x{}x{}",
                    sweep.len(),
                    hi.tflops,
                    hi.m,
                    hi.n,
                    hi.k,
                    lo.tflops,
                    lo.m,
                    lo.n,
                    lo.k
                );
            }
            let plan: Vec<&BenchGemm> = f.gemms.iter().filter(|g| g.class != "sweep").collect();
            if !plan.is_empty() {
                println!("The plan's GEMM shapes:");
                println!(
                    "  {:<16} {:>8} {:>8} {:>8} {:>6} {:>12} {:>9}",
                    "class", "m", "n", "k", "batch", "median s", "TFLOP/s"
                );
                for g in plan {
                    println!(
                        "  {:<16} {:>8} {:>8} {:>8} {:>6} {:>12.3e} {:>9.1}",
                        g.class, g.m, g.n, g.k, g.batch, g.median_secs, g.tflops
                    );
                }
            }
        }
        "hbm" => {
            println!(
                "  {:<7} {:>14} {:>12} {:>10}",
                "op", "bytes", "median s", "GB/s"
            );
            for p in &f.memory {
                println!(
                    "  {:<7} {:>14} {:>12.3e} {:>10.1}",
                    p.op, p.bytes, p.median_secs, p.gbytes_per_s
                );
            }
        }
        "nccl" => {
            if let Some(c) = f.collectives.first() {
                if c.ranks == 1 {
                    println!("  one GPU: NCCL's one-rank path, a copy within the device; no link is crossed (bus bandwidth 0)");
                }
            }
            println!(
                "  {:<15} {:>5} {:>14} {:>12} {:>10} {:>10}",
                "op", "ranks", "bytes", "median s", "algbw GB/s", "busbw GB/s"
            );
            for c in &f.collectives {
                println!(
                    "  {:<15} {:>5} {:>14} {:>12.3e} {:>10.1} {:>10.1}",
                    c.op,
                    c.ranks,
                    c.bytes,
                    c.median_secs,
                    c.algbw_gbytes_per_s,
                    c.busbw_gbytes_per_s
                );
            }
        }
        _ => {
            println!(
                "  {:<9} {:>5} {:>14} {:>12} {:>10}",
                "src->dst", "peer", "bytes", "median s", "GB/s"
            );
            for p in &f.p2p {
                println!(
                    "  {:<9} {:>5} {:>14} {:>12.3e} {:>10.1}",
                    format!("{}->{}", p.src, p.dst),
                    p.peer_access,
                    p.bytes,
                    p.median_secs,
                    p.gbytes_per_s
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_rfc3339_utc() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_709_210_096), "2024-02-29T12:34:56Z");
        assert_eq!(rfc3339(4_107_542_399), "2100-02-28T23:59:59Z");
        assert_eq!(rfc3339(4_107_542_400), "2100-03-01T00:00:00Z");
    }

    #[test]
    fn versions_read_as_their_libraries_write_them() {
        assert_eq!(cuda_version(13000), "13.0");
        assert_eq!(cuda_version(12080), "12.8");
        assert_eq!(cublas_version(130000), "13.0.0");
        assert_eq!(cublas_version(120804), "12.8.4");
        assert_eq!(nccl_version(22800), "2.28.0");
        assert_eq!(nccl_version(22703), "2.27.3");
        assert_eq!(nccl_version(2708), "2.7.8");
        let proc = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build  (dvs-builder@U16)  Sun Jul 27 07:09:06 UTC 2025\nGCC version:  gcc version 12.3.0\n";
        assert_eq!(driver_version(proc).as_deref(), Some("580.65.06"));
        assert_eq!(
            driver_version("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024").as_deref(),
            Some("550.54.15")
        );
        assert_eq!(driver_version("no version here\n"), None);
        assert_eq!(driver_version(""), None);
    }

    #[test]
    fn byte_sizes() {
        assert_eq!(parse_bytes("--bytes", "64K").unwrap(), 65_536);
        assert_eq!(parse_bytes("--bytes", "1g").unwrap(), 1 << 30);
        assert_eq!(parse_bytes("--bytes", " 4096 ").unwrap(), 4096);
        for bad in [
            "",
            "0",
            "K",
            "1.5M",
            "-1",
            "2T",
            "99999999999999999999",
            "1025G",
        ] {
            let e = parse_bytes("--bytes", bad).unwrap_err().to_string();
            assert!(e.contains("give sizes in bytes from 1 to 1T"), "{bad}: {e}");
        }
    }
}

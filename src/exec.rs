//! `sextant exec`, `sextant calibrate` and `sextant compare`: the executor's command
//! line. Reads the launcher's environment, the plan file and the clock, starts local
//! ranks for `--ranks N`, and writes the measured run (rank 0) without clobbering.

use std::net::TcpListener;
use std::path::Path;
use std::time::Duration;

use anyhow::{anyhow, bail, Result};
use sextant_executor::auth::{JobKey, SECRET_VAR};
use sextant_executor::mesh::Mesh;
use sextant_executor::program::{self, Options};
use sextant_executor::rendezvous::{bind_root, launch_env, rendezvous, LaunchEnv};
use sextant_planner::banded::{estimate_with, simulated};
use sextant_planner::bench::{overlay as bench_overlay, BenchFile};
use sextant_planner::calibration::{
    apply, bare_gemm_ratio, bare_measurement, calibrate, duplicates, MeasuredRun, Overlay, Target,
};
use sextant_planner::cost::{Assumptions, CommKind};
use sextant_planner::hardware::{builtin_profile, Cluster, HardwareProfile};
use sextant_planner::plan::PlanFile;

use crate::flags::BackendFlag;
use crate::io::{read_text, write_new};

mod launch;
mod logs;
mod output;

#[derive(clap::Args, Debug)]
pub struct ExecArgs {
    /// Plan file from `sextant plan --out` or `sextant estimate --json --out`.
    plan: String,
    /// cpu: the test backend (real data over loopback TCP, small f32 GEMMs);
    /// cuda: GPUs (needs a build with --features cuda).
    #[arg(long, value_enum, default_value_t = BackendFlag::Cpu)]
    backend: BackendFlag,
    /// Start this many local ranks (processes) instead of reading torchrun/Slurm/MPI variables.
    #[arg(long)]
    ranks: Option<u64>,
    /// Which ranked plan of the file to run.
    #[arg(long = "plan", default_value_t = 1)]
    plan_rank: usize,
    /// Timed steps.
    #[arg(long = "max-steps", default_value_t = 2)]
    steps: u64,
    /// Untimed steps before them.
    #[arg(long, default_value_t = 1)]
    warmup: u64,
    /// Micro-batches per step (default: the plan's, capped at 2 x pp on the CPU backend).
    #[arg(long = "micro-batches")]
    micro_batches: Option<u64>,
    /// Run this many layers, split over the stages in the plan's proportions.
    #[arg(long = "scale-layers")]
    scale_layers: Option<u64>,
    /// Run at the plan's real sizes (the default on CUDA; on the CPU backend only for tiny models, refused when the plan's memory over the local ranks exceeds the host's available memory).
    #[arg(long = "full-size")]
    full_size: bool,
    /// Skip the comparison with the unsharded reference.
    #[arg(long = "no-verify")]
    no_verify: bool,
    /// Seconds any rank waits for a peer (rendezvous, every receive) before failing.
    #[arg(long, default_value_t = 300)]
    timeout: u64,
    /// Where rank 0 writes the measured run.
    #[arg(long, default_value = "sextant-run.json")]
    out: String,
    /// Replace an existing measured-run file.
    #[arg(long)]
    force: bool,
    /// Build every rank's device program (what the CUDA backend issues, at the
    /// plan's sizes) and check on this machine that the ranks' collectives and
    /// transfers pair up without hanging; runs nothing and needs no GPU.
    #[arg(long = "dry-run")]
    dry_run: bool,
    /// Testing hook: `die:RANK:STEP` (that rank exits abruptly mid-step) or
    /// `absent:RANK` (that rank never reaches the rendezvous).
    #[arg(long, hide = true)]
    fault: Option<String>,
}

#[derive(clap::Args, Debug)]
pub struct CalibrateArgs {
    /// Measured runs (from `sextant exec`), all for the same hardware profile.
    #[arg(
        required_unless_present_any = ["logs", "bench"],
        conflicts_with_all = ["logs", "bench"]
    )]
    runs: Vec<String>,
    /// Benchmark files from `sextant bench` instead of runs, at most one per
    /// benchmark, of one GPU: the overlay takes the GEMM curve, the HBM bandwidth
    /// and the NCCL bus bandwidth (needs --hardware).
    #[arg(long, num_args = 1.., value_name = "FILE", conflicts_with = "logs")]
    bench: Vec<String>,
    /// The profile the runs were planned for, or the benchmarks' GPU's: a built-in
    /// name or a profile JSON (default for runs: the built-in profile they name).
    /// Not with --log: a plan carries its profile.
    #[arg(long, conflicts_with = "logs")]
    hardware: Option<String>,
    /// A training log of your own run (Megatron-LM, Megatron-Bridge or NeMo 2);
    /// repeat for runs of other configurations on the same GPUs.
    #[arg(long = "log", value_name = "FILE")]
    logs: Vec<String>,
    /// The plan file of the configuration each --log ran, in the same order (its
    /// first plan), or one for all of them.
    #[arg(long = "plan", value_name = "FILE", requires = "logs")]
    plans: Vec<String>,
    /// A PyTorch profiler (Kineto) trace of a few steps of each --log's run, in
    /// the same order: splits GEMM, attention and NCCL time.
    #[arg(long = "trace", value_name = "FILE", requires = "logs")]
    traces: Vec<String>,
    /// Iterations at the start of each log that are not measured (start-up,
    /// warm-up); the step is the median of the lines after them.
    #[arg(long = "warmup-iters", default_value_t = sextant_planner::trainlog::DEFAULT_WARMUP_ITERS)]
    warmup_iters: u64,
    #[arg(long, short = 'o', default_value = "sextant-overlay.json")]
    out: String,
    /// Replace an existing overlay file.
    #[arg(long)]
    force: bool,
}

#[derive(clap::Args, Debug)]
pub struct CompareArgs {
    /// The plan file that was run.
    plan: String,
    /// The measured run (from `sextant exec`).
    #[arg(required_unless_present = "log", conflicts_with = "log")]
    run: Option<String>,
    /// A training log of the plan's run instead (Megatron-LM, Megatron-Bridge, NeMo 2).
    #[arg(long, value_name = "FILE")]
    log: Option<String>,
    /// A PyTorch profiler (Kineto) trace of the --log's run: adds kernel-time rows.
    #[arg(long, value_name = "FILE", requires = "log")]
    trace: Option<String>,
    /// Iterations at the start of the log that are not measured.
    #[arg(long = "warmup-iters", default_value_t = sextant_planner::trainlog::DEFAULT_WARMUP_ITERS)]
    warmup_iters: u64,
    /// Also predict with this calibration overlay applied.
    #[arg(long)]
    calibration: Option<String>,
    #[arg(long)]
    json: bool,
}

enum Fault {
    Die(u64, u64),
    Absent(u64),
}

/// Most local processes `--ranks` starts.
const MAX_LOCAL_RANKS: u64 = 256;

/// `x` with a negative zero made positive (`-0.0 + 0.0` is `0.0`), so that no
/// table or JSON says "-0".
pub(crate) fn unsigned_zero(x: f64) -> f64 {
    x + 0.0
}

/// A name from a file (a profile's, a run's device) as a terminal line shows it:
/// one line, control characters escaped, at most 120 characters.
fn shown(s: &str) -> String {
    sextant_planner::json::one_line(s, 120)
}

/// `--ranks n` against the `need` ranks the plan runs on. `local`: the ranks are
/// started here as processes (at most [`MAX_LOCAL_RANKS`]); a dry run starts none,
/// so any count the plan needs is fine there.
fn check_rank_count(n: u64, need: u64, local: bool) -> Result<()> {
    if n == 0 {
        bail!("--ranks 0: give the plan's {need} ranks (tp x cp x dp x pp)");
    }
    if n != need {
        bail!("the plan needs {need} ranks (tp x cp x dp x pp) but --ranks {n} was given: use --ranks {need}");
    }
    if local && need > MAX_LOCAL_RANKS {
        bail!("the plan needs {need} ranks, more than the {MAX_LOCAL_RANKS} local processes --ranks starts: launch it under torchrun, srun or mpirun (sextant export --to torchrun-exec or slurm-exec), or check its pairing with --dry-run --ranks {need}");
    }
    Ok(())
}

/// `--full-size` on the CPU backend holds the plan's real tensors in host memory:
/// refuse it when the plan's own memory estimate per GPU, over `ranks` ranks on
/// this host, already exceeds what the host has available (`MemAvailable` in
/// /proc/meminfo; no check where that cannot be read). A lower bound: the CPU
/// backend keeps FP32 copies the GPU estimate does not count.
fn fits_in_host_memory(bytes: f64, ranks: u64) -> Result<()> {
    let Some(available) = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("MemAvailable:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        })
        .map(|kib| kib * 1024.0)
    else {
        return Ok(());
    };
    let gib = sextant_planner::hardware::GIB;
    if bytes > available {
        bail!(
            "--full-size on the CPU backend would hold at least {:.1} GiB ({ranks} rank{} at the plan's {:.1} GiB per GPU), more than the {:.1} GiB this host has available: run it with --backend cuda on the GPUs, or without --full-size",
            bytes / gib,
            if ranks == 1 { "" } else { "s" },
            bytes / ranks as f64 / gib,
            available / gib
        );
    }
    Ok(())
}

fn parse_fault(s: &str) -> Result<Fault> {
    let f: Vec<&str> = s.split(':').collect();
    let num = |x: &str| {
        x.parse::<u64>()
            .map_err(|_| anyhow!("--fault '{s}': '{x}' is not a number"))
    };
    match f.as_slice() {
        ["die", r, st] => Ok(Fault::Die(num(r)?, num(st)?)),
        ["absent", r] => Ok(Fault::Absent(num(r)?)),
        _ => bail!("--fault '{s}' is not die:RANK:STEP or absent:RANK"),
    }
}

const CUDA_NOT_BUILT: &str = "this sextant was built without CUDA support: rebuild with `cargo build --release --features cuda`, or use --backend cpu";

pub fn cmd_exec(a: ExecArgs) -> Result<()> {
    let cuda = a.backend == BackendFlag::Cuda;
    // Said once, here, rather than by every rank it would start.
    if cuda && !cfg!(feature = "cuda") {
        bail!("{CUDA_NOT_BUILT}");
    }
    if a.timeout == 0 || a.timeout > 86_400 {
        bail!(
            "--timeout {} is out of range: use 1 to 86400 seconds",
            a.timeout
        );
    }
    if a.steps == 0 {
        bail!("--max-steps 0: run at least one timed step");
    }
    let fault = a.fault.as_deref().map(parse_fault).transpose()?;
    let opts = Options {
        plan_rank: a.plan_rank,
        steps: a.steps,
        warmup: a.warmup,
        micro_batches: a.micro_batches,
        scale_layers: a.scale_layers,
        verify: !a.no_verify,
        full_size: a.full_size || cuda,
        timeout: Duration::from_secs(a.timeout),
        die_at: match fault {
            Some(Fault::Die(r, s)) => Some((r, s)),
            _ => None,
        },
    };
    let text = read_text(Path::new(&a.plan), "plan")?;
    let hash = program::plan_hash(text.as_bytes());
    let plan = PlanFile::from_json(&text).map_err(|e| anyhow!("'{}': {e}", a.plan))?;
    crate::check_plan_target(&a.plan, &plan)?;
    if a.dry_run {
        let opts = Options {
            full_size: true,
            ..opts
        };
        let setup = program::prepare(&plan, hash, &opts).map_err(|e| anyhow!(e))?;
        if let Some(n) = a.ranks {
            check_rank_count(n, setup.cfg.gpus(), false)?;
        }
        return dry_run(&setup, &plan);
    }
    let plan_path = Path::new(&a.plan);
    let out = Path::new(&a.out);
    if let Some(n) = a.ranks {
        // Refuse an unrunnable plan, a wrong rank count and an unwritable output
        // once, before starting any rank.
        let setup = program::prepare(&plan, hash, &opts).map_err(|e| anyhow!(e))?;
        check_rank_count(n, setup.cfg.gpus(), true)?;
        if !cuda && opts.full_size {
            fits_in_host_memory(setup.predicted_bytes * n as f64, n)?;
        }
        output::check_out(out, plan_path, a.force)?;
        output::remove_stale_temps(out);
        return launch::launch_local(n, a.timeout);
    }
    let env = launch_env(|k| std::env::var(k).ok()).map_err(|e| anyhow!(e))?;
    let setup =
        program::prepare(&plan, hash, &opts).map_err(|e| anyhow!("rank {}: {e}", env.rank))?;
    // The launcher's world against the plan, before anything is sized by it.
    if env.world != setup.cfg.gpus() {
        bail!(
            "rank {}: the launcher started {} ranks (its world size) but the plan needs {} (tp x cp x dp x pp): start exactly {}",
            env.rank,
            env.world,
            setup.cfg.gpus(),
            setup.cfg.gpus()
        );
    }
    if env.rank == 0 {
        output::check_out(out, plan_path, a.force).map_err(|e| anyhow!("rank 0: {e}"))?;
        output::remove_stale_temps(out);
    }
    if !cuda && opts.full_size {
        fits_in_host_memory(setup.predicted_bytes, 1)
            .map_err(|e| anyhow!("rank {}: {e}", env.rank))?;
    }
    if cuda {
        return run_cuda(&setup, &opts, &env, hash, (out, plan_path), a.force);
    }
    let key = job_key(&env)?;
    if let Some(Fault::Absent(r)) = fault {
        if r == env.rank {
            eprintln!("rank {r}: staying away from the rendezvous (--fault absent testing hook)");
            std::thread::sleep(Duration::from_secs(a.timeout + 5));
            bail!("rank {r}: stayed away from the rendezvous (testing hook)");
        }
    }
    let device = format!("cpu: {} processes, loopback TCP", env.world);
    // Rank 0 records a failure in the run file; the error line says where.
    let failed = |msg: String| -> anyhow::Error {
        if env.rank != 0 {
            return anyhow!(msg);
        }
        let note = record_failure(
            &setup,
            &opts,
            (a.backend.name(), &device, env.world),
            (out, plan_path),
            a.force,
            &msg,
        );
        anyhow!("{msg} ({note})")
    };
    let mesh = match connect(&env, &key, hash, &setup, opts.timeout, vec![]) {
        Ok((mesh, _)) => mesh,
        Err(e) => return Err(failed(format!("{e:#}"))),
    };
    match program::run(&setup, &opts, &mesh, &device) {
        Ok(Some(run)) => {
            mesh.finish();
            let json = serde_json::to_string_pretty(&run).expect("run serialises");
            output::check_out(out, plan_path, a.force)?;
            write_new(out, &json, a.force)?;
            print_summary(&run, out);
            Ok(())
        }
        Ok(None) => {
            mesh.finish();
            Ok(())
        }
        Err(e) => {
            let msg = e.to_string();
            mesh.abort(&msg);
            Err(failed(msg))
        }
    }
}

/// The job secret every rank must share (`SEXTANT_JOB_SECRET`). A world of one
/// accepts no connection and needs none.
fn job_key(env: &LaunchEnv) -> Result<JobKey> {
    match std::env::var(SECRET_VAR) {
        Ok(s) => JobKey::new(&s).map_err(|e| anyhow!("rank {}: {e}", env.rank)),
        Err(std::env::VarError::NotUnicode(_)) => bail!(
            "rank {}: {SECRET_VAR} is not valid UTF-8; use printable characters (e.g. the output of `openssl rand -hex 32`)",
            env.rank
        ),
        Err(_) if env.world == 1 => {
            JobKey::new(&JobKey::generate().map_err(|e| anyhow!(e))?).map_err(|e| anyhow!(e))
        }
        Err(_) => bail!(
            "rank {}: {SECRET_VAR} is not set: every rank of a {}-rank launch needs the same secret, so that no other process can join; export it before torchrun/srun/mpirun (e.g. `export {SECRET_VAR}=$(openssl rand -hex 32)`; mpirun needs `-x {SECRET_VAR}`), or use --ranks N, which makes one",
            env.rank,
            env.world
        ),
    }
}

/// Most ops held at once to check every rank's device program (about 70 bytes each).
const DRY_RUN_MAX_OPS: u64 = 60_000_000;

/// `--dry-run`: every rank's device program for one step, cross-checked.
fn dry_run(setup: &program::Setup, plan: &PlanFile) -> Result<()> {
    use sextant_executor::trace::{self, Op};
    use sextant_planner::cost::Priced;
    use sextant_planner::walk::{walk_step, Tally};
    let map = setup.rank_map().map_err(|e| anyhow!(e))?;
    // Every rank's program is held at once: bound the total.
    const MAX_OPS: u64 = DRY_RUN_MAX_OPS;
    // Rank 0's ops counted as the walk finds them, before any program is held.
    struct Count(u64);
    impl sextant_planner::walk::Sink for Count {
        fn op(&mut self, _: Op) {
            self.0 += 1;
        }
    }
    let dims = setup.walk_dims();
    let count_at = |m: u64| {
        let s = program::Setup {
            micro_batches: m,
            ..setup.clone()
        };
        let mut count = Count(0);
        walk_step(s.walk(&dims), &map, 0, &mut count);
        count.0
    };
    // A step's ops grow linearly with its micro-batches: two short walks bound a
    // long step's count from below, so a step far over the limit is refused
    // without walking it whole (which took minutes at a million micro-batches).
    let p2 = 2 * setup.cfg.pp.max(1);
    let (m1, m2) = (4 * p2, 8 * p2);
    if setup.micro_batches > m2 {
        let (a, b) = (count_at(m1), count_at(m2));
        let per = b.saturating_sub(a) / (m2 - m1);
        let at_least = b.saturating_add(per.saturating_mul(setup.micro_batches - m2));
        let total = at_least.saturating_mul(map.world_size);
        if total > MAX_OPS {
            bail!(
                "--dry-run would hold at least {total} ops ({} ranks x {at_least} each), more than {MAX_OPS}: cut the step down with --micro-batches or --scale-layers (the pairing does not depend on either)",
                map.world_size
            );
        }
    }
    let count = Count(count_at(setup.micro_batches));
    let total = count.0.saturating_mul(map.world_size);
    if total > MAX_OPS {
        bail!(
            "--dry-run would hold about {total} ops ({} ranks x {} each), more than {MAX_OPS}: cut the step down with --micro-batches or --scale-layers (the pairing does not depend on either)",
            map.world_size,
            count.0
        );
    }
    let programs: Vec<Vec<Op>> = (0..map.world_size)
        .map(|r| trace::program(setup, &map, r))
        .collect();
    let checked = trace::check(&programs, &map).map_err(|e| anyhow!(e))?;
    // Rank 0's step walked again into a tally and into the cost model's prices.
    let mut tally = Tally::default();
    walk_step(setup.walk(&dims), &map, 0, &mut tally);
    let mut bytes = tally.collective_bytes.clone();
    for (k, b) in &tally.sent_bytes {
        *bytes.entry(k).or_default() += b;
    }
    // The device program runs every GEMM in BF16.
    let bf16 = sextant_planner::Workload {
        precision: sextant_planner::Precision::Bf16,
        ..setup.workload.clone()
    };
    let mut priced = Priced::new(
        &setup.model,
        &plan.hardware,
        &bf16,
        &setup.cfg,
        plan.assumptions,
    );
    walk_step(setup.walk(&dims), &map, 0, &mut priced);
    let c = &setup.cfg;
    println!(
        "Device programs of {} ranks (tp {} cp {} pp {} dp {} ep {}, {} layers, {} micro-batches, {:?}) pair up: {} ops, {} collectives, {} point-to-point transfers, no hang.",
        map.world_size, c.tp, c.cp, c.pp, c.dp, c.ep, setup.dims.layers, setup.micro_batches, setup.schedule, checked.ops, checked.collectives, checked.p2p
    );
    println!(
        "GEMM work per step: busiest rank {:.4e} FLOP, all ranks {:.4e} FLOP.",
        checked.max_rank_flops, checked.total_flops
    );
    let list: Vec<String> = bytes
        .iter()
        .map(|(k, b)| format!("{k} {:.3} GB", *b as f64 / 1e9))
        .collect();
    println!(
        "Rank 0 moves per step: {}.",
        if list.is_empty() {
            "nothing".to_string()
        } else {
            list.join(", ")
        }
    );
    let sum = |m: &std::collections::BTreeMap<&str, f64>| m.values().sum::<f64>() + 0.0;
    println!(
        "Rank 0's device program priced op by op on {} (the cost model's roofline at the executed sizes, BF16 GEMMs, the attention core as batched GEMMs, nothing overlapped, no waiting; not the plan's step time): GEMMs {:.3} s, replayed GEMMs {:.3} s, HBM traffic {:.3} s, communication {:.3} s.",
        shown(&plan.hardware.name),
        sum(&priced.gemm),
        sum(&priced.recompute),
        sum(&priced.memory),
        sum(&priced.collective)
    );
    Ok(())
}

/// The CUDA backend: every rank runs its device program on GPU `LOCAL_RANK` with
/// NCCL (the unique id handed out at the rendezvous), rank 0 gathers the timings
/// over the TCP mesh. A watchdog ends the rank with its phase when a peer fails or
/// nothing moves for `--timeout` seconds (NCCL would otherwise wait forever).
/// Without the `cuda` feature the executor's CUDA functions each return the same
/// error; this says so once, before the rendezvous, as `bench` does.
fn run_cuda(
    setup: &program::Setup,
    opts: &Options,
    env: &LaunchEnv,
    hash: u64,
    (out, plan): (&Path, &Path),
    force: bool,
) -> Result<()> {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::Instant;

    use sextant_executor::device::{run_device, DeviceJob};
    use sextant_executor::{cuda, trace};
    if !cfg!(feature = "cuda") {
        bail!("{CUDA_NOT_BUILT}")
    }
    let rank = env.rank;
    let tag = |phase: &str, e: &dyn std::fmt::Display| anyhow!("rank {rank}, {phase}: {e}");
    let ordinal = env.local_rank as usize;
    let gpu = cuda::probe(ordinal).map_err(|e| tag("opening the GPU", &e))?;
    let map = setup.rank_map().map_err(|e| tag("setting up groups", &e))?;
    if map.world_size != env.world {
        bail!(
            "rank {rank}: the plan needs {} ranks (tp x cp x dp x pp) but {} were started",
            map.world_size,
            env.world
        );
    }
    let program = trace::program(setup, &map, rank);
    // Every rank checks the whole set (the same answer everywhere) before any GPU
    // work: a plan whose programs would hang is refused here, not after a timeout.
    if (program.len() as u64).saturating_mul(env.world) <= DRY_RUN_MAX_OPS {
        trace::check(&trace::programs(setup, &map), &map)
            .map_err(|e| tag("checking the device programs", &e))?;
    }
    let id = if rank == 0 {
        cuda::nccl_unique_id().map_err(|e| tag("creating the NCCL id", &e))?
    } else {
        vec![]
    };
    let key = job_key(env)?;
    let device = format!("cuda: {} ranks, {gpu} on rank 0", env.world);
    let (mesh, blob) = match connect(env, &key, hash, setup, opts.timeout, id.clone()) {
        Ok(x) => x,
        Err(e) => {
            if rank == 0 {
                let msg = format!("{e:#}");
                let note = record_failure(
                    setup,
                    opts,
                    (BackendFlag::Cuda.name(), &device, env.world),
                    (out, plan),
                    force,
                    &msg,
                );
                return Err(anyhow!("{msg} ({note})"));
            }
            return Err(e);
        }
    };
    let unique_id = if rank == 0 { id } else { blob };
    let phase = Arc::new(Mutex::new("starting".to_string()));
    let done = Arc::new(AtomicBool::new(false));
    let watchdog = {
        let (phase, done, watch, timeout) =
            (phase.clone(), done.clone(), mesh.watch(), opts.timeout);
        std::thread::Builder::new().name("sextant-watchdog".into()).spawn(move || {
            let mut last = (String::new(), Instant::now());
            while !done.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(200));
                let now = phase.lock().unwrap_or_else(|e| e.into_inner()).clone();
                if let Some(f) = watch.failure() {
                    eprintln!("rank {rank}, {now}: {f}");
                    std::process::exit(1);
                }
                if now != last.0 {
                    last = (now, Instant::now());
                } else if last.1.elapsed() > timeout {
                    eprintln!("rank {rank}, {now}: no progress for {} s (a peer is stuck or the step is longer than --timeout)", timeout.as_secs());
                    std::process::exit(1);
                }
            }
        })
        .map_err(|e| anyhow!("rank {rank}: cannot start the watchdog thread: {e}"))?
    };
    let job = DeviceJob {
        ordinal,
        unique_id: &unique_id,
        rank,
        map: &map,
        program: &program,
        footprint: trace::footprint(setup, &map, rank),
        warmup: opts.warmup,
        steps: opts.steps,
        phase: &phase,
    };
    let result = run_device(&job)
        .map_err(|e| e.to_string())
        .and_then(|stats| {
            *phase.lock().unwrap_or_else(|e| e.into_inner()) = "gathering measurements".into();
            program::collect(
                setup,
                opts,
                &mesh,
                &map,
                stats,
                (BackendFlag::Cuda.name(), "bf16"),
                &device,
            )
            .map_err(|e| e.to_string())
        });
    done.store(true, Ordering::Relaxed);
    let _ = watchdog.join();
    match result {
        Ok(run) => {
            mesh.finish();
            if let Some(run) = run {
                let json = serde_json::to_string_pretty(&run).expect("run serialises");
                output::check_out(out, plan, force)?;
                write_new(out, &json, force)?;
                println!(
                    "Ran {} timed step(s) of the plan on {device}: median step {:.3} s.",
                    run.steps,
                    sextant_planner::calibration::median(&run.step_secs).unwrap_or(0.0)
                );
                if let Some(m) = run.device_memory.first() {
                    print_device_memory(m, setup.predicted_bytes);
                }
                println!("Measured run written to {}", out.display());
            }
            Ok(())
        }
        Err(e) => {
            let msg = format!(
                "rank {rank}, {}: {e}",
                phase.lock().unwrap_or_else(|p| p.into_inner())
            );
            mesh.abort(&msg);
            if rank == 0 {
                let note = record_failure(
                    setup,
                    opts,
                    (BackendFlag::Cuda.name(), &device, env.world),
                    (out, plan),
                    force,
                    &msg,
                );
                return Err(anyhow!("{msg} ({note})"));
            }
            Err(anyhow!(msg))
        }
    }
}

/// Rank 0's measured device memory, beside what the plan predicts per GPU.
fn print_device_memory(m: &sextant_planner::calibration::DeviceMemory, predicted_bytes: f64) {
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let used = |free: u64| gib(m.total_bytes.saturating_sub(free));
    println!(
        "Device memory on rank {} (of {:.1} GiB): {:.2} GiB used with the context, {:.2} GiB with NCCL and cuBLAS, {:.2} GiB after the timed steps; the pool's peak {:.2} GiB in use, {:.2} GiB reserved, {:.2} GiB more reserved during the timed steps (the plan predicts {:.2} GiB per GPU).",
        m.rank,
        gib(m.total_bytes),
        used(m.free_with_context_bytes),
        used(m.free_before_run_bytes),
        used(m.free_after_steps_bytes),
        gib(m.pool_used_peak_bytes),
        gib(m.pool_reserved_peak_bytes),
        gib(m.pool_grown_in_timed_steps_bytes),
        predicted_bytes / (1u64 << 30) as f64
    );
}

/// The rendezvous and the TCP mesh between the ranks, every connection proving it
/// holds `key`; rank 0 hands `blob` to the others, who get it back.
fn connect(
    env: &LaunchEnv,
    key: &JobKey,
    hash: u64,
    setup: &program::Setup,
    timeout: Duration,
    blob: Vec<u8>,
) -> Result<(Mesh, Vec<u8>)> {
    let tag = |phase: &str, e: &dyn std::fmt::Display| anyhow!("rank {}, {phase}: {e}", env.rank);
    let root = if env.rank == 0 {
        Some(bind_root(env).map_err(|e| tag("rendezvous", &e))?)
    } else {
        None
    };
    let data = TcpListener::bind(("0.0.0.0", 0)).map_err(|e| tag("opening the peer port", &e))?;
    let port = data
        .local_addr()
        .map_err(|e| tag("opening the peer port", &e))?
        .port();
    let rz =
        rendezvous(env, root, key, hash, port, timeout, blob).map_err(|e| tag("rendezvous", &e))?;
    let max_frame = setup.max_message_bytes();
    let mesh = Mesh::connect(
        env.rank, env.world, data, &rz.peers, timeout, key, max_frame,
    )
    .map_err(|e| tag("connecting to peers", &e))?;
    Ok((mesh, rz.blob))
}

/// Rank 0's measured-run file for a failed run, marked incomplete. Returns what
/// happened to it, for the error line.
fn record_failure(
    setup: &program::Setup,
    opts: &Options,
    (backend, device, world): (&str, &str, u64),
    (out, plan): (&Path, &Path),
    force: bool,
    msg: &str,
) -> String {
    let run = program::incomplete_run(setup, opts, backend, device, world, msg);
    let json = serde_json::to_string_pretty(&run).expect("run serialises");
    match output::check_out(out, plan, force).and_then(|()| write_new(out, &json, force)) {
        Ok(()) => format!("'{}' is marked incomplete", out.display()),
        Err(w) => format!("could not record the failure in '{}': {w:#}", out.display()),
    }
}

fn print_summary(run: &MeasuredRun, out: &Path) {
    let c = &run.checks;
    println!(
        "Ran plan {} ({} ranks, {} schedule, {} micro-batches of {} x {} tokens, {} layers): {} timed step(s), median {:.4} s.",
        run.plan_rank,
        run.world_size,
        run.schedule,
        run.workload.global_batch / (run.config.dp * run.config.mbs).max(1),
        run.config.mbs,
        run.workload.seq,
        run.model.layers,
        run.step_secs.len(),
        run.median_step_secs().unwrap_or(0.0)
    );
    println!(
        "Checks passed: {} collectives with known data, {} activations and {} gradients against the unsharded reference (max relative error {:.1e}), {} replica comparisons, {}{} pipeline messages; no unmatched send.",
        c.collectives,
        c.activations,
        c.gradients,
        c.max_rel_error,
        c.replicas,
        if c.param_gathers > 0 { format!("{} ZeRO-3 parameter gathers, ", c.param_gathers) } else { String::new() },
        c.p2p_messages
    );
    println!(
        "Peak live micro-batch chunks per pipeline rank: {:?}",
        run.peak_live_chunks
    );
    println!("Measured run written to {}", out.display());
}

fn load_hardware(arg: &str) -> Result<HardwareProfile> {
    if arg.ends_with(".json") || Path::new(arg).exists() {
        let text = read_text(Path::new(arg), "hardware profile")?;
        return HardwareProfile::from_json(&text).map_err(|e| anyhow!("'{arg}': {e}"));
    }
    Ok(builtin_profile(arg)?)
}

fn read_run(path: &str) -> Result<MeasuredRun> {
    let text = read_text(Path::new(path), "measured run")?;
    MeasuredRun::from_json(&text).map_err(|e| anyhow!("'{path}': {e}"))
}

pub fn read_overlay(path: &str) -> Result<Overlay> {
    let text = read_text(Path::new(path), "calibration overlay")?;
    Overlay::from_json(&text).map_err(|e| anyhow!("'{path}': {e}"))
}

pub fn cmd_calibrate(a: CalibrateArgs) -> Result<()> {
    if !a.bench.is_empty() {
        return calibrate_bench(&a);
    }
    if !a.logs.is_empty() {
        return logs::calibrate(logs::CalibrateLogs {
            logs: &a.logs,
            plans: &a.plans,
            traces: &a.traces,
            warmup_iters: a.warmup_iters,
            out: &a.out,
            force: a.force,
        });
    }
    // The runs and a profile file are inputs: an overlay written over one would
    // lose it (a built-in profile name matches no file).
    let inputs: Vec<(&str, &str)> = a
        .runs
        .iter()
        .map(|p| ("run", p.as_str()))
        .chain(a.hardware.iter().map(|h| ("--hardware", h.as_str())))
        .collect();
    crate::io::check_outputs(&[("--out", a.out.as_str())], &inputs, a.force)?;
    let runs: Vec<MeasuredRun> = a.runs.iter().map(|p| read_run(p)).collect::<Result<_>>()?;
    let profile = load_hardware(a.hardware.as_deref().unwrap_or(&runs[0].profile))?;
    let overlay = calibrate(&runs, &profile).map_err(|e| anyhow!(e))?;
    write_new(
        Path::new(&a.out),
        &serde_json::to_string_pretty(&overlay).expect("overlay serialises"),
        a.force,
    )?;
    let show = |x: Option<f64>| x.map_or("not measured".to_string(), |v| format!("{v:.3e}"));
    // A file given twice (or a copy of one) is one run (`same_measurement`).
    let same: Vec<String> = duplicates(&runs)
        .iter()
        .enumerate()
        .filter_map(|(i, d)| {
            d.map(|j| {
                format!(
                    "run {} '{}' repeats run {} '{}'",
                    i + 1,
                    a.runs[i],
                    j + 1,
                    a.runs[j]
                )
            })
        })
        .collect();
    let counted = if same.is_empty() {
        String::new()
    } else {
        format!(
            "; {} duplicate(s) counted once: {}",
            same.len(),
            same.join(", ")
        )
    };
    println!(
        "Calibrated '{}' from {} run(s) on {} ({}){counted}:",
        shown(&profile.name),
        overlay.runs.len(),
        shown(&overlay.device),
        shown(&overlay.backend)
    );
    println!(
        "  GEMM efficiency (fraction of BF16 peak): {} (profile: {})",
        show(overlay.gemm_bf16),
        profile.efficiency.gemm_bf16
    );
    println!(
        "  attention efficiency: {} (profile: {})",
        show(overlay.attention),
        profile.efficiency.attention_fwd
    );
    println!(
        "  intra-node bus bandwidth fraction: {} (profile: {})",
        show(overlay.nvlink_busbw),
        profile.efficiency.nvlink_busbw
    );
    println!(
        "  network bus bandwidth fraction: {} (profile: {})",
        show(overlay.network_busbw),
        profile.efficiency.network_busbw
    );
    println!(
        "  {} GEMM shapes and {} collective sizes kept as points",
        overlay.gemm_points.len(),
        overlay.collective_points.len()
    );
    if overlay.backend == "cpu" {
        println!("  (measured by the CPU test backend: it describes this CPU, and `sextant plan --calibration` refuses it)");
    } else {
        print_planning_effect(&profile, &overlay);
        if overlay.attention.is_some() {
            println!("  the attention efficiency above is the executor's (batched GEMMs and a separate softmax, not the fused kernel training stacks run): planning keeps the profile's attention curves");
        }
    }
    println!("Overlay written to {}", a.out);
    Ok(())
}

/// What `plan --calibration` makes of an overlay ([`Target::Stack`]), said after
/// `calibrate` writes one: the same [`apply`] a plan runs, so the two cannot
/// disagree.
fn print_planning_effect(profile: &HardwareProfile, overlay: &Overlay) {
    let bare = bare_measurement(overlay);
    match apply(profile, overlay, Target::Stack) {
        Err(e) => println!("  for planning: refused: {e}"),
        Ok(_) if !bare => println!(
            "  for planning (plan/estimate --calibration, compare --log): the measured HBM and collective figures replace the profile's; no GEMM level was measured"
        ),
        Ok(p) => {
            let r = bare_gemm_ratio(profile, &overlay.gemm_points).unwrap_or(f64::NAN);
            println!(
                "  for planning (plan/estimate --calibration, compare --log): this GPU's large BF16 GEMMs ran at {r:.3} of the profile's bare-GEMM level ({:.3} of peak, with its shape curve), so its fitted GEMM level (what training stacks sustain) goes from {} to {:.3}, FP8 likewise; attention and the curves stay; the measured levels above replace the profile's only in `compare` with a measured run",
                profile.bare_gemm_bf16().unwrap_or(f64::NAN),
                profile.efficiency.gemm_bf16,
                p.efficiency.gemm_bf16
            );
        }
    }
}

/// `calibrate --bench`: an overlay from benchmark files (`sextant bench`).
fn calibrate_bench(a: &CalibrateArgs) -> Result<()> {
    let Some(hw) = &a.hardware else {
        bail!("calibrate --bench needs --hardware PROFILE (e.g. h100-sxm, or a profile JSON): a benchmark file names its GPU, not the profile to calibrate");
    };
    let inputs: Vec<(&str, &str)> = a
        .bench
        .iter()
        .map(|p| ("--bench", p.as_str()))
        .chain(std::iter::once(("--hardware", hw.as_str())))
        .collect();
    crate::io::check_outputs(&[("--out", a.out.as_str())], &inputs, a.force)?;
    let profile = load_hardware(hw)?;
    let files = a
        .bench
        .iter()
        .map(|p| {
            let text = read_text(Path::new(p), "benchmark file")?;
            BenchFile::from_json(&text).map_err(|e| anyhow!("'{p}': {e}"))
        })
        .collect::<Result<Vec<_>>>()?;
    let (overlay, fit) = bench_overlay(&files, &profile).map_err(|e| anyhow!(e))?;
    write_new(
        Path::new(&a.out),
        &serde_json::to_string_pretty(&overlay).expect("overlay serialises"),
        a.force,
    )?;
    let show = |x: Option<f64>| x.map_or("not measured".to_string(), |v| format!("{v:.3}"));
    println!(
        "Calibrated '{}' from {} benchmark file(s) on {}:",
        shown(&profile.name),
        files.len(),
        shown(&overlay.device)
    );
    let e = &profile.efficiency;
    match &overlay.gemm_curve {
        Some(c) => println!(
            "  GEMM: the measured BF16 curve ({} shapes); its best point, {:.1} TFLOP/s, is {} of the BF16 peak (profile, fitted on training runs: {})",
            overlay.gemm_points.iter().filter(|g| g.class == "sweep").count(),
            c.best_tflops(),
            show(overlay.gemm_bf16),
            e.gemm_bf16
        ),
        None => println!("  GEMM: not measured"),
    }
    if !fit.plan_shapes.is_empty() {
        let err: Vec<f64> = fit
            .plan_shapes
            .iter()
            .map(|(g, curve)| curve / g.tflops - 1.0)
            .collect();
        let worst = err
            .iter()
            .copied()
            .fold(0.0f64, |a, x| if x.abs() > a.abs() { x } else { a });
        println!(
            "  the curve against the plan's {} measured GEMM shapes: median {:+.1}%, worst {:+.1}% (the curve prices a shape at its grid neighbours; a batched attention GEMM is priced by the attention curve, not this one)",
            err.len(),
            100.0 * sextant_planner::calibration::median(&err).unwrap_or(0.0),
            100.0 * worst
        );
    }
    match &fit.hbm_copy {
        Some(c) => println!(
            "  HBM: a {}-byte copy at {:.0} GB/s is {} of {} TB/s (profile: {})",
            c.bytes,
            c.gbytes_per_s,
            show(overlay.hbm),
            profile.gpu.hbm_tbytes_per_s,
            e.hbm
        ),
        None => println!("  HBM: not measured"),
    }
    match overlay.nvlink_busbw {
        Some(b) => println!(
            "  intra-node bus bandwidth: {} of {} GB/s, {:.2} us per step, fitted to {} collective points over 2 or more GPUs (profile: {}, {} us)",
            show(Some(b)),
            profile.node.nvlink_gbytes_per_s,
            overlay.nvlink_latency_us.unwrap_or(0.0),
            fit.collectives_fitted,
            e.nvlink_busbw,
            e.nvlink_latency_us
        ),
        None => println!("  intra-node bus bandwidth: not measured (no collective over 2 or more GPUs)"),
    }
    for n in &fit.not_used {
        println!("  not used: {n}");
    }
    print_planning_effect(&profile, &overlay);
    println!("Overlay written to {}", a.out);
    Ok(())
}

/// Predicted seconds per step by measured component name.
fn predicted_components(
    run: &MeasuredRun,
    profile: &HardwareProfile,
    assumptions: Assumptions,
) -> Result<Vec<(String, f64)>> {
    let mut cluster = Cluster::new(profile.clone(), run.world_size)?;
    cluster.allow_tp_beyond_nvlink = true;
    // The plan's assumptions (rank order, kernels): the executor ran the plan.
    let e = estimate_with(
        &run.model,
        &cluster,
        &run.workload,
        &run.config,
        assumptions,
    )
    .map_err(|r| anyhow!("the cost model cannot estimate the executed configuration: {r}"))?;
    // The pipeline simulated, as `estimate` and the search price every plan.
    let e = simulated(e, &run.config);
    let c = &e.time.compute;
    let mut v = vec![
        ("attention_proj".to_string(), c.attention_proj),
        ("attention_core".into(), c.attention_core),
        ("mlp".into(), c.mlp),
        ("moe_experts".into(), c.moe_experts),
        ("router".into(), c.router),
        ("elementwise".into(), c.elementwise),
        ("recompute".into(), e.time.recompute),
    ];
    for kind in [
        CommKind::Tp,
        CommKind::Cp,
        CommKind::Ep,
        CommKind::Pp,
        CommKind::DpGrad,
        CommKind::DpParam,
        CommKind::EdpGrad,
        CommKind::EdpParam,
    ] {
        v.push((
            kind.key().into(),
            e.comm
                .iter()
                .filter(|t| t.kind == kind)
                .map(|t| t.total_secs)
                .sum(),
        ));
    }
    v.push(("optimizer".into(), e.time.optimizer));
    v.push(("step".into(), e.step_secs));
    Ok(v)
}

/// The measured run at `run_path`, checked to be a complete run of the plan
/// file whose text is `plan_text` (same hash); with that hash.
fn run_of_plan(
    plan_path: &str,
    plan_text: &str,
    plan: &PlanFile,
    run_path: &str,
) -> Result<(MeasuredRun, String)> {
    let run = read_run(run_path)?;
    let hash = format!("{:016x}", program::plan_hash(plan_text.as_bytes()));
    if hash != run.plan_hash {
        bail!(
            "'{}' was measured on a different plan (hash {}) from '{}' ({hash})",
            run_path,
            run.plan_hash,
            plan_path
        );
    }
    if !run.complete {
        bail!(
            "'{}' is marked incomplete: {}",
            run_path,
            run.failure.as_deref().unwrap_or("no reason recorded")
        );
    }
    // The hash ties the run to the plan file, not the run's own records: an
    // edited run would be compared as another configuration, or with no step.
    if run.step_secs.is_empty() {
        bail!("'{run_path}' records no timed step: compare a complete run of `sextant exec`");
    }
    let ranked = run.plan_rank.checked_sub(1).and_then(|i| plan.plans.get(i));
    let Some(ranked) = ranked else {
        bail!(
            "'{run_path}' says it ran plan #{} but '{plan_path}' holds {} plan(s)",
            run.plan_rank,
            plan.plans.len()
        );
    };
    // The executor may run smaller sizes than the plan (the CPU backend caps the
    // micro-batch at 2 and scales the layers), never other degrees or choices.
    let (p, r) = (&ranked.config, &run.config);
    let differs: Vec<String> = p
        .named_degrees()
        .into_iter()
        .zip(r.named_degrees())
        .map(|((n, a), (_, b))| (n, a, b))
        .chain([("ranks", plan.gpus, run.world_size)])
        .filter(|(_, a, b)| a != b)
        .map(|(n, a, b)| format!("{n} {b} (the plan {a})"))
        .chain((p.sp != r.sp).then(|| format!("SP {} (the plan {})", r.sp, p.sp)))
        .chain((p.zero != r.zero).then(|| format!("ZeRO {} (the plan {})", r.zero, p.zero)))
        .chain(
            (p.recompute != r.recompute)
                .then(|| format!("recompute {} (the plan {})", r.recompute, p.recompute)),
        )
        .chain(
            (p.schedule != r.schedule)
                .then(|| format!("schedule {} (the plan {})", r.schedule, p.schedule)),
        )
        .collect();
    if !differs.is_empty() {
        bail!(
            "'{run_path}' records another configuration than plan #{} of '{plan_path}': {}; the run file was edited or belongs to another plan",
            run.plan_rank,
            differs.join(", ")
        );
    }
    Ok((run, hash))
}

/// What `report --run` shows: each component the run measured (or the cost model
/// predicted) with both numbers, as `compare` prints them, and the run's device.
pub fn measured_components(
    plan_path: &str,
    plan_text: &str,
    plan: &PlanFile,
    run_path: &str,
) -> Result<(String, Vec<sextant_reports::Measured>)> {
    let (run, _) = run_of_plan(plan_path, plan_text, plan, run_path)?;
    // The report is about the file's first plan: a run of another would sit in
    // its section 9 unlabelled.
    if run.plan_rank != 1 {
        bail!(
            "'{run_path}' ran plan {} of '{plan_path}', and the report is about plan 1: give a run of plan 1 (sextant exec '{plan_path}' without --plan), or compare this one with `sextant compare '{plan_path}' '{run_path}'`",
            run.plan_rank
        );
    }
    let rows = predicted_components(&run, &plan.hardware, plan.assumptions)?
        .into_iter()
        .map(|(name, p)| {
            let m = if name == "step" {
                run.median_step_secs().unwrap_or(0.0)
            } else {
                run.components.get(&name).copied().unwrap_or(0.0)
            };
            sextant_reports::Measured {
                component: name,
                predicted_secs: p,
                measured_secs: m,
            }
        })
        .filter(|r| r.predicted_secs != 0.0 || r.measured_secs != 0.0)
        .collect();
    Ok((
        format!("{} ({})", shown(&run.device), shown(&run.backend)),
        rows,
    ))
}

pub fn cmd_compare(a: CompareArgs) -> Result<()> {
    let run_path = match (&a.run, &a.log) {
        (_, Some(log)) => {
            return logs::compare(logs::CompareLog {
                plan: &a.plan,
                log,
                trace: a.trace.as_deref(),
                warmup_iters: a.warmup_iters,
                calibration: a.calibration.as_deref(),
                json: a.json,
            })
        }
        (Some(r), None) => r.clone(),
        (None, None) => bail!("compare needs a measured run or --log FILE"),
    };
    let text = read_text(Path::new(&a.plan), "plan")?;
    let plan = PlanFile::from_json(&text).map_err(|e| anyhow!("'{}': {e}", a.plan))?;
    crate::check_plan_target(&a.plan, &plan)?;
    let (run, hash) = run_of_plan(&a.plan, &text, &plan, &run_path)?;
    let before = predicted_components(&run, &plan.hardware, plan.assumptions)?;
    let after = match &a.calibration {
        Some(p) => {
            let o = read_overlay(p)?;
            Some(predicted_components(
                &run,
                &apply(&plan.hardware, &o, Target::Executor).map_err(|e| anyhow!(e))?,
                plan.assumptions,
            )?)
        }
        None => None,
    };
    let measured = |name: &str| -> f64 {
        if name == "step" {
            run.median_step_secs().unwrap_or(0.0)
        } else {
            run.components.get(name).copied().unwrap_or(0.0)
        }
    };
    if a.json {
        let rows: Vec<serde_json::Value> = before
            .iter()
            .enumerate()
            .map(|(i, (name, p))| {
                serde_json::json!({"component": name, "predicted_secs": p,
                    "measured_secs": measured(name),
                    "calibrated_secs": after.as_ref().map(|v| v[i].1)})
            })
            .collect();
        println!(
            "{}",
            crate::render::json_text(
                serde_json::json!({"plan_hash": hash, "device": run.device, "rows": rows})
            )
        );
        return Ok(());
    }
    println!(
        "Predicted ({}) vs measured ({}), seconds per step; slowest rank per component:",
        shown(&plan.hardware.name),
        shown(&run.device)
    );
    let ratio = |p: f64, m: f64| {
        if m > 0.0 && p > 0.0 {
            format!("{:>9.2}x", p / m)
        } else {
            format!("{:>10}", "-")
        }
    };
    print!(
        "{:<16} {:>12} {:>12} {:>10}",
        "component", "predicted", "measured", "pred/meas"
    );
    if after.is_some() {
        print!(" {:>12} {:>10}", "calibrated", "cal/meas");
    }
    println!();
    for (i, (name, p)) in before.iter().enumerate() {
        let m = measured(name);
        if *p == 0.0 && m == 0.0 {
            continue;
        }
        print!(
            "{name:<16} {:>12.3e} {:>12.3e} {}",
            unsigned_zero(*p),
            unsigned_zero(m),
            ratio(*p, m)
        );
        if let Some(v) = &after {
            print!(" {:>12.3e} {}", unsigned_zero(v[i].1), ratio(v[i].1, m));
        }
        println!();
    }
    Ok(())
}

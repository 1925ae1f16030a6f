//! Launch scripts: `torchrun` (one node, or each node of several) and a Slurm
//! `sbatch` script, each for the user's framework (Megatron-LM's `pretrain_gpt.py`
//! with the plan's arguments) or for `sextant exec plan.json`.
//!
//! torchrun options are those of `torch/distributed/run.py` (`--nproc-per-node`,
//! `--nnodes`, `--node-rank`, `--master-addr`, `--master-port`, `--no-python`);
//! Slurm directives are sbatch's (`--nodes`, `--ntasks-per-node`, `--gpus-per-node`,
//! `--exclusive`) and srun's `--gpu-bind`. One process per GPU; under Slurm each
//! task exports the torch.distributed variables (RANK, WORLD_SIZE, LOCAL_RANK,
//! MASTER_ADDR, MASTER_PORT) from SLURM_PROCID, SLURM_NTASKS and SLURM_LOCALID.
//!
//! Every user-controlled string goes through `crate::quote`: names into the
//! header comment, the plan path as one shell word (a NUL byte is refused).

use std::fmt::Write;

use sextant_planner::plan::PlanFile;

use crate::quote;
use crate::Reason;

/// What each process runs.
pub enum Program {
    /// Megatron-LM's training script with these arguments.
    Megatron(Vec<String>),
    /// Sextant's executor on the plan file at this path, running its plan of this
    /// rank (1 = the best).
    SextantExec { plan_path: String, rank: usize },
    /// ScaleTorch's `train.py` with these arguments, under this environment
    /// (names and values plain words).
    ScaleTorch {
        args: Vec<String>,
        env: Vec<(String, String)>,
    },
}

const PORT: u16 = 29500;

fn header(s: &mut String, plan: &PlanFile, index: usize, what: &str) {
    let cfg = &plan.plans[index].config;
    let _ = writeln!(s, "#!/usr/bin/env bash");
    let _ = writeln!(
        s,
        "# {what}: {} on {} x {} ({}), plan #{} (TP {} PP {} VPP {} CP {} EP {} DP {}). Written by {}.",
        quote::comment(&plan.model.name),
        plan.gpus,
        quote::comment(&plan.hardware.gpu.name),
        quote::comment(&plan.hardware.name),
        plan.plans[index].rank,
        cfg.tp,
        cfg.pp,
        cfg.vpp,
        cfg.cp,
        cfg.ep,
        cfg.dp,
        quote::comment(&plan.generator)
    );
}

/// Continuation lines for a long command, two per line.
fn command_lines(words: &[String]) -> String {
    let mut s = String::new();
    for chunk in words.chunks(2) {
        let _ = write!(s, " \\\n    {}", chunk.join(" "));
    }
    s
}

/// The program's words, each already a shell word. A plan path that no shell
/// word can carry (a NUL byte) is the `Err`.
fn program_words(p: &Program) -> Result<(bool, Vec<String>), Reason> {
    Ok(match p {
        Program::Megatron(args) => {
            let mut w = vec!["\"${MEGATRON_LM:-.}/pretrain_gpt.py\"".to_string()];
            w.extend(args.iter().cloned());
            (false, w)
        }
        Program::ScaleTorch { args, .. } => {
            let mut w = vec!["\"${SCALETORCH:-.}/train.py\"".to_string()];
            w.extend(args.iter().cloned());
            (false, w)
        }
        Program::SextantExec { plan_path, rank } => {
            // A relative path that starts with '-' would read as an option.
            let path = if plan_path.starts_with('-') {
                format!("./{plan_path}")
            } else {
                plan_path.clone()
            };
            let path = quote::shell(&path).map_err(|e| Reason(format!("the plan path {e}")))?;
            let mut w = vec!["\"${SEXTANT:-sextant}\"".into(), "exec".into(), path];
            // The plan the header names: exec runs plan 1 unless told.
            if *rank != 1 {
                w.extend(["--plan".into(), rank.to_string()]);
            }
            (true, w)
        }
    })
}

/// 32 random bytes as hex (coreutils only), the job secret `sextant exec` ranks
/// authenticate with; never on a command line.
const SECRET_FROM_URANDOM: &str =
    "SEXTANT_JOB_SECRET=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \\n')";

/// The environment Megatron-LM's `validate_args` wants for this plan
/// (`CUDA_DEVICE_MAX_CONNECTIONS`: 1 with TP or CP on pre-Blackwell GPUs, unset
/// for Megatron-FSDP and the EP overlap), as a script line; torchrun and srun pass
/// it on to every rank.
fn megatron_env(s: &mut String, plan: &PlanFile, index: usize, program: &Program) {
    if let Program::Megatron(_) = program {
        match crate::megatron::cuda_device_max_connections(plan, index) {
            Some(crate::megatron::MaxConnections::One) => {
                let _ = writeln!(s, "export CUDA_DEVICE_MAX_CONNECTIONS=1");
            }
            Some(crate::megatron::MaxConnections::Unset) => {
                let _ = writeln!(s, "unset CUDA_DEVICE_MAX_CONNECTIONS");
            }
            None => {}
        }
    }
}

pub fn torchrun(plan: &PlanFile, index: usize, program: &Program) -> Result<String, Reason> {
    let per_node = plan.hardware.node.gpus_per_node.min(plan.gpus);
    let nodes = plan.gpus.div_ceil(per_node);
    let mut s = String::new();
    header(&mut s, plan, index, "torchrun launch");
    let _ = writeln!(s, "# Run on each of the {nodes} node(s) with NODE_RANK set (0 on the first) and MASTER_ADDR pointing at node 0.");
    let _ = writeln!(s, "set -euo pipefail");
    let _ = writeln!(s, "NNODES={nodes}");
    let _ = writeln!(s, "NODE_RANK=${{NODE_RANK:-0}}");
    let _ = writeln!(s, "MASTER_ADDR=${{MASTER_ADDR:-localhost}}");
    let _ = writeln!(s, "MASTER_PORT=${{MASTER_PORT:-{PORT}}}");
    let (no_python, words) = program_words(program)?;
    megatron_env(&mut s, plan, index, program);
    if let Program::ScaleTorch { env, .. } = program {
        for (k, v) in env {
            let _ = writeln!(s, "export {k}={v}");
        }
    }
    if no_python {
        // `sextant exec` ranks authenticate each other with a secret every rank
        // shares (README, "Executing a plan"). Each node runs this script, so a
        // secret made here would differ between nodes: with several nodes the
        // user sets it on every node; on one node it is made here.
        let _ = writeln!(s, "if [ -z \"${{SEXTANT_JOB_SECRET-}}\" ]; then");
        let _ = writeln!(s, "  if [ \"$NNODES\" -gt 1 ]; then");
        let _ = writeln!(s, "    echo \"set SEXTANT_JOB_SECRET to one secret of at least 16 characters on every node\" >&2");
        let _ = writeln!(s, "    exit 1");
        let _ = writeln!(s, "  fi");
        let _ = writeln!(s, "  {SECRET_FROM_URANDOM}");
        let _ = writeln!(s, "fi");
        let _ = writeln!(s, "export SEXTANT_JOB_SECRET");
    }
    let mut launcher = vec![
        format!("--nproc-per-node {per_node}"),
        "--nnodes \"$NNODES\"".into(),
        "--node-rank \"$NODE_RANK\"".into(),
        "--master-addr \"$MASTER_ADDR\"".into(),
        "--master-port \"$MASTER_PORT\"".into(),
    ];
    if no_python {
        launcher.push("--no-python".into());
    }
    let mut all = launcher;
    all.extend(words);
    let _ = writeln!(s, "torchrun{}", command_lines(&all));
    Ok(s)
}

/// The task's device index, as a shell fragment inside the srun task's
/// `bash -c '...'` (so it holds no single quote). Slurm's documentation for
/// `--gpus-per-task` says it implies `--gpu-bind=per_task:<n>`: each task is bound
/// to its own GPU and its CUDA_VISIBLE_DEVICES names that one GPU, so device index
/// SLURM_LOCALID (1..7) would not exist. The script therefore asks for GPUs per
/// node (`--gpus-per-node`) and starts the tasks with `srun --gpu-bind=none`,
/// under which Slurm binds no task to a GPU: every task sees all the node's GPUs
/// and LOCAL_RANK = SLURM_LOCALID picks its own. Should a site bind tasks anyway
/// (a job-submit or CLI filter), a CUDA_VISIBLE_DEVICES with exactly one entry
/// means that entry is this task's GPU, device 0.
const SLURM_DEVICE_INDEX: &str = "export RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID; case ${CUDA_VISIBLE_DEVICES-} in *,* | \"\") ;; *) LOCAL_RANK=0 ;; esac;";

pub fn slurm(plan: &PlanFile, index: usize, program: &Program) -> Result<String, Reason> {
    let per_node = plan.hardware.node.gpus_per_node.min(plan.gpus);
    let nodes = plan.gpus.div_ceil(per_node);
    let (no_python, words) = program_words(program)?;
    let mut s = String::new();
    header(&mut s, plan, index, "Slurm batch script");
    let _ = writeln!(
        s,
        "#SBATCH --job-name=sextant-{}",
        quote::slurm_job_name(&plan.model.name)
    );
    let _ = writeln!(s, "#SBATCH --nodes={nodes}");
    let _ = writeln!(s, "#SBATCH --ntasks-per-node={per_node}");
    // GPUs per node, not per task: see SLURM_DEVICE_INDEX.
    let _ = writeln!(s, "#SBATCH --gpus-per-node={per_node}");
    let _ = writeln!(s, "#SBATCH --exclusive");
    // Where an NVLink domain spans several nodes (GB200 NVL72), the plan was priced
    // with the job in equal segments of whole nodes (`Cluster::job_domain`, in the
    // plan's `nvlink_domain`): ask Slurm's topology/block plugin for them, so that
    // no group straddles a rack (Megatron-Bridge's launcher does the same).
    let domain = sextant_planner::hardware::Cluster::job_domain(&plan.hardware, plan.gpus);
    if domain > per_node && nodes > 1 {
        let _ = writeln!(s, "#SBATCH --segment={}", domain / per_node);
    }
    let _ = writeln!(s, "set -euo pipefail");
    let _ = writeln!(
        s,
        "export MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1)"
    );
    let _ = writeln!(s, "export MASTER_PORT=${{MASTER_PORT:-{PORT}}}");
    let _ = writeln!(s, "export WORLD_SIZE={}", plan.gpus);
    megatron_env(&mut s, plan, index, program);
    if no_python {
        // The batch script runs once and srun passes its environment to every
        // task: one secret for the job, made here unless the user set one.
        let _ = writeln!(
            s,
            "if [ -z \"${{SEXTANT_JOB_SECRET-}}\" ]; then {SECRET_FROM_URANDOM}; fi"
        );
        let _ = writeln!(s, "export SEXTANT_JOB_SECRET");
    }
    let runner = if no_python {
        String::new()
    } else {
        "python ".into()
    };
    let _ = writeln!(
        s,
        "srun --ntasks={} --ntasks-per-node={per_node} --gpu-bind=none bash -c '{SLURM_DEVICE_INDEX} exec {runner}\"$0\" \"$@\"'{}",
        plan.gpus,
        command_lines(&words)
    );
    Ok(s)
}

//! The enumerated command-line flags as clap `ValueEnum`s: the words a user types,
//! kept apart from the planner's types (which know nothing of clap), each mapped to
//! its planner value in one place. clap lists the accepted words in `--help`, in
//! completions and in the one-line error for a wrong one.

use clap::ValueEnum;
use sextant_planner::config::{Dispatcher, Precision, Recompute, Zero};
use sextant_planner::cost::LossKernel;
use sextant_planner::reach::RankBy;
use sextant_planner::schedule::Schedule;

/// `--precision`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
#[value(rename_all = "lower")]
pub enum PrecisionFlag {
    Bf16,
    Fp16,
    Fp8,
    Mxfp8,
}

impl From<PrecisionFlag> for Precision {
    fn from(f: PrecisionFlag) -> Precision {
        match f {
            PrecisionFlag::Bf16 => Precision::Bf16,
            PrecisionFlag::Fp16 => Precision::Fp16,
            PrecisionFlag::Fp8 => Precision::Fp8,
            PrecisionFlag::Mxfp8 => Precision::Mxfp8,
        }
    }
}

/// `--loss`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
#[value(rename_all = "lower")]
pub enum LossFlag {
    /// Transformer Engine's cross-entropy (Megatron-Bridge's performance scripts).
    Te,
    /// Megatron's fused cross-entropy (`--cross-entropy-loss-fusion`).
    Native,
    /// Megatron-LM without the fusion flag.
    Unfused,
    /// torchtitan's loss under torch.compile (`--target torchtitan` only).
    Compiled,
}

impl From<LossFlag> for LossKernel {
    fn from(f: LossFlag) -> LossKernel {
        match f {
            LossFlag::Te => LossKernel::Te,
            LossFlag::Native => LossKernel::Native,
            LossFlag::Unfused => LossKernel::Unfused,
            LossFlag::Compiled => LossKernel::Compiled,
        }
    }
}

/// `--moe-dispatcher`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DispatcherFlag {
    /// Megatron's all-to-all dispatcher.
    #[value(name = "alltoall", alias = "all-to-all")]
    AllToAll,
    /// DeepEP / HybridEP: one network copy per destination node.
    #[value(name = "dedup", aliases = ["deepep", "hybridep", "flex"])]
    Dedup,
}

impl From<DispatcherFlag> for Dispatcher {
    fn from(f: DispatcherFlag) -> Dispatcher {
        match f {
            DispatcherFlag::AllToAll => Dispatcher::AllToAll,
            DispatcherFlag::Dedup => Dispatcher::Deduplicated,
        }
    }
}

/// `--schedule`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ScheduleFlag {
    #[value(name = "1f1b", alias = "one-f-one-b")]
    OneFOneB,
    #[value(name = "interleaved", aliases = ["interleaved-1f1b", "vpp"])]
    Interleaved,
    #[value(name = "zb-h1", aliases = ["zbh1", "zb1p", "zb_h1"])]
    ZbH1,
    #[value(name = "dualpipe", aliases = ["dual-pipe", "dual_pipe"])]
    DualPipe,
    #[value(name = "gpipe")]
    Gpipe,
}

impl From<ScheduleFlag> for Schedule {
    fn from(f: ScheduleFlag) -> Schedule {
        match f {
            ScheduleFlag::OneFOneB => Schedule::OneFOneB,
            ScheduleFlag::Interleaved => Schedule::Interleaved,
            ScheduleFlag::ZbH1 => Schedule::ZbH1,
            ScheduleFlag::DualPipe => Schedule::DualPipe,
            ScheduleFlag::Gpipe => Schedule::Gpipe,
        }
    }
}

/// `--zero`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ZeroFlag {
    /// Plain data parallelism.
    #[value(name = "0", alias = "none")]
    Zero0,
    /// Megatron's distributed optimizer.
    #[value(name = "1", aliases = ["do", "dist-opt", "distributed-optimizer"])]
    Zero1,
    #[value(name = "2")]
    Zero2,
    #[value(name = "3", alias = "fsdp")]
    Zero3,
}

impl From<ZeroFlag> for Zero {
    fn from(f: ZeroFlag) -> Zero {
        match f {
            ZeroFlag::Zero0 => Zero::None,
            ZeroFlag::Zero1 => Zero::DistOpt,
            ZeroFlag::Zero2 => Zero::Zero2,
            ZeroFlag::Zero3 => Zero::Zero3,
        }
    }
}

/// `--recompute`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RecomputeFlag {
    #[value(name = "none", alias = "no")]
    None,
    #[value(name = "selective", alias = "sel")]
    Selective,
    #[value(name = "full")]
    Full,
}

impl From<RecomputeFlag> for Recompute {
    fn from(f: RecomputeFlag) -> Recompute {
        match f {
            RecomputeFlag::None => Recompute::None,
            RecomputeFlag::Selective => Recompute::Selective,
            RecomputeFlag::Full => Recompute::Full,
        }
    }
}

/// `--rank-by`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
#[value(rename_all = "lower")]
pub enum RankByFlag {
    /// The step time.
    Point,
    /// The upper end of the error band (80%, or more where widened).
    Upper,
}

impl From<RankByFlag> for RankBy {
    fn from(f: RankByFlag) -> RankBy {
        match f {
            RankByFlag::Point => RankBy::Point,
            RankByFlag::Upper => RankBy::Upper,
        }
    }
}

/// `exec --backend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
#[value(rename_all = "lower")]
pub enum BackendFlag {
    /// The test backend: real data over loopback TCP, small f32 GEMMs.
    Cpu,
    /// GPUs (needs a build with `--features cuda`).
    Cuda,
}

impl BackendFlag {
    /// The name a run file records.
    pub fn name(self) -> &'static str {
        match self {
            BackendFlag::Cpu => "cpu",
            BackendFlag::Cuda => "cuda",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every word each planner parser accepted before the flags were enums is
    /// still accepted, and means the same.
    #[test]
    fn flags_accept_the_planner_parsers_words() {
        let parse = |v: &[&str], f: &dyn Fn(&str) -> bool| {
            for w in v {
                assert!(f(w), "{w}");
            }
        };
        parse(&["bf16", "fp16", "fp8", "mxfp8", "BF16"], &|w| {
            Precision::from(PrecisionFlag::from_str(w, true).unwrap())
                == Precision::parse(w).unwrap()
        });
        parse(&["te", "native", "unfused"], &|w| {
            LossKernel::from(LossFlag::from_str(w, true).unwrap()) == LossKernel::parse(w).unwrap()
        });
        parse(
            &[
                "alltoall",
                "all-to-all",
                "dedup",
                "deepep",
                "hybridep",
                "flex",
            ],
            &|w| {
                Dispatcher::from(DispatcherFlag::from_str(w, true).unwrap())
                    == Dispatcher::parse(w).unwrap()
            },
        );
        parse(
            &[
                "1f1b",
                "one-f-one-b",
                "interleaved",
                "interleaved-1f1b",
                "vpp",
                "zb-h1",
                "zbh1",
                "zb1p",
                "zb_h1",
                "dualpipe",
                "dual-pipe",
                "dual_pipe",
                "gpipe",
            ],
            &|w| {
                Schedule::from(ScheduleFlag::from_str(w, true).unwrap())
                    == Schedule::parse(w).unwrap()
            },
        );
        parse(&["point", "upper"], &|w| {
            RankBy::from(RankByFlag::from_str(w, true).unwrap()) == RankBy::parse(w).unwrap()
        });
        for (w, z) in [
            ("0", Zero::None),
            ("none", Zero::None),
            ("1", Zero::DistOpt),
            ("do", Zero::DistOpt),
            ("dist-opt", Zero::DistOpt),
            ("distributed-optimizer", Zero::DistOpt),
            ("2", Zero::Zero2),
            ("3", Zero::Zero3),
            ("fsdp", Zero::Zero3),
        ] {
            assert_eq!(Zero::from(ZeroFlag::from_str(w, true).unwrap()), z, "{w}");
        }
        for (w, r) in [
            ("none", Recompute::None),
            ("no", Recompute::None),
            ("selective", Recompute::Selective),
            ("sel", Recompute::Selective),
            ("full", Recompute::Full),
        ] {
            assert_eq!(
                Recompute::from(RecomputeFlag::from_str(w, true).unwrap()),
                r,
                "{w}"
            );
        }
        assert!(ZeroFlag::from_str("4", true).is_err());
        assert!(ScheduleFlag::from_str("zb-h2", true).is_err());
    }
}

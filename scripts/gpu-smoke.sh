#!/usr/bin/env bash
# The GPU smoke test: a prebuilt sextant (cargo build --release --features cuda) on
# a machine with an NVIDIA GPU.
#
#   scripts/gpu-smoke.sh OUTDIR
#
# It prints the driver and library versions (nvidia-smi, and the libraries the
# binary loads), plans a small model on one GPU, runs the microbenchmarks (gemm
# with the plan's GEMM shapes, hbm, nccl over the visible GPUs, p2p when there are
# two or more), compares each benchmarked GEMM shape with torch.matmul when
# PyTorch with CUDA is present, runs the plan with `exec --backend cuda --ranks 1`,
# calibrates from the run and compares predicted with measured time before and
# after, and last builds an overlay from the benchmarks, compares with it and
# plans with it. Everything it writes goes under OUTDIR (a new or empty
# directory); each step's output is also kept in OUTDIR/STEP.log. The first step
# that fails ends the script with exit status 1 and one line naming it.
#
# Environment (all optional):
#   SEXTANT           the binary (default: ./sextant beside this script)
#   PYTHON            the Python with PyTorch (default: python3)
#   SEXTANT_PROFILE   the hardware profile, a built-in name or a profile JSON
#                     (default: from the GPU's name, e.g. H100 -> h100-sxm)
#   SMOKE_MODEL       the model planned and run (default: gpt-1.7b)
#   SMOKE_SEQ, SMOKE_GLOBAL_BATCH, SMOKE_MBS   its workload (default: 2048, 8, 1)
#   SMOKE_GEMM_SIZES, SMOKE_HBM_BYTES, SMOKE_NCCL_BYTES, SMOKE_P2P_BYTES,
#   SMOKE_ITERS       passed to `sextant bench` as --sizes, --bytes and --iters
#                     (default: the benchmarks' own)
set -euo pipefail

here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)

fail() {
  printf 'gpu-smoke: %s\n' "$*" >&2
  exit 1
}

[ "$#" -eq 1 ] || fail "usage: gpu-smoke.sh OUTDIR (a new or empty directory for the results)"
out=$1
sextant=${SEXTANT:-$here/sextant}
python=${PYTHON:-python3}
model=${SMOKE_MODEL:-gpt-1.7b}
seq=${SMOKE_SEQ:-2048}
global_batch=${SMOKE_GLOBAL_BATCH:-8}
mbs=${SMOKE_MBS:-1}

if [ ! -f "$sextant" ] || [ ! -x "$sextant" ]; then
  fail "no sextant binary at '$sextant': build one with 'cargo build --release --features cuda' and set SEXTANT to it"
fi
if [ -e "$out" ] || [ -L "$out" ]; then
  if [ ! -d "$out" ] || [ -L "$out" ]; then
    fail "OUTDIR '$out' exists and is not a directory: give a new or empty directory"
  fi
  [ -z "$(ls -A -- "$out")" ] || fail "OUTDIR '$out' is not empty: give a new or empty directory (nothing there is overwritten)"
fi
mkdir -p -- "$out" || fail "cannot create OUTDIR '$out'"
out=$(cd -- "$out" && pwd)

# run STEP COMMAND...: runs the command, its output shown and kept in
# OUTDIR/STEP.log; a failure ends the script with one line.
run() {
  local step=$1 rc why
  shift
  printf '\n== %s\n' "$step"
  set +e
  "$@" 2>&1 | tee "$out/$step.log"
  rc=${PIPESTATUS[0]}
  set -e
  if [ "$rc" -ne 0 ]; then
    why=$(grep -m 1 -E '^(error|gpu-smoke|Traceback)' "$out/$step.log" || true)
    [ -n "$why" ] || why=$(tail -n 1 "$out/$step.log")
    fail "step '$step' failed (exit $rc): ${why:-no output}; its output is in $out/$step.log"
  fi
}

# Versions: the binary, the driver (nvidia-smi), the GPUs.
printf '== versions\n'
gpu_name=
gpus=1
{
  printf 'sextant: %s (%s)\n' "$("$sextant" --version)" "$sextant"
  if command -v nvidia-smi > /dev/null 2>&1; then
    nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
    nvidia-smi
  else
    echo "nvidia-smi: not found"
  fi
} 2>&1 | tee "$out/versions.txt"
if command -v nvidia-smi > /dev/null 2>&1; then
  listed=$(nvidia-smi --query-gpu=name --format=csv,noheader) || fail "nvidia-smi cannot list the GPUs (see $out/versions.txt)"
  gpu_name=$(printf '%s\n' "$listed" | head -n 1)
  gpus=$(printf '%s\n' "$listed" | grep -c .) || true
  [ "$gpus" -ge 1 ] || fail "nvidia-smi lists no GPU"
fi

profile=${SEXTANT_PROFILE:-}
if [ -z "$profile" ]; then
  case "$gpu_name" in
    *GB200*) profile=gb200-nvl72 ;;
    *B200*) profile=b200 ;;
    *H200*) profile=h200-sxm ;;
    *H800*) profile=h800 ;;
    *H100*PCIe* | *H100*NVL*) ;;
    *H100*) profile=h100-sxm ;;
    *A100*80GB*) profile=a100-80g ;;
    *A100*) profile=a100-40g ;;
  esac
  [ -n "$profile" ] ||
    fail "no built-in profile matches the GPU '${gpu_name:-unknown}': set SEXTANT_PROFILE to a profile name (sextant profiles) or a profile JSON"
fi
case "$profile" in
  *.json) hw=(--cluster "$profile") ;;
  *) hw=(--gpu "$profile") ;;
esac
printf 'GPUs: %s x %s; profile: %s\n' "$gpus" "${gpu_name:-unknown}" "$profile" | tee -a "$out/versions.txt"

# Benchmark arguments the environment may set.
iters=()
[ -z "${SMOKE_ITERS:-}" ] || iters=(--iters "$SMOKE_ITERS")
opt() { [ -z "$2" ] || printf '%s\n%s\n' "$1" "$2"; }
mapfile -t gemm_sizes < <(opt --sizes "${SMOKE_GEMM_SIZES:-}")
mapfile -t hbm_bytes < <(opt --bytes "${SMOKE_HBM_BYTES:-}")
mapfile -t nccl_bytes < <(opt --bytes "${SMOKE_NCCL_BYTES:-}")
mapfile -t p2p_bytes < <(opt --bytes "${SMOKE_P2P_BYTES:-}")

run plan "$sextant" plan --model "$model" --gpus 1 "${hw[@]}" --seq "$seq" \
  --global-batch "$global_batch" --mbs "$mbs" --top 3 --out "$out/plan.json"

run bench-gemm "$sextant" bench gemm --plan "$out/plan.json" "${gemm_sizes[@]}" "${iters[@]}" \
  -o "$out/bench-gemm.json"
run bench-hbm "$sextant" bench hbm "${hbm_bytes[@]}" "${iters[@]}" -o "$out/bench-hbm.json"
run bench-nccl "$sextant" bench nccl "${nccl_bytes[@]}" "${iters[@]}" -o "$out/bench-nccl.json"
bench=("$out/bench-gemm.json" "$out/bench-hbm.json" "$out/bench-nccl.json")
if [ "$gpus" -ge 2 ]; then
  run bench-p2p "$sextant" bench p2p "${p2p_bytes[@]}" "${iters[@]}" -o "$out/bench-p2p.json"
  bench+=("$out/bench-p2p.json")
else
  printf '\n== bench-p2p\none GPU: no peer copy to time\n' | tee "$out/bench-p2p.log"
fi

if "$python" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' > /dev/null 2>&1; then
  run torch-gemm "$python" "$here/gemm_vs_torch.py" "$out/bench-gemm.json" "$out/gemm-vs-torch.tsv"
else
  printf '\n== torch-gemm\nno PyTorch with CUDA in %s: the torch.matmul comparison is skipped\n' "$python" |
    tee "$out/torch-gemm.log"
fi

run exec "$sextant" exec "$out/plan.json" --backend cuda --ranks 1 --warmup 2 --max-steps 5 \
  --out "$out/run.json"
run calibrate "$sextant" calibrate "$out/run.json" --out "$out/run-overlay.json"
run compare "$sextant" compare "$out/plan.json" "$out/run.json" --calibration "$out/run-overlay.json"
run calibrate-bench "$sextant" calibrate --bench "${bench[@]}" --hardware "$profile" \
  --out "$out/bench-overlay.json"
run compare-bench "$sextant" compare "$out/plan.json" "$out/run.json" \
  --calibration "$out/bench-overlay.json"
run plan-bench "$sextant" plan --model "$model" --gpus 1 "${hw[@]}" --seq "$seq" \
  --global-batch "$global_batch" --mbs "$mbs" --top 3 --calibration "$out/bench-overlay.json" \
  --out "$out/plan-bench.json"

printf '\ngpu-smoke: every step passed; the results are in %s\n' "$out"

#!/usr/bin/env python3
"""Times torch.matmul on the GEMM shapes of a `sextant bench gemm` file and writes a
table of Sextant's TFLOP/s as a ratio to torch's (scripts/gpu-smoke.sh runs it).

usage: gemm_vs_torch.py BENCH_GEMM_JSON OUT_TSV

Each shape as the benchmark ran it: row-major C[m,n] = A[m,k] @ B[k,n] in BF16
(batched for a batch above 1), FP32 accumulation throughout
(allow_bf16_reduced_precision_reduction off, as cublasGemmEx with
CUBLAS_COMPUTE_32F), inputs uniform in [-1, 1), on the benchmark's device. Timed as
the benchmark times: its warm-up calls, then its number of calls, each between its
own pair of CUDA events, queued in batches of 64 behind a GPU spin
(torch.cuda._sleep) so that the events time the kernels and not Python's launch
gaps, as Sextant's host gate does; the median per shape. The TSV has one row per
shape; the last lines printed summarise the ratios.
"""

import json
import statistics
import sys

BATCH = 64
# GPU cycles the spin lasts: several milliseconds, longer than Python takes to
# queue a batch of 64 matmuls with their events.
SPIN_CYCLES = 10_000_000


def fail(msg):
    print(f"gemm_vs_torch: {msg}", file=sys.stderr)
    return 1


def time_shape(torch, dev, g, warmup, iters, spin):
    m, n, k, b = g["m"], g["n"], g["k"], g["batch"]
    lead = (b,) if b > 1 else ()
    a = torch.empty(lead + (m, k), dtype=torch.bfloat16, device=dev).uniform_(-1, 1)
    w = torch.empty(lead + (k, n), dtype=torch.bfloat16, device=dev).uniform_(-1, 1)
    c = torch.empty(lead + (m, n), dtype=torch.bfloat16, device=dev)
    for _ in range(warmup):
        torch.matmul(a, w, out=c)
    torch.cuda.synchronize(dev)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for first in range(0, iters, BATCH):
        if spin is not None:
            spin(SPIN_CYCLES)
        for i in range(first, min(first + BATCH, iters)):
            starts[i].record()
            torch.matmul(a, w, out=c)
            ends[i].record()
    torch.cuda.synchronize(dev)
    secs = statistics.median(s.elapsed_time(e) / 1e3 for s, e in zip(starts, ends))
    del a, w, c
    return 2.0 * m * n * k * b / secs / 1e12


def main(argv):
    if len(argv) != 3:
        return fail("usage: gemm_vs_torch.py BENCH_GEMM_JSON OUT_TSV")
    try:
        with open(argv[1], encoding="utf-8") as f:
            bench = json.load(f)
    except (OSError, ValueError) as e:
        return fail(f"cannot read '{argv[1]}': {e}")
    if bench.get("benchmark") != "gemm" or not bench.get("gemms"):
        return fail(f"'{argv[1]}' is not a `sextant bench gemm` file")
    import torch

    if not torch.cuda.is_available():
        return fail("PyTorch sees no CUDA device")
    ordinal = bench["device"]["ordinals"][0]
    dev = torch.device("cuda", ordinal)
    torch.cuda.set_device(dev)
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    spin = getattr(torch.cuda, "_sleep", None)
    warmup, iters = int(bench["warmup"]), int(bench["iters"])
    rows = []
    for g in bench["gemms"]:
        mine = time_shape(torch, dev, g, warmup, iters, spin)
        rows.append((g, mine, g["tflops"] / mine))
    name = torch.cuda.get_device_name(dev)
    with open(argv[2], "w", encoding="utf-8") as f:
        f.write(
            f"# torch {torch.__version__} (CUDA {torch.version.cuda}) on {name} (device {ordinal}); "
            f"sextant bench gemm of {bench['date']} on {bench['device']['name']}; "
            f"{warmup} warm-up and {iters} timed calls per shape, median; "
            f"{'GPU spin before each batch' if spin else 'no GPU spin (torch.cuda._sleep missing): small shapes include launch gaps'}\n"
        )
        f.write("class\tm\tn\tk\tbatch\tsextant_tflops\ttorch_tflops\tratio\n")
        for g, mine, ratio in rows:
            f.write(
                f"{g['class']}\t{g['m']}\t{g['n']}\t{g['k']}\t{g['batch']}\t"
                f"{g['tflops']:.6g}\t{mine:.6g}\t{ratio:.4f}\n"
            )
    ratios = [r for _, _, r in rows]
    worst = min(rows, key=lambda r: r[2])
    g = worst[0]
    print(f"torch {torch.__version__} (CUDA {torch.version.cuda}) on {name}")
    print(
        f"Sextant's GEMM TFLOP/s over torch.matmul's on {len(rows)} shapes: "
        f"median {statistics.median(ratios):.3f}, worst {worst[2]:.3f} "
        f"({g['class']} {g['m']}x{g['n']}x{g['k']} batch {g['batch']}), "
        f"{sum(r >= 0.95 for r in ratios)} of {len(rows)} at 0.95 or more"
    )
    for cls in sorted({g["class"] for g, _, _ in rows}):
        rs = [r for g, _, r in rows if g["class"] == cls]
        print(f"  {cls}: {len(rs)} shapes, median ratio {statistics.median(rs):.3f}")
    print(f"Table written to {argv[2]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

#!/usr/bin/env bash
# Exports every plan of a fixed set of searches and estimates to Megatron-LM
# arguments and to Megatron-Core Python, then checks them all with
# tools/megatron_args_check.py --core (Megatron-LM's validation of the arguments,
# and the two exports of each plan building the same TransformerConfig).
#
#   tools/megatron_sweep.sh SEXTANT_BINARY MEGATRON_LM_DIR OUT_DIR [PYTHON]
#
# OUT_DIR must not exist. Plans go to OUT_DIR/<case>.json, exports to
# OUT_DIR/<case>-<K>.txt and OUT_DIR/<case>-<K>.core.py, refusals to
# OUT_DIR/<case>-<K>.refused and OUT_DIR/<case>-<K>.core.refused. PYTHON (default
# python3) needs numpy and packaging; Megatron-LM main needs Python 3.12.
set -euo pipefail
if [ $# -lt 3 ]; then
    echo "usage: $0 SEXTANT_BINARY MEGATRON_LM_DIR OUT_DIR [PYTHON]" >&2
    exit 2
fi
sextant=$1 megatron=$2 out=$3 python=${4:-python3}
here=$(cd "$(dirname "$0")" && pwd)
mkdir "$out"

# name | command and flags (after `sextant`), written to OUT_DIR/<name>.json
cases=(
    "70b-128|plan --model 70b --gpus 128 --top 10"
    "8b-64|plan --model 8b --gpus 64 --top 10"
    "405b-1024|plan --model 405b --gpus 1024 --top 10"
    "dsv3-1024-h800|plan --model deepseek-v3 --gpus 1024 --gpu h800 --top 10"
    "mixtral-64|plan --model mixtral-8x7b --gpus 64 --top 10"
    "gptoss-64|plan --model gpt-oss-120b --gpus 64 --top 10"
    "qwen3-30b-16|plan --model qwen3-30b-a3b --gpus 16 --top 10"
    "qwen3-235b-256|plan --model qwen3-235b-a22b --gpus 256 --top 10"
    "mixtral22-128-fp8|plan --model mixtral-8x22b --gpus 128 --precision fp8 --top 10"
    "70b-128-fp8|plan --model 70b --gpus 128 --precision fp8 --top 10"
    "70b-64-tpo|plan --model 70b --gpus 64 --tp-comm-overlap --top 10"
    "405b-512-sel|plan --model 405b --gpus 512 --recompute selective --top 10"
    "70b-64-full|plan --model 70b --gpus 64 --recompute full --top 10"
    "70b-64-zero23|plan --model 70b --gpus 64 --zero 2,3 --top 10"
    "8b-16-fp16|plan --model 8b --gpus 16 --precision fp16 --top 10"
    "8b-16-mxfp8-b200|plan --model 8b --gpus 16 --precision mxfp8 --gpu b200 --top 10"
    "13b-32-moments|plan --model 13b --gpus 32 --bf16-moments --bf16-grads --top 10"
    "8b-32-long|plan --model 8b --gpus 32 --seq 65536 --global-batch 64 --top 10"
    "dsv3-256-epo|plan --model deepseek-v3 --gpus 256 --gpu h800 --ep-comm-overlap --moe-dispatcher dedup --top 10"
    "mixtral-32-cap|plan --model mixtral-8x7b --gpus 32 --moe-capacity-factor 1.25 --moe-pad-to-capacity --top 10"
    "8b-8-unfused|plan --model 8b --gpus 8 --no-flash-attention --loss unfused --top 10"
    "gpt3-256|plan --model gpt3-175b --gpus 256 --top 10"
    "nemotron-512|plan --model nemotron4-340b --gpus 512 --top 10"
    "70b-64-vpp|estimate --model 70b --gpus 64 --tp 4 --pp 4 --vpp 5 --cp 2 --dp 2 --mbs 1 --global-batch 128 --seq 8192 --recompute selective --tp-comm-overlap"
    "405b-256-cp|estimate --model 405b --gpus 256 --tp 8 --pp 16 --cp 2 --dp 1 --global-batch 64 --seq 16384 --recompute full --account-embedding-loss"
    "mixtral-32-ep|estimate --model mixtral-8x7b --gpus 32 --tp 2 --pp 2 --ep 4 --dp 8 --mbs 2 --global-batch 256 --precision fp8 --recompute full"
    "8b-8-layout|estimate --model 8b --gpus 8 --tp 1 --pp 2 --dp 4 --global-batch 64 --pp-layout Et*15|t*17L"
    "70b-64-layout-vpp|estimate --model 70b --gpus 64 --tp 8 --pp 4 --dp 2 --global-batch 128 --pp-layout Et*9|t*10|t*10|t*10|t*10|t*10|t*10|t*11L"
    "405b-256-first-last|estimate --model 405b --gpus 256 --tp 8 --pp 8 --dp 4 --global-batch 64 --first-stage-layers 15 --last-stage-layers 15 --zero 3 --recompute full"
    "405b-64-acct|estimate --model 405b --gpus 64 --tp 8 --pp 8 --vpp 2 --dp 1 --global-batch 64 --account-embedding-loss --zero 3 --precision mxfp8 --gpu b200"
    "dsv3-1024-est|estimate --model deepseek-v3 --gpus 1024 --gpu h800 --tp 2 --pp 16 --ep 64 --etp 1 --dp 32 --global-batch 4096 --zero 1 --recompute full --pp-layout Et*3|(t*4|)*14t*2mL"
    "70b-128-interleaved|plan --model 70b --gpus 128 --schedule interleaved --top 10"
    "mixtral-64-epo|plan --model mixtral-8x7b --gpus 64 --ep-comm-overlap --top 10"
    "gptoss-64-fp8|plan --model gpt-oss-120b --gpus 64 --precision fp8 --recompute selective --top 10"
    "qwen235-256-fp8-sel|plan --model qwen3-235b-a22b --gpus 256 --precision fp8 --recompute selective --top 10"
    "dsv3-2048-fp8|plan --model deepseek-v3 --gpus 2048 --gpu h800 --precision fp8 --top 10"
    "qwen30-16-dedup|estimate --model qwen3-30b-a3b --gpus 16 --tp 1 --pp 1 --ep 16 --dp 16 --global-batch 64 --moe-dispatcher dedup"
    "8b-16-sel-mods|estimate --model 8b --gpus 16 --tp 2 --pp 1 --dp 8 --global-batch 128 --recompute selective --recompute-modules core_attn,mlp,layernorm"
    "8b-64-full-graph|estimate --model 8b --gpus 64 --tp 8 --pp 1 --dp 8 --global-batch 512 --seq 2048 --cuda-graphs full_iteration"
    "dsv3-256-b200-graphs|estimate --model deepseek-v3 --gpus 256 --gpu b200 --tp 1 --pp 8 --ep 32 --global-batch 4096 --pp-layout Et*4|(t*4|)*14tmL --precision mxfp8 --recompute selective --recompute-modules mla_up_proj,mlp --bf16-moments --moe-dispatcher deepep --ep-comm-overlap --cuda-graphs attn,moe_router,moe_preprocess"
    "qwen30-16-graphs|plan --model qwen3-30b-a3b --gpus 16 --cuda-graphs attn,moe_router --top 10"
    "70b-64-tpo-sp|plan --model 70b --gpus 64 --tp-comm-overlap --recompute selective --top 10"
    "70b-64-graphs|plan --model 70b --gpus 64 --cuda-graphs attn --top 10"
    "gptoss-64-graphs-epo|estimate --model gpt-oss-120b --gpus 64 --tp 1 --pp 1 --ep 64 --dp 64 --global-batch 512 --ep-comm-overlap --cuda-graphs attn,moe_router --recompute selective"
)

for c in "${cases[@]}"; do
    name=${c%%|*}
    read -r -a cmd <<<"${c#*|}"
    if ! "$sextant" "${cmd[@]}" --out "$out/$name.json" >"$out/$name.log" 2>&1; then
        echo "$name: sextant ${cmd[*]} failed: $(tail -n 1 "$out/$name.log")"
        continue
    fi
    n=$("$python" -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["plans"]))' "$out/$name.json")
    for k in $(seq 1 "$n"); do
        if ! "$sextant" export "$out/$name.json" --plan "$k" --to megatron-core \
            -o "$out/$name-$k.core.py" 2>"$out/$name-$k.core.refused"; then
            echo "$name plan $k refused by megatron-core: $(cat "$out/$name-$k.core.refused")"
        else
            rm -f "$out/$name-$k.core.refused"
        fi
        if ! "$sextant" export "$out/$name.json" --plan "$k" --to megatron-lm \
            -o "$out/$name-$k.txt" 2>"$out/$name-$k.refused"; then
            echo "$name plan $k refused: $(cat "$out/$name-$k.refused")"
        else
            rm -f "$out/$name-$k.refused"
        fi
    done
done

exec "$python" "$here/megatron_args_check.py" --core "$megatron" "$out"/*.txt

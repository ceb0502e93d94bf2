#!/bin/bash
# Runs gpu_vs_trl.py rows on a lent GPU machine inside one time budget (issue 48).
#
#   bash benchmarks/device_rows.sh SECONDS JOB [JOB ...]
#   JOB = shape:rows:steps:frameworks[:lora rank]    e.g. qwen3-8b:8x8x256:3:agentrl,trl,trl_cb:16
#
# Expects beside this file's folder (carried with the call, see benchmarks/RESULTS.md, issue 48):
# ../whl/*.whl (agentrl's wheel, TRL, datasets, pydantic, bitsandbytes and their missing needs) and
# ../tok/qwen3.tar.xz (Qwen3's tokenizer). Installs them once per machine, builds each shape's
# random model once (/tmp/m/<shape>), and stops starting runs when SECONDS are used up; every
# result is in $OUT/<job number>-<shape>-<rows>.json as soon as its run ends, the logs in $OUT/logs.tgz.
set -u
END=$(( $(date +%s) + $1 )); shift
HERE=$(cd "$(dirname "$0")" && pwd)
CARRY=$(dirname "$HERE")
OUT=${OUT:-/tmp/out}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false TORCH_LOGS=recompiles
if [ ! -f /tmp/site/.done ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$CARRY"/whl/*.whl && touch /tmp/site/.done || exit 1
fi
export PYTHONPATH=/tmp/site
[ -f /tmp/tok/qwen3/tokenizer.json ] || { mkdir -p /tmp/tok && tar xJf "$CARRY/tok/qwen3.tar.xz" -C /tmp/tok; }
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
python3 -c "import torch, transformers, trl, peft, bitsandbytes; print('torch', torch.__version__, 'transformers', transformers.__version__, 'trl', trl.__version__, 'peft', peft.__version__, 'bitsandbytes', bitsandbytes.__version__)"
echo "inductor cache before: $(du -sh /tmp/torchinductor_root 2>/dev/null | cut -f1)"
n=0
for job in "$@"; do
  n=$((n + 1))
  IFS=: read -r shape rows steps frameworks lora <<< "$job"
  left=$(( END - $(date +%s) ))
  if [ "$left" -lt 40 ]; then echo "SKIP $job: ${left} s left"; continue; fi
  model=/tmp/m/$shape${lora:+-bf16}
  echo "JOB $job at $(date -u +%H:%M:%S), ${left} s left"
  python3 "$HERE/gpu_vs_trl.py" --tokenizer /tmp/tok/qwen3 --shape "$shape" --model "$model" --rows "$rows" --steps "$steps" \
    --frameworks "$frameworks" ${lora:+--lora "$lora"} --deadline "$(( left - 15 ))" --logs "/tmp/logs/$n-$shape" \
    --json "$OUT/$n-$shape${lora:+-lora$lora}-${rows//,/_}.json" 2>&1 | grep -v -E "it/s\]|s/it\]|^\s*$"
done
echo "inductor cache after: $(du -sh /tmp/torchinductor_root 2>/dev/null | cut -f1)"
tar czf "$OUT/logs.tgz" -C /tmp logs 2>/dev/null

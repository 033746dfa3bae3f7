#!/usr/bin/env bash
# Everything we check on a GPU machine, in one go: the CUDA engine tests, then benchmarks/gpu.py at release size.
# Logs go to $LOGS (default ./gpu-logs); the summary table is printed last.
# Runs from a checkout with the package importable (pip install -e . or PYTHONPATH=src). Usage:
#   bash benchmarks/gpu_check.sh [full-size levels, default 1,8,32,64] [seconds per stream, default 10]
set -uo pipefail
LOGS=${LOGS:-gpu-logs}
LEVELS=${1:-1,8,32,64}
SECONDS_PER_STREAM=${2:-10}
mkdir -p "$LOGS"
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."

nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total,clocks.sm --format=csv | tee "$LOGS/gpu.txt"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())" \
  | tee -a "$LOGS/gpu.txt"

timeout 120 python3 -m pytest -q -o addopts=-ra -p no:cacheprovider tests/engine/test_cuda.py tests/layers/test_kv_pool.py 2>&1 \
  | tee "$LOGS/tests.txt" | tail -5
# The engine's own LM step (KV pool + CUDA graphs); should it fail, the eager pooled step, so a run still measures.
timeout 300 python3 benchmarks/gpu.py --size full --levels "$LEVELS" --seconds "$SECONDS_PER_STREAM" 2>&1 \
  | tee "$LOGS/full.txt" \
  || timeout 150 python3 benchmarks/gpu.py --size full --levels 1,8,32 --seconds "$SECONDS_PER_STREAM" --lm-step pool \
       --stages 1,8 2>&1 | tee "$LOGS/full_pool.txt"

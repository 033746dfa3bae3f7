#!/usr/bin/env bash
# cadenza-tiny's vocoder round on a GPU machine, in a fixed time (docs/cadenza-tiny.md, "Quality"):
#   1. here:   python recipes/tiny/vocoder_subset.py --data WORK/data_p --minutes 40 --out .vocoder_data
#   2. there:  bash recipes/tiny/gpu_vocoder.sh .vocoder_data 420 "$OUT"   (the device tool, carrying .vocoder_data)
#   3. here:   copy OUT/hift.pt (float16) into a copy of the shipped folder; judge it with
#              recipes/tiny/vocoder_harmonics.py and diagnose_v2.py before shipping.
# Trains configs/hift_joe_gpu.yaml for SECONDS, then exports the newest checkpoint as OUT/hift.pt; OUT/run keeps
# that checkpoint (to continue in a later round: carry it back as OUT/run) and metrics.jsonl.
set -uo pipefail
DATA=$(realpath "${1:-.vocoder_data}")
BUDGET=${2:-420}
OUT=$(realpath -m "${3:-gpu-vocoder}")
cd "$(dirname "$0")/../.."
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
config="$OUT/hift_joe_gpu.yaml"
sed "s#init_hift: SHIPPED#init_hift: $PWD/src/cadenza/assets/cadenza-tiny/hift.pt#" recipes/tiny/configs/hift_joe_gpu.yaml > "$config"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
resume=()
ls "$OUT"/run/checkpoints/step_*.pt >/dev/null 2>&1 && resume=(--resume)
timeout "$BUDGET" python3 -m cadenza.cli.main train hift --config "$config" --data "$DATA" --out "$OUT/run" "${resume[@]}" \
  > "$OUT/train.log" 2>&1
newest=$(ls "$OUT"/run/checkpoints/step_*.pt 2>/dev/null | sed 's/.*step_\([0-9]*\)\.pt/\1/' | sort -n | tail -1)
if [ -z "$newest" ]; then
  echo "no checkpoint written in ${BUDGET} s; see $OUT/train.log"; tail -n 20 "$OUT/train.log"; exit 1
fi
# Resuming at max_steps = the newest step trains nothing and exports it.
python3 -m cadenza.cli.main train hift --config "$config" --data "$DATA" --out "$OUT/run" --max-steps "$newest" --resume \
  >> "$OUT/train.log" 2>&1 && cp "$OUT/run/hift.pt" "$OUT/hift.pt"
echo "step $newest exported to $OUT/hift.pt"
tail -n 2 "$OUT/run/metrics.jsonl"

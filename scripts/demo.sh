#!/usr/bin/env bash
# The main job: sets up (cached) and runs slotune's operator on a local control plane.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
scripts/setup.sh
export SLOTUNE_K8S_BIN="$(scripts/build-control-plane.sh --print-dir)"
exec .venv/bin/python scripts/demo.py "$@"

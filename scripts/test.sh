#!/usr/bin/env bash
# The test command: sets up what the tests need (cached), runs the linters, then the unit and
# integration suites against the real control plane. Extra arguments go to pytest.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
scripts/setup.sh
export SLOTUNE_K8S_BIN="$(scripts/build-control-plane.sh --print-dir)"
export HELM="$SLOTUNE_K8S_BIN/helm"

echo "== lint" >&2
.venv/bin/ruff check operator tests scripts
.venv/bin/ruff format --check operator tests scripts
.venv/bin/mypy
.venv/bin/lint-imports
"$HELM" lint --strict charts/slotune
scripts/generated.sh check

echo "== tests" >&2
.venv/bin/python -m pytest tests/unit tests/integration "$@"

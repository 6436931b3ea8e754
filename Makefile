.PHONY: setup test unit integration lint format generate verify demo bench clean

PY := .venv/bin/python

setup:            ## venv + control-plane binaries (cached)
	scripts/setup.sh

test:             ## everything CI runs
	scripts/test.sh

unit: setup
	$(PY) -m pytest tests/unit

integration: setup
	SLOTUNE_K8S_BIN=$$(scripts/build-control-plane.sh --print-dir) $(PY) -m pytest tests/integration

lint: setup
	.venv/bin/ruff check operator tests scripts
	.venv/bin/ruff format --check operator tests scripts
	.venv/bin/mypy
	.venv/bin/lint-imports
	$$(scripts/build-control-plane.sh --print-dir)/helm lint --strict charts/slotune

format: setup
	.venv/bin/ruff format operator tests scripts
	.venv/bin/ruff check --fix operator tests scripts

generate: setup   ## CRD from the models, chart CRD copy, manifests/ from the chart
	scripts/generated.sh generate

verify: setup     ## generated files match their sources
	scripts/generated.sh check

demo:             ## the operator on a local control plane with a sample LLMDeployment
	scripts/demo.sh

clean:
	rm -rf .venv .mypy_cache .ruff_cache .pytest_cache

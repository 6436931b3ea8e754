.PHONY: setup test unit integration engine lint format generate verify tune demo image bench clean

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
	.venv/bin/ruff check operator tests scripts bench tools
	.venv/bin/ruff format --check operator tests scripts bench tools
	.venv/bin/mypy
	.venv/bin/lint-imports
	$$(scripts/build-control-plane.sh --print-dir)/helm lint --strict charts/slotune

format: setup
	.venv/bin/ruff format operator tests scripts bench tools
	.venv/bin/ruff check --fix operator tests scripts bench tools

generate: setup   ## CRD from the models, chart CRD copy, manifests/ from the chart
	scripts/generated.sh generate

verify: setup     ## generated files match their sources
	scripts/generated.sh check

tune:             ## the main job: a local tuning study on the real vLLM CPU engine
	scripts/tune-demo.sh

demo:             ## the operator on a local control plane with the sample LLMDeployments
	scripts/demo.sh

image:            ## the operator image, daemonless (buildah), as build/slotune-operator-<version>.oci.tar
	scripts/build-image.sh

engine: setup     ## the engine tests (real vLLM CPU engine, real Prometheus)
	scripts/setup.sh --with-engine
	$(PY) -m pytest tests/engine

bench: setup      ## benchmarks that print figures (load generator; capacity repeatability; tuners)
	$(PY) bench/loadgen_overhead.py
	$(PY) bench/capacity_repeatability.py
	$(PY) bench/tuner_comparison.py

clean:
	rm -rf .venv .mypy_cache .ruff_cache .pytest_cache

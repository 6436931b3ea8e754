"""The tuner on the real CPU engine: a configuration that cannot start becomes an infeasible
observation with its cause (the study goes on), never a crash of the study."""

from __future__ import annotations

from pathlib import Path

import pytest

from slotune.local.process import LocalRuntime
from slotune.measure.probe import CapacityMeasure
from slotune.models import LLMDeploymentSpec
from slotune.tuner.loop import Tuner, TunerOptions
from slotune.tuner.records import RecordStore, TrialState
from slotune.tuner.space import CPU
from support.engine import TINY_MODEL, vllm_python

pytestmark = pytest.mark.engine


def test_a_start_that_fails_is_recorded_as_infeasible_with_its_cause(tmp_path: Path) -> None:
    spec = LLMDeploymentSpec.model_validate(
        {
            "model": {"name": "tiny"},
            "engine": {
                "attentionBackend": "CPU_ATTN",
                "args": {"maxModelLen": 4096},
                # 1 MiB of KV cache cannot hold one 4096-token sequence: vLLM refuses to start.
                "extraArgs": ["--kv-cache-memory-bytes", "1M"],
            },
            "slo": {"ttft": {"maxSeconds": 2.0}},
            "tuning": {
                "enabled": True,
                "maxTrials": 1,
                "workload": {
                    "source": "Synthetic",
                    "promptTokens": {"mean": 64},
                    "outputTokens": {"mean": 8},
                    "requestRate": 2,
                    "duration": "5s",
                },
            },
        }
    )
    store = RecordStore(tmp_path / "trials.jsonl")
    tuner = Tuner(
        spec,
        runtime=LocalRuntime(vllm_python(), tmp_path / "engines", dummy_weights=True),
        measure=CapacityMeasure(spec, "tiny"),
        platform=CPU,
        model=str(TINY_MODEL),
        served_name="tiny",
        store=store,
        options=TunerOptions(finalists=0, startup_timeout=240),
    )
    outcome = tuner.run()
    (record,) = store.load()
    assert record.state == TrialState.FAILED
    assert record.failure_kind == "KVCacheTooSmall"
    assert "max seq len (4096)" in (record.cause or "")
    assert not record.feasible
    assert record.constraints
    assert all(value > 0 for value in record.constraints)
    assert outcome.winner is None
    assert tuner.study.trials[0].state.name == "COMPLETE"  # told to Optuna, not dropped

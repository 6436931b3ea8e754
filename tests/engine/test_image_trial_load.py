"""`slotune trial-load` from the operator image, under podman with runc, as the trial Job runs
it (the image's non-root user, read-only root, every capability dropped): it measures the
real vLLM CPU engine and writes its measurement to the termination-message path."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from slotune.measure.capacity import Ceiling
from slotune.measure.probe import TERMINATION_MESSAGE_BYTES
from slotune.measure.record import Measurement
from slotune.models import SloSpec, WorkloadSpec
from support.engine import SERVED_NAME, ScrapedEngine
from support.image import operator_image, podman_env, run_argv

pytestmark = pytest.mark.engine

TERMINATION_LOG = "/dev/termination-log"
TARGET = 2.2  # req/s: 2 with 10% headroom
PROMPT = 64


def test_trial_load_in_the_image_measures_the_engine(
    scraped_vllm: ScrapedEngine, tmp_path: Path
) -> None:
    image = operator_image()
    result = tmp_path / "termination-log"
    result.touch()
    result.chmod(0o666)  # written by the image's user, as the kubelet's file is
    workload = WorkloadSpec.model_validate(
        {
            "source": "Synthetic",
            "promptTokens": {"mean": PROMPT, "spread": 0.1},
            "outputTokens": {"mean": 16, "spread": 0.0},
            "requestRate": 2,
            "duration": "5s",
        }
    )
    slo = SloSpec.model_validate({"ttft": {"percentile": 90, "maxSeconds": 2.0}})
    # A ceiling the study would have measured, here one that lets the search climb two grid
    # steps above the target: two probes keep the test short.
    ceiling = Ceiling(
        prefill_tps=TARGET * 1.3 * PROMPT,
        decode_tps=500,
        decode_concurrency=8,
        prompt_tokens=PROMPT,
    )
    argv = run_argv(
        image,
        [
            "trial-load",
            "--url", scraped_vllm.url,
            "--model", SERVED_NAME,
            "--workload", workload.model_dump_json(by_alias=True, exclude_none=True),
            "--slo", slo.model_dump_json(by_alias=True, exclude_none=True),
            "--seed", "3",
            "--target-rate", str(TARGET),
            "--ceiling", ceiling.model_dump_json(),
            "--result-file", TERMINATION_LOG,
        ],
        mounts={result: TERMINATION_LOG},
    )  # fmt: skip
    run = subprocess.run(
        argv, capture_output=True, text=True, timeout=600, env=podman_env(), check=False
    )
    assert run.returncode == 0, run.stderr[-4000:]
    message = result.read_text()
    assert 0 < len(message.encode()) <= TERMINATION_MESSAGE_BYTES
    assert json.loads(run.stdout) == json.loads(message)
    measurement = Measurement.model_validate_json(message)
    found = measurement.capacity
    assert found is not None, message
    print(f"trial-load in the image: {found.describe()}; probes {len(found.probes)}")
    # 64-token prompts at 2.2 req/s are far from what even two CPU cores can prefill.
    assert found.feasible
    assert found.capacity >= TARGET
    assert [p.verdict for p in found.probes][:1] == ["Pass"]
    assert all(p.requests > 0 for p in found.probes)
    assert "probe" in run.stderr  # the search's progress went to the container's log

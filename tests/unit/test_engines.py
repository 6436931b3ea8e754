"""The engine seam: every adapter in `slotune.engine.ENGINES` against the same expectations,
and the one dispatch on `spec.engine.kind`."""

from typing import Any

import pytest

from slotune import models, render
from slotune.engine import ENGINES, engine_for
from slotune.engine.base import ENGINE_SIGNALS, Engine
from slotune.engine.startup import FailureKind
from slotune.models import EngineArgs
from slotune.slo import attainment
from slotune.spec import parse_spec
from slotune.study import trials

OWNER = render.Owner(name="chat", namespace="llm", uid="1234")
# Series only vLLM exposes, read by the local tools (the workload's shape, cache statistics)
# and by the capacity search (speculative decoding's acceptance).
VLLM_ONLY_SERIES = (
    "queue_time", "prefill_time", "decode_time", "request_prompt_tokens",
    "request_generation_tokens", "preemptions", "prefix_cache_hits", "prefix_cache_queries",
    "admission_rejections", "cache_config", "spec_decode_drafted", "spec_decode_accepted",
)  # fmt: skip


def raw_spec(kind: str) -> dict[str, Any]:
    return {"model": {"name": "m"}, "engine": {"kind": kind}}


# --- every adapter ---------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ENGINES.values(), ids=list(ENGINES))
def test_each_adapter_names_its_knobs_metrics_and_buckets_consistently(engine: Engine) -> None:
    assert engine_for(engine.kind) is engine
    fields = [knob.field for knob in engine.knobs]
    assert set(fields) <= set(EngineArgs.model_fields)
    assert len(set(fields)) == len(fields)
    flags = [knob.flag for knob in engine.knobs]
    assert len(set(flags)) == len(flags)
    # A knob is named the same in trial lines whichever engine runs it.
    vllm_short = {k.field: k.short for k in engine_for("vllm").knobs}
    assert all(knob.short == vllm_short[knob.field] for knob in engine.knobs)
    assert set(engine.metrics) >= {"request_success", "requests_running", "requests_waiting"}
    assert set(engine.metrics) <= set(ENGINE_SIGNALS) | set(VLLM_ONLY_SERIES)
    for name, bounds in engine.default_buckets.items():
        assert name in attainment.SLO_METRICS
        assert list(bounds) == sorted(set(bounds)), name
    assert engine.health_path.startswith("/")


@pytest.mark.parametrize("engine", ENGINES.values(), ids=list(ENGINES))
def test_each_adapter_renders_its_own_serving_flags(engine: Engine) -> None:
    args = EngineArgs(max_num_batched_tokens=512, max_num_seqs=64, enable_prefix_caching=True)
    rendered = engine.serve_args("m", "chat", args, ["--extra"], port=9000)
    assert rendered[-1] == "--extra"
    assert "chat" in rendered
    assert rendered[rendered.index("--port") + 1] == "9000"
    by_field = {knob.field: knob for knob in engine.knobs}
    for field in ("max_num_batched_tokens", "max_num_seqs"):
        flag = by_field[field].flag
        assert rendered[rendered.index(flag) + 1] == str(getattr(args, field))


@pytest.mark.parametrize("engine", ENGINES.values(), ids=list(ENGINES))
def test_each_adapter_puts_its_caches_apart_on_the_cache_volume(engine: Engine) -> None:
    """With `spec.cache`, each cache the engine's stack writes has a folder of its own on the
    shared volume, beside the Hub's; without, none of them is set."""
    raw = {**raw_spec(engine.kind), "cache": {"pvc": {"claimName": "llm-cache"}}}
    spec, problems = parse_spec(raw)
    assert spec is not None, problems
    pod = render.render_trial_pod(OWNER, spec, {}, 1, 1)["spec"]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    folders = [env["HF_HOME"]] + [env[name] for name in engine.cache_dirs]
    assert folders == [
        f"{render.CACHE_MOUNT}/{f}" for f in ("huggingface", *engine.cache_dirs.values())
    ]
    assert len(set(folders)) == len(folders)
    plain, _ = parse_spec(raw_spec(engine.kind))
    assert plain is not None
    pod = render.render_trial_pod(OWNER, plain, {}, 1, 1)["spec"]
    assert not {e["name"] for e in pod["containers"][0]["env"]} & set(engine.cache_dirs)


@pytest.mark.parametrize("engine", ENGINES.values(), ids=list(ENGINES))
def test_each_adapter_reads_an_oom_kill_as_out_of_memory(engine: Engine) -> None:
    failure = engine.classify_failure("Loading weights\n", exit_code=137, timed_out=False)
    assert failure.kind == FailureKind.OUT_OF_MEMORY
    timeout = engine.classify_failure("", exit_code=None, timed_out=True)
    assert timeout.kind == FailureKind.TIMEOUT


def test_an_unknown_engine_kind_is_an_error_that_lists_the_known_ones() -> None:
    spec, problems = parse_spec(raw_spec("tgi"))
    assert spec is None
    assert problems == [
        "spec.engine.kind: 'tgi' is not an engine slotune runs; use one of "
        + ", ".join(sorted(ENGINES))
    ]


def test_vllm_stays_the_default_engine() -> None:
    spec = models.LLMDeploymentSpec.model_validate({"model": {"name": "m"}})
    assert spec.engine.kind == "vllm"
    assert (
        render.render_deployment(OWNER, spec, annotate_for_scraping=False)["spec"]["selector"][
            "matchLabels"
        ][render.LABEL_NAME]
        == "vllm"
    )


def test_an_upgrade_that_brings_engine_kind_restarts_no_study() -> None:
    """Studies are keyed by a hash of the spec: the default engine, unset or spelled out,
    hashes as this spec did before the field existed (3103a31f1015, computed by 47e9bd3), and
    so does a spec without the model sources added since (`image`); another engine is another
    study."""
    raw: dict[str, Any] = {
        "model": {"name": "m"},
        "slo": {"ttft": {"maxSeconds": 2}},
        "tuning": {"enabled": True},
    }
    unset = models.LLMDeploymentSpec.model_validate(raw)
    spelled = models.LLMDeploymentSpec.model_validate({**raw, "engine": {"kind": "vllm"}})
    other = models.LLMDeploymentSpec.model_validate({**raw, "engine": {"kind": "other"}})
    assert trials.spec_hash(unset) == trials.spec_hash(spelled) == "3103a31f1015"
    assert trials.spec_hash(other) != trials.spec_hash(unset)

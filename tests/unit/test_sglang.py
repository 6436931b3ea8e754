"""SGLang's adapter from plain data: its flags for the typed settings, its metric names, health
path, bucket flags, rules and start-up log, and what an SGLang LLMDeployment renders."""

from typing import Any

from slotune import models, render
from slotune.engine import engine_for
from slotune.models import EngineArgs, SloSpec, SloTarget
from slotune.spec import parse_spec
from slotune.study import trials
from slotune.tuner.space import H200, default_space, platform_for

OWNER = render.Owner(name="chat", namespace="llm", uid="1234")
SGLANG = engine_for("sglang")


def raw_spec(kind: str, **engine: Any) -> dict[str, Any]:
    return {
        "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
        "engine": {"kind": kind, "image": "lmsysorg/sglang:v0.5.5", **engine},
        "slo": {"ttft": {"percentile": 95, "maxSeconds": 2.0}},
    }


def sglang_spec(**engine: Any) -> models.LLMDeploymentSpec:
    spec, problems = parse_spec(raw_spec("sglang", **engine))
    assert spec is not None, problems
    assert problems == []
    return spec


def test_sglang_renders_its_own_flags_for_the_typed_settings() -> None:
    args = EngineArgs(
        max_num_batched_tokens=512,
        block_size=16,
        gpu_memory_utilization=0.85,
        max_num_seqs=64,
        max_model_len=8192,
        enable_prefix_caching=False,
    )
    assert SGLANG.serve_args("/models/llama", "chat", args, [], tensor_parallel_size=2) == [
        "--model-path", "/models/llama",
        "--served-model-name", "chat",
        "--host", "0.0.0.0",
        "--port", "30000",
        "--tp-size", "2",
        "--enable-metrics",
        "--chunked-prefill-size", "512",
        "--page-size", "16",
        "--mem-fraction-static", "0.85",
        "--max-running-requests", "64",
        "--context-length", "8192",
        "--disable-radix-cache",
    ]  # fmt: skip
    # Prefix caching on is SGLang's default: nothing to render.
    on = SGLANG.serve_args("m", "chat", EngineArgs(enable_prefix_caching=True), [])
    assert "--disable-radix-cache" not in on


def test_sglang_metric_names_and_health_path() -> None:
    assert SGLANG.health_path == "/health"
    assert SGLANG.model_label == "model_name"
    assert SGLANG.metrics["ttft"] == ("sglang:time_to_first_token_seconds",)
    assert SGLANG.metrics["itl"] == ("sglang:inter_token_latency_seconds",)
    assert SGLANG.metrics["e2e"] == ("sglang:e2e_request_latency_seconds",)
    assert SGLANG.metrics["requests_waiting"] == ("sglang:num_queue_reqs",)
    assert SGLANG.metrics["kv_cache_usage"] == ("sglang:token_usage",)
    assert "tpot" not in SGLANG.metrics  # SGLang keeps no per-request TPOT histogram


def test_sglang_bucket_flags_add_bounds_around_the_thresholds() -> None:
    slo = SloSpec(
        ttft=SloTarget(percentile=95, max_seconds=3.0),
        itl=SloTarget(percentile=95, max_seconds=0.05),
    )
    rendered = SGLANG.observability_args(slo, "lmsysorg/sglang:v0.5.5", [])
    values: dict[str, list[float]] = {}
    for token in rendered:
        if token.startswith("--"):
            flag = token
            values[flag] = []
        else:
            values[flag].append(float(token))
    assert set(values) == {"--bucket-time-to-first-token", "--bucket-inter-token-latency"}
    ttft_bounds = values["--bucket-time-to-first-token"]
    itl_bounds = values["--bucket-inter-token-latency"]
    assert {2.4, 2.7, 3.0, 3.3, 3.75} <= set(ttft_bounds)  # SGLang's own jump 2 s → 4 s
    assert set(SGLANG.default_buckets["ttft"]) <= set(ttft_bounds)
    assert 0.05 in itl_bounds
    assert ttft_bounds == sorted(ttft_bounds)
    # A flag the user set wins.
    given = ["--bucket-time-to-first-token", "1", "2"]
    assert "--bucket-time-to-first-token" not in SGLANG.observability_args(slo, "x", given)


def test_an_sglang_deployment_runs_sglang_with_its_port_probes_and_key() -> None:
    spec = sglang_spec(
        args={"maxNumBatchedTokens": 1024},
        apiKeySecretRef={"name": "keys", "key": "chat"},
    )
    deployment = render.render_deployment(OWNER, spec, annotate_for_scraping=True)
    pod = deployment["spec"]["template"]
    container = pod["spec"]["containers"][0]
    assert container["name"] == "sglang"
    assert container["command"] == ["python3", "-m", "sglang.launch_server"]
    assert container["ports"] == [{"name": "http", "containerPort": 30000, "protocol": "TCP"}]
    assert container["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    args = container["args"]
    assert args[: args.index("--enable-metrics")] == [
        "--model-path", "meta-llama/Llama-3.1-8B-Instruct",
        "--served-model-name", "chat",
        "--host", "0.0.0.0",
        "--port", "30000",
    ]  # fmt: skip
    assert "--bucket-time-to-first-token" in args
    # The key comes from the Secret into SGLang's variable, and from there into its flag.
    assert args[args.index("--api-key") + 1] == "$(SGLANG_API_KEY)"
    env = {e["name"]: e for e in container["env"]}
    assert env["SGLANG_API_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "keys", "key": "chat"}
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == "30000"
    assert deployment["spec"]["selector"]["matchLabels"][render.LABEL_NAME] == "sglang"
    service = render.render_service(OWNER, spec)
    assert service["spec"]["ports"][0]["port"] == 30000


def test_an_sglang_trial_pod_gets_no_vllm_environment() -> None:
    pod = render.render_trial_pod(OWNER, sglang_spec(), {"max_num_seqs": 32}, 1, 2)
    env = {e["name"] for e in pod["spec"]["containers"][0].get("env", [])}
    assert "VLLM_SERVER_DEV_MODE" not in env
    assert pod["metadata"]["labels"][render.LABEL_NAME] == "sglang"


def test_an_sglang_pod_on_a_cache_volume_keeps_sglangs_caches_there() -> None:
    spec, problems = parse_spec({**raw_spec("sglang"), "cache": {"pvc": {"claimName": "c"}}})
    assert spec is not None, problems
    pod = render.render_trial_pod(OWNER, spec, {}, 1, 1)
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["SGLANG_CACHE_DIR"] == "/root/.cache/sglang"
    assert env["TORCHINDUCTOR_CACHE_DIR"] == "/root/.cache/torchinductor"
    assert "VLLM_CACHE_ROOT" not in env


def test_a_crashed_sglang_trial_is_read_with_sglang_patterns() -> None:
    pod = render.render_trial_pod(OWNER, sglang_spec(), {}, 1, 1)
    pod["status"] = {
        "containerStatuses": [
            {
                "state": {
                    "terminated": {
                        "exitCode": 1,
                        "message": "RuntimeError: Not enough memory. Please try to increase "
                        "--mem-fraction-static.",
                    }
                }
            }
        ]
    }
    state = trials.PodState.of(pod)
    assert state.phase == "Failed"
    assert state.failure_kind == "OutOfMemory"
    assert "Not enough memory" in state.detail


def test_sglang_startup_reports_its_kv_capacity() -> None:
    log = "max_total_num_tokens=161721, chunked_prefill_size=8192, max_prefill_tokens=16384"
    assert SGLANG.parse_startup(log).kv_cache_tokens == 161721


def test_sglang_rules_point_at_the_typed_field_or_refuse_what_it_lacks() -> None:
    _, problems = parse_spec(raw_spec("sglang", extraArgs=["--chunked-prefill-size", "512"]))
    assert problems == [
        "spec.engine.extraArgs[0]: --chunked-prefill-size is a tuned setting; set "
        "spec.engine.args.maxNumBatchedTokens instead of passing it in extraArgs"
    ]
    _, problems = parse_spec(raw_spec("sglang", extraArgs=["--port=9000"]))
    assert problems == [
        "spec.engine.extraArgs[0]: --port is managed by slotune: the operator serves on SGLang's "
        "port 30000, named http"
    ]
    _, problems = parse_spec(raw_spec("sglang", args={"kvCacheDtype": "fp8"}))
    assert len(problems) == 1
    assert problems[0].startswith("spec.engine.args.kv_cache_dtype: SGLang has no such setting")


def test_an_sglang_study_tunes_sglang_knobs() -> None:
    spec = sglang_spec()
    spec = spec.model_copy(update={"resources": models.ResourceSpec(gpus=1)})
    platform = platform_for(spec)
    assert platform.engine is SGLANG
    space = default_space(platform)
    assert set(space) == {k.field for k in SGLANG.knobs if H200.name in k.search}
    assert "kv_cache_dtype" not in space


def test_an_slo_target_sglang_cannot_observe_is_refused_with_the_ones_it_can() -> None:
    raw = raw_spec("sglang")
    raw["slo"] = {"tpot": {"percentile": 95, "maxSeconds": 0.05}}
    _, problems = parse_spec(raw)
    assert problems == [
        "spec.slo.tpot: SGLang exposes no histogram of it, so the live SLO could not be "
        "judged; use one it does (e2e, itl, ttft)"
    ]

"""Rendering an LLMDeployment into its Deployment, Service and PodMonitor."""

import json
from typing import Any

import pytest
from tests.support.specs import llm_spec

from slotune import models, render
from slotune.measure.capacity import MeasureRequest
from slotune.spec import parse_spec

OWNER = render.Owner(name="chat", namespace="llm", uid="1234")


def spec(**overrides: Any) -> models.LLMDeploymentSpec:
    fields: dict[str, Any] = {
        "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
        "engine": {
            "image": "vllm/vllm-openai:v0.32.0",
            "args": {"maxNumBatchedTokens": 4096, "blockSize": 32, "maxNumSeqs": 128},
            "extraArgs": ["--stream-interval", "2"],
        },
        "slo": None,
    }
    return llm_spec(**{**fields, **overrides})


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    result: dict[str, Any] = containers[0]
    return result


def test_deployment_runs_vllm_with_rendered_args() -> None:
    dep = render.render_deployment(OWNER, spec(), annotate_for_scraping=True)
    c = container(dep)
    assert c["image"] == "vllm/vllm-openai:v0.32.0"
    assert c["command"] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    assert c["args"] == [
        "--model", "meta-llama/Llama-3.1-8B-Instruct",
        "--served-model-name", "chat",
        "--host", "0.0.0.0",
        "--port", "8000",
        "--max-num-batched-tokens", "4096",
        "--block-size", "32",
        "--max-num-seqs", "128",
        "--stream-interval", "2",
    ]  # fmt: skip
    assert c["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]


def test_gpus_are_requested_and_tensor_parallel_follows() -> None:
    c = container(
        render.render_deployment(
            OWNER,
            spec(resources={"gpus": 2, "gpuResourceName": "amd.com/gpu", "memory": "64Gi"}),
            annotate_for_scraping=True,
        )
    )
    assert c["resources"]["limits"] == {"amd.com/gpu": "2", "memory": "64Gi"}
    assert c["resources"]["requests"]["amd.com/gpu"] == "2"
    assert c["args"][c["args"].index("--tensor-parallel-size") + 1] == "2"


def test_probes_watch_health_on_the_named_port() -> None:
    c = container(render.render_deployment(OWNER, spec(), annotate_for_scraping=True))
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"] == {"path": "/health", "port": "http"}
    # Start-up (weights, compilation) gets minutes before liveness may act.
    startup = c["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600


def volumes_of(pod_spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in pod_spec["volumes"]}


def mounts_of(pod_spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["name"]: m for m in pod_spec["containers"][0]["volumeMounts"]}


def env_of(pod_spec: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in pod_spec["containers"][0]["env"]}


def serving_and_trial(s: models.LLMDeploymentSpec) -> list[dict[str, Any]]:
    """The pod specs of the serving Deployment and of a trial pod."""
    dep = render.render_deployment(OWNER, s, annotate_for_scraping=True)
    trial = render.render_trial_pod(OWNER, s, {"max_num_seqs": 64}, 1, 2)
    return [dep["spec"]["template"]["spec"], trial["spec"]]


CACHE_VARS = ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")


def test_shared_memory_and_a_cache_of_each_pods_own_without_spec_cache() -> None:
    for pod in serving_and_trial(spec()):
        volumes = volumes_of(pod)
        assert volumes["shm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "2Gi"}
        assert volumes["cache"] == {"name": "cache", "emptyDir": {}}
        assert mounts_of(pod)["cache"] == {"name": "cache", "mountPath": "/root/.cache"}
        assert mounts_of(pod)["shm"]["mountPath"] == "/dev/shm"
        env = env_of(pod)
        assert env["HF_HOME"] == "/root/.cache/huggingface"
        # As before spec.cache: an upgrade of the operator rolls no serving Deployment.
        assert not set(CACHE_VARS) & set(env)


def test_a_cache_claim_holds_every_cache_of_the_serving_and_trial_pods() -> None:
    cached = spec(cache={"pvc": {"claimName": "llm-cache"}})
    for pod in serving_and_trial(cached):
        assert volumes_of(pod)["cache"] == {
            "name": "cache",
            "persistentVolumeClaim": {"claimName": "llm-cache"},
        }
        assert mounts_of(pod)["cache"] == {"name": "cache", "mountPath": "/root/.cache"}
        env = env_of(pod)
        assert {name: env[name] for name in ("HF_HOME", *CACHE_VARS)} == {
            "HF_HOME": "/root/.cache/huggingface",
            "VLLM_CACHE_ROOT": "/root/.cache/vllm",
            "TORCHINDUCTOR_CACHE_DIR": "/root/.cache/torchinductor",
            "TRITON_CACHE_DIR": "/root/.cache/triton",
        }


def test_a_model_claim_and_a_cache_claim_are_mounted_apart() -> None:
    both = spec(
        model={"name": "qwen", "source": {"pvc": {"claimName": "models", "path": "qwen"}}},
        cache={"pvc": {"claimName": "llm-cache"}},
    )
    for pod in serving_and_trial(both):
        volumes, mounts = volumes_of(pod), mounts_of(pod)
        assert volumes["model"]["persistentVolumeClaim"] == {
            "claimName": "models",
            "readOnly": True,
        }
        assert volumes["cache"]["persistentVolumeClaim"] == {"claimName": "llm-cache"}
        assert len(volumes) == len(pod["volumes"])  # no two volumes of one name
        # No mount hides another: no path twice, none inside another.
        paths = [m["mountPath"] + "/" for m in pod["containers"][0]["volumeMounts"]]
        assert len(set(paths)) == len(paths)
        assert not [(a, b) for a in paths for b in paths if a != b and b.startswith(a)]
        assert mounts["model"]["readOnly"] is True
        assert "readOnly" not in mounts["cache"]
        args = pod["containers"][0]["args"]
        assert args[args.index("--model") + 1] == "/models/qwen"
        assert env_of(pod)["VLLM_CACHE_ROOT"] == "/root/.cache/vllm"


def test_token_comes_from_the_secret_reference() -> None:
    s = spec(
        model={
            "name": "meta-llama/Llama-3.1-8B-Instruct",
            "source": {"huggingFace": {"tokenSecretRef": {"name": "hf", "key": "tok"}}},
        }
    )
    env = {
        e["name"]: e
        for e in container(render.render_deployment(OWNER, s, annotate_for_scraping=True))["env"]
    }
    assert env["HF_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "hf", "key": "tok"}}


def test_pvc_source_mounts_the_claim_read_only() -> None:
    s = spec(model={"name": "qwen", "source": {"pvc": {"claimName": "models", "path": "/qwen/"}}})
    dep = render.render_deployment(OWNER, s, annotate_for_scraping=True)
    c = container(dep)
    assert c["args"][1] == "/models/qwen"
    volumes = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
    assert volumes["model"]["persistentVolumeClaim"] == {"claimName": "models", "readOnly": True}


def test_image_source_mounts_an_image_volume_read_only_at_the_model_path() -> None:
    s = spec(
        model={
            "name": "meta-llama/Llama-3.1-8B-Instruct",
            "source": {
                "image": {
                    "reference": "registry.example/models/llama-3.1-8b@sha256:" + "0" * 64,
                    "pullPolicy": "IfNotPresent",
                    "path": "/models/",
                }
            },
        }
    )
    for pod in serving_and_trial(s):
        assert volumes_of(pod)["model"] == {
            "name": "model",
            "image": {
                "reference": "registry.example/models/llama-3.1-8b@sha256:" + "0" * 64,
                "pullPolicy": "IfNotPresent",
            },
        }
        assert mounts_of(pod)["model"] == {
            "name": "model",
            "mountPath": "/models",
            "readOnly": True,
        }
        args = pod["containers"][0]["args"]
        assert args[args.index("--model") + 1] == "/models/models"
    # Unset, the pull policy is Kubernetes' own default; the image's root holds the model.
    plain = spec(model={"name": "m", "source": {"image": {"reference": "models/m:1"}}})
    for pod in serving_and_trial(plain):
        assert volumes_of(pod)["model"]["image"] == {"reference": "models/m:1"}
        assert pod["containers"][0]["args"][1] == "/models"


def test_scheduling_fields_pass_through() -> None:
    toleration = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {}}}
    s = spec(
        scheduling={
            "nodeSelector": {"gpu": "h200"},
            "tolerations": [toleration],
            "affinity": affinity,
        }
    )
    pod = render.render_deployment(OWNER, s, annotate_for_scraping=True)["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"gpu": "h200"}
    assert pod["tolerations"] == [toleration]
    assert pod["affinity"] == affinity


def test_children_are_owned_and_labelled_with_the_config_hash() -> None:
    for child in render.render_children(OWNER, spec(), pod_monitor_crd_present=True):
        meta = child["metadata"]
        assert meta["ownerReferences"] == [
            {
                "apiVersion": "slotune.dev/v1alpha1",
                "kind": "LLMDeployment",
                "name": "chat",
                "uid": "1234",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        assert meta["labels"][render.LABEL_CONFIG_HASH] == render.config_hash(OWNER, spec())


def test_config_hash_follows_the_engine_configuration_only() -> None:
    base = render.config_hash(OWNER, spec())
    other_args = spec(engine={"image": "vllm/vllm-openai:v0.32.0", "args": {"blockSize": 64}})
    assert render.config_hash(OWNER, other_args) != base
    assert render.config_hash(OWNER, spec(replicas=5)) == base


def test_rolling_update_keeps_serving_capacity() -> None:
    dep = render.render_deployment(OWNER, spec(), annotate_for_scraping=True)
    assert dep["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    # The selector must not include the hash, or a new configuration would orphan old pods.
    assert render.LABEL_CONFIG_HASH not in dep["spec"]["selector"]["matchLabels"]


def test_service_targets_the_named_port() -> None:
    svc = render.render_service(OWNER, spec())
    assert svc["spec"]["ports"][0]["targetPort"] == "http"
    assert svc["spec"]["selector"] == render.selector_labels(OWNER)


@pytest.mark.parametrize(
    ("mode", "crd_present", "kinds", "annotated"),
    [
        ("Auto", True, ["Deployment", "Service", "PodMonitor"], False),
        ("Auto", False, ["Deployment", "Service"], True),
        ("Disabled", True, ["Deployment", "Service"], True),
        ("Enabled", True, ["Deployment", "Service", "PodMonitor"], False),
    ],
)
def test_pod_monitor_or_scrape_annotations(
    mode: str, crd_present: bool, kinds: list[str], annotated: bool
) -> None:
    children = render.render_children(
        OWNER, spec(monitoring={"podMonitor": mode}), pod_monitor_crd_present=crd_present
    )
    assert [c["kind"] for c in children] == kinds
    template = children[0]["spec"]["template"]["metadata"]
    assert ("annotations" in template) is annotated
    if annotated:
        assert template["annotations"]["prometheus.io/scrape"] == "true"


def test_what_others_add_to_a_rendered_list_is_named_and_taken_back() -> None:
    """Drift: a container or env var added by hand, a Service port edited in place."""
    dep = render.render_deployment(OWNER, spec(), annotate_for_scraping=True)
    live = json.loads(json.dumps(dep))
    live["metadata"].update(resourceVersion="7", managedFields=[{"manager": "kubectl"}])
    live["status"] = {"replicas": 1}
    pod = live["spec"]["template"]["spec"]
    pod["containers"][0]["env"].append({"name": "DEBUG", "value": "1"})
    pod["containers"].append({"name": "sidecar", "image": "busybox"})
    pod["tolerations"] = [{"operator": "Exists"}]  # not a list slotune renders whole: theirs
    assert render.foreign_entries(dep, dep) == []
    assert render.foreign_entries(dep, live) == [
        "env var DEBUG of container vllm",
        "container sidecar",
    ]
    back = render.taken_back(dep, live)
    assert (
        back["spec"]["template"]["spec"]["containers"]
        == dep["spec"]["template"]["spec"]["containers"]
    )
    assert back["spec"]["template"]["spec"]["tolerations"] == [{"operator": "Exists"}]
    assert back["metadata"]["resourceVersion"] == "7"  # a newer edit makes the PUT fail
    assert "managedFields" not in back["metadata"]
    assert "status" not in back
    assert render.foreign_entries(dep, back) == []

    svc = render.render_service(OWNER, spec())
    edited = json.loads(json.dumps(svc))
    edited["spec"]["ports"][0]["port"] = 9000
    assert render.foreign_entries(svc, edited) == ["port http:9000/TCP"]
    assert render.taken_back(svc, edited)["spec"]["ports"] == svc["spec"]["ports"]


def test_an_env_from_added_by_hand_is_named_and_taken_back() -> None:
    """A whole Secret or ConfigMap poured into the engine's environment is drift too."""
    dep = render.render_deployment(OWNER, spec(), annotate_for_scraping=True)
    live = json.loads(json.dumps(dep))
    engine = live["spec"]["template"]["spec"]["containers"][0]
    engine["envFrom"] = [{"secretRef": {"name": "cloud-keys"}}, {"configMapRef": {"name": "x"}}]
    assert render.foreign_entries(dep, live) == [
        "envFrom secret cloud-keys of container vllm",
        "envFrom configMap x of container vllm",
    ]
    back = render.taken_back(dep, live)
    assert "envFrom" not in back["spec"]["template"]["spec"]["containers"][0]
    assert render.foreign_entries(dep, back) == []


def test_the_spec_sets_the_serving_pods_security_context_and_the_load_job_is_restricted() -> None:
    """Under PSA restricted: what the spec says on the serving and trial pods; the load Job is
    non-root with the runtime's seccomp profile on its own."""
    restricted = spec(
        podSecurityContext={"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        engine={
            "image": "vllm/vllm-openai:v0.32.0",
            "securityContext": {"allowPrivilegeEscalation": False},
        },
    )
    for pod in (
        render.render_deployment(OWNER, restricted, annotate_for_scraping=True)["spec"]["template"][
            "spec"
        ],
        render.render_trial_pod(OWNER, restricted, {}, 1, 1)["spec"],
    ):
        assert pod["securityContext"] == {
            "runAsNonRoot": True,
            "seccompProfile": {"type": "RuntimeDefault"},
        }
        assert pod["containers"][0]["securityContext"] == {"allowPrivilegeEscalation": False}
    plain = render.render_deployment(OWNER, spec(), annotate_for_scraping=True)
    assert "securityContext" not in plain["spec"]["template"]["spec"]


def test_the_api_key_comes_from_a_secret_to_the_engine_and_the_load_job() -> None:
    keyed = spec(
        engine={
            "image": "vllm/vllm-openai:v0.32.0",
            "apiKeySecretRef": {"name": "llm-keys", "key": "chat"},
        },
        slo={"ttft": {"percentile": 95, "maxSeconds": 2.0}},
    )
    from_secret = {
        "name": "VLLM_API_KEY",
        "valueFrom": {"secretKeyRef": {"name": "llm-keys", "key": "chat"}},
    }
    dep = render.render_deployment(OWNER, keyed, annotate_for_scraping=True)
    assert from_secret in container(dep)["env"]
    assert "--api-key" not in container(dep)["args"]
    job = render.render_load_job(
        OWNER,
        keyed,
        image="slotune/operator:1",
        url="http://10.0.0.9:8000",
        workload=keyed.tuning.workload,
        request=MeasureRequest(seed=1, target_rate=2.0),
        study=1,
        trial=1,
    )
    assert job["spec"]["template"]["spec"]["containers"][0]["env"] == [from_secret]


def test_a_trial_engine_serves_no_dev_endpoints_unless_the_spec_asks() -> None:
    """The capacity search salts each probe's requests instead of resetting the cache, so a
    trial pod gets no VLLM_SERVER_DEV_MODE (which would serve /sleep and /collective_rpc to
    whoever reaches it); a spec that sets it gets it on every pod, as written."""

    def env(pod: dict[str, Any]) -> dict[str, str]:
        return {e["name"]: e.get("value") for e in pod["spec"]["containers"][0].get("env", [])}

    plain = render.render_trial_pod(OWNER, spec(), {"max_num_seqs": 64}, 2, 5)
    assert "VLLM_SERVER_DEV_MODE" not in env(plain)
    asked = spec(engine={"env": [{"name": "VLLM_SERVER_DEV_MODE", "value": "1"}]})
    trial = render.render_trial_pod(OWNER, asked, {"max_num_seqs": 64}, 2, 5)
    serving = render.render_deployment(OWNER, asked, annotate_for_scraping=True)["spec"]["template"]
    assert env(trial)["VLLM_SERVER_DEV_MODE"] == env(serving)["VLLM_SERVER_DEV_MODE"] == "1"


def test_only_the_trials_load_job_reaches_the_trial_engine() -> None:
    policy = render.render_trial_network_policy(OWNER, spec(), 2, 5)
    pod = render.render_trial_pod(OWNER, spec(), {}, 2, 5)
    selected = policy["spec"]["podSelector"]["matchLabels"]
    assert selected.items() <= pod["metadata"]["labels"].items()  # it selects the trial pod
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    allowed = rule["from"][0]["podSelector"]["matchLabels"]
    job = render.trial_labels(OWNER, render.LOAD_COMPONENT, 2, 5)
    assert allowed.items() <= job.items()  # the load Job's pods, and no one else's
    assert allowed[render.LABEL_TRIAL] == "5"
    assert rule["ports"] == [{"port": 8000, "protocol": "TCP"}]
    assert policy["metadata"]["ownerReferences"] == [OWNER.reference()]


COLLECTOR = "http://otel-collector.observability:4317"


def test_tracing_sends_the_serving_and_trial_engines_to_the_collector() -> None:
    traced = spec(monitoring={"otlpTracesEndpoint": COLLECTOR})
    serving = container(render.render_deployment(OWNER, traced, annotate_for_scraping=False))
    trial = render.render_trial_pod(OWNER, traced, {"max_num_seqs": 64}, study=1, trial=1)
    for args in (serving["args"], trial["spec"]["containers"][0]["args"]):
        at = args.index("--otlp-traces-endpoint")
        assert args[at + 1] == COLLECTOR
    untraced = container(render.render_deployment(OWNER, spec(), annotate_for_scraping=False))
    assert "--otlp-traces-endpoint" not in untraced["args"]


def test_sglang_traces_only_when_asked() -> None:
    traced = spec(
        engine={"kind": "sglang", "image": "lmsysorg/sglang:v0.5.5"},
        monitoring={"otlpTracesEndpoint": COLLECTOR},
    )
    args = container(render.render_deployment(OWNER, traced, annotate_for_scraping=False))["args"]
    assert args[args.index("--enable-trace") + 1 : args.index("--enable-trace") + 3] == [
        "--otlp-traces-endpoint",
        COLLECTOR,
    ]


def test_a_tracing_flag_beside_the_field_says_where_it_belongs() -> None:
    raw = json.loads(
        spec(
            engine={"image": "vllm/vllm-openai:v0.32.0",
                    "extraArgs": ["--otlp-traces-endpoint=http://other:4317"]},
            monitoring={"otlpTracesEndpoint": COLLECTOR},
        ).model_dump_json(by_alias=True, exclude_defaults=True)
    )  # fmt: skip
    _, problems = parse_spec(raw)
    assert problems == [
        "spec.engine.extraArgs: --otlp-traces-endpoint is set from "
        "spec.monitoring.otlpTracesEndpoint; give the endpoint there only"
    ]
    _, problems = parse_spec({**raw, "monitoring": {"otlpTracesEndpoint": "otel:4317"}})
    assert any("otlpTracesEndpoint" in p for p in problems), problems

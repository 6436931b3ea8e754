"""Renders an LLMDeployment into the Kubernetes objects that serve it.

Pure: spec in, plain dicts out, ready for server-side apply. Every child carries an owner
reference to its LLMDeployment (so deletion cascades through the garbage collector) and the
hash of the engine configuration it runs (so a changed configuration rolls the pods, and an
on-call engineer can tell which configuration a pod serves).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slotune import models
from slotune.engine import DEFAULT_KIND, engine_for
from slotune.engine.base import Engine
from slotune.measure.capacity import MAX_PROBES, MeasureRequest
from slotune.measure.loadjob import LoadArgs

MANAGED_BY = "slotune"
LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_OWNER = "slotune.dev/llmdeployment"
LABEL_CONFIG_HASH = "slotune.dev/config-hash"

PORT_NAME = "http"
MODEL_MOUNT = "/models"
CACHE_MOUNT = "/root/.cache"


@dataclass(frozen=True)
class Owner:
    """The LLMDeployment the children belong to."""

    name: str
    namespace: str
    uid: str

    def reference(self) -> dict[str, Any]:
        return {
            "apiVersion": models.API_VERSION,
            "kind": models.KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


def served_name(owner: Owner, spec: models.LLMDeploymentSpec) -> str:
    return spec.model.served_name or owner.name


def model_path(spec: models.LLMDeploymentSpec) -> str:
    """What `--model` points at: the Hub id, or the folder inside the mounted claim or image."""
    mounted = spec.model.source.pvc or spec.model.source.image
    if mounted is None:
        return spec.model.name
    return f"{MODEL_MOUNT}/{mounted.path.strip('/')}".rstrip("/")


def engine_of(spec: models.LLMDeploymentSpec) -> Engine:
    """The adapter of the spec's engine (`spec.engine.kind`, checked by `spec.parse_spec`)."""
    return engine_for(spec.engine.kind)


def engine_args(owner: Owner, spec: models.LLMDeploymentSpec) -> list[str]:
    engine = engine_of(spec)
    extra = list(spec.engine.extra_args)
    if spec.model.source.random_weights is not None:
        extra = ["--load-format", "dummy", *extra]
    # Engines' default latency buckets cannot decide most SLOs (vLLM's have none between 1 s
    # and 2.5 s for TTFT): bounds around each target let Prometheus judge the live SLO.
    if spec.slo is not None:
        extra += engine.observability_args(spec.slo, spec.engine.image, extra)
    if spec.monitoring.otlp_traces_endpoint is not None:
        extra += engine.tracing_args(spec.monitoring.otlp_traces_endpoint)
    if spec.engine.api_key_secret_ref is not None:
        extra += engine.api_key_args
    return engine.serve_args(
        model_path(spec),
        served_name(owner, spec),
        spec.engine.args,
        extra,
        tensor_parallel_size=max(spec.resources.gpus, 1),
    )


def config_hash(owner: Owner, spec: models.LLMDeploymentSpec) -> str:
    """Identifies the engine configuration: image, flags and environment."""
    identity = {
        "image": spec.engine.image,
        "args": engine_args(owner, spec),
        "env": [var.model_dump() for var in spec.engine.env],
    }
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()
    return digest[:10]


def selector_labels(owner: Owner, kind: str = DEFAULT_KIND) -> dict[str, str]:
    """Labels that select the serving pods; stable across configurations (the engine's kind
    cannot change, as a Deployment's selector cannot)."""
    return {
        LABEL_NAME: kind,
        LABEL_INSTANCE: owner.name,
        LABEL_COMPONENT: "serving",
    }


def selector_string(owner: Owner, kind: str = DEFAULT_KIND) -> str:
    """`selector_labels` as a label selector string: what the scale subresource publishes
    for an HPA to find the pods."""
    return ",".join(f"{k}={v}" for k, v in sorted(selector_labels(owner, kind).items()))


def child_labels(owner: Owner, spec: models.LLMDeploymentSpec) -> dict[str, str]:
    return {
        **selector_labels(owner, spec.engine.kind),
        LABEL_MANAGED_BY: MANAGED_BY,
        LABEL_OWNER: owner.name,
        LABEL_CONFIG_HASH: config_hash(owner, spec),
    }


def _metadata(owner: Owner, spec: models.LLMDeploymentSpec, name: str) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": owner.namespace,
        "labels": child_labels(owner, spec),
        "ownerReferences": [owner.reference()],
    }


def _probe(path: str, period: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": PORT_NAME},
        "periodSeconds": period,
        "timeoutSeconds": 5,
        "failureThreshold": failures,
    }


def _from_secret(name: str, ref: models.SecretKeyRef) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}


def _api_key_env(spec: models.LLMDeploymentSpec) -> list[dict[str, Any]]:
    ref = spec.engine.api_key_secret_ref
    return [_from_secret(engine_of(spec).api_key_env, ref)] if ref is not None else []


def _env(spec: models.LLMDeploymentSpec) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [{"name": "HF_HOME", "value": f"{CACHE_MOUNT}/huggingface"}]
    # Only on a shared volume, where another pod's start reuses what they hold: an operator
    # upgrade must not roll every serving Deployment that sets no cache.
    if spec.cache is not None:
        env += [
            {"name": name, "value": f"{CACHE_MOUNT}/{folder}"}
            for name, folder in engine_of(spec).cache_dirs.items()
        ]
    hf = spec.model.source.hugging_face
    if hf is not None and hf.token_secret_ref is not None:
        env.append(_from_secret("HF_TOKEN", hf.token_secret_ref))
    env += _api_key_env(spec)
    env += [{"name": var.name, "value": var.value} for var in spec.engine.env]
    return env


def _cache_volume(spec: models.LLMDeploymentSpec) -> dict[str, Any]:
    """The shared claim of `spec.cache`, or the pod's own emptyDir, which every start fills
    again."""
    if spec.cache is None:
        return {"name": "cache", "emptyDir": {}}
    return {"name": "cache", "persistentVolumeClaim": {"claimName": spec.cache.pvc.claim_name}}


def _model_volume(spec: models.LLMDeploymentSpec) -> dict[str, Any] | None:
    """The claim or image that holds the weights, mounted read-only at `MODEL_MOUNT`; None for
    a model the engine downloads (or runs with random weights)."""
    source = spec.model.source
    if source.pvc is not None:
        claim = {"claimName": source.pvc.claim_name, "readOnly": True}
        return {"name": "model", "persistentVolumeClaim": claim}
    if source.image is not None:
        image = {"reference": source.image.reference}
        if source.image.pull_policy is not None:
            image["pullPolicy"] = source.image.pull_policy
        return {"name": "model", "image": image}
    return None


def _volumes(spec: models.LLMDeploymentSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    volumes: list[dict[str, Any]] = [
        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": spec.engine.shm_size}},
        _cache_volume(spec),
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "shm", "mountPath": "/dev/shm"},  # noqa: S108 - the pod's own shared memory
        {"name": "cache", "mountPath": CACHE_MOUNT},
    ]
    model = _model_volume(spec)
    if model is not None:
        volumes.append(model)
        mounts.append({"name": "model", "mountPath": MODEL_MOUNT, "readOnly": True})
    return volumes, mounts


def _resources(spec: models.LLMDeploymentSpec) -> dict[str, Any]:
    limits: dict[str, str] = {}
    requests: dict[str, str] = {}
    if spec.resources.gpus > 0:
        limits[spec.resources.gpu_resource_name] = str(spec.resources.gpus)
        requests[spec.resources.gpu_resource_name] = str(spec.resources.gpus)
    if spec.resources.cpu is not None:
        requests["cpu"] = spec.resources.cpu
    if spec.resources.memory is not None:
        requests["memory"] = spec.resources.memory
        limits["memory"] = spec.resources.memory
    resources: dict[str, Any] = {}
    if limits:
        resources["limits"] = limits
    if requests:
        resources["requests"] = requests
    return resources


def scrape_annotations(engine: Engine) -> dict[str, str]:
    return {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(engine.port),
        "prometheus.io/path": "/metrics",
    }


def render_deployment(
    owner: Owner, spec: models.LLMDeploymentSpec, *, annotate_for_scraping: bool
) -> dict[str, Any]:
    """The serving Deployment."""
    engine = engine_of(spec)
    volumes, mounts = _volumes(spec)
    container: dict[str, Any] = {
        "name": engine.container_name,
        "image": spec.engine.image,
        "command": list(engine.command),
        "args": engine_args(owner, spec),
        "ports": [{"name": PORT_NAME, "containerPort": engine.port, "protocol": "TCP"}],
        "env": _env(spec),
        "resources": _resources(spec),
        "volumeMounts": mounts,
        # A crashed engine leaves its log tail in the pod's status, for `kubectl describe` and
        # for the operator, which classifies the failure from it.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        # Loading weights and compiling can take minutes; the startup probe covers it so
        # liveness never kills an engine that is still starting.
        "startupProbe": _probe(engine.health_path, period=10, failures=90),
        "readinessProbe": _probe(engine.health_path, period=5, failures=3),
        "livenessProbe": _probe(engine.health_path, period=10, failures=3),
    }
    if spec.engine.image_pull_policy is not None:
        container["imagePullPolicy"] = spec.engine.image_pull_policy
    if spec.engine.security_context:
        container["securityContext"] = dict(spec.engine.security_context)
    pod_spec: dict[str, Any] = {
        "containers": [container],
        "volumes": volumes,
        "terminationGracePeriodSeconds": 60,
    }
    scheduling = spec.scheduling
    if scheduling.node_selector:
        pod_spec["nodeSelector"] = dict(scheduling.node_selector)
    if scheduling.tolerations:
        pod_spec["tolerations"] = [dict(t) for t in scheduling.tolerations]
    if scheduling.affinity:
        pod_spec["affinity"] = dict(scheduling.affinity)
    if scheduling.priority_class_name:
        pod_spec["priorityClassName"] = scheduling.priority_class_name
    if spec.pod_security_context:
        pod_spec["securityContext"] = dict(spec.pod_security_context)

    labels = child_labels(owner, spec)
    template_meta: dict[str, Any] = {"labels": labels}
    if annotate_for_scraping:
        template_meta["annotations"] = scrape_annotations(engine)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(owner, spec, owner.name),
        "spec": {
            "replicas": spec.replicas,
            "selector": {"matchLabels": selector_labels(owner, spec.engine.kind)},
            # Surge a new pod before removing an old one: no loss of serving capacity.
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
            },
            "template": {"metadata": template_meta, "spec": pod_spec},
        },
    }


def render_service(owner: Owner, spec: models.LLMDeploymentSpec) -> dict[str, Any]:
    """The Service clients reach the model through."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(owner, spec, owner.name),
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(owner, spec.engine.kind),
            "ports": [
                {
                    "name": PORT_NAME,
                    "port": engine_of(spec).port,
                    "targetPort": PORT_NAME,
                    "protocol": "TCP",
                }
            ],
        },
    }


def render_pod_monitor(owner: Owner, spec: models.LLMDeploymentSpec) -> dict[str, Any]:
    """A Prometheus Operator PodMonitor scraping the engine's /metrics."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": _metadata(owner, spec, owner.name),
        "spec": {
            "selector": {"matchLabels": selector_labels(owner, spec.engine.kind)},
            "podMetricsEndpoints": [{"port": PORT_NAME, "path": "/metrics", "interval": "15s"}],
        },
    }


def wants_pod_monitor(spec: models.LLMDeploymentSpec, pod_monitor_crd_present: bool) -> bool:
    mode = spec.monitoring.pod_monitor
    return mode == "Enabled" or (mode == "Auto" and pod_monitor_crd_present)


def render_inference_pool(owner: Owner, spec: models.LLMDeploymentSpec) -> dict[str, Any]:
    """A Gateway API Inference Extension InferencePool of the serving pods.

    It selects them as the Service does: trial and load pods carry another component, so no
    gateway sends a user's request to a canary, and the config hash is not among the labels,
    so the pool keeps the pods of a promoted configuration through its rollout. The fields the
    CRD would default are written out, so the pool the server stores is the one rendered.
    """
    pool: dict[str, Any] = {
        "selector": {"matchLabels": selector_labels(owner, spec.engine.kind)},
        "targetPorts": [{"number": engine_of(spec).port}],
        "appProtocol": "http",
    }
    picker = spec.inference_pool.endpoint_picker_ref
    if picker is not None:
        pool["endpointPickerRef"] = {
            "group": "",
            "kind": "Service",
            "name": picker.name,
            "port": {"number": picker.port},
            "failureMode": picker.failure_mode,
        }
    return {
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": _metadata(owner, spec, owner.name),
        "spec": pool,
    }


def render_children(
    owner: Owner, spec: models.LLMDeploymentSpec, *, pod_monitor_crd_present: bool
) -> list[dict[str, Any]]:
    """Every object that serves this LLMDeployment, in apply order."""
    with_monitor = wants_pod_monitor(spec, pod_monitor_crd_present)
    children = [
        render_deployment(owner, spec, annotate_for_scraping=not with_monitor),
        render_service(owner, spec),
    ]
    if with_monitor:
        children.append(render_pod_monitor(owner, spec))
    if spec.inference_pool.enabled:
        children.append(render_inference_pool(owner, spec))
    return children


# --- drift ----------------------------------------------------------------------------------

# The lists slotune renders whole, with what identifies an entry. An entry of the live object's
# that slotune did not render (a container or env var added by hand, a Service port edited in
# place, which server-side apply would keep beside slotune's own) is drift: it is taken back.
# What else others add (labels, annotations, volumes, tolerations) stays theirs.
_WHOLE_LISTS: dict[str, list[tuple[tuple[str, ...], str]]] = {
    "Deployment": [
        (("spec", "template", "spec", "containers"), "container"),
        (("spec", "template", "spec", "initContainers"), "init container"),
    ],
    "Service": [(("spec", "ports"), "port")],
}


def _at(obj: dict[str, Any], path: tuple[str, ...]) -> list[dict[str, Any]]:
    for part in path:
        obj = obj.get(part) or {}
    return obj if isinstance(obj, list) else []


def _entry_key(what: str, entry: dict[str, Any]) -> object:
    if what == "port":  # a Service port is identified by its number and protocol
        return (entry.get("port"), entry.get("protocol", "TCP"))
    return entry.get("name")


def _entry_label(what: str, entry: dict[str, Any]) -> str:
    if what == "port":
        return f"port {entry.get('name', '')}:{entry.get('port')}/{entry.get('protocol', 'TCP')}"
    return f"{what} {entry.get('name')}"


def foreign_entries(rendered: dict[str, Any], live: dict[str, Any]) -> list[str]:
    """What the live child holds, in a list slotune renders whole, that slotune did not render:
    `container sidecar`, `env var DEBUG of container vllm`, `port http:9000/TCP`."""
    found = []
    for path, what in _WHOLE_LISTS.get(rendered.get("kind", ""), []):
        mine = {_entry_key(what, e): e for e in _at(rendered, path)}
        for entry in _at(live, path):
            ours = mine.get(_entry_key(what, entry))
            if ours is None:
                found.append(_entry_label(what, entry))
                continue
            own_env = {v.get("name") for v in ours.get("env") or []}
            found += [
                f"env var {v.get('name')} of {what} {entry.get('name')}"
                for v in entry.get("env") or []
                if v.get("name") not in own_env
            ]
            # A whole ConfigMap or Secret poured into the environment, beside slotune's own.
            own_from = [json.dumps(s, sort_keys=True) for s in ours.get("envFrom") or []]
            found += [
                f"envFrom {_source(s)} of {what} {entry.get('name')}"
                for s in entry.get("envFrom") or []
                if json.dumps(s, sort_keys=True) not in own_from
            ]
    return found


def _source(env_from: dict[str, Any]) -> str:
    """`configMap NAME` or `secret NAME`: where an envFrom entry reads."""
    for key, kind in (("configMapRef", "configMap"), ("secretRef", "secret")):
        if key in env_from:
            return f"{kind} {(env_from[key] or {}).get('name', '')}"
    return json.dumps(env_from, sort_keys=True)


def taken_back(rendered: dict[str, Any], live: dict[str, Any]) -> dict[str, Any]:
    """The live child with every list slotune renders whole set to what slotune renders: a
    replacement (PUT) that keeps the live `resourceVersion`, so it fails rather than overwrite
    a newer edit."""
    restored: dict[str, Any] = json.loads(json.dumps(live))
    restored.pop("status", None)
    restored.get("metadata", {}).pop("managedFields", None)  # omitted: the server keeps them
    for path, _ in _WHOLE_LISTS.get(rendered.get("kind", ""), []):
        source, target = rendered, restored
        for part in path[:-1]:
            source, target = source.get(part) or {}, target.setdefault(part, {})
        if path[-1] in source:
            target[path[-1]] = json.loads(json.dumps(source[path[-1]]))
        else:
            target.pop(path[-1], None)
    return restored


# --- tuning ---------------------------------------------------------------------------------

LABEL_STUDY = "slotune.dev/study"
LABEL_TRIAL = "slotune.dev/trial"
TRIAL_COMPONENT = "trial"
LOAD_COMPONENT = "load"
LOAD_CONTAINER = "load"
TERMINATION_LOG = "/dev/termination-log"
RECORDS_KEY = "trials.jsonl"
QUARANTINE_KEY = "unreadable.jsonl"  # record lines that did not load, kept for a person


def with_params(spec: models.LLMDeploymentSpec, params: dict[str, Any]) -> models.LLMDeploymentSpec:
    """The spec with tuned engine settings (field names, as the tuner keeps them) on top."""
    if not params:
        return spec
    args = models.EngineArgs.model_validate({**spec.engine.args.explicit(), **params})
    engine = spec.engine.model_copy(update={"args": args})
    return spec.model_copy(update={"engine": engine})


def service_url(owner: Owner, spec: models.LLMDeploymentSpec) -> str:
    """The serving Service, as a pod in the cluster reaches it."""
    return f"http://{owner.name}.{owner.namespace}.svc:{engine_of(spec).port}"


def child_name(owner: Owner, *parts: object) -> str:
    """`<owner>-<part>-...`, shortened with a hash when it would not fit a label value (63)."""
    suffix = "-".join(str(p) for p in parts)
    name = f"{owner.name}-{suffix}"
    if len(name) <= 63:
        return name
    digest = hashlib.sha256(owner.name.encode()).hexdigest()[:8]
    return f"{owner.name[: 63 - len(suffix) - 10]}-{digest}-{suffix}"


def trial_labels(
    owner: Owner, component: str, study: int, trial: int, kind: str = DEFAULT_KIND
) -> dict[str, str]:
    return {
        LABEL_NAME: kind if component == TRIAL_COMPONENT else "slotune-load",
        LABEL_INSTANCE: owner.name,
        LABEL_COMPONENT: component,
        LABEL_MANAGED_BY: MANAGED_BY,
        LABEL_OWNER: owner.name,
        LABEL_STUDY: str(study),
        LABEL_TRIAL: str(trial),
    }


def render_trial_pod(
    owner: Owner, spec: models.LLMDeploymentSpec, params: dict[str, Any], study: int, trial: int
) -> dict[str, Any]:
    """A canary pod running one trial's configuration, outside the serving Service.

    Its labels do not match the Service's selector, so no user request reaches it. It is never
    restarted: a crash is the trial's result, and the log tail it leaves in the termination
    message says why.
    """
    tuned = with_params(spec, params)
    template = render_deployment(owner, tuned, annotate_for_scraping=False)["spec"]["template"]
    pod_spec = template["spec"]
    pod_spec["restartPolicy"] = "Never"
    container = pod_spec["containers"][0]
    container.pop("livenessProbe", None)
    # Nothing beyond the serving pods' environment: the capacity search keeps its probes apart
    # with a cache salt per probe, not with an engine endpoint that a setting would open.
    labels = {
        **trial_labels(owner, TRIAL_COMPONENT, study, trial, spec.engine.kind),
        LABEL_CONFIG_HASH: config_hash(owner, tuned),
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": child_name(owner, "trial", study, trial),
            "namespace": owner.namespace,
            "labels": labels,
            "ownerReferences": [owner.reference()],
        },
        "spec": pod_spec,
    }


def render_trial_network_policy(
    owner: Owner, spec: models.LLMDeploymentSpec, study: int, trial: int
) -> dict[str, Any]:
    """Lets only the trial's own load Job reach the trial engine, on its port: a trial pod
    runs the engine's development endpoints (the prefix-cache reset between probes), which no
    other pod may call. Applied before the pod, deleted with it."""

    def trial_pods(component: str) -> dict[str, Any]:
        return {
            "matchLabels": {
                LABEL_OWNER: owner.name,
                LABEL_COMPONENT: component,
                LABEL_STUDY: str(study),
                LABEL_TRIAL: str(trial),
            }
        }

    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": child_name(owner, "trial", study, trial),
            "namespace": owner.namespace,
            "labels": trial_labels(owner, TRIAL_COMPONENT, study, trial, spec.engine.kind),
            "ownerReferences": [owner.reference()],
        },
        "spec": {
            "podSelector": trial_pods(TRIAL_COMPONENT),
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "from": [{"podSelector": trial_pods(LOAD_COMPONENT)}],
                    "ports": [{"port": engine_of(spec).port, "protocol": "TCP"}],
                }
            ],
        },
    }


GATE_SECONDS = 600
"""What the quality gate adds to a load Job at most: two engines scoring a few dozen prompts."""


def render_load_job(
    owner: Owner,
    spec: models.LLMDeploymentSpec,
    *,
    image: str,
    url: str,
    workload: models.WorkloadSpec,
    request: MeasureRequest,
    study: int,
    trial: int,
    gated: bool = False,
    reference_url: str | None = None,
) -> dict[str, Any]:
    """A Job that measures the capacity of the trial's engine and reports what it found; where
    `gated` (a lossy configuration), the quality gate against the engines at `reference_url`.

    It runs the operator's own image (`slotune trial-load`); the measurement comes back as the
    container's termination message, which the operator reads from the pod's status.
    """
    if spec.slo is None:
        raise ValueError("a load Job needs spec.slo")
    measured = models.seconds(workload.duration)
    load = LoadArgs(
        url=url,
        model=served_name(owner, spec),
        engine=spec.engine.kind,
        workload=workload,
        slo=spec.slo,
        request=request,
        result_file=Path(TERMINATION_LOG),
        quality=spec.tuning.quality if gated else None,
        reference_url=reference_url if gated else None,
    )
    command = ["slotune", "trial-load", *load.argv()]
    labels = trial_labels(owner, LOAD_COMPONENT, study, trial)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": child_name(owner, "load", study, trial),
            "namespace": owner.namespace,
            "labels": labels,
            "ownerReferences": [owner.reference()],
        },
        "spec": {
            "backoffLimit": 0,
            # Every probe of the capacity search at its longest (the window and its
            # extensions, warm-up, tail and drain), the ceilings, and the quality gate.
            "activeDeadlineSeconds": int(
                MAX_PROBES * (measured * 3 + 90) + 300 + (GATE_SECONDS if gated else 0)
            ),
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "restartPolicy": "Never",
                    # Runs under PSA restricted: non-root, the runtime's seccomp profile.
                    "securityContext": {
                        "runAsNonRoot": True,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    # The root is read-only; anything that writes a temporary file gets /tmp.
                    "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}],
                    "containers": [
                        {
                            "name": LOAD_CONTAINER,
                            "image": image,
                            "command": command[:1],
                            "args": command[1:],
                            "terminationMessagePath": TERMINATION_LOG,
                            "terminationMessagePolicy": "FallbackToLogsOnError",
                            "resources": {"requests": {"cpu": "1", "memory": "256Mi"}},
                            "env": _api_key_env(spec),
                            "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],  # noqa: S108 - an emptyDir of its own
                            "securityContext": {
                                "allowPrivilegeEscalation": False,
                                "readOnlyRootFilesystem": True,
                                "runAsNonRoot": True,
                                "capabilities": {"drop": ["ALL"]},
                            },
                        }
                    ],
                },
            },
        },
    }


def render_records(owner: Owner, study: int, text: str, quarantined: str = "") -> dict[str, Any]:
    """The ConfigMap that keeps a study's trial records (JSON lines) in the API, and under
    `QUARANTINE_KEY` the lines that did not load, as they were."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": child_name(owner, "trials"),
            "namespace": owner.namespace,
            "labels": {
                LABEL_INSTANCE: owner.name,
                LABEL_MANAGED_BY: MANAGED_BY,
                LABEL_OWNER: owner.name,
                LABEL_STUDY: str(study),
            },
            "ownerReferences": [owner.reference()],
        },
        "data": {
            "study": str(study),
            RECORDS_KEY: text,
            **({QUARANTINE_KEY: quarantined} if quarantined else {}),
        },
    }

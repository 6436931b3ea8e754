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
from typing import Any

from slotune import models
from slotune.engine import vllm

MANAGED_BY = "slotune"
LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_OWNER = "slotune.dev/llmdeployment"
LABEL_CONFIG_HASH = "slotune.dev/config-hash"

CONTAINER_NAME = "vllm"
PORT_NAME = "http"
MODEL_MOUNT = "/models"
CACHE_MOUNT = "/root/.cache"
ENGINE_COMMAND = ["python3", "-m", "vllm.entrypoints.openai.api_server"]


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
    """What `--model` points at: the Hub id, or the folder inside the mounted claim."""
    pvc = spec.model.source.pvc
    if pvc is None:
        return spec.model.name
    return f"{MODEL_MOUNT}/{pvc.path.strip('/')}".rstrip("/")


def engine_args(owner: Owner, spec: models.LLMDeploymentSpec) -> list[str]:
    return vllm.render_serve_args(
        model_path(spec),
        served_name(owner, spec),
        spec.engine.args,
        spec.engine.extra_args,
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


def selector_labels(owner: Owner) -> dict[str, str]:
    """Labels that select the serving pods; stable across configurations."""
    return {
        LABEL_NAME: "vllm",
        LABEL_INSTANCE: owner.name,
        LABEL_COMPONENT: "serving",
    }


def child_labels(owner: Owner, spec: models.LLMDeploymentSpec) -> dict[str, str]:
    return {
        **selector_labels(owner),
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


def _env(spec: models.LLMDeploymentSpec) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [{"name": "HF_HOME", "value": f"{CACHE_MOUNT}/huggingface"}]
    hf = spec.model.source.hugging_face
    if hf is not None and hf.token_secret_ref is not None:
        env.append(
            {
                "name": "HF_TOKEN",
                "valueFrom": {
                    "secretKeyRef": {
                        "name": hf.token_secret_ref.name,
                        "key": hf.token_secret_ref.key,
                    }
                },
            }
        )
    env += [{"name": var.name, "value": var.value} for var in spec.engine.env]
    return env


def _volumes(spec: models.LLMDeploymentSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    volumes: list[dict[str, Any]] = [
        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": spec.engine.shm_size}},
        {"name": "cache", "emptyDir": {}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "shm", "mountPath": "/dev/shm"},  # noqa: S108 - the pod's own shared memory
        {"name": "cache", "mountPath": CACHE_MOUNT},
    ]
    pvc = spec.model.source.pvc
    if pvc is not None:
        volumes.append(
            {
                "name": "model",
                "persistentVolumeClaim": {"claimName": pvc.claim_name, "readOnly": True},
            }
        )
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


def scrape_annotations() -> dict[str, str]:
    return {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(vllm.DEFAULT_PORT),
        "prometheus.io/path": "/metrics",
    }


def render_deployment(
    owner: Owner, spec: models.LLMDeploymentSpec, *, annotate_for_scraping: bool
) -> dict[str, Any]:
    """The serving Deployment."""
    volumes, mounts = _volumes(spec)
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": spec.engine.image,
        "command": ENGINE_COMMAND,
        "args": engine_args(owner, spec),
        "ports": [{"name": PORT_NAME, "containerPort": vllm.DEFAULT_PORT, "protocol": "TCP"}],
        "env": _env(spec),
        "resources": _resources(spec),
        "volumeMounts": mounts,
        # Loading weights and compiling can take minutes; the startup probe covers it so
        # liveness never kills an engine that is still starting.
        "startupProbe": _probe("/health", period=10, failures=90),
        "readinessProbe": _probe("/health", period=5, failures=3),
        "livenessProbe": _probe("/health", period=10, failures=3),
    }
    if spec.engine.image_pull_policy is not None:
        container["imagePullPolicy"] = spec.engine.image_pull_policy
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

    labels = child_labels(owner, spec)
    template_meta: dict[str, Any] = {"labels": labels}
    if annotate_for_scraping:
        template_meta["annotations"] = scrape_annotations()
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(owner, spec, owner.name),
        "spec": {
            "replicas": spec.replicas,
            "selector": {"matchLabels": selector_labels(owner)},
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
            "selector": selector_labels(owner),
            "ports": [
                {
                    "name": PORT_NAME,
                    "port": vllm.DEFAULT_PORT,
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
            "selector": {"matchLabels": selector_labels(owner)},
            "podMetricsEndpoints": [{"port": PORT_NAME, "path": "/metrics", "interval": "15s"}],
        },
    }


def wants_pod_monitor(spec: models.LLMDeploymentSpec, pod_monitor_crd_present: bool) -> bool:
    mode = spec.monitoring.pod_monitor
    return mode == "Enabled" or (mode == "Auto" and pod_monitor_crd_present)


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
    return children

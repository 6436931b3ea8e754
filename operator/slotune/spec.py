"""Whether a spec can be served: the API's own rules, then its engine's rule table.

Pure, and shared by the operator (which turns the problems into a condition) and the command
line (`slotune validate`), so a file checked in CI fails for the same reasons a cluster would
refuse it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from pydantic import ValidationError

from slotune.engine import DEFAULT_KIND, ENGINES, engine_for, engine_or_default
from slotune.engine.base import Engine
from slotune.models import LLMDeploymentSpec

# Checks free-form fields against the Kubernetes API's types: `(path, type, value)` triples
# in, problems out (`kube.schema_problems`; this module stays free of the client).
SchemaCheck = Callable[[Iterable[tuple[str, str, Any]]], list[str]]


def validation_problems(
    error: ValidationError, prefix: str = "spec", kind: str = DEFAULT_KIND
) -> list[str]:
    """Pydantic errors as `spec.path: what is wrong` lines (`kind`: the spec's engine)."""
    problems = []
    for item in error.errors():
        path = ".".join(str(part) for part in (prefix, *item["loc"]) if part != "")
        message = item["msg"]
        if _is_kv_cache_dtype(item["loc"]) and isinstance(item.get("input"), str):
            value = item["input"]
            engine = engine_or_default(kind)
            hint = engine.kv_cache_dtype_hint(value)
            message = f"{value!r} is not a KV-cache dtype of {engine.title}'s; {hint}"
        problems.append(f"{path}: {message}")
    return problems


def _is_kv_cache_dtype(loc: tuple[int | str, ...]) -> bool:
    """The spec's KV-cache dtype field (engine.args), or an item of its search space."""
    names = [part for part in loc if isinstance(part, str)]
    return bool(names) and names[-1] == "kvCacheDtype"


# The largest spec served, as compact JSON. Real ones are a few KiB; the schema bounds most
# fields, but free-form ones (affinity, tolerations) are bounded only here. The children, the
# status (which keeps the last good spec) and an object's annotations then stay far below the
# API server's limits (256 KiB of annotations, 1.5 MiB per object).
MAX_SPEC_BYTES = 64 * 1024


def parse_spec(
    raw: dict[str, Any], schema: SchemaCheck | None = None
) -> tuple[LLMDeploymentSpec | None, list[str]]:
    """The spec, and the reasons it cannot be served (empty when it can). With `schema`, the
    fields passed to Kubernetes as written are checked against the API's types too, so that a
    typo in one is a spec error here rather than an apply the server refuses."""
    size = len(json.dumps(raw, separators=(",", ":"), ensure_ascii=False).encode())
    if size > MAX_SPEC_BYTES:
        largest = max(raw, key=lambda k: len(json.dumps(raw[k])), default="")
        return None, [
            f"spec: {size / 1024:.0f} KiB, more than slotune serves ({MAX_SPEC_BYTES // 1024} "
            f"KiB); its largest part is spec.{largest}"
        ]
    try:
        spec = LLMDeploymentSpec.model_validate(raw)
    except ValidationError as error:
        return None, validation_problems(error, kind=kind_of(raw))
    given = spec.engine
    if given.kind not in ENGINES:
        return None, [
            f"spec.engine.kind: {given.kind!r} is not an engine slotune runs; use one of "
            + ", ".join(sorted(ENGINES))
        ]
    engine = engine_for(given.kind)
    violations = engine.check_config(
        given.args, given.extra_args, given.attention_backend, given.image
    ) + engine.check_resources(
        given.extra_args, spec.resources.gpus, given.image, given.attention_backend
    )
    unjudged = (
        [
            f"spec.slo.{name}: {engine.title} exposes no histogram of it, so the live SLO could "
            f"not be judged; use one it does ({', '.join(sorted(engine.default_buckets))})"
            for name in spec.slo.targets()
            if name not in engine.metrics
        ]
        if spec.slo is not None
        else []
    )
    pod_problems = env_problems(spec, engine)
    pod_problems += tracing_problems(spec, engine)
    if schema is not None:
        pod_problems += schema(free_form_fields(spec))
    return spec, [str(v) for v in violations] + unjudged + pod_problems


def tracing_problems(spec: LLMDeploymentSpec, engine: Engine) -> list[str]:
    """A tracing flag in extraArgs beside spec.monitoring.otlpTracesEndpoint, which sets it."""
    endpoint = spec.monitoring.otlp_traces_endpoint
    if endpoint is None:
        return []
    given = {token.split("=", 1)[0] for token in spec.engine.extra_args if token.startswith("--")}
    return [
        f"spec.engine.extraArgs: {flag} is set from spec.monitoring.otlpTracesEndpoint; "
        "give the endpoint there only"
        for flag in engine.tracing_args(endpoint)
        if flag.startswith("--") and flag in given
    ]


def free_form_fields(spec: LLMDeploymentSpec) -> list[tuple[str, str, Any]]:
    """The fields slotune passes to the pods as written, with the Kubernetes type of each."""
    scheduling = spec.scheduling
    fields = [
        ("spec.engine.securityContext", "V1SecurityContext", spec.engine.security_context),
        ("spec.podSecurityContext", "V1PodSecurityContext", spec.pod_security_context),
        ("spec.scheduling.affinity", "V1Affinity", scheduling.affinity),
    ]
    fields += [
        (f"spec.scheduling.tolerations[{index}]", "V1Toleration", toleration)
        for index, toleration in enumerate(scheduling.tolerations)
    ]
    return fields


def env_set_by_slotune(spec: LLMDeploymentSpec, engine: Engine) -> dict[str, str]:
    """The environment variables slotune sets on the engine itself, each with where its value
    comes from: one of them in `engine.env` as well would be a duplicate entry, which the API
    server refuses."""
    names = {"HF_HOME": "slotune points it at the model cache"}
    hf = spec.model.source.hugging_face
    if hf is not None and hf.token_secret_ref is not None:
        why = "slotune reads it from model.source.huggingFace.tokenSecretRef"
        names["HF_TOKEN"] = why
    names[engine.api_key_env] = "put the key in a Secret and name it in engine.apiKeySecretRef"
    if spec.cache is not None:
        for name in engine.cache_dirs:
            names[name] = "slotune points it at the cache volume of spec.cache"
    return names


def env_problems(spec: LLMDeploymentSpec, engine: Engine) -> list[str]:
    """Names in `engine.env` given twice, or also set by slotune."""
    problems = []
    reserved = env_set_by_slotune(spec, engine)
    first: dict[str, int] = {}
    for index, var in enumerate(spec.engine.env):
        where = f"spec.engine.env[{index}].name"
        if var.name in first:
            problems.append(
                f"{where}: {var.name} is given twice (also at env[{first[var.name]}]); keep one"
            )
        elif var.name in reserved:
            problems.append(f"{where}: {var.name} is not set here: {reserved[var.name]}")
        first.setdefault(var.name, index)
    return problems


def kind_of(raw: dict[str, Any]) -> str:
    """The engine a raw spec names, before it is validated (unset: the default)."""
    engine = raw.get("engine")
    kind = engine.get("kind") if isinstance(engine, dict) else None
    return kind if isinstance(kind, str) else DEFAULT_KIND


# Pod Security Standards: the levels in order, the namespace label that enforces one, and the
# capabilities the baseline level lets a container add.
PSA_LEVELS = ("restricted", "baseline", "privileged")
PSA_ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"
# The sysctls the baseline level allows a pod to set, and the SELinux types.
SAFE_SYSCTLS = frozenset(
    {
        "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_unprivileged_port_start", "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes",
    }
)  # fmt: skip
BASELINE_SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t"})
BASELINE_CAPABILITIES = frozenset(
    {
        "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
        "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
    }
)  # fmt: skip


def privilege_asked(spec: LLMDeploymentSpec) -> list[tuple[str, str]]:
    """What of the pods' security contexts needs more than the restricted level, each with the
    level that allows it: `(what, level)`."""
    container = spec.engine.security_context
    pod = spec.pod_security_context
    asked: list[tuple[str, str]] = []
    if container.get("privileged") is True:
        asked.append(("spec.engine.securityContext.privileged: true", "privileged"))
    added = (container.get("capabilities") or {}).get("add") or []
    beyond = sorted(
        str(c) for c in added if str(c).removeprefix("CAP_") not in BASELINE_CAPABILITIES
    )
    if beyond:
        asked.append(
            (f"spec.engine.securityContext.capabilities.add: {', '.join(beyond)}", "privileged")
        )
    for where, context in (
        ("spec.engine.securityContext", container),
        ("spec.podSecurityContext", pod),
    ):
        for profile in ("seccompProfile", "appArmorProfile"):
            if (context.get(profile) or {}).get("type") == "Unconfined":
                asked.append((f"{where}.{profile}.type: Unconfined", "privileged"))
        selinux = context.get("seLinuxOptions") or {}
        custom = selinux.get("type", "") not in BASELINE_SELINUX_TYPES
        if custom or selinux.get("user") or selinux.get("role"):
            asked.append((f"{where}.seLinuxOptions: {selinux}", "privileged"))
        if context.get("runAsUser") == 0:
            asked.append((f"{where}.runAsUser: 0 (root)", "baseline"))
    unsafe = sorted(
        str(s.get("name")) for s in pod.get("sysctls") or [] if s.get("name") not in SAFE_SYSCTLS
    )
    if unsafe:
        asked.append((f"spec.podSecurityContext.sysctls: {', '.join(unsafe)}", "privileged"))
    if container.get("procMount") == "Unmasked":
        asked.append(("spec.engine.securityContext.procMount: Unmasked", "privileged"))
    return asked


def privilege_problems(
    asked: list[tuple[str, str]], namespace: str, level: str | None
) -> list[str]:
    """What the namespace's enforced Pod Security level (`level`, None: not labelled) does not
    allow. slotune asks for the label itself: a namespace without one gets no privileged or
    root engine through it, whatever the cluster's default."""
    allowed = PSA_LEVELS.index(level) if level in PSA_LEVELS else -1
    return [
        f"{what}: namespace {namespace} does not allow it (label it "
        f"{PSA_ENFORCE_LABEL}={needed} to allow it, if its owner agrees)"
        for what, needed in asked
        if PSA_LEVELS.index(needed) > allowed
    ]

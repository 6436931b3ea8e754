"""Spec errors found before apply: the free-form fields checked against the Kubernetes API's
own types, environment names given twice or set by slotune, and the API server's answers that
are about the object (refused the same on every retry) told from those about the moment."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

import pytest

from slotune import render
from slotune.engine import engine_for
from slotune.kube import KubeError, Ref, schema_problems
from slotune.models import EngineArgs, LLMDeploymentStatus
from slotune.reconcile import reconcile
from slotune.spec import env_set_by_slotune, parse_spec, privilege_asked, privilege_problems
from support.memkube import MemoryApi

NOW = datetime(2026, 12, 6, 8, 0, tzinfo=UTC)


def raw(**overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "model": {
            "name": "m",
            "source": {"huggingFace": {"tokenSecretRef": {"name": "hf", "key": "token"}}},
        },
        "engine": {"image": "vllm/vllm-openai:v0.32.0", "args": {"maxNumBatchedTokens": 2048}},
    }
    for path, value in overrides.items():
        *parents, last = path.split(".")
        node = spec
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return spec


def problems(spec: dict[str, Any]) -> list[str]:
    parsed, found = parse_spec(spec, schema_problems)
    assert parsed is not None
    return found


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        (
            "engine.securityContext",
            {"allowPrivilegeEscalaton": False},
            "spec.engine.securityContext.allowPrivilegeEscalaton: not a field of SecurityContext; "
            "did you mean allowPrivilegeEscalation?",
        ),
        (
            "engine.securityContext",
            {"capabilities": {"drop": ["ALL"], "ad": ["NET_ADMIN"]}},
            "spec.engine.securityContext.capabilities.ad: not a field of Capabilities; did you "
            "mean add?",
        ),
        (
            "engine.securityContext",
            {"runAsUser": "root"},
            "spec.engine.securityContext.runAsUser: input should be a valid integer",
        ),
        (
            "podSecurityContext",
            {"run_as_non_root": True},
            "spec.podSecurityContext.run_as_non_root: not a field of PodSecurityContext; did you "
            "mean runAsNonRoot?",
        ),
        (
            "scheduling.tolerations",
            [{"key": "gpu", "operator": "Exists"}, {"key": "a", "opertor": "Exists"}],
            "spec.scheduling.tolerations[1].opertor: not a field of Toleration; did you mean "
            "operator?",
        ),
        (
            "scheduling.affinity",
            {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": "gpu"}]}]}}},
            "spec.scheduling.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
            ".nodeSelectorTerms[0].matchExpressions[0].operator: field required",
        ),
        (
            "engine.env",
            [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}],
            "spec.engine.env[1].name: A is given twice (also at env[0]); keep one",
        ),
        (
            "engine.env",
            [{"name": "HF_TOKEN", "value": "x"}],
            "spec.engine.env[0].name: HF_TOKEN is not set here: slotune reads it from "
            "model.source.huggingFace.tokenSecretRef",
        ),
    ],
)  # fmt: skip
def test_a_typo_in_a_field_passed_to_kubernetes_is_a_spec_error(
    path: str, value: Any, expected: str
) -> None:
    found = problems(raw(**{path: value}))
    assert any(problem.startswith(expected) for problem in found), found


def test_well_formed_free_form_fields_pass() -> None:
    spec = raw(
        **{
            "engine.securityContext": {
                "allowPrivilegeEscalation": False,
                "capabilities": {"drop": ["ALL"]},
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "podSecurityContext": {"runAsNonRoot": True, "runAsUser": 1000, "fsGroup": 1000},
            "scheduling.tolerations": [
                {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}
            ],
            "scheduling.affinity": {"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "gpu", "operator": "In", "values": ["h100"]}]}]}}},
            "engine.env": [{"name": "A", "value": "1"}],
        }
    )  # fmt: skip
    assert problems(spec) == []


@pytest.mark.parametrize("cache", [None, {"pvc": {"claimName": "llm-cache"}}])
def test_every_variable_slotune_sets_is_reserved(cache: dict[str, Any] | None) -> None:
    """What render puts in the engine's environment beside `engine.env` is exactly what the
    spec check refuses there, so a duplicate can never reach the API server."""
    spec = raw(**{"engine.apiKeySecretRef": {"name": "k", "key": "key"}, "cache": cache})
    parsed, _ = parse_spec(spec)
    assert parsed is not None
    owner = render.Owner(name="m", namespace="ns", uid="u")
    pod = render.render_trial_pod(owner, parsed, {}, 1, 0)
    rendered = {var["name"] for var in pod["spec"]["containers"][0]["env"]}
    assert rendered == set(env_set_by_slotune(parsed, engine_for("vllm")))


def test_the_cache_variables_are_slotunes_only_with_a_cache_volume() -> None:
    """With `spec.cache` slotune points the compile caches at the volume; without, they are the
    user's to set."""
    own_root = {"engine.env": [{"name": "VLLM_CACHE_ROOT", "value": "/scratch/vllm"}]}
    assert problems(raw(**own_root)) == []
    assert problems(raw(**own_root, cache={"pvc": {"claimName": "llm-cache"}})) == [
        "spec.engine.env[0].name: VLLM_CACHE_ROOT is not set here: slotune points it at the "
        "cache volume of spec.cache"
    ]


@pytest.mark.parametrize(
    ("status", "message", "rejected"),
    [
        (422, "Deployment.apps is invalid", True),
        (500, 'failed to create typed patch object (ns/x; apps/v1, Kind=Deployment): '
              '.spec.template.spec.containers[name="vllm"].securityContext.x: field not '
              'declared in schema', True),
        (500, '.spec.template.spec.containers[name="vllm"].env: duplicate entries for key '
              '[name="A"]', True),
        (500, "etcdserver: request timed out", False),
        (503, "the server is currently unable to handle the request", False),
        (403, "exceeded quota", False),
    ],
)  # fmt: skip
def test_an_answer_about_the_object_is_a_spec_error_one_about_the_moment_is_retried(
    status: int, message: str, rejected: bool
) -> None:
    assert KubeError(status, "x", message).rejected is rejected


def stored(api: MemoryApi, spec: dict[str, Any]) -> Ref:
    """An LLMDeployment `m` in namespace `ns` with this spec, as the API server holds it."""
    ref = Ref("slotune.dev/v1alpha1", "LLMDeployment", "ns", "m")
    api.objects[MemoryApi._key(ref)] = {
        "apiVersion": "slotune.dev/v1alpha1",
        "kind": "LLMDeployment",
        "metadata": {"name": "m", "namespace": "ns", "uid": "u-1", "generation": 1},
        "spec": copy.deepcopy(spec),
    }
    return ref


class RefusingApi(MemoryApi):
    """Answers an apply of a Deployment of more than one replica as server-side apply answers
    a field its schema lacks (500, every time)."""

    def apply(self, obj: dict[str, Any], *, subresource: str | None = None) -> dict[str, Any]:
        if obj["kind"] == "Deployment" and obj["spec"].get("replicas", 1) > 1:
            raise KubeError(
                500,
                "Internal Server Error",
                "failed to create typed patch object (ns/m; apps/v1, Kind=Deployment): "
                ".spec.template.spec.x: field not declared in schema",
            )
        return super().apply(obj, subresource=subresource)


def test_a_refused_apply_is_invalid_and_the_last_good_spec_keeps_serving() -> None:
    api = RefusingApi()
    ref = stored(api, raw())
    reconcile(api.get(ref) or {}, api, NOW)
    good = api.get(Ref("apps/v1", "Deployment", "ns", "m"))
    assert good is not None

    edited = api.get(ref) or {}
    edited["spec"]["replicas"] = 2
    edited["metadata"]["generation"] = 2
    api.objects[MemoryApi._key(ref)] = edited
    done = reconcile(api.get(ref) or {}, api, NOW)
    assert done.apply_failure is None  # not retried with back-off
    assert done.invalid is not None
    assert "field not declared in schema" in done.invalid
    status = LLMDeploymentStatus.model_validate((api.get(ref) or {})["status"])
    assert status.phase == "Invalid"
    assert status.serving_spec == raw()  # the last good, not the refused one

    # Deleted meanwhile, the Deployment comes back at the last good spec.
    del api.objects[("apps/v1", "Deployment", "ns", "m")]
    reconcile(api.get(ref) or {}, api, NOW)
    back = api.get(Ref("apps/v1", "Deployment", "ns", "m"))
    assert back is not None
    assert back["spec"]["replicas"] == 1
    assert back["spec"]["template"] == good["spec"]["template"]


PRIVILEGED = {"privileged": True, "capabilities": {"add": ["SYS_ADMIN", "CHOWN"]}}


def test_privilege_a_spec_asks_for_and_the_level_that_allows_it() -> None:
    parsed, _ = parse_spec(
        raw(**{"engine.securityContext": PRIVILEGED, "podSecurityContext": {"runAsUser": 0}})
    )
    assert parsed is not None
    asked = privilege_asked(parsed)
    assert asked == [
        ("spec.engine.securityContext.privileged: true", "privileged"),
        ("spec.engine.securityContext.capabilities.add: SYS_ADMIN", "privileged"),
        ("spec.podSecurityContext.runAsUser: 0 (root)", "baseline"),
    ]
    unlabelled = privilege_problems(asked, "team", None)
    assert len(unlabelled) == 3
    assert "label it pod-security.kubernetes.io/enforce=privileged" in unlabelled[0]
    assert [p.split(":")[0] for p in privilege_problems(asked, "team", "baseline")] == [
        "spec.engine.securityContext.privileged",
        "spec.engine.securityContext.capabilities.add",
    ]
    assert privilege_problems(asked, "team", "privileged") == []
    plain, _ = parse_spec(raw(**{"engine.securityContext": {"runAsNonRoot": True}}))
    assert plain is not None
    assert privilege_asked(plain) == []


def test_without_the_policy_the_operator_refuses_privilege_the_namespace_does_not_allow() -> None:
    api = MemoryApi()
    ref = stored(api, raw(**{"engine.securityContext": {"privileged": True}}))
    done = reconcile(api.get(ref) or {}, api, NOW)
    assert done.invalid is not None
    assert "spec.engine.securityContext.privileged: true: namespace ns does not allow it" in (
        done.invalid
    )
    assert api.get(Ref("apps/v1", "Deployment", "ns", "m")) is None  # nothing applied
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ns"}}
    namespace["metadata"]["labels"] = {"pod-security.kubernetes.io/enforce": "privileged"}  # type: ignore[index]
    api.objects[("v1", "Namespace", "", "ns")] = namespace
    done = reconcile(api.get(ref) or {}, api, NOW)
    assert done.invalid is None
    assert api.get(Ref("apps/v1", "Deployment", "ns", "m")) is not None


def test_a_malformed_duration_says_what_a_duration_is() -> None:
    """Not the regular expression alone: what to write."""
    _, found = parse_spec(raw(**{"slo": {"window": "5 minutes", "ttft": {"maxSeconds": 2}}}))
    assert found == [
        "spec.slo.window: Value error, '5 minutes' must be a duration: a number and a unit, "
        "e.g. 30s, 5m or 1h30m (ms, s, m, h)"
    ]


class RefusingServices(MemoryApi):
    """Refuses any Service of a spec with two replicas, as a policy added after the last good
    spec was served might: the Deployment before it goes in."""

    def apply(self, obj: dict[str, Any], *, subresource: str | None = None) -> dict[str, Any]:
        if obj["kind"] == "Service" and self.replicas == 2:
            raise KubeError(422, "Invalid", "Service is invalid: spec.ports: forbidden")
        return super().apply(obj, subresource=subresource)

    replicas = 1


def test_a_later_child_refused_does_not_roll_the_deployment_back_and_forth() -> None:
    """The new Deployment went in and a later child was refused: the Deployment stays on the
    new spec (applying the last good one again would roll it out and back on every reconcile),
    and the status says what the server refused."""
    api = RefusingServices()
    ref = stored(api, raw())
    reconcile(api.get(ref) or {}, api, NOW)
    edited = api.get(ref) or {}
    edited["spec"]["replicas"] = 2
    api.objects[MemoryApi._key(ref)] = edited
    api.replicas = 2
    for _ in range(3):
        done = reconcile(api.get(ref) or {}, api, NOW)
        assert done.invalid is not None
        deployment = api.get(Ref("apps/v1", "Deployment", "ns", "m"))
        assert deployment is not None
        assert deployment["spec"]["replicas"] == 2
    status = LLMDeploymentStatus.model_validate((api.get(ref) or {})["status"])
    assert status.serving_spec == raw()


def test_choices_are_checked_only_against_the_images_own_version() -> None:
    """A value a newer vLLM may list (a quantization method) is not refused for an image whose
    version has no flag table here; a value of the wrong type still is."""
    vllm_engine = engine_for("vllm")
    args = EngineArgs()
    newer = "vllm/vllm-openai:v0.99.0"
    found = [str(v) for v in vllm_engine.check_config(args, ["-q", "fp9"], "FLASH_ATTN", newer)]
    assert not any("is not a value" in p for p in found), found
    found = [str(v) for v in vllm_engine.check_config(args, ["--seed", "x"], "FLASH_ATTN", newer)]
    assert any("--seed takes an integer" in p for p in found), found
    exact = "vllm/vllm-openai:v0.32.0"
    found = [str(v) for v in vllm_engine.check_config(args, ["-q", "fp9"], "FLASH_ATTN", exact)]
    assert any("'fp9' is not a value -q takes" in p for p in found), found


@pytest.mark.parametrize(
    ("path", "value", "asked"),
    [
        ("engine.securityContext", {"appArmorProfile": {"type": "Unconfined"}}, "appArmorProfile"),
        ("podSecurityContext", {"seLinuxOptions": {"type": "spc_t"}}, "seLinuxOptions"),
        ("podSecurityContext", {"sysctls": [{"name": "kernel.msgmax", "value": "1"}]}, "sysctls"),
    ],
)
def test_what_the_baseline_level_forbids_needs_the_privileged_label(
    path: str, value: dict[str, Any], asked: str
) -> None:
    parsed, _ = parse_spec(raw(**{path: value}))
    assert parsed is not None
    found = privilege_asked(parsed)
    assert [level for _, level in found] == ["privileged"]
    assert asked in found[0][0]
    safe, _ = parse_spec(
        raw(podSecurityContext={"sysctls": [{"name": "net.ipv4.tcp_syncookies", "value": "1"}]})
    )
    assert safe is not None
    assert privilege_asked(safe) == []


def test_an_image_without_its_own_flag_table_is_said_once_per_generation() -> None:
    """The engine's flags were checked against another version's table (vLLM 0.33 against
    0.32's): a Warning event says so at the first reconcile of a generation, as `slotune
    validate` does, and not at every resync after it."""

    def notes(done: Any) -> list[str]:
        return [e.message for e in done.events if e.reason == "FlagsCheckedAgainstOtherVersion"]

    api = MemoryApi()
    ref = stored(api, raw(**{"engine.image": "vllm/vllm-openai:v0.33.0"}))
    (note,) = notes(reconcile(api.get(ref) or {}, api, NOW))
    assert "0.32.0" in note
    assert "0.33.0" in note
    assert notes(reconcile(api.get(ref) or {}, api, NOW)) == []
    pinned = MemoryApi()
    ref = stored(pinned, raw())
    assert notes(reconcile(pinned.get(ref) or {}, pinned, NOW)) == []

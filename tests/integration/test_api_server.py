"""The generated CRD on the real API server: accepted, structural, and enforcing its rules."""

from __future__ import annotations

from typing import Any

import pytest

from slotune import models
from support.cluster import ROOT, Cluster, llmd, wait_for

pytestmark = pytest.mark.integration


def test_crd_is_established_with_status_subresource_and_columns(cluster: Cluster) -> None:
    crd = cluster.get("crd", "llmdeployments.slotune.dev", "default")
    assert crd is not None
    conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert conditions["Established"] == "True"
    assert conditions["NamesAccepted"] == "True"
    # A non-structural schema would show NonStructuralSchema=True.
    assert "NonStructuralSchema" not in conditions
    version = crd["spec"]["versions"][0]
    assert version["subresources"] == {
        "status": {},
        "scale": {
            "specReplicasPath": ".spec.replicas",
            "statusReplicasPath": ".status.replicas",
            "labelSelectorPath": ".status.selector",
        },
    }
    assert cluster.kubectl("get", "llmd", "-A").returncode == 0


@pytest.mark.parametrize("sample", sorted((ROOT / "samples").glob("*.yaml")), ids=lambda p: p.name)
def test_samples_are_accepted_by_the_server(cluster: Cluster, sample: Any) -> None:
    result = cluster.kubectl("apply", "--dry-run=server", "-f", str(sample), check=False)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        # CEL rules (x-kubernetes-validations)
        (
            {"engine": {"args": {"maxNumBatchedTokens": 64, "maxNumSeqs": 128}}},
            "maxNumBatchedTokens must be at least maxNumSeqs",
        ),
        (
            {"model": {"name": "m", "source": {"huggingFace": {}, "pvc": {"claimName": "c"}}}},
            "set exactly one of model.source.huggingFace, model.source.pvc, model.source.image or",
        ),
        ({"slo": None, "tuning": {"enabled": True}}, "tuning.enabled needs an slo to tune for"),
        ({"slo": {"window": "5m"}}, "give at least one SLO target"),
        (
            {"tuning": {"searchSpace": {"maxNumBatchedTokens": {"min": 8192, "max": 512}}}},
            "min must not exceed max",
        ),
        (
            {"tuning": {"workload": {"source": "Synthetic", "requestRate": 4}}},
            "a Synthetic workload needs promptTokens, outputTokens",
        ),
        (
            {"model": {"name": "m", "servedName": "--api-key"}},
            "model.servedName must not start with '-' (vLLM would read it as a flag)",
        ),
        ({"model": {"name": "m\u0001"}}, "model.name must not start with '-'"),
        (
            {"tuning": {"searchSpace": {"kvCacheDtype": ["auto", "fp8"]}}},
            "searchSpace names lossy settings",
        ),
        (
            {"tuning": {"searchSpace": {"quantization": ["none", "fp8"]}}},
            "set tuning.quality.allowLossy: true",
        ),
        (
            {"tuning": {"strategy": "InPlace", "quality": {"allowLossy": True}}},
            "quality.allowLossy needs strategy Canary",
        ),
        (
            {
                "engine": {
                    "args": {
                        "speculative": {
                            "method": "ngram",
                            "numSpeculativeTokens": 4,
                            "draftModel": "m-small",
                        }
                    }
                }
            },
            "draftModel goes with a method that has a model",
        ),
        (
            {
                "engine": {
                    "args": {"speculative": {"method": "draft_model", "numSpeculativeTokens": 4}}
                }
            },
            "method draft_model needs draftModel",
        ),
        (
            {"engine": {"env": [{"name": "VLLM_API_KEY", "value": "s3cret"}]}},
            "engine.env must not set VLLM_API_KEY",
        ),
        # OpenAPI schema
        (
            {"engine": {"args": {"gpuMemoryUtilization": 1.5}}},
            "spec.engine.args.gpuMemoryUtilization: Invalid value: 1.5",
        ),
        # A CEL rule, not an enum, so that the refusal names the dtype meant (#37)
        (
            {"engine": {"args": {"kvCacheDtype": "int4"}}},
            "'int4' is not a KV-cache dtype of vLLM's; nearest: int4_per_token_head",
        ),
        (
            {"tuning": {"searchSpace": {"kvCacheDtype": ["auto", "FP8_E4"]}}},
            "'FP8_E4' is not a KV-cache dtype of vLLM's; nearest: fp8, fp8_e4m3,",
        ),
        (
            {"engine": {"args": {"kvCacheDtype": "fp4"}}},
            "'fp4' is not a KV-cache dtype of vLLM's; use one of auto, float16, bfloat16, fp8,",
        ),
        ({"replicas": -1}, "spec.replicas: Invalid value: -1"),
        (
            {"scaling": {"mode": "Capacity", "minReplicas": 5, "maxReplicas": 2}},
            "minReplicas must not exceed maxReplicas",
        ),
        # An unset bound is its default (maxReplicas 10) on the server too.
        ({"scaling": {"minReplicas": 20}}, "minReplicas must not exceed maxReplicas"),
        ({"scaling": {"mode": "Auto"}}, 'Unsupported value: "Auto"'),
        (
            {"engine": {"chunkedPrefillSize": 4096}},
            'unknown field "spec.engine.chunkedPrefillSize"',
        ),
        # Bounded fields (#14): no field alone can carry a spec past what an object holds
        (
            {"engine": {"extraArgs": ["--chat-template", "x" * 20_000]}},
            "spec.engine.extraArgs[1]: Too long: may not be more than 16384",
        ),
        (
            {"engine": {"env": [{"name": "BIG", "value": "v" * 20_000}]}},
            "spec.engine.env[0].value: Too long: may not be more than 16384",
        ),
        (
            {"engine": {"extraArgs": ["--enable-log-requests"] * 129}},
            "spec.engine.extraArgs: Too many: 129: must have at most 128 items",
        ),
        (
            {"scheduling": {"tolerations": [{"operator": "Exists"}] * 65}},
            "spec.scheduling.tolerations: Too many: 65: must have at most 64 items",
        ),
    ],
)
def test_invalid_specs_are_rejected_by_the_server(
    cluster: Cluster, spec: dict[str, Any], message: str
) -> None:
    obj = llmd("bad", "default")
    for key, value in spec.items():
        if value is None:
            obj["spec"].pop(key, None)
        elif key == "engine":  # keep the image, override inside
            obj["spec"][key] = {**obj["spec"][key], **value}
        else:
            obj["spec"][key] = value
    result = cluster.apply(obj, "--dry-run=server")
    assert result.returncode != 0, f"the server accepted {spec}"
    assert message in result.stderr


@pytest.mark.parametrize("name", ["llama-3.1-8b", "a" * 64])
def test_a_name_its_service_cannot_take_is_rejected_by_the_server(
    cluster: Cluster, name: str
) -> None:
    result = cluster.apply(llmd(name, "default"), "--dry-run=server")
    assert result.returncode != 0, f"the server accepted the name {name!r}"
    assert "metadata.name must be a DNS-1035 label" in result.stderr
    accepted = cluster.apply(llmd("llama-3-1-8b", "default"), "--dry-run=server")
    assert accepted.returncode == 0, accepted.stderr


def test_with_watch_namespaces_the_operator_holds_nothing_outside_them(cluster: Cluster) -> None:
    """The chart's namespace-scoped RBAC (watchNamespaces set), on the real API server's
    authorizer: everything the operator does inside the watched namespace, nothing of it in
    another one (kube-system), and cluster-wide only list/watch of CRDs."""
    cluster.kubectl("create", "namespace", "scoped-system")
    cluster.kubectl("create", "namespace", "team-a")
    rendered = cluster.helm(
        "template", "scoped", str(ROOT / "charts" / "slotune"),
        "--namespace", "scoped-system", "--set", "watchNamespaces={team-a}",
        "--show-only", "templates/serviceaccount.yaml",
        "--show-only", "templates/clusterrole.yaml",
        "--show-only", "templates/clusterrolebinding.yaml",
    )  # fmt: skip
    applied = cluster.apply(rendered)
    assert applied.returncode == 0, applied.stderr
    account = "system:serviceaccount:scoped-system:scoped-slotune"

    def can(verb: str, resource: str, namespace: str | None = None) -> bool:
        where = ["-n", namespace] if namespace else ["--all-namespaces"]
        answer = cluster.kubectl(
            "auth", "can-i", verb, resource, "--as", account, *where, check=False
        )
        return answer.stdout.strip() == "yes"

    for verb, resource in [
        ("create", "deployments.apps"),
        ("delete", "pods"),
        ("create", "jobs.batch"),
        ("patch", "configmaps"),
        ("watch", "llmdeployments.slotune.dev"),
        ("patch", "llmdeployments.slotune.dev/status"),
    ]:
        assert can(verb, resource, "team-a"), f"{verb} {resource} in team-a"
        assert not can(verb, resource, "kube-system"), f"{verb} {resource} in kube-system"
        assert not can(verb, resource), f"{verb} {resource} cluster-wide"
    assert can("watch", "customresourcedefinitions.apiextensions.k8s.io")
    assert not can("get", "secrets", "team-a")


def test_the_admission_policy_limits_what_an_author_gets_through_the_operator(
    cluster: Cluster,
) -> None:
    """The chart's optional ValidatingAdmissionPolicy, enforced by the real API server, in a
    namespace its selector picks: what an author cannot have the operator run for them."""
    cluster.kubectl("create", "namespace", "vap-team")
    cluster.kubectl("label", "namespace", "vap-team", "slotune-policy=on")
    rendered = cluster.helm(
        "template", "vap", str(ROOT / "charts" / "slotune"),
        "--set", "admissionPolicy.enabled=true",
        "--set", "admissionPolicy.allowedPriorityClasses={llm-serving}",
        "--set", "admissionPolicy.namespaceSelector.matchLabels.slotune-policy=on",
        "--show-only", "templates/admissionpolicy.yaml",
    )  # fmt: skip
    assert f"'{models.DEFAULT_ENGINE_IMAGE}'" in rendered  # what an unset image runs
    applied = cluster.apply(rendered)
    assert applied.returncode == 0, applied.stderr

    def refusal(name: str, **spec: Any) -> str:
        obj = llmd(name, "vap-team", **spec)
        result = cluster.apply(obj, "--dry-run=server")
        return "" if result.returncode == 0 else result.stderr

    def with_image(image: str) -> dict[str, Any]:
        return {"image": image, "args": {"maxNumBatchedTokens": 2048}}

    try:
        message = wait_for(
            "the policy in force",
            lambda: refusal("miner", engine=with_image("evil.example/miner:1")),
            timeout=60,
        )
        assert "spec.engine.image evil.example/miner:1 is not allowed here" in message
        assert refusal("fine", engine=with_image("vllm/vllm-openai:v0.32.0")) == ""
        unset = llmd("unset", "vap-team")
        del unset["spec"]["engine"]["image"]
        assert cluster.apply(unset, "--dry-run=server").returncode == 0
        assert "priorityClassName system-node-critical is not allowed here" in refusal(
            "pc", scheduling={"priorityClassName": "system-node-critical"}
        )
        assert refusal("pc", scheduling={"priorityClassName": "llm-serving"}) == ""
        assert "toleration without a key tolerates every taint" in refusal(
            "tol", scheduling={"tolerations": [{"operator": "Exists"}]}
        )
        gpu = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
        assert refusal("tol", scheduling={"tolerations": gpu}) == ""

        # No privilege: privileged, added capabilities, root.
        def with_context(context: dict[str, Any]) -> dict[str, Any]:
            return {**with_image("vllm/vllm-openai:v0.32.0"), "securityContext": context}

        assert "securityContext.privileged is not allowed here" in refusal(
            "priv", engine=with_context({"privileged": True})
        )
        assert "capabilities.add is not allowed here" in refusal(
            "caps", engine=with_context({"capabilities": {"add": ["SYS_ADMIN"]}})
        )
        assert "running as root" in refusal("root", podSecurityContext={"runAsUser": 0})
        assert "running as root" in refusal("root", engine=with_context({"runAsNonRoot": False}))
        restricted = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
        assert refusal("fine", engine=with_context(restricted)) == ""
        assert refusal("fine", podSecurityContext={"runAsNonRoot": True, "runAsUser": 1000}) == ""
        assert "Unconfined seccomp or AppArmor profile" in refusal(
            "sec", engine=with_context({"seccompProfile": {"type": "Unconfined"}})
        )
        assert "a sysctl" in refusal(
            "sysctl", podSecurityContext={"sysctls": [{"name": "kernel.msgmax", "value": "1"}]}
        )
        assert "custom SELinux" in refusal(
            "selinux", podSecurityContext={"seLinuxOptions": {"user": "system_u"}}
        )
        runtime = {"seccompProfile": {"type": "RuntimeDefault"}}
        assert refusal("fine", engine=with_context(runtime), podSecurityContext=runtime) == ""

        # Which nodes, and which Secrets, the operator's pods are steered to on the author's
        # behalf.
        assert "nodeSelector or of the node affinity" in refusal(
            "node", scheduling={"nodeSelector": {"node-role.kubernetes.io/control-plane": ""}}
        )
        pinned = {"key": "kubernetes.io/hostname", "operator": "In", "values": ["node-1"]}
        required = {"nodeSelectorTerms": [{"matchExpressions": [pinned]}]}
        assert "nodeSelector or of the node affinity" in refusal(
            "node",
            scheduling={
                "affinity": {
                    "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}
                }
            },
        )
        preferred = [
            {"weight": 1, "preference": {"matchFields": [{**pinned, "key": "metadata.name"}]}}
        ]
        assert "nodeSelector or of the node affinity" in refusal(
            "node",
            scheduling={
                "affinity": {
                    "nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": preferred}
                }
            },
        )
        h100 = {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["H100"]}
        gpu_node = {"nodeSelectorTerms": [{"matchExpressions": [h100]}]}
        allowed = {
            "nodeSelector": {"kubernetes.io/arch": "amd64"},
            "affinity": {
                "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": gpu_node}
            },
        }
        assert refusal("node", scheduling=allowed) == ""
        assert "the Secret kube-admin" in refusal(
            "secret",
            model={
                "name": "m",
                "source": {"huggingFace": {"tokenSecretRef": {"name": "kube-admin"}}},
            },
        )
        keyed = {
            **with_image("vllm/vllm-openai:v0.32.0"),
            "apiKeySecretRef": {"name": "db", "key": "k"},
        }
        assert "the Secret db" in refusal("secret", engine=keyed)
        assert (
            refusal(
                "secret",
                model={
                    "name": "m",
                    "source": {"huggingFace": {"tokenSecretRef": {"name": "hf-x"}}},
                },
            )
            == ""
        )
        # Elsewhere the policy does not apply.
        elsewhere = llmd("miner", "default", engine=with_image("evil.example/miner:1"))
        assert cluster.apply(elsewhere, "--dry-run=server").returncode == 0
    finally:
        cluster.kubectl("delete", "-f", "-", input=rendered, check=False)


def test_the_engine_kind_cannot_change_once_created(cluster: Cluster) -> None:
    """The serving pods' selector names the engine, and a Deployment's selector is immutable:
    the server refuses the edit, with a message that says what to do instead. Unset means
    vllm, so objects written without the field take every other edit."""
    obj = llmd("kind-fixed", "default")
    created = cluster.apply(obj)
    assert created.returncode == 0, created.stderr
    try:
        other = {**obj, "spec": {**obj["spec"], "engine": {**obj["spec"]["engine"]}}}
        other["spec"]["engine"]["kind"] = "another-engine"
        result = cluster.apply(other, "--dry-run=server")
        assert result.returncode != 0, "the server let spec.engine.kind change"
        assert "engine.kind cannot change" in result.stderr
        assert "no such key" not in result.stderr
        other["spec"]["engine"]["kind"] = "vllm"  # the same engine, now spelled out
        same = cluster.apply(other, "--dry-run=server")
        assert same.returncode == 0, same.stderr
        edited = {**obj, "spec": {**obj["spec"], "replicas": 2}}
        unrelated = cluster.apply(edited, "--dry-run=server")
        assert unrelated.returncode == 0, unrelated.stderr
    finally:
        cluster.kubectl(
            "delete", "llmd", "kind-fixed", "-n", "default", "--wait=false", check=False
        )


def test_a_malformed_duration_is_refused_with_what_to_write(cluster: Cluster) -> None:
    """The API server answers a duration that is not one with what a duration is, not with a
    regular expression."""
    obj = llmd("window", "default", slo={"window": "5 minutes", "ttft": {"maxSeconds": 2.0}})
    result = cluster.apply(obj, "--dry-run=server")
    assert result.returncode != 0
    assert "must be a duration: a number and a unit, e.g. 30s, 5m or 1h30m" in result.stderr
    assert "^([0-9]+" not in result.stderr


def test_helm_upgrade_between_cluster_wide_and_namespace_mode_and_uninstall_leave_nothing(
    cluster: Cluster,
) -> None:
    """A binding's roleRef cannot change: each mode's ClusterRoleBinding has its own name, so
    an upgrade replaces it; an uninstall leaves no cluster-scoped object of the release."""
    chart = str(ROOT / "charts" / "slotune")
    cluster.kubectl("create", "namespace", "modes-team")

    def cluster_scoped() -> set[str]:
        found = set()
        for kind in ("clusterrole", "clusterrolebinding"):
            out = cluster.kubectl("get", kind, "-o", "name").stdout.split()
            found |= {name for name in out if "/modes-" in name}
        return found

    common = ["--kubeconfig", str(cluster.kubeconfig), "--namespace", "modes-system"]
    cluster.helm("install", "modes", chart, "--create-namespace", *common)
    assert cluster_scoped() == {
        "clusterrole.rbac.authorization.k8s.io/modes-slotune",
        "clusterrolebinding.rbac.authorization.k8s.io/modes-slotune",
    }
    cluster.helm("upgrade", "modes", chart, *common, "--set", "watchNamespaces={modes-team}")
    assert cluster_scoped() == {
        "clusterrole.rbac.authorization.k8s.io/modes-slotune",
        "clusterrole.rbac.authorization.k8s.io/modes-slotune-crds",
        "clusterrolebinding.rbac.authorization.k8s.io/modes-slotune-crds",
    }
    cluster.helm("upgrade", "modes", chart, *common, "--reset-values")  # and back
    assert cluster_scoped() == {
        "clusterrole.rbac.authorization.k8s.io/modes-slotune",
        "clusterrolebinding.rbac.authorization.k8s.io/modes-slotune",
    }
    cluster.helm("uninstall", "modes", *common)
    assert cluster_scoped() == set()

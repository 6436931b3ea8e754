"""The Helm chart and the generated files: linted by the real helm, least privilege, and
checked for drift (a hand edit to any generated file fails the check)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from support.cluster import ROOT
from support.controlplane import bin_dir_from_env

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def helm() -> Path:
    return bin_dir_from_env() / "helm"


def rendered(helm: Path) -> list[dict[str, Any]]:
    out = subprocess.run(
        [
            str(helm),
            "template",
            "slotune",
            str(ROOT / "charts" / "slotune"),
            "-n",
            "slotune-system",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def test_chart_lints_strictly(helm: Path) -> None:
    result = subprocess.run(
        [str(helm), "lint", "--strict", str(ROOT / "charts" / "slotune")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_cluster_role_is_least_privilege(helm: Path) -> None:
    (role,) = [d for d in rendered(helm) if d["kind"] == "ClusterRole"]
    for rule in role["rules"]:
        for field in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule[field], rule
        assert "secrets" not in rule["resources"], rule
    status_rules = [r for r in role["rules"] if "llmdeployments" in r["resources"]]
    # The resource itself may be patched (Kopf's annotations) but never updated wholesale.
    assert "update" not in status_rules[0]["verbs"]


def test_operator_runs_non_root_read_only_with_a_liveness_probe(helm: Path) -> None:
    (deployment,) = [d for d in rendered(helm) if d["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    (container,) = pod["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert any("--liveness=" in arg for arg in container["args"])


def copy_of_repository(tmp_path: Path) -> Path:
    for part in ("crds", "charts", "manifests", "operator", "tools/argocd", "pyproject.toml"):
        source = ROOT / part
        if source.is_dir():
            shutil.copytree(source, tmp_path / part, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(source, tmp_path / part)
    return tmp_path


def check(root: Path, helm: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(ROOT / "scripts" / "generated.sh"), "check"],
        env={**os.environ, "ROOT": str(root), "HELM": str(helm)},
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.mark.parametrize(
    ("path", "edit", "named"),
    [
        ("crds/slotune.dev_llmdeployments.yaml", ("- llmd", "- llm"), "crds/"),
        (
            "charts/slotune/crds/slotune.dev_llmdeployments.yaml",
            ("- llmd", "- llm"),
            "charts/slotune/crds/",
        ),
        ("manifests/slotune.yaml", ('verbs: ["list", "watch"]', 'verbs: ["*"]'), "manifests/"),
        (
            "charts/slotune/templates/_helpers.tpl",  # the RBAC rules, shared by the roles
            ('"list", "watch"]', '"list"]'),
            "manifests/",
        ),
        (
            "tools/argocd/resource_customizations/slotune.dev/LLMDeployment/testdata/stale.yaml",
            ("generation: 3", "generation: 2"),
            "testdata/stale.yaml",
        ),
    ],
)
def test_drift_check_names_a_hand_edited_file(
    tmp_path: Path, helm: Path, path: str, edit: tuple[str, str], named: str
) -> None:
    root = copy_of_repository(tmp_path)
    assert check(root, helm).returncode == 0, check(root, helm).stderr
    target = root / path
    text = target.read_text()
    assert edit[0] in text
    target.write_text(text.replace(edit[0], edit[1], 1))
    result = check(root, helm)
    assert result.returncode == 1
    assert named in result.stderr

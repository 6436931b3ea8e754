"""The Argo CD health check has one source: `tools/argocd/.../health.lua`. The `argocd-cm`
example in docs/argocd.md carries it verbatim, and its test cases are what
`tools/argocd/cases.py` writes from the operator's own statuses. The check itself runs in
gopher-lua (`tests/integration/test_argocd_gopher_lua.py`)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "argocd.md"
CHECK = ROOT / "tools" / "argocd" / "resource_customizations" / "slotune.dev" / "LLMDeployment"
KEY = "resource.customizations.health.slotune.dev_LLMDeployment"


def documented_script() -> str:
    for block in re.findall(r"```yaml\n(.*?)```", DOC.read_text(), flags=re.DOTALL):
        config = yaml.safe_load(block)
        if isinstance(config, dict) and KEY in config.get("data", {}):
            script: str = config["data"][KEY]
            return script
    raise AssertionError(f"no {KEY} in {DOC}")


def test_the_documented_check_is_the_tested_one() -> None:
    assert documented_script() == (CHECK / "health.lua").read_text()


def test_the_cases_are_what_the_operator_writes() -> None:
    checked = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "argocd" / "cases.py"), "--check"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stderr


def test_every_case_has_its_object() -> None:
    listed = yaml.safe_load((CHECK / "health_test.yaml").read_text())["tests"]
    assert {t["inputPath"] for t in listed} == {
        f"testdata/{p.name}" for p in (CHECK / "testdata").glob("*.yaml")
    }
    assert {t["healthStatus"]["status"] for t in listed} == {
        "Healthy", "Progressing", "Degraded", "Suspended",
    }  # fmt: skip

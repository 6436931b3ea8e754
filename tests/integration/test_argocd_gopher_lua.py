"""The Argo CD health check in Argo CD's own Lua engine: `tools/argocd/health_test.go` runs
`health.lua` in gopher-lua over the cases of `health_test.yaml`, as Argo CD runs a resource
customization (tools/argocd/resource_customizations/slotune.dev/LLMDeployment/)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
import yaml

from support.cluster import ROOT

CASES = ROOT / "tools" / "argocd" / "resource_customizations" / "slotune.dev" / "LLMDeployment"

pytestmark = pytest.mark.integration


def test_the_health_check_passes_its_cases_in_gopher_lua() -> None:
    go = shutil.which("go") or "/usr/local/go/bin/go"
    env = {**os.environ, "GOFLAGS": "-mod=mod", "GOTOOLCHAIN": "local"}
    ran = subprocess.run(
        [go, "test", "-count=1", "-v", "./..."],
        cwd=ROOT / "tools" / "argocd", env=env, capture_output=True, text=True,
        timeout=600, check=False,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stdout + ran.stderr
    # Every case ran: a go test that found no cases would pass as well.
    cases = yaml.safe_load((CASES / "health_test.yaml").read_text())["tests"]
    assert ran.stdout.count("--- PASS: TestHealth/") == len(cases), ran.stdout

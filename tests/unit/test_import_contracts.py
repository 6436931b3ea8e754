"""The import contracts in pyproject.toml hold on the code and break when a layer is crossed:
each case copies the package, adds one import that crosses a line, and runs import-linter on
the copy with the project's own contracts."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def lint(tmp_path: Path, module: str = "", line: str = "") -> tuple[int, str]:
    """lint-imports over a copy of the package, `line` appended to `module` (a path under
    operator/slotune, created if new)."""
    shutil.copytree(ROOT / "operator" / "slotune", tmp_path / "operator" / "slotune")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    if module:
        target = tmp_path / "operator" / "slotune" / module
        with target.open("a") as handle:
            handle.write(f"\n{line}  # noqa\n")
    run = subprocess.run(
        [str(LINT_IMPORTS), "pyproject.toml", "--no-cache"],
        cwd=tmp_path,
        # A wide terminal, so that each contract's name and verdict share a line.
        env={"PYTHONPATH": str(tmp_path / "operator"), "PATH": "/usr/bin:/bin", "COLUMNS": "400"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return run.returncode, run.stdout + run.stderr


def test_the_contracts_hold_on_the_code(tmp_path: Path) -> None:
    code, out = lint(tmp_path)
    assert code == 0, out
    assert "0 broken" in out


@pytest.mark.parametrize(
    ("module", "line", "broken"),
    [
        # The pure core reaching up into the cluster side.
        ("render.py", "from slotune import study", "The layers"),
        # The API models depending on anything of ours.
        ("models.py", "from slotune import stats", "The layers"),
        # A module that did not exist when the contracts were written, importing Kopf.
        ("newcomer.py", "import kopf", "Only slotune.handlers imports kopf"),
        # A pure module starting a process.
        ("measure/capacity.py", "import subprocess", "The pure core neither"),
        # The Kubernetes client outside slotune.kube.
        ("reconcile.py", "import kubernetes", "Only slotune.kube imports the kubernetes"),
        # The study's transitions doing I/O instead of deciding from their observation.
        ("study/transitions.py", "from slotune import kube", "The pure core neither"),
        # An engine adapter reaching into the cluster side.
        ("engine/sglang/__init__.py", "from slotune import render", "The layers"),
        # The study judging a trial by the live verdict.
        ("study/trials.py", "from slotune.live import oncall", "The study decides"),
        # The tuner reading the live verdict.
        ("tuner/loop.py", "from slotune.live import oncall", "The tuner plans"),
        # The measurement reaching up into the tuner that plans with it.
        ("measure/probe.py", "from slotune.tuner import loop", "The layers"),
        # The edge's services reaching up into the Kopf module, or importing Kopf themselves.
        ("edge/reconciler.py", "from slotune import handlers", "The layers"),
        ("edge/resync.py", "import kopf", "Only slotune.handlers imports kopf"),
        # A row of the study's table doing I/O instead of deciding from its observation.
        ("study/launch.py", "from slotune import kube", "The pure core neither"),
    ],
)
def test_a_crossed_line_breaks_its_contract(
    tmp_path: Path, module: str, line: str, broken: str
) -> None:
    code, out = lint(tmp_path, module, line)
    assert code != 0, out
    # "<contract name> KEPT|BROKEN", maybe followed by "(n ignored imports)".
    verdicts = {m[1]: m[2] for m in re.finditer(r"^(.+?) (KEPT|BROKEN)(?: \(.*\))?$", out, re.M)}
    assert [n for n, v in verdicts.items() if v == "BROKEN" and n.startswith(broken)], out


def test_every_top_level_module_and_package_is_in_a_layer() -> None:
    """A module added at the top level belongs to a layer from its first line: the layers
    contract names packages and top-level modules, and one in no layer goes unchecked."""
    with (ROOT / "pyproject.toml").open("rb") as handle:
        config = tomllib.load(handle)
    layers = next(
        c["layers"] for c in config["tool"]["importlinter"]["contracts"] if c["type"] == "layers"
    )
    named = {name.strip() for layer in layers for name in layer.split("|")}
    package = ROOT / "operator" / "slotune"
    present = {
        f"slotune.{p.stem}"
        for p in package.iterdir()
        if (p.suffix == ".py" and p.name != "__init__.py")
        or (p.is_dir() and (p / "__init__.py").exists())
    }
    assert sorted(present - named) == []
    assert sorted(named - present) == []

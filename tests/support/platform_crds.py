"""The platform projects' own CRDs (the Prometheus Operator's, the Gateway API Inference
Extension's), fetched from their pinned Go modules by scripts/fetch-platform-crds.sh, for
tests that apply slotune's objects of those kinds to the real API server.

    install_platform_crds(cluster)  # PodMonitor, PrometheusRule, Prometheus, InferencePool ...
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from support.cluster import ROOT, Cluster


def platform_crd_dir() -> Path:
    """The folder of fetched CRD files (fetched on first use, cached)."""
    fetched = subprocess.run(
        [str(ROOT / "scripts" / "fetch-platform-crds.sh")],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return Path(fetched.stdout.strip().splitlines()[-1])


def install_platform_crds(cluster: Cluster) -> list[str]:
    """Applies every fetched CRD, waits until each is established, and returns their names."""
    folder = platform_crd_dir()
    # BaseLoader: every scalar a string (a Prometheus Operator CRD lists "=" among an enum's
    # values, which YAML 1.1's value tag makes unreadable to the safe loader).
    names = [
        yaml.load(path.read_text(), Loader=yaml.BaseLoader)["metadata"]["name"]  # noqa: S506 - BaseLoader builds no objects
        for path in sorted(folder.glob("*.yaml"))
    ]
    cluster.install_crds([folder], names)
    return names

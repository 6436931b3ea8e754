"""The platform projects' own CRDs (the Prometheus Operator's, the Gateway API Inference
Extension's), fetched from their pinned Go modules by scripts/fetch-platform-crds.sh, for
tests that apply slotune's objects of those kinds to the real API server.

    install_platform_crds(cluster)  # PodMonitor, PrometheusRule, Prometheus, InferencePool ...
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from support.cluster import ROOT, Cluster

PROMETHEUS_OPERATOR = (
    "podmonitors.monitoring.coreos.com",
    "prometheusrules.monitoring.coreos.com",
    "prometheuses.monitoring.coreos.com",
    "servicemonitors.monitoring.coreos.com",
)
INFERENCE_EXTENSION = ("inferencepools.inference.networking.k8s.io",)


def platform_crd_dir() -> Path:
    """The folder of fetched CRD files (fetched on first use, cached)."""
    fetched = subprocess.run(
        [str(ROOT / "scripts" / "fetch-platform-crds.sh")],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return Path(fetched.stdout.strip().splitlines()[-1])


def install_platform_crds(cluster: Cluster) -> None:
    """Applies every fetched CRD and waits until each is established."""
    cluster.install_crds([platform_crd_dir()], [*PROMETHEUS_OPERATOR, *INFERENCE_EXTENSION])

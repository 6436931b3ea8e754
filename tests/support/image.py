"""The operator image under a real OCI runtime: podman with runc, configured by the project's
own containers.conf (scripts/containers/), and hardened as the chart and the trial Job run it:
the image's own non-root user, a read-only root with /tmp as the only writable place, every
capability dropped, no privilege escalation.

The image is the one `make image` builds (scripts/build-image.sh, cached: a no-op once built);
SLOTUNE_OPERATOR_IMAGE names another one already in podman's storage.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from support.kubelet import Image
from support.procs import script_path

ROOT = Path(__file__).resolve().parents[2]
CONTAINERS_CONF = ROOT / "scripts" / "containers" / "containers.conf"
HARDENED = (
    "--read-only",
    "--read-only-tmpfs=false",  # no writable /run, /var/tmp: only what is mounted below
    "--tmpfs=/tmp:rw,size=256m,mode=1777",  # the chart's emptyDir
    "--cap-drop=ALL",
    "--security-opt=no-new-privileges",
    "--network=host",  # the test control plane and engines listen on the host's loopback
)


def operator_image() -> str:
    """The image's full name (docker.io/slotune/operator:<version>), built if need be."""
    configured = os.environ.get("SLOTUNE_OPERATOR_IMAGE")
    if configured:
        return configured
    return str(script_path(ROOT / "scripts" / "build-image.sh"))


def podman_env() -> dict[str, str]:
    return {**os.environ, "CONTAINERS_CONF": str(CONTAINERS_CONF)}


def podman(
    *args: str, timeout: float = 120, check: bool = True
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        ["podman", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=podman_env(),
        check=False,
    )
    if check and result.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    return result


def run_argv(
    image: str,
    args: Sequence[str],
    *,
    name: str | None = None,
    mounts: Mapping[Path, str] = {},
    env: Mapping[str, str] = {},
    entrypoint: str | None = None,
) -> list[str]:
    """`podman run` of the image, hardened, with host files mounted at container paths."""
    argv = ["podman", "run", "--rm", *HARDENED]
    if name is not None:
        argv += ["--name", name, "--replace"]
    for host, path in mounts.items():
        argv += ["--volume", f"{host}:{path}:rw"]
    for key, value in env.items():
        argv += ["--env", f"{key}={value}"]
    if entrypoint is not None:
        argv += ["--entrypoint", entrypoint]
    return [*argv, image, *args]


def kubelet_image(name: str | None = None) -> Image:
    """The operator image as the test kubelet runs it: a real container under podman."""
    name = name or operator_image()
    (found,) = json.loads(podman("image", "inspect", name).stdout)
    user = found.get("Config", {}).get("User", "")
    return Image(name=name, user=user, env={"CONTAINERS_CONF": str(CONTAINERS_CONF)})

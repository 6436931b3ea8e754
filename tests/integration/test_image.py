"""The operator image (`make image`) under a real OCI runtime, podman with runc: its shape, and
`slotune operator` in a container reconciling a sample against the real kube-apiserver, under
the chart's ServiceAccount and RBAC, as the chart runs it (non-root, read-only root, every
capability dropped)."""

from __future__ import annotations

import json
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from support.cluster import Cluster, OperatorProcess, wait_for
from support.image import CONTAINERS_CONF, ROOT, operator_image, podman, run_argv

pytestmark = pytest.mark.integration

UID = "65532"


@pytest.fixture(scope="module")
def image() -> str:
    return operator_image()


def inspect(image: str) -> dict[str, Any]:
    (found,) = json.loads(podman("image", "inspect", image).stdout)
    return found


def run(image: str, *args: str, entrypoint: str | None = None) -> tuple[int, str]:
    argv = run_argv(image, args, entrypoint=entrypoint)
    result = podman(*argv[1:], check=False)
    return result.returncode, result.stdout + result.stderr


def test_the_image_has_the_charts_name_and_runs_as_a_numeric_non_root_user(image: str) -> None:
    chart = yaml.safe_load((ROOT / "charts" / "slotune" / "Chart.yaml").read_text())
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert chart["appVersion"] == version
    # The chart's slotune/operator:<appVersion>, as a container runtime normalises it.
    assert image == f"docker.io/slotune/operator:{chart['appVersion']}"
    config = inspect(image)["Config"]
    assert config["User"] == f"{UID}:{UID}"  # numeric: runAsNonRoot can verify it
    assert config["Entrypoint"] == ["slotune"]
    assert config["Cmd"] == ["operator"]
    assert run(image, "-u", entrypoint="id") == (0, f"{UID}\n")


def test_the_image_works_with_a_read_only_root_and_holds_no_pip_or_plots(image: str) -> None:
    code, out = run(image, "--help")
    assert code == 0, out
    assert "trial-load" in out
    # Read-only: writing anywhere but /tmp fails; bytecode was compiled at build time.
    code, out = run(image, "-c", "touch /opt/slotune/x", entrypoint="sh")
    assert code != 0
    assert "Read-only file system" in out
    code, out = run(
        image,
        "-c",
        "import importlib.util as u, os, sys, slotune.cli as cli;"
        "print(u.find_spec('pip'), u.find_spec('matplotlib'), sys.flags.dont_write_bytecode,"
        " os.path.exists(u.cache_from_source(cli.__file__)))",
        entrypoint="python3",
    )
    # No pip, no plotting stack (the `plots` extra), and bytecode precompiled.
    assert (code, out) == (0, "None None 1 True\n")


JEMALLOC_SETTINGS = """
import ctypes, os, sys
lib = ctypes.CDLL(None)
def opt(name, kind):
    value, size = kind(), ctypes.c_size_t(ctypes.sizeof(kind))
    failed = lib.mallctl(
        name.encode(), ctypes.byref(value), ctypes.byref(size), None, ctypes.c_size_t(0)
    )
    return None if failed else value.value
print('libjemalloc.so.2' in open('/proc/self/maps').read(), os.environ.get('PYTHONMALLOC'),
      sys.getallocatedblocks(), opt('opt.narenas', ctypes.c_uint),
      opt('opt.background_thread', ctypes.c_bool),
      opt('opt.tcache_nslots_small_max', ctypes.c_uint))
"""


def test_the_image_allocates_with_jemalloc(image: str) -> None:
    """Every allocation from jemalloc, which gives freed memory back, with the settings the
    churn figures were measured with (bench/results/scale.md, "Where the rest was")."""
    code, out = run(image, "-c", JEMALLOC_SETTINGS, entrypoint="python3")
    # Loaded; Python's own small-object allocator off (it holds no blocks); two arenas, the
    # background purge, thread caches of 20 (a misspelt setting reads as jemalloc's default
    # and prints "Invalid conf pair", which would be in `out` too).
    assert (code, out) == (0, "True malloc 0 2 True 20\n")


@pytest.fixture
def image_operator(
    cluster: Cluster,
    operator: OperatorProcess,
    operator_kubeconfig: Path,
    image: str,
    tmp_path: Path,
) -> Iterator[OperatorProcess]:
    """The operator from the image, alone: the session's operator from this checkout is
    stopped meanwhile, or both would reconcile the sample."""
    operator.stop()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(operator_kubeconfig.read_text())
    kubeconfig.chmod(0o644)  # readable by the image's user
    process = OperatorProcess(
        operator_kubeconfig,
        tmp_path / "image-operator.log",
        env={"CONTAINERS_CONF": str(CONTAINERS_CONF)},  # podman's, not the container's
        argv=run_argv(
            image,
            ["operator", "--kubeconfig=/config/kubeconfig"],
            name="slotune-image-operator",
            mounts={kubeconfig: "/config/kubeconfig"},
            env={"SLOTUNE_RESYNC_SECONDS": "3"},
        ),
    )
    try:
        process.start()
        yield process
    finally:
        process.stop()
        operator.start()


def test_the_operator_in_the_image_reconciles_a_sample(
    cluster: Cluster, image_operator: OperatorProcess, namespace: str
) -> None:
    sample = yaml.safe_load((ROOT / "samples" / "llama-8b.yaml").read_text())
    sample["metadata"]["namespace"] = namespace
    assert cluster.apply(sample).returncode == 0
    dep = wait_for("the Deployment", lambda: cluster.get("deployment", "llama-8b", namespace))
    assert wait_for("the Service", lambda: cluster.get("service", "llama-8b", namespace))
    (engine,) = dep["spec"]["template"]["spec"]["containers"]
    assert engine["image"] == "vllm/vllm-openai:v0.32.0"
    assert "--max-num-batched-tokens" in engine["args"]
    obj = wait_for(
        "the sample's status",
        lambda: (
            (o := cluster.get("llmd", "llama-8b", namespace))
            and o.get("status", {}).get("observedGeneration")
            and o
        ),
    )
    assert obj["status"]["phase"] == "Deploying"
    log = image_operator.log()
    assert "Started the slotune operator" in log
    assert "Traceback" not in log, log

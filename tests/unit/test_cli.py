"""The command line loads only what a command needs: `slotune tune` and `slotune loadgen`
run where the Kubernetes client and Kopf are not installed (a GPU box, a CI job)."""

import subprocess
import sys


def test_importing_the_cli_loads_neither_kopf_nor_the_kubernetes_client() -> None:
    code = "import sys, slotune.cli; print(sorted({'kopf', 'kubernetes'} & set(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"

"""The main job, for now: slotune's operator on a local upstream control plane.

Starts etcd, kube-apiserver (RBAC on) and kube-controller-manager, installs the CRD and the
chart's RBAC, runs `slotune operator` under the chart's ServiceAccount, applies the sample
LLMDeployments (and one with a flag vLLM does not have), and shows what an on-call engineer
sees: `kubectl get llmd`, the children, the conditions and the events. The control plane has
no nodes, so the vLLM pods stay Pending. `--keep` leaves everything running until Ctrl-C.
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from support.cluster import Cluster, OperatorProcess, wait_for  # noqa: E402
from support.controlplane import ControlPlane, bin_dir_from_env  # noqa: E402

BROKEN = """\
apiVersion: slotune.dev/v1alpha1
kind: LLMDeployment
metadata: {name: copied-from-a-blog, namespace: default}
spec:
  model: {name: Qwen/Qwen2.5-0.5B-Instruct}
  engine:
    image: vllm/vllm-openai:v0.32.0
    extraArgs: ["--chunked-prefill-size", "4096", "--swap-space", "4"]
"""


def show(cluster: Cluster, title: str, *args: str) -> None:
    print(f"\n$ kubectl {' '.join(args)}    # {title}", flush=True)
    print(cluster.kubectl(*args, check=False).stdout.rstrip(), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keep", action="store_true", help="keep running until Ctrl-C")
    options = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="slotune-demo-"))
    bin_dir = bin_dir_from_env()
    print(f"Starting etcd, kube-apiserver and kube-controller-manager from {bin_dir}", flush=True)
    with ControlPlane(bin_dir, work / "control-plane") as plane:
        cluster = Cluster(plane, bin_dir)
        cluster.install_crd()
        kubeconfig = cluster.install_operator_rbac(work / "operator.kubeconfig")
        operator = OperatorProcess(kubeconfig, work / "operator.log")
        operator.start()
        print(f"Operator running as the chart's ServiceAccount (log: {operator.log_path})")
        try:
            for sample in sorted((ROOT / "samples").glob("*.yaml")):
                show(cluster, "a sample", "apply", "-f", str(sample))
            print(f"\n$ kubectl apply -f - <<EOF\n{BROKEN}EOF")
            print(cluster.apply(BROKEN).stdout.rstrip())

            def every_phase_known() -> bool:
                phases = cluster.kubectl(
                    "get", "llmd", "-A", "-o", "jsonpath={range .items[*]}{.status.phase},{end}"
                ).stdout.split(",")[:-1]
                return bool(phases) and all(phases)

            wait_for("every LLMDeployment to get a phase", every_phase_known, timeout=60)
            show(cluster, "what on-call sees", "get", "llmd", "-A")
            show(cluster, "what slotune made", "get", "deploy,rs,svc,pods", "-n", "default")
            show(
                cluster, "the engine flags slotune rendered",
                "get", "deploy", "llama-8b",
                "-o", "jsonpath={.spec.template.spec.containers[0].args}",
            )  # fmt: skip
            show(
                cluster, "why the broken one is not served",
                "get", "llmd", "copied-from-a-blog",
                "-o", "jsonpath={.status.conditions[?(@.type=='Ready')].message}",
            )  # fmt: skip
            show(
                cluster, "events on transitions",
                "get", "events", "-n", "default",
                "--field-selector", "involvedObject.kind=LLMDeployment",
                "--sort-by", ".lastTimestamp",
            )  # fmt: skip
            if options.keep:
                print(f"\nexport KUBECONFIG={plane.admin_kubeconfig}\nRunning; Ctrl-C stops.")
                signal.sigwait({signal.SIGINT, signal.SIGTERM})
            else:
                time.sleep(0.1)
        finally:
            operator.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

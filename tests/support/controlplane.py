"""A real, local Kubernetes control plane for tests: etcd + kube-apiserver +
kube-controller-manager, built from upstream sources by
``scripts/build-control-plane.sh``.

No nodes/kubelets: Pods are created (by the ReplicaSet controller) but stay
Pending. RBAC is on (``--authorization-mode=Node,RBAC``), ServiceAccount
admission is on, the garbage collector and all other default controllers run.

Standard library only; certificates are made with the ``openssl`` CLI.

Library use::

    from support.controlplane import ControlPlane, bin_dir_from_env
    with ControlPlane(bin_dir_from_env(build=True), tmp_path) as cp:
        subprocess.run(["kubectl", "--kubeconfig", cp.admin_kubeconfig, "get", "ns"])

CLI use (blocks until SIGINT/SIGTERM)::

    cd tests && python -m support.controlplane [--bin-dir DIR] [--work-dir DIR]
"""

from __future__ import annotations

import argparse
import atexit
import base64
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from support.procs import free_ports, log_tail, script_path

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "scripts" / "build-control-plane.sh"
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kubectl", "helm")

# /16: room for 65,000 Services, i.e. thousands of LLMDeployments (bench/scale.py makes 500)
SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/16"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"


class ControlPlaneError(RuntimeError):
    pass


# --------------------------------------------------------------------------
# locating binaries


def missing_binaries(bin_dir: Path) -> list[str]:
    return [b for b in BINARIES if not os.access(Path(bin_dir) / b, os.X_OK)]


def bin_dir_from_env(build: bool = False) -> Path:
    """Directory holding etcd, kube-apiserver, kube-controller-manager,
    kubectl and helm.

    ``$SLOTUNE_K8S_BIN`` wins if set. Otherwise the cache directory of
    ``scripts/build-control-plane.sh``; with ``build=True`` the script is run
    (a no-op when already built, a long build otherwise) so the binaries exist.
    """
    env = os.environ.get("SLOTUNE_K8S_BIN")
    if env:
        return Path(env)
    # With --print-dir the script only names the directory; without it, it builds first.
    return script_path(BUILD_SCRIPT) if build else script_path(BUILD_SCRIPT, "--print-dir")


# --------------------------------------------------------------------------
# helpers


def _openssl(*args: str, cwd: Path) -> None:
    proc = subprocess.run(
        ["openssl", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise ControlPlaneError(f"openssl {' '.join(args)} failed:\n{proc.stdout}")


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def write_kubeconfig(
    path: Path,
    server: str,
    ca_file: Path,
    *,
    user: str,
    token: str | None = None,
    cert_file: Path | None = None,
    key_file: Path | None = None,
    namespace: str | None = None,
) -> Path:
    """Write a self-contained kubeconfig (JSON, which is valid YAML)."""
    user_entry: dict[str, str] = {}
    if token is not None:
        user_entry["token"] = token
    if cert_file is not None and key_file is not None:
        user_entry["client-certificate-data"] = _b64(cert_file)
        user_entry["client-key-data"] = _b64(key_file)
    context: dict[str, str] = {"cluster": "slotune-test", "user": user}
    if namespace:
        context["namespace"] = namespace
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "slotune-test",
                "cluster": {"server": server, "certificate-authority-data": _b64(ca_file)},
            }
        ],
        "users": [{"name": user, "user": user_entry}],
        "contexts": [{"name": "slotune-test", "context": context}],
        "current-context": "slotune-test",
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(cfg, indent=2) + "\n")
    path.chmod(0o600)
    return path


# --------------------------------------------------------------------------


class ControlPlane:
    """etcd + kube-apiserver (+ kube-controller-manager) on random 127.0.0.1 ports.

    Attributes (valid after ``start()``):
      server            https://127.0.0.1:<port>
      ca_file           CA that signed the apiserver serving cert and client certs
      admin_kubeconfig  kubeconfig of user "slotune-admin" in group system:masters
      admin_token       static bearer token of a system:masters user (same rights)
      etcd_url          http://127.0.0.1:<port>
      work_dir          certs, kubeconfigs, etcd data and *.log files
    """

    def __init__(
        self,
        bin_dir: Path,
        work_dir: Path,
        *,
        controller_manager: bool = True,
        apiserver_args: Sequence[str] = (),
    ):
        self.bin_dir = Path(bin_dir).resolve()
        self.work_dir = Path(work_dir).resolve()
        self.controller_manager = controller_manager
        self.apiserver_args = list(apiserver_args)  # e.g. an audit log, for bench/scale.py
        self.pki = self.work_dir / "pki"
        self.ca_file = self.pki / "ca.crt"
        self.admin_kubeconfig = self.work_dir / "admin.kubeconfig"
        self.admin_token = "slotune-admin-" + base64.b32encode(os.urandom(10)).decode().lower()
        self.server = ""
        self.etcd_url = ""
        self._procs: list[tuple[str, subprocess.Popen, Path]] = []
        self._stopped = True
        self._lock = threading.Lock()

    # -- public API -------------------------------------------------------

    @property
    def kubectl(self) -> Path:
        return self.bin_dir / "kubectl"

    @property
    def helm(self) -> Path:
        return self.bin_dir / "helm"

    def start(self, timeout: float = 120) -> None:
        missing = missing_binaries(self.bin_dir)
        if missing:
            raise ControlPlaneError(
                f"missing binaries in {self.bin_dir}: {', '.join(missing)} (run {BUILD_SCRIPT})"
            )
        deadline = time.monotonic() + timeout
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self._stopped = False
        atexit.register(self.stop)
        try:
            etcd_client, etcd_peer, api_port, kcm_port = free_ports(4)
            self.server = f"https://127.0.0.1:{api_port}"
            self.etcd_url = f"http://127.0.0.1:{etcd_client}"
            self._make_pki()
            self._start_etcd(etcd_client, etcd_peer)
            self._wait_etcd(deadline)
            self._start_apiserver(api_port)
            self._wait_apiserver(deadline)
            if self.controller_manager:
                self._start_controller_manager(kcm_port)
            self._wait_default_namespace(deadline)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            # reverse start order: controller-manager, apiserver, etcd
            for _name, proc, _log in reversed(self._procs):
                if proc.poll() is None:
                    proc.terminate()
                    try:
                        proc.wait(timeout=10)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait(timeout=10)
            self._procs.clear()
        atexit.unregister(self.stop)

    def kubeconfig_for_token(self, token: str, path: Path, *, namespace: str | None = None) -> Path:
        return write_kubeconfig(
            path, self.server, self.ca_file, user="token-user", token=token, namespace=namespace
        )

    def kubectl_run(
        self,
        *args: str,
        kubeconfig: Path | None = None,
        check: bool = True,
        input: str | None = None,
        timeout: float = 60,
    ) -> subprocess.CompletedProcess:
        """Run kubectl (admin kubeconfig by default); returns CompletedProcess (text)."""
        cmd = [str(self.kubectl), "--kubeconfig", str(kubeconfig or self.admin_kubeconfig), *args]
        proc = subprocess.run(
            cmd, input=input, capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and proc.returncode != 0:
            raise ControlPlaneError(
                f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
            )
        return proc

    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- PKI ----------------------------------------------------------------

    def _make_pki(self) -> None:
        p = self.pki
        p.mkdir(parents=True, exist_ok=True)
        ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        _openssl(
            "req",
            "-x509",
            *ec,
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "3650",
            "-subj",
            "/CN=slotune-test-ca",
            cwd=p,
        )

        def issue(name: str, subj: str, ext: str) -> None:
            (p / f"{name}.ext").write_text(ext)
            _openssl(
                "req",
                "-new",
                *ec,
                "-keyout",
                f"{name}.key",
                "-out",
                f"{name}.csr",
                "-subj",
                subj,
                cwd=p,
            )
            _openssl(
                "x509",
                "-req",
                "-in",
                f"{name}.csr",
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                f"{name}.crt",
                "-days",
                "3650",
                "-extfile",
                f"{name}.ext",
                cwd=p,
            )

        issue(
            "apiserver",
            "/CN=kube-apiserver",
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
            "extendedKeyUsage=serverAuth\n"
            "subjectAltName=IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,"
            "DNS:kubernetes.default,DNS:kubernetes.default.svc,"
            "DNS:kubernetes.default.svc.cluster.local\n",
        )
        client_ext = (
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
            "extendedKeyUsage=clientAuth\n"
        )
        issue("admin", "/O=system:masters/CN=slotune-admin", client_ext)
        # The aggregation layer's front proxy: the API server presents this client
        # certificate to the API services it proxies to (a metrics adapter), which trust the
        # user it names in its headers because the CA is the one in
        # kube-system/extension-apiserver-authentication.
        _openssl("req", "-x509", *ec, "-keyout", "front-proxy-ca.key",
                 "-out", "front-proxy-ca.crt", "-days", "3650", "-subj", "/CN=front-proxy-ca",
                 cwd=p)  # fmt: skip
        (p / "front-proxy-client.ext").write_text(client_ext)
        _openssl("req", "-new", *ec, "-keyout", "front-proxy-client.key", "-out",
                 "front-proxy-client.csr", "-subj", "/CN=front-proxy-client", cwd=p)  # fmt: skip
        _openssl("x509", "-req", "-in", "front-proxy-client.csr", "-CA", "front-proxy-ca.crt",
                 "-CAkey", "front-proxy-ca.key", "-CAcreateserial", "-out",
                 "front-proxy-client.crt", "-days", "3650", "-extfile", "front-proxy-client.ext",
                 cwd=p)  # fmt: skip
        issue("kube-controller-manager", "/CN=system:kube-controller-manager", client_ext)
        # ServiceAccount token signing key.
        _openssl(
            "genpkey",
            "-algorithm",
            "EC",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-out",
            "sa.key",
            cwd=p,
        )
        _openssl("pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=p)
        # Static token (a second way to be cluster-admin).
        (p / "tokens.csv").write_text(
            f'{self.admin_token},slotune-admin-token,admin-token-uid,"system:masters"\n'
        )

        write_kubeconfig(
            self.admin_kubeconfig,
            self.server,
            self.ca_file,
            user="slotune-admin",
            cert_file=p / "admin.crt",
            key_file=p / "admin.key",
        )
        write_kubeconfig(
            self.work_dir / "kube-controller-manager.kubeconfig",
            self.server,
            self.ca_file,
            user="system:kube-controller-manager",
            cert_file=p / "kube-controller-manager.crt",
            key_file=p / "kube-controller-manager.key",
        )

    # -- processes ------------------------------------------------------------

    def _spawn(self, name: str, args: list[str]) -> None:
        log = self.work_dir / f"{name}.log"
        with log.open("ab") as fh:
            proc = subprocess.Popen(
                [str(self.bin_dir / name), *args],
                stdout=fh,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.work_dir,
                start_new_session=True,  # Ctrl-C in a terminal goes to us, not to them
            )
        self._procs.append((name, proc, log))

    def _check_alive(self) -> None:
        for name, proc, log in self._procs:
            if proc.poll() is not None:
                raise ControlPlaneError(
                    f"{name} exited with code {proc.returncode}; tail of {log}:\n{log_tail(log)}"
                )

    def _timeout(self, what: str, name: str) -> ControlPlaneError:
        log = self.work_dir / f"{name}.log"
        return ControlPlaneError(f"timed out waiting for {what}; tail of {log}:\n{log_tail(log)}")

    def _start_etcd(self, client: int, peer: int) -> None:
        data = self.work_dir / "etcd-data"
        if data.exists():
            shutil.rmtree(data)
        peer_url = f"http://127.0.0.1:{peer}"
        self._spawn(
            "etcd",
            [
                "--name=default",
                f"--data-dir={data}",
                f"--listen-client-urls={self.etcd_url}",
                f"--advertise-client-urls={self.etcd_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=default={peer_url}",
                "--unsafe-no-fsync=true",
                "--log-level=warn",
            ],
        )

    def _wait_etcd(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                with urllib.request.urlopen(self.etcd_url + "/health", timeout=2) as r:  # noqa: S310 - our http(s) URL
                    if json.loads(r.read()).get("health") == "true":
                        return
            except (OSError, ValueError):
                pass
            time.sleep(0.2)
        raise self._timeout("etcd /health", "etcd")

    def _start_apiserver(self, port: int) -> None:
        p = self.pki
        self._spawn(
            "kube-apiserver",
            [
                f"--etcd-servers={self.etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={port}",
                f"--tls-cert-file={p / 'apiserver.crt'}",
                f"--tls-private-key-file={p / 'apiserver.key'}",
                f"--client-ca-file={p / 'ca.crt'}",
                f"--token-auth-file={p / 'tokens.csv'}",
                "--authorization-mode=Node,RBAC",
                f"--service-account-key-file={p / 'sa.pub'}",
                f"--service-account-signing-key-file={p / 'sa.key'}",
                f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
                f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
                "--allow-privileged=true",
                "--enable-priority-and-fairness=false",
                # 127.0.0.1 is not a valid Endpoints address; no kubelets need it anyway.
                "--endpoint-reconciler-type=none",
                "--profiling=false",
                f"--cert-dir={self.work_dir / 'apiserver-certs'}",
                # The aggregation layer (an external metrics adapter for the HPA): requests
                # to an APIService go to its Service's endpoints (no kube-proxy here).
                f"--requestheader-client-ca-file={p / 'front-proxy-ca.crt'}",
                "--requestheader-allowed-names=front-proxy-client",
                "--requestheader-username-headers=X-Remote-User",
                "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                f"--proxy-client-cert-file={p / 'front-proxy-client.crt'}",
                f"--proxy-client-key-file={p / 'front-proxy-client.key'}",
                "--enable-aggregator-routing=true",
                *self.apiserver_args,
            ],
        )

    def _ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        ctx.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
        return ctx

    def _get(self, path: str, ctx: ssl.SSLContext) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(self.server + path, context=ctx, timeout=5) as r:  # noqa: S310
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def _wait_apiserver(self, deadline: float) -> None:
        ctx = self._ssl_context()
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                status, _ = self._get("/readyz", ctx)
                if status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.5)
        raise self._timeout("kube-apiserver /readyz", "kube-apiserver")

    def _wait_default_namespace(self, deadline: float) -> None:
        ctx = self._ssl_context()
        paths = ["/api/v1/namespaces/default"]
        if self.controller_manager:
            # created by the controller-manager's serviceaccount controller
            paths.append("/api/v1/namespaces/default/serviceaccounts/default")
        for path in paths:
            while True:
                self._check_alive()
                try:
                    status, _ = self._get(path, ctx)
                    if status == 200:
                        break
                except OSError:
                    pass
                if time.monotonic() >= deadline:
                    name = (
                        "kube-controller-manager" if "serviceaccounts" in path else "kube-apiserver"
                    )
                    raise self._timeout(path, name)
                time.sleep(0.5)

    def _start_controller_manager(self, port: int) -> None:
        p = self.pki
        kubeconfig = self.work_dir / "kube-controller-manager.kubeconfig"
        self._spawn(
            "kube-controller-manager",
            [
                f"--kubeconfig={kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={self.work_dir / 'kcm-certs'}",
                "--controllers=*",
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={p / 'sa.key'}",
                f"--root-ca-file={p / 'ca.crt'}",
                f"--cluster-signing-cert-file={p / 'ca.crt'}",
                f"--cluster-signing-key-file={p / 'ca.key'}",
                f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
                "--leader-elect=false",
                "--profiling=false",
            ],
        )


# --------------------------------------------------------------------------
# CLI


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description="Run a local Kubernetes control plane until SIGINT/SIGTERM."
    )
    ap.add_argument(
        "--bin-dir",
        type=Path,
        help="default: $SLOTUNE_K8S_BIN or the build script's cache dir (built if missing)",
    )
    ap.add_argument("--work-dir", type=Path, help="default: a new temp dir")
    ap.add_argument("--no-controller-manager", action="store_true")
    ap.add_argument("--timeout", type=float, default=120)
    args = ap.parse_args(argv)

    bin_dir = args.bin_dir or bin_dir_from_env(build=True)
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="slotune-cp-"))
    cp = ControlPlane(bin_dir, work_dir, controller_manager=not args.no_controller_manager)

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    print(f"starting control plane in {work_dir} ...", file=sys.stderr, flush=True)
    cp.start(timeout=args.timeout)
    try:
        print(f"export KUBECONFIG={cp.admin_kubeconfig}", flush=True)
        print(f"export PATH={cp.bin_dir}:$PATH", flush=True)
        print(
            f"# server {cp.server}; logs in {work_dir}; Ctrl-C to stop", file=sys.stderr, flush=True
        )
        while not stop.wait(1):
            for name, proc, log in cp._procs:
                if proc.poll() is not None:
                    print(
                        f"{name} exited ({proc.returncode}); tail of {log}:\n{log_tail(log)}",
                        file=sys.stderr,
                        flush=True,
                    )
                    return 1
    finally:
        cp.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

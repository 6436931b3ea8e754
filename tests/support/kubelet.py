"""A kubelet for tests: runs what pods ask for as local processes and reports them through the
Kubernetes API, so that end-to-end tests see pods run, become Ready, fail and complete.

The test control plane (support.controlplane) has no scheduler and no kubelet: pods stay
Pending. `Kubelet` plays both parts for one Node:

- it registers the Node and keeps it alive (Lease renewals, Ready heartbeats), so that
  kube-controller-manager's node lifecycle controller never taints it or evicts its pods;
- it binds the unscheduled pods created since it started (or those `schedule` selects);
- it runs each container's command as a local process group, on a loopback IP of the pod's
  own (127.0.0.N), with the pod's env (and KUBERNETES_SERVICE_HOST/PORT, the API server's
  address, as every kubelet sets them), its emptyDir, projected and persistentVolumeClaim
  volumes (the projected ServiceAccount token that admission adds to every pod: a
  TokenRequest bound to the pod, the cluster's CA from kube-root-ca.crt, the namespace) and
  its termination-message file mapped to local paths, and the output in a log file per
  container;
- it reports status as a kubelet does: phase, container states, restarts with back-off,
  termination messages, probes and conditions; it honours deletion with a grace period;
- it lists the pods annotated `prometheus.io/scrape: "true"` in a Prometheus file_sd file.

A pod whose image is one of the kubelet's `images` (the operator image, `make image`) runs as
a real container under podman and runc, with its command, args, env, emptyDir, claim and
projected volumes (read-only), termination-message file and securityContext. Other pods
have no image here: a container's command (`command` + `args`) is looked up by prefix in a
table of `Executable`s.
`operator_commands()` is the table for the operator's pods: the vLLM
image's `python3 -m vllm.entrypoints.openai.api_server` runs with the vLLM CPU environment's
python and listens on the pod's IP; the operator image's `slotune` runs this checkout's.

Library use::

    from support.kubelet import Kubelet, operator_commands
    with Kubelet(cluster.kubeconfig, tmp_path, operator_commands(vllm_python())) as kubelet:
        ...  # pods of Deployments, Jobs and bare pods now run
        kubelet.fail_pods(lambda pod: ..., "CUDA out of memory")  # until clear_faults()
        kubelet.kill_container(namespace, pod, container)  # SIGKILL; restartPolicy decides
        PrometheusServer(prometheus_binary(), prom_dir, file_sd=kubelet.file_sd)
        print(kubelet.log_tails())  # or kubelet.logs(namespace, pod, container)

A persistentVolumeClaim is kept small: each claim is one folder under the work dir's `claims/`,
made at first use and shared by every pod that mounts it, as a ReadWriteMany claim is (a
shared model or compile cache); the claim object itself is never read, so nothing is bound,
sized or refused for its access modes.

Not modelled: init and ephemeral containers, exec and gRPC probes (they always pass), volumes
of other kinds (an image volume among them), token rotation (a projected token is requested at
each container start and lives its expirationSeconds), resource limits and admission (every
pod fits), `hostNetwork`, `workingDir`, readiness gates, `kubectl logs`/`exec` (there is no
kubelet server).
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import http.client
import json
import logging
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from slotune.engine.vllm import ENGINE as VLLM

log = logging.getLogger(__name__)

Pod = dict[str, Any]
Lookup = Callable[[str, str, str], dict[str, Any] | None]
"""(resource, namespace, name) -> the object, or None when it does not exist."""
TokenSource = Callable[[Pod, dict[str, Any]], str]
"""(pod, a projected serviceAccountToken source) -> a token of the pod's ServiceAccount."""

NODE_NAME = "slotune-test-node"
HOST_IP = "127.0.0.1"
LEASE_NAMESPACE = "kube-node-lease"
LEASE_SECONDS = 40
RENEW_SECONDS = 10  # the real kubelet renews its Lease at a quarter of its duration
DEFAULT_TERMINATION_PATH = "/dev/termination-log"
# The real kubelet's limits: a termination message is the last 4 KiB of the file; the log
# fallback is the last 80 lines of the log, at most 2 KiB.
MAX_MESSAGE_BYTES = 4096
FALLBACK_LOG_LINES = 80
FALLBACK_LOG_BYTES = 2048
INITIAL_BACKOFF_SECONDS = 1.0
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
PROBES = ("startup", "readiness", "liveness")


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _now_micro() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# --------------------------------------------------------------------------------------------
# The API server, over plain HTTPS


class ApiError(RuntimeError):
    """The API server answered with an error status."""

    def __init__(self, method: str, path: str, status: int, body: str) -> None:
        super().__init__(f"{method} {path} answered {status}: {body[:500]}")
        self.status = status


def _named(entries: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next(entry for entry in entries if entry["name"] == name)


class KubeApi:
    """JSON over HTTPS to the API server, as the current context of a kubeconfig (client
    certificate or bearer token)."""

    def __init__(self, kubeconfig: Path, credentials_dir: Path) -> None:
        config = yaml.safe_load(Path(kubeconfig).read_text())
        context = _named(config["contexts"], config["current-context"])["context"]
        cluster = _named(config["clusters"], context["cluster"])["cluster"]
        user = _named(config["users"], context["user"])["user"]
        self.server = cluster["server"].rstrip("/")
        ca_data = cluster.get("certificate-authority-data")
        tls = ssl.create_default_context(
            cafile=cluster.get("certificate-authority"),
            cadata=base64.b64decode(ca_data).decode() if ca_data else None,
        )
        cert, key = user.get("client-certificate"), user.get("client-key")
        if "client-certificate-data" in user:
            # ssl loads client certificates from files only.
            credentials_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            cert, key = credentials_dir / "client.crt", credentials_dir / "client.key"
            for path, data in (
                (cert, user["client-certificate-data"]),
                (key, user["client-key-data"]),
            ):
                path.write_bytes(base64.b64decode(data))
                path.chmod(0o600)
        if cert and key:
            tls.load_cert_chain(str(cert), str(key))
        self._headers = {"Accept": "application/json"}
        if "token" in user:
            self._headers["Authorization"] = f"Bearer {user['token']}"
        self._opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=tls)
        )

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> Any:
        url = self.server + path + (f"?{urllib.parse.urlencode(params)}" if params else "")
        request = urllib.request.Request(  # noqa: S310 - the API server's https URL
            url,
            data=None if body is None else json.dumps(body).encode(),
            method=method,
            headers={**self._headers, "Content-Type": content_type},
        )
        try:
            with self._opener.open(request, timeout=15) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as error:
            raise ApiError(
                method, path, error.code, error.read().decode(errors="replace")
            ) from None

    def get(self, path: str, **params: str) -> Any:
        return self.request("GET", path, params=params)

    def create(self, path: str, body: Any) -> Any:
        return self.request("POST", path, body)

    def merge_patch(self, path: str, body: Any) -> Any:
        return self.request("PATCH", path, body, content_type="application/merge-patch+json")

    def delete(self, path: str, body: Any = None) -> Any:
        return self.request("DELETE", path, body)


# --------------------------------------------------------------------------------------------
# What a container runs here (pure)


@dataclass(frozen=True)
class Executable:
    """What a command prefix runs on this machine: `argv` replaces the prefix, `append` follows
    the pod's own arguments ("{pod_ip}" in it stands for the pod's IP)."""

    argv: tuple[str, ...]
    append: tuple[str, ...] = ()


Commands = Mapping[tuple[str, ...], Executable]

VLLM_COMMAND = VLLM.command


def operator_commands(
    vllm_python: Path, slotune: Path | None = None
) -> dict[tuple[str, ...], Executable]:
    """The commands of the operator's pods. The engine binds the pod's IP (the operator renders
    `--host 0.0.0.0`; the last `--host` wins), so several engine pods each serve port 8000."""
    slotune = slotune or Path(sys.executable).with_name("slotune")
    return {
        VLLM_COMMAND: Executable(
            (str(vllm_python), *VLLM_COMMAND[1:]), append=("--host", "{pod_ip}")
        ),
        ("slotune",): Executable((str(slotune),)),
    }


class ContainerConfigError(Exception):
    """A container that cannot be created; it stays Waiting with this reason and message."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class PodDirs:
    """Where one pod's files live on this machine, and the node's claims it may mount."""

    root: Path
    claims: Path

    def volume(self, name: str) -> Path:
        return self.root / "volumes" / name

    def claim(self, namespace: str, name: str) -> Path:
        """A PersistentVolumeClaim's folder: one per claim, whichever pod mounts it."""
        return self.claims / namespace / name

    def log(self, container: str) -> Path:
        return self.root / f"{container}.log"

    def termination_log(self, container: str) -> Path:
        return self.root / f"{container}.termination-log"


@dataclass(frozen=True)
class Launch:
    """A process to start for a container; `cleanup` runs once it has ended (a container
    runtime's leftovers: a SIGKILLed `podman run` leaves its container behind)."""

    argv: list[str]
    env: dict[str, str]
    cwd: Path
    cleanup: tuple[str, ...] = ()
    container_id: str = ""  # the runtime's name for it; a local process is `local://<pid>`


_REFERENCE = re.compile(r"\$\$|\$\(([-._a-zA-Z][-._a-zA-Z0-9]*)\)")


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion: defined variables are substituted, `$$` is a `$`,
    anything else stays as written."""

    def substitute(match: re.Match[str]) -> str:
        if match[0] == "$$":
            return "$"
        return env.get(match[1], match[0])

    return _REFERENCE.sub(substitute, text)


def pod_field(pod: Pod, path: str, pod_ip: str) -> str:
    """The value of a downward-API `fieldRef`."""
    meta, spec = pod["metadata"], pod["spec"]
    fields = {
        "metadata.name": meta["name"],
        "metadata.namespace": meta["namespace"],
        "metadata.uid": meta["uid"],
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", ""),
        "status.podIP": pod_ip,
        "status.podIPs": pod_ip,
        "status.hostIP": HOST_IP,
        "status.hostIPs": HOST_IP,
    }
    if path in fields:
        return str(fields[path])
    match = re.fullmatch(r"metadata\.(labels|annotations)\['(.*)'\]", path)
    if match:
        return str((meta.get(match[1]) or {}).get(match[2], ""))
    raise ContainerConfigError("CreateContainerConfigError", f"unsupported fieldRef {path}")


def _object_data(
    pod: Pod, resource: str, name: str, optional: bool, lookup: Lookup
) -> dict[str, str] | None:
    """The data of a Secret or ConfigMap of the pod's namespace, decoded."""
    obj = lookup(resource, pod["metadata"]["namespace"], name)
    if obj is None:
        if optional:
            return None
        kind = "secret" if resource == "secrets" else "configmap"
        raise ContainerConfigError("CreateContainerConfigError", f'{kind} "{name}" not found')
    data: dict[str, str] = obj.get("data") or {}
    if resource == "secrets":
        return {key: base64.b64decode(value).decode() for key, value in data.items()}
    return dict(data)


def _env_value(
    pod: Pod, var: dict[str, Any], pod_ip: str, defined: Mapping[str, str], lookup: Lookup
) -> str | None:
    if "value" in var:
        return expand(var["value"], defined)
    source = var.get("valueFrom")
    if not source:
        return ""
    if "fieldRef" in source:
        return pod_field(pod, source["fieldRef"]["fieldPath"], pod_ip)
    for ref_kind, resource in (("secretKeyRef", "secrets"), ("configMapKeyRef", "configmaps")):
        if ref_kind in source:
            ref = source[ref_kind]
            optional = bool(ref.get("optional"))
            data = _object_data(pod, resource, ref["name"], optional, lookup)
            if data is not None and ref["key"] in data:
                return data[ref["key"]]
            if optional:
                return None
            raise ContainerConfigError(
                "CreateContainerConfigError", f"couldn't find key {ref['key']} in {ref['name']}"
            )
    raise ContainerConfigError(
        "CreateContainerConfigError", f"env {var['name']}: unsupported valueFrom {sorted(source)}"
    )


def container_env(
    pod: Pod, container: dict[str, Any], pod_ip: str, lookup: Lookup
) -> dict[str, str]:
    """The container's environment as the pod declares it: envFrom, then env in order (later
    values may refer to earlier ones with `$(NAME)`)."""
    env: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        for ref_kind, resource in (("secretRef", "secrets"), ("configMapRef", "configmaps")):
            if ref_kind in source:
                ref = source[ref_kind]
                data = _object_data(pod, resource, ref["name"], bool(ref.get("optional")), lookup)
                prefix = source.get("prefix", "")
                env.update({prefix + key: value for key, value in (data or {}).items()})
    for var in container.get("env") or []:
        value = _env_value(pod, var, pod_ip, env, lookup)
        if value is not None:
            env[var["name"]] = value
    return env


def projected_files(
    pod: Pod, volume: dict[str, Any], *, pod_ip: str, lookup: Lookup, token: TokenSource
) -> dict[str, str]:
    """The files of a projected volume by relative path: its serviceAccountToken, configMap,
    secret and downwardAPI (fieldRef) sources, as a kubelet writes them."""
    files: dict[str, str] = {}
    for source in volume["projected"].get("sources") or []:
        if "serviceAccountToken" in source:
            files[source["serviceAccountToken"]["path"]] = token(pod, source["serviceAccountToken"])
        for kind, resource in (("configMap", "configmaps"), ("secret", "secrets")):
            if kind not in source:
                continue
            ref = source[kind]
            optional = bool(ref.get("optional"))
            data = _object_data(pod, resource, ref["name"], optional, lookup)
            if data is None:
                continue
            for item in ref.get("items") or [{"key": key, "path": key} for key in data]:
                if item["key"] in data:
                    files[item["path"]] = data[item["key"]]
                elif not optional:
                    raise ContainerConfigError(
                        "CreateContainerConfigError",
                        f"couldn't find key {item['key']} in {kind} {ref['name']}",
                    )
        for item in (source.get("downwardAPI") or {}).get("items") or []:
            if "fieldRef" not in item:
                raise ContainerConfigError(
                    "CreateContainerConfigError", f"unsupported downwardAPI item {sorted(item)}"
                )
            files[item["path"]] = pod_field(pod, item["fieldRef"]["fieldPath"], pod_ip)
    return files


def volume_dirs(pod: Pod, dirs: PodDirs) -> dict[str, Path]:
    """The local folder behind each volume of the pod this kubelet backs, by volume name: the
    pod's own for an emptyDir or projected volume, the claim's for a persistentVolumeClaim."""
    found = {}
    for volume in pod["spec"].get("volumes") or []:
        if "persistentVolumeClaim" in volume:
            claim = volume["persistentVolumeClaim"]["claimName"]
            found[volume["name"]] = dirs.claim(pod["metadata"]["namespace"], claim)
        elif "emptyDir" in volume or "projected" in volume:
            found[volume["name"]] = dirs.volume(volume["name"])
    return found


def match_command(argv: Sequence[str], commands: Commands) -> tuple[int, Executable]:
    """The executable for the longest matching prefix, and that prefix's length."""
    for prefix in sorted(commands, key=len, reverse=True):
        if prefix and tuple(argv[: len(prefix)]) == prefix:
            return len(prefix), commands[prefix]
    shown = " ".join(argv[:4]) if argv else "(none: the image's entrypoint)"
    known = "; ".join(" ".join(prefix) for prefix in commands)
    raise ContainerConfigError(
        "CreateContainerError",
        f"no local executable for command {shown!r} (this kubelet runs: {known})",
    )


def local_mounts(pod: Pod, container: dict[str, Any], dirs: PodDirs) -> list[tuple[str, str]]:
    """(mount path, local dir) of the container's mounts of the volumes in `volume_dirs`,
    longest path first. Mounts under /dev (the shared-memory emptyDir at /dev/shm) stay the
    machine's own."""
    local_volumes = volume_dirs(pod, dirs)
    mounts = []
    for mount in container.get("volumeMounts") or []:
        path = mount["mountPath"].rstrip("/") or "/"
        if mount["name"] in local_volumes and not path.startswith("/dev/"):
            local = local_volumes[mount["name"]] / mount.get("subPath", "")
            mounts.append((path, str(local).rstrip("/")))
    return sorted(mounts, key=lambda m: len(m[0]), reverse=True)


def localize(value: str, termination: tuple[str, str], mounts: Sequence[tuple[str, str]]) -> str:
    """Maps the pod's paths in an argument or env value to local ones: every occurrence of the
    termination-message path; a path under an emptyDir mount, alone or as `--flag=PATH`."""
    value = value.replace(*termination)
    flag, equals, path = value.partition("=") if value.startswith("-") else ("", "", value)
    for mount, local in mounts:
        if path == mount or path.startswith(mount + "/"):
            return flag + equals + local + path[len(mount) :]
    return value


def plan_launch(
    pod: Pod,
    container: dict[str, Any],
    *,
    pod_ip: str,
    commands: Commands,
    dirs: PodDirs,
    host_env: Mapping[str, str],
    lookup: Lookup,
    images: Mapping[str, Image] | None = None,
    start: int = 0,
    service_env: Mapping[str, str] | None = None,
) -> Launch:
    """The process that runs a container here; ContainerConfigError when there is none. A
    container of one of `images` runs as a real container; any other, as a local process.
    `service_env`: what every container gets under its own env (the API server's address)."""
    env = {**(service_env or {}), **container_env(pod, container, pod_ip, lookup)}
    image = (images or {}).get(normalize_image(container.get("image", "")))
    if image is not None:
        name = container_name(pod, container["name"], start)
        return podman_launch(
            pod, container, image, name=name, env=env, dirs=dirs, host_env=host_env
        )
    argv = [expand(arg, env) for arg in [*container.get("command", []), *container.get("args", [])]]
    matched, executable = match_command(argv, commands)
    termination = (
        container.get("terminationMessagePath") or DEFAULT_TERMINATION_PATH,
        str(dirs.termination_log(container["name"])),
    )
    mounts = local_mounts(pod, container, dirs)
    args = [localize(arg, termination, mounts) for arg in argv[matched:]]
    args += [arg.replace("{pod_ip}", pod_ip) for arg in executable.append]
    local_env = {name: localize(value, termination, mounts) for name, value in env.items()}
    return Launch([*executable.argv, *args], {**host_env, **local_env}, dirs.root)


@dataclass(frozen=True)
class Image:
    """An image this kubelet runs as a real container (podman with runc): its full name and
    the user its config names (for `runAsNonRoot`)."""

    name: str
    user: str
    env: Mapping[str, str] = field(default_factory=dict)  # podman's own (its config)


def normalize_image(reference: str) -> str:
    """The full name a container runtime gives a reference: `slotune/operator:1` is
    `docker.io/slotune/operator:1`, `nginx` is `docker.io/library/nginx:latest`."""
    if "@" in reference:
        return reference  # by digest: as it is
    name, tag = reference, "latest"
    if ":" in reference.rsplit("/", 1)[-1]:
        name, tag = reference.rsplit(":", 1)
    first = name.split("/", 1)[0]
    if "/" not in name:
        name = f"docker.io/library/{name}"
    elif "." not in first and ":" not in first and first != "localhost":
        name = f"docker.io/{name}"
    return f"{name}:{tag}"


def container_name(pod: Pod, container: str, start: int) -> str:
    meta = pod["metadata"]
    uid = meta.get("uid", "")[:8]
    raw = f"k8s_{container}_{meta['name']}_{meta.get('namespace', '')}_{uid}_{start}"
    return re.sub(r"[^a-zA-Z0-9_.-]", "-", raw)


def podman_launch(
    pod: Pod,
    container: dict[str, Any],
    image: Image,
    *,
    name: str,
    env: Mapping[str, str],
    dirs: PodDirs,
    host_env: Mapping[str, str],
) -> Launch:
    """`podman run` of a container as its pod declares it: command and args, env, emptyDir,
    claim and projected volumes, the termination-message file, and the securityContext (user,
    read-only root, capabilities, privilege escalation) with `runAsNonRoot` checked as a
    kubelet checks it.
    The pod's network is the host's: pod IPs are loopback addresses of this machine."""
    pod_sc = pod["spec"].get("securityContext") or {}
    sc = {**pod_sc, **(container.get("securityContext") or {})}
    user, group = sc.get("runAsUser"), sc.get("runAsGroup")
    if sc.get("runAsNonRoot"):
        effective = str(user) if user is not None else image.user.split(":", 1)[0]
        if not effective.isdigit():
            raise ContainerConfigError(
                "CreateContainerConfigError",
                f"container has runAsNonRoot and image has non-numeric user ({effective or '-'}),"
                " cannot verify user is non-root",
            )
        if int(effective) == 0:
            raise ContainerConfigError(
                "CreateContainerConfigError",
                "container has runAsNonRoot and image will run as root",
            )
    argv = ["podman", "run", "--rm", "--replace", "--name", name, "--network=host"]
    if user is not None:
        argv.append(f"--user={user}" + (f":{group}" if group is not None else ""))
    if sc.get("readOnlyRootFilesystem"):
        argv += ["--read-only", "--read-only-tmpfs=false"]
    if sc.get("allowPrivilegeEscalation") is False:
        argv.append("--security-opt=no-new-privileges")
    capabilities = sc.get("capabilities") or {}
    argv += [f"--cap-drop={c}" for c in capabilities.get("drop") or []]
    argv += [f"--cap-add={c}" for c in capabilities.get("add") or []]
    volumes = {volume["name"]: volume for volume in pod["spec"].get("volumes") or []}
    local_volumes = volume_dirs(pod, dirs)
    for mount in container.get("volumeMounts") or []:
        volume = mount["name"]  # not `name`: that is the container's, for --name and the kill
        if volume not in local_volumes:
            continue
        local = local_volumes[volume] / mount.get("subPath", "")
        if "projected" in volumes[volume]:  # the kubelet writes it; read-only, as in Kubernetes
            argv += ["--volume", f"{local}:{mount['mountPath']}:ro"]
            continue
        local.mkdir(parents=True, exist_ok=True)
        local.chmod(0o777)  # writable by any user of the pod, as an emptyDir is
        claim = volumes[volume].get("persistentVolumeClaim") or {}
        mode = "ro" if mount.get("readOnly") or claim.get("readOnly") else "rw"
        argv += ["--volume", f"{local}:{mount['mountPath']}:{mode}"]
    termination = dirs.termination_log(container["name"])
    termination.touch()
    termination.chmod(0o666)
    path = container.get("terminationMessagePath") or DEFAULT_TERMINATION_PATH
    argv += ["--volume", f"{termination}:{path}:rw"]
    for key, value in env.items():
        argv += ["--env", f"{key}={value}"]
    if container.get("command"):
        argv.append("--entrypoint=" + json.dumps(container["command"]))
    argv += [image.name, *(container.get("args") or [])]
    podman_env = {**host_env, **image.env}
    cleanup = ("podman", "rm", "--force", "--ignore", name)
    return Launch(argv, podman_env, dirs.root, cleanup=cleanup, container_id=f"podman://{name}")


def termination_message(
    written: bytes, log_tail: bytes, *, fallback_to_logs: bool, exit_code: int
) -> str:
    """`state.terminated.message`: the last 4 KiB of what the container wrote to its
    termination-message file; with FallbackToLogsOnError, a failed container that wrote nothing
    gets the end of its log instead (the last 80 lines, at most 2 KiB)."""
    message = written[-MAX_MESSAGE_BYTES:]
    if not message and fallback_to_logs and exit_code != 0:
        lines = log_tail.splitlines(keepends=True)[-FALLBACK_LOG_LINES:]
        message = b"".join(lines)[-FALLBACK_LOG_BYTES:]
    return message.decode(errors="replace")


def pod_phase(restart_policy: str, states: Sequence[tuple[dict[str, Any], dict[str, Any]]]) -> str:
    """The pod's phase from its containers' (state, lastState), decided as the kubelet does."""
    running = waiting = stopped = succeeded = 0
    for state, last_state in states:
        if "running" in state:
            running += 1
        elif "terminated" in state:
            stopped += 1
            succeeded += state["terminated"]["exitCode"] == 0
        elif "terminated" in last_state:
            stopped += 1  # waiting to restart
        else:
            waiting += 1
    if waiting or not (running or stopped):
        return "Pending"
    if running or restart_policy == "Always":
        return "Running"
    if stopped == succeeded:
        return "Succeeded"
    return "Failed" if restart_policy == "Never" else "Running"


def prometheus_label(name: str) -> str:
    """A Kubernetes label key as a Prometheus label name."""
    label = re.sub(r"[^a-zA-Z0-9_]", "_", name)
    return f"_{label}" if label[:1].isdigit() else label


def scrape_target(pod: Pod, pod_ip: str, running: set[str]) -> dict[str, Any] | None:
    """The file_sd target group of a pod annotated for scraping whose container is running."""
    meta = pod["metadata"]
    annotations = meta.get("annotations") or {}
    port = annotations.get("prometheus.io/port")
    if annotations.get("prometheus.io/scrape") != "true" or not port:
        return None
    containers = pod["spec"]["containers"]
    container = next(
        (
            c
            for c in containers
            if any(str(p.get("containerPort")) == port for p in c.get("ports") or [])
        ),
        containers[0],
    )
    if container["name"] not in running:
        return None
    labels = {prometheus_label(key): value for key, value in (meta.get("labels") or {}).items()}
    labels |= {"namespace": meta["namespace"], "pod": meta["name"], "container": container["name"]}
    if "prometheus.io/path" in annotations:
        labels["__metrics_path__"] = annotations["prometheus.io/path"]
    return {"targets": [f"{pod_ip}:{port}"], "labels": labels}


def loopback_ip(index: int) -> str:
    """The index-th host address of 127.0.0.0/8: 1 is 127.0.0.2, 253 is 127.0.0.254, 254 is
    127.0.1.1, ..."""
    block, host = divmod(index, 254)
    return f"127.{(block >> 8) & 255}.{block & 255}.{host + 1}"


def node_conditions(heartbeat: str, since: str) -> list[dict[str, str]]:
    def condition(kind: str, status: str, reason: str, message: str) -> dict[str, str]:
        return {
            "type": kind,
            "status": status,
            "reason": reason,
            "message": message,
            "lastHeartbeatTime": heartbeat,
            "lastTransitionTime": since,
        }

    return [
        condition(
            "MemoryPressure",
            "False",
            "KubeletHasSufficientMemory",
            "kubelet has sufficient memory available",
        ),
        condition(
            "DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"
        ),
        condition(
            "PIDPressure",
            "False",
            "KubeletHasSufficientPID",
            "kubelet has sufficient PID available",
        ),
        condition("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
    ]


def default_capacity() -> dict[str, str]:
    memory_kib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 1024
    return {
        "cpu": str(os.cpu_count() or 1),
        "memory": f"{memory_kib}Ki",
        "ephemeral-storage": "100Gi",
        "pods": "110",
        "nvidia.com/gpu": "8",  # so that pods asking for GPUs fit, as on a GPU node
    }


# --------------------------------------------------------------------------------------------
# One container: its processes, probes and state


def _read_tail(path: Path, limit: int, start: int = 0) -> bytes:
    try:
        with path.open("rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            handle.seek(max(start, size - limit))
            return handle.read()
    except FileNotFoundError:
        return b""


def probe_succeeds(probe: dict[str, Any], container: dict[str, Any], pod_ip: str) -> bool:
    """One httpGet or tcpSocket probe against the pod's IP; others are not run here and pass."""
    action = probe.get("httpGet") or probe.get("tcpSocket")
    if action is None:
        return True
    port = action["port"]
    if isinstance(port, str) and not port.isdigit():
        named = [p["containerPort"] for p in container.get("ports") or [] if p.get("name") == port]
        if not named:
            return False
        port = named[0]
    host, timeout = action.get("host") or pod_ip, float(probe.get("timeoutSeconds", 1))
    if "tcpSocket" in probe:
        try:
            socket.create_connection((host, int(port)), timeout=timeout).close()
        except OSError:
            return False
        return True
    connection_type = (
        http.client.HTTPSConnection
        if action.get("scheme") == "HTTPS"
        else http.client.HTTPConnection
    )
    connection = connection_type(host, int(port), timeout=timeout)
    headers = {"User-Agent": "kube-probe/slotune-test"}
    headers |= {h["name"]: h["value"] for h in action.get("httpHeaders") or []}
    try:
        connection.request("GET", action.get("path", "/"), headers=headers)
        return 200 <= connection.getresponse().status < 400
    except (OSError, http.client.HTTPException):
        return False
    finally:
        connection.close()


def _group_gone(pgid: int, timeout: float) -> bool:
    """Waits until no process of the group is left (killed children linger until reaped)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


@dataclass
class ProbeState:
    spec: dict[str, Any]
    due: float
    failures: int = 0
    successes: int = 0


class LocalContainer:
    """One container of a pod: its process (one per start), its probes and its state."""

    def __init__(
        self,
        spec: dict[str, Any],
        dirs: PodDirs,
        pod_key: str,
        restart_policy: str,
        max_backoff: float,
    ) -> None:
        self.spec = spec
        self.name: str = spec["name"]
        self.dirs = dirs
        self.pod_key = pod_key
        self.restart_policy = restart_policy
        self.max_backoff = max_backoff
        self.process: subprocess.Popen[bytes] | None = None
        self.cleanup: tuple[str, ...] = ()
        self.cleanup_env: dict[str, str] = {}
        self.runtime_id = ""
        self.state: dict[str, Any] = {"waiting": {"reason": "ContainerCreating"}}
        self.last_state: dict[str, Any] = {}
        self.starts = 0
        self.started = False
        self.ready = False
        self.done = False  # will not run again
        self.restart_at = 0.0
        self._backoff = 0.0
        self._probes: dict[str, ProbeState] = {}
        self._log_offset = 0
        self._started_at = ""
        self._started_mono = 0.0

    @property
    def container_id(self) -> str:
        if self.process is None:
            return ""
        return self.runtime_id or f"local://{self.process.pid}"

    def due(self, now: float) -> bool:
        return self.process is None and not self.done and now >= self.restart_at

    def start(self, launch: Launch, now: float) -> None:
        log_path = self.dirs.log(self.name)
        self._log_offset = log_path.stat().st_size if log_path.exists() else 0
        self.dirs.termination_log(self.name).write_bytes(b"")
        with log_path.open("ab") as log_file:
            try:
                self.process = subprocess.Popen(
                    launch.argv,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=launch.env,
                    cwd=launch.cwd,
                    start_new_session=True,  # a process group: stopping it stops the children
                )
            except OSError as error:
                raise ContainerConfigError(
                    "CreateContainerError", f"cannot run {launch.argv[0]}: {error.strerror}"
                ) from None
        self.cleanup, self.cleanup_env = launch.cleanup, launch.env
        self.runtime_id = launch.container_id
        self.starts += 1
        self._started_at, self._started_mono = _now(), now
        self.state = {"running": {"startedAt": self._started_at}}
        self._probes = {
            kind: ProbeState(spec, due=now + float(spec.get("initialDelaySeconds", 0)))
            for kind in PROBES
            if (spec := self.spec.get(f"{kind}Probe"))
        }
        self.started = "startup" not in self._probes
        self.ready = False

    def cannot_start(self, error: ContainerConfigError) -> None:
        waiting = {"reason": error.reason, "message": error.message}
        if self.state.get("waiting") != waiting:
            log.warning(
                "Failed to create container %s of pod %s: %s",
                self.name,
                self.pod_key,
                error.message,
            )
        self.state = {"waiting": waiting}

    def check(self, now: float, pod_ip: str, grace: float) -> None:
        """Notices an exit; runs the probes that are due and acts on their verdicts."""
        assert self.process is not None
        if self.process.poll() is not None:
            self.finish(now, may_restart=True)
            return
        if not self.started:
            verdict = self._probe("startup", now, pod_ip)
            if verdict is False:
                self._kill("failed its startup probe", grace, now)
                return
            if verdict is None:
                return
            self.started = True
            if "readiness" in self._probes:
                self._probes["readiness"].due = now
        if self._probe("liveness", now, pod_ip) is False:
            self._kill("failed its liveness probe", grace, now)
            return
        if "readiness" not in self._probes:
            self.ready = True
        elif (verdict := self._probe("readiness", now, pod_ip)) is not None:
            self.ready = verdict

    def _probe(self, kind: str, now: float, pod_ip: str) -> bool | None:
        """Runs the probe when due: True once it passed successThreshold times in a row, False
        once it failed failureThreshold times in a row, None while undecided or not due."""
        probe = self._probes.get(kind)
        if probe is None or now < probe.due:
            return None
        probe.due = now + float(probe.spec.get("periodSeconds", 10))
        if probe_succeeds(probe.spec, self.spec, pod_ip):
            probe.successes, probe.failures = probe.successes + 1, 0
        else:
            probe.successes, probe.failures = 0, probe.failures + 1
        if probe.successes >= int(probe.spec.get("successThreshold", 1)):
            return True
        if probe.failures >= int(probe.spec.get("failureThreshold", 3)):
            return False
        return None

    def _kill(self, why: str, grace: float, now: float) -> None:
        log.info("Killing container %s of pod %s: it %s", self.name, self.pod_key, why)
        self.signal(signal.SIGTERM)
        self.wait(time.monotonic() + grace)
        self.finish(now, may_restart=True)

    def kill_main(self) -> None:
        """SIGKILL to the container's own process (in a podman container, its PID 1), as the
        OOM killer would; the next check sees the exit and the restart policy decides."""
        name = self.runtime_id.removeprefix("podman://")
        if name != self.runtime_id:
            killed = subprocess.run(
                ("podman", "kill", "--signal=KILL", name),
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
                env=self.cleanup_env,
            )
            if killed.returncode != 0:  # a kill that did not happen must not pass unseen
                raise RuntimeError(f"podman kill {name} failed: {killed.stderr.strip()}")
        else:
            self.signal(signal.SIGKILL)

    def signal(self, sig: signal.Signals) -> None:
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, sig)

    def wait(self, deadline: float) -> None:
        if self.process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=max(0.0, deadline - time.monotonic()))

    def finish(self, now: float, *, may_restart: bool) -> None:
        """Ends the running process (and whatever is left of its group, as a container's end
        would) and records how it ended; restarts it later if the restart policy says so."""
        process = self.process
        if process is None:
            return
        self.signal(signal.SIGKILL)
        code = process.wait()
        if self.cleanup:
            subprocess.run(
                self.cleanup, capture_output=True, timeout=60, check=False, env=self.cleanup_env
            )
        if not _group_gone(process.pid, timeout=5):
            log.warning(
                "Processes of container %s of pod %s outlived SIGKILL", self.name, self.pod_key
            )
        exit_code = code if code >= 0 else 128 - code  # killed by a signal: 128 + its number
        terminated: dict[str, Any] = {
            "exitCode": exit_code,
            "reason": "Completed" if exit_code == 0 else "Error",
            "startedAt": self._started_at,
            "finishedAt": _now(),
            "containerID": self.container_id,
        }
        message = termination_message(
            _read_tail(self.dirs.termination_log(self.name), MAX_MESSAGE_BYTES),
            _read_tail(self.dirs.log(self.name), FALLBACK_LOG_BYTES, start=self._log_offset),
            fallback_to_logs=self.spec.get("terminationMessagePolicy") == "FallbackToLogsOnError",
            exit_code=exit_code,
        )
        if message:
            terminated["message"] = message
        log.info("Container %s of pod %s exited with code %d", self.name, self.pod_key, exit_code)
        self.process = None
        self.started = self.ready = False
        restart = self.restart_policy == "Always" or (
            self.restart_policy == "OnFailure" and exit_code != 0
        )
        if not (may_restart and restart):
            self.state, self.done = {"terminated": terminated}, True
            return
        ran_long = now - self._started_mono > 2 * self.max_backoff
        self._backoff = (
            INITIAL_BACKOFF_SECONDS
            if ran_long or not self._backoff
            else min(2 * self._backoff, self.max_backoff)
        )
        self.restart_at = now + self._backoff
        self.last_state = {"terminated": terminated}
        self.state = {
            "waiting": {
                "reason": "CrashLoopBackOff",
                "message": f"back-off {self._backoff:g}s restarting failed "
                f"container={self.name} pod={self.pod_key}",
            }
        }

    def status(self) -> dict[str, Any]:
        status = {
            "name": self.name,
            "image": self.spec.get("image", ""),
            "imageID": "",
            "ready": self.ready,
            "started": self.started,
            "restartCount": max(self.starts - 1, 0),
            "state": self.state,
            "lastState": self.last_state,
        }
        if self.process is not None:
            status["containerID"] = self.container_id
        return status


# --------------------------------------------------------------------------------------------
# One pod: a worker thread, as the real kubelet has


class PodWorker:
    """Runs one pod's containers, reports its status, and carries out its deletion."""

    def __init__(self, kubelet: Kubelet, pod: Pod, pod_ip: str, dirs: PodDirs) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        self.kubelet = kubelet
        self.pod = pod  # the latest copy from the API; the kubelet's loop replaces it
        self.uid: str = meta["uid"]
        self.key = f"{meta['namespace']}/{meta['name']}"
        self.pod_ip = pod_ip
        self.dirs = dirs
        self.restart_policy: str = spec.get("restartPolicy", "Always")
        self.containers = [
            LocalContainer(c, dirs, self.key, self.restart_policy, kubelet.max_backoff)
            for c in spec["containers"]
        ]
        status = pod.get("status") or {}
        self.start_time: str = status.get("startTime") or _now()
        # A pod that ended before this kubelet started stays as it is.
        self._ended = status.get("phase") in TERMINAL_PHASES
        self._conditions: dict[str, tuple[str, str]] = {}
        self._written: dict[str, Any] | None = None
        self._deleted = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"pod {self.key}", daemon=True)

    @property
    def name(self) -> tuple[str, str]:
        meta = self.pod["metadata"]
        return meta["namespace"], meta["name"]

    def start(self) -> None:
        for local in volume_dirs(self.pod, self.dirs).values():
            local.mkdir(parents=True, exist_ok=True)
        self._thread.start()

    def stop(self) -> None:
        """Ends the worker; its processes are killed (the pod is gone or the kubelet stops)."""
        self._stop.set()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def scrape_target(self) -> dict[str, Any] | None:
        running = {c.name for c in self.containers if c.process is not None}
        return scrape_target(self.pod, self.pod_ip, running)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sync()
            except Exception:  # an API or probe error must not end the worker
                log.warning("Failed to sync pod %s; retrying", self.key, exc_info=True)
            self._stop.wait(self.kubelet.poll_interval)
        self._kill_all(self.kubelet.stop_grace)

    def sync(self) -> None:
        pod = self.pod
        if self._deleted:
            return
        if pod["metadata"].get("deletionTimestamp"):
            self._terminate(pod)
            return
        if self._ended:
            return
        now = time.monotonic()
        for container in self.containers:
            if container.process is not None:
                container.check(now, self.pod_ip, self._grace(pod))
            elif container.due(now):
                self._start(pod, container, now)
        self._report()

    def _start(self, pod: Pod, container: LocalContainer, now: float) -> None:
        try:
            container.start(self._plan(pod, container.spec, container.starts), now)
        except ContainerConfigError as error:
            container.cannot_start(error)
            return
        log.info(
            "Started container %s of pod %s (%s)", container.name, self.key, container.container_id
        )
        self.kubelet.started.append((self.key, container.name, container.container_id))

    def _plan(self, pod: Pod, spec: dict[str, Any], starts: int) -> Launch:
        fault = self.kubelet.injected_fault(pod)
        if fault is not None:
            # The container starts, says why it fails, and exits 1.
            argv = ["/bin/sh", "-c", 'echo "$1" >&2; exit 1', "sh", fault]
            return Launch(argv, dict(self.kubelet.host_env), self.dirs.root)
        self._project(pod)
        return plan_launch(
            pod,
            spec,
            pod_ip=self.pod_ip,
            commands=self.kubelet.commands,
            dirs=self.dirs,
            host_env=self.kubelet.host_env,
            lookup=self.kubelet.lookup,
            images=self.kubelet.images,
            start=starts,
            service_env=self.kubelet.service_env,
        )

    def _project(self, pod: Pod) -> None:
        """Writes the pod's projected volumes afresh (a new token at each container start)."""
        for volume in pod["spec"].get("volumes") or []:
            if "projected" not in volume:
                continue
            files = projected_files(
                pod,
                volume,
                pod_ip=self.pod_ip,
                lookup=self.kubelet.lookup,
                token=self.kubelet.service_account_token,
            )
            mode = int(volume["projected"].get("defaultMode", 0o644))
            root = self.dirs.volume(volume["name"])
            for relative, content in files.items():
                path = root / relative
                path.parent.mkdir(parents=True, exist_ok=True)
                path.parent.chmod(0o755)
                path.write_text(content)
                path.chmod(mode)

    def _grace(self, pod: Pod) -> float:
        seconds = pod["metadata"].get("deletionGracePeriodSeconds")
        if seconds is None:
            seconds = pod["spec"].get("terminationGracePeriodSeconds", 30)
        return min(float(seconds), self.kubelet.max_grace)

    def _kill_all(self, grace: float) -> None:
        """SIGTERM to every container, the grace period, then SIGKILL; nothing restarts."""
        running = [c for c in self.containers if c.process is not None]
        for container in running:
            container.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for container in running:
            container.wait(deadline)
        for container in running:
            container.finish(time.monotonic(), may_restart=False)
        for container in self.containers:
            container.done = True

    def _terminate(self, pod: Pod) -> None:
        """A deleted pod: stop its containers within the grace period, report the final status,
        then remove the pod object for good (grace period 0, this pod's uid only)."""
        self._kill_all(self._grace(pod))
        if not self._ended and (pod.get("status") or {}).get("phase") not in TERMINAL_PHASES:
            self._report(deleting=True)
        namespace, name = self.name
        try:
            self.kubelet.api.delete(
                f"/api/v1/namespaces/{namespace}/pods/{name}",
                {"gracePeriodSeconds": 0, "preconditions": {"uid": self.uid}},
            )
        except ApiError as error:
            if error.status not in (404, 409):  # gone, or a new pod of the same name
                raise
        self._deleted = True
        log.info("Deleted pod %s after stopping its containers", self.key)

    def _condition(
        self, kind: str, true: bool, reason: str = "", message: str = ""
    ) -> dict[str, Any]:
        status = "True" if true else "False"
        previous = self._conditions.get(kind)
        if previous is None or previous[0] != status:
            self._conditions[kind] = (status, _now())
        condition: dict[str, Any] = {
            "type": kind,
            "status": status,
            "lastProbeTime": None,
            "lastTransitionTime": self._conditions[kind][1],
        }
        if not true and reason:
            condition |= {"reason": reason, "message": message}
        return condition

    def _status(self, deleting: bool) -> dict[str, Any]:
        statuses = [c.status() for c in self.containers]
        if deleting:
            # A deleted pod ends in a terminal phase, as with the real kubelet.
            exits = [s["state"].get("terminated", {}).get("exitCode") for s in statuses]
            phase = "Succeeded" if all(code == 0 for code in exits) else "Failed"
        else:
            phase = pod_phase(self.restart_policy, [(s["state"], s["lastState"]) for s in statuses])
        ready = phase == "Running" and all(c.ready for c in self.containers)
        unready = " ".join(c.name for c in self.containers if not c.ready)
        why = (
            ("PodCompleted", "")
            if phase in TERMINAL_PHASES
            else ("ContainersNotReady", f"containers with unready status: [{unready}]")
        )
        return {
            "phase": phase,
            "conditions": [
                self._condition("PodScheduled", True),
                self._condition("Initialized", True),
                self._condition("ContainersReady", ready, *why),
                self._condition("Ready", ready, *why),
            ],
            "hostIP": HOST_IP,
            "hostIPs": [{"ip": HOST_IP}],
            "podIP": self.pod_ip,
            "podIPs": [{"ip": self.pod_ip}],
            "startTime": self.start_time,
            "containerStatuses": statuses,
        }

    def _report(self, *, deleting: bool = False) -> None:
        """Writes the status when it changed since the last write."""
        status = self._status(deleting)
        if status == self._written:
            return
        namespace, name = self.name
        try:
            self.kubelet.api.merge_patch(
                f"/api/v1/namespaces/{namespace}/pods/{name}/status", {"status": status}
            )
        except ApiError as error:
            if error.status != 404:  # a pod that is gone needs no status
                raise
        self._written = status


# --------------------------------------------------------------------------------------------
# The kubelet


class Kubelet:
    """One Node of the test cluster, its scheduler and its container runtime, in background
    threads: a loop that keeps the Node alive, binds pods and hands them to pod workers."""

    def __init__(
        self,
        kubeconfig: Path,
        work_dir: Path,
        commands: Commands,
        *,
        node_name: str = NODE_NAME,
        env: Mapping[str, str] | None = None,
        capacity: Mapping[str, str] | None = None,
        poll_interval: float = 0.5,
        max_grace: float = 10.0,
        max_backoff: float = 10.0,
        stop_grace: float = 5.0,
        schedule: Callable[[Pod], bool] | None = None,
        images: Sequence[Image] = (),
    ) -> None:
        """`commands`: what each command prefix runs here; `images`: those whose containers
        run as real containers instead (podman). `env`: added to the minimal host
        environment (PATH, HOME) under every container's own. Grace periods are capped at
        `max_grace` seconds, restart back-off at `max_backoff`. `schedule`: which unscheduled
        pods to bind; by default those created since the kubelet started, so that pods other
        tests of the session left Pending on purpose stay so."""
        self.work_dir = Path(work_dir).resolve()
        self.api = KubeApi(kubeconfig, self.work_dir / "credentials")
        self.commands = dict(commands)
        self.images = {image.name: image for image in images}
        self.started: list[tuple[str, str, str]] = []
        """(namespace/pod, container, container ID) of every container start, in order."""
        self.node_name = node_name
        self.host_env = {
            "PATH": os.environ.get("PATH", os.defpath),
            "HOME": os.environ.get("HOME", "/"),
            **(env or {}),
        }
        server = urllib.parse.urlsplit(self.api.server)
        self.service_env = {
            "KUBERNETES_SERVICE_HOST": server.hostname or HOST_IP,
            "KUBERNETES_SERVICE_PORT": str(server.port or 443),
        }
        """The API server's address, as a kubelet gives it to every container (the
        `kubernetes` Service's; here the API server's own, on the host's loopback)."""
        self.capacity = {**default_capacity(), **(capacity or {})}
        self.poll_interval = poll_interval
        self.max_grace = max_grace
        self.max_backoff = max_backoff
        self.stop_grace = stop_grace
        self.schedule = schedule or self._created_since_start
        self.file_sd = self.work_dir / "file_sd.json"
        self._lock = threading.Lock()
        self._workers: dict[str, PodWorker] = {}
        self._retired: list[PodWorker] = []
        self._dirs: dict[tuple[str, str], PodDirs] = {}
        self._faults: list[tuple[Callable[[Pod], bool], str]] = []
        self._ip_index = 0
        self._published: list[dict[str, Any]] | None = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._node_uid = ""
        self._ready_since = ""
        self._next_lease = self._next_heartbeat = 0.0
        self._started = datetime.now(UTC)

    # -- life cycle ------------------------------------------------------------------------

    def start(self) -> None:
        self._started = datetime.now(UTC).replace(microsecond=0)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self._publish([])  # a Prometheus can be pointed at the file at once
        self._register_node()
        self._renew_lease()
        self._next_lease = self._next_heartbeat = time.monotonic() + RENEW_SECONDS
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, name="kubelet", daemon=True)
        self._thread.start()
        atexit.register(self.stop)

    def stop(self) -> None:
        """Kills every container, then removes the Lease and the Node. Pods stay bound to the
        Node that is gone (kube-controller-manager's pod GC removes them later)."""
        if self._thread is None:
            return
        self._stopping.set()
        self._thread.join(timeout=30)
        self._thread = None
        with self._lock:
            workers = [*self._workers.values(), *self._retired]
            self._workers.clear()
            self._retired.clear()
        for worker in workers:
            worker.stop()
        for worker in workers:
            worker.join(timeout=self.stop_grace + 15)
        for path in (
            f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases/{self.node_name}",
            f"/api/v1/nodes/{self.node_name}",
        ):
            try:
                self.api.delete(path)
            except (ApiError, OSError) as error:
                log.warning("Failed to delete %s: %s", path, error)
        atexit.unregister(self.stop)
        log.info("Stopped node %s", self.node_name)

    def __enter__(self) -> Kubelet:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- for tests -----------------------------------------------------------------------------

    def fail_pods(
        self, predicate: Callable[[Pod], bool], message: str = "injected failure"
    ) -> None:
        """From now on, every container of a pod for which `predicate(pod)` holds fails at each
        start: it writes `message` to its log and exits 1, as a configuration that cannot run
        on this node would. Until `clear_faults()`."""
        with self._lock:
            self._faults.append((predicate, message))

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    def injected_fault(self, pod: Pod) -> str | None:
        with self._lock:
            faults = list(self._faults)
        return next((message for predicate, message in faults if predicate(pod)), None)

    def kill_container(self, namespace: str, name: str, container: str) -> None:
        """SIGKILLs a running container of a pod, as the OOM killer would; the pod's restart
        policy decides what follows (a Deployment's pod restarts it after a back-off)."""
        found = self._container(namespace, name, container)
        if found is None or found.process is None:
            raise LookupError(f"no running container {container} in pod {namespace}/{name}")
        found.kill_main()

    def restarts(self, namespace: str, name: str, container: str) -> int:
        """How often a container of the pod has been started, less one."""
        found = self._container(namespace, name, container)
        return max(found.starts - 1, 0) if found else 0

    def _container(self, namespace: str, name: str, container: str) -> LocalContainer | None:
        worker = self._worker(namespace, name)
        found = [c for c in worker.containers if c.name == container] if worker else []
        return found[0] if found else None

    def service_account_token(self, pod: Pod, source: dict[str, Any]) -> str:
        """A token of the pod's ServiceAccount, bound to the pod (TokenRequest), for a
        projected serviceAccountToken source."""
        meta = pod["metadata"]
        account = pod["spec"].get("serviceAccountName") or "default"
        spec: dict[str, Any] = {
            "expirationSeconds": int(source.get("expirationSeconds", 3600)),
            "boundObjectRef": {
                "apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]
            },
        }  # fmt: skip
        if source.get("audience"):
            spec["audiences"] = [source["audience"]]
        answer = self.api.create(
            f"/api/v1/namespaces/{meta['namespace']}/serviceaccounts/{account}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
        )
        token: str = answer["status"]["token"]
        return token

    def pod_ip(self, namespace: str, name: str) -> str | None:
        worker = self._worker(namespace, name)
        return worker.pod_ip if worker is not None else None

    def log_path(self, namespace: str, name: str, container: str) -> Path | None:
        """The log of a container of the latest pod of that name (also after it is gone)."""
        with self._lock:
            dirs = self._dirs.get((namespace, name))
        return dirs.log(container) if dirs is not None else None

    def logs(self, namespace: str, name: str, container: str) -> str:
        path = self.log_path(namespace, name, container)
        return path.read_text(errors="replace") if path is not None and path.exists() else ""

    def log_tails(self, lines: int = 20) -> str:
        """The end of every container log, for the message of a failed test."""
        with self._lock:
            pods = sorted(self._dirs.items())
        parts = []
        for (namespace, name), dirs in pods:
            for path in sorted(dirs.root.glob("*.log")):
                tail = path.read_text(errors="replace").splitlines()[-lines:]
                parts.append(f"--- {namespace}/{name} {path.stem} ({path})\n" + "\n".join(tail))
        return "\n".join(parts) or "(no containers ran)"

    # -- the loop ------------------------------------------------------------------------------

    def _run(self) -> None:
        steps = (self._keep_node_alive, self._schedule, self._sync_pods, self._publish_targets)
        while not self._stopping.is_set():
            for step in steps:
                try:
                    step()
                except Exception:  # API errors are retried on the next round
                    log.warning("Kubelet step %s failed; retrying", step.__name__, exc_info=True)
            self._stopping.wait(self.poll_interval)

    def _keep_node_alive(self) -> None:
        now = time.monotonic()
        if now >= self._next_lease:
            self._renew_lease()
            self._next_lease = now + RENEW_SECONDS
        if now >= self._next_heartbeat:
            try:
                self.api.merge_patch(
                    f"/api/v1/nodes/{self.node_name}/status",
                    {"status": {"conditions": node_conditions(_now(), self._ready_since)}},
                )
            except ApiError as error:
                if error.status != 404:
                    raise
                self._register_node()  # someone deleted the Node
            self._next_heartbeat = now + RENEW_SECONDS

    def _register_node(self) -> None:
        self._ready_since = _now()
        status = {
            "capacity": self.capacity,
            "allocatable": self.capacity,
            "conditions": node_conditions(self._ready_since, self._ready_since),
            "addresses": [
                {"type": "InternalIP", "address": HOST_IP},
                {"type": "Hostname", "address": self.node_name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "operatingSystem": "linux",
                "architecture": "amd64",
                "containerRuntimeVersion": "local://",
            },
        }
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.node_name,
                "labels": {
                    "kubernetes.io/hostname": self.node_name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                },
            },
            "status": status,
        }
        try:
            created = self.api.create("/api/v1/nodes", node)
        except ApiError as error:
            if error.status != 409:
                raise
            created = self.api.merge_patch(
                f"/api/v1/nodes/{self.node_name}/status", {"status": status}
            )
        self._node_uid = created["metadata"]["uid"]
        log.info("Registered node %s", self.node_name)

    def _renew_lease(self) -> None:
        path = f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases"
        spec = {
            "holderIdentity": self.node_name,
            "leaseDurationSeconds": LEASE_SECONDS,
            "renewTime": _now_micro(),
        }
        try:
            self.api.merge_patch(f"{path}/{self.node_name}", {"spec": spec})
        except ApiError as error:
            if error.status != 404:
                raise
            owner = {
                "apiVersion": "v1",
                "kind": "Node",
                "name": self.node_name,
                "uid": self._node_uid,
            }
            lease = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {
                    "name": self.node_name,
                    "namespace": LEASE_NAMESPACE,
                    "ownerReferences": [owner],
                },
                "spec": spec,
            }
            self.api.create(path, lease)

    def _schedule(self) -> None:
        """Binds the unscheduled pods it takes (see `schedule`) to this Node."""
        for pod in self.api.get("/api/v1/pods", fieldSelector="spec.nodeName=")["items"]:
            meta = pod["metadata"]
            pending = (pod.get("status") or {}).get("phase", "Pending") == "Pending"
            if meta.get("deletionTimestamp") or not pending or not self.schedule(pod):
                continue
            binding = {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {
                    "name": meta["name"],
                    "namespace": meta["namespace"],
                    "uid": meta["uid"],
                },
                "target": {"apiVersion": "v1", "kind": "Node", "name": self.node_name},
            }
            try:
                self.api.create(
                    f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/binding", binding
                )
            except ApiError as error:
                if error.status in (404, 409):  # gone, or bound meanwhile
                    continue
                raise
            log.info("Bound pod %s/%s to node %s", meta["namespace"], meta["name"], self.node_name)

    def _created_since_start(self, pod: Pod) -> bool:
        created = datetime.strptime(pod["metadata"]["creationTimestamp"], "%Y-%m-%dT%H:%M:%S%z")
        return created >= self._started

    def _sync_pods(self) -> None:
        """Hands every pod of this Node to its worker; stops the workers of pods that are gone."""
        pods = self.api.get("/api/v1/pods", fieldSelector=f"spec.nodeName={self.node_name}")[
            "items"
        ]
        seen = set()
        for pod in pods:
            uid = pod["metadata"]["uid"]
            seen.add(uid)
            with self._lock:
                worker = self._workers.get(uid)
            if worker is not None:
                worker.pod = pod
            else:
                self._add_worker(pod)
        with self._lock:
            gone = [worker for uid, worker in self._workers.items() if uid not in seen]
            for worker in gone:
                del self._workers[worker.uid]
            self._retired = [w for w in self._retired if w.alive] + gone
        for worker in gone:
            worker.stop()

    def _add_worker(self, pod: Pod) -> None:
        meta = pod["metadata"]
        dirs = PodDirs(
            self.work_dir / "pods" / meta["namespace"] / f"{meta['name']}-{meta['uid'][:8]}",
            self.work_dir / "claims",
        )
        dirs.root.mkdir(parents=True, exist_ok=True)
        with self._lock:
            worker = PodWorker(self, pod, self._allocate_ip(pod), dirs)
            self._workers[worker.uid] = worker
            self._dirs[(meta["namespace"], meta["name"])] = dirs
        worker.start()

    def _allocate_ip(self, pod: Pod) -> str:
        """The pod's own loopback IP: the one it already reports (after a kubelet restart), or
        the next free one from 127.0.0.2 up. Linux routes all of 127/8 to the loopback device."""
        in_use = {worker.pod_ip for worker in self._workers.values()}
        known = (pod.get("status") or {}).get("podIP", "")
        if known.startswith("127.") and known != HOST_IP and known not in in_use:
            return str(known)
        while True:
            self._ip_index += 1
            ip = loopback_ip(self._ip_index)
            if ip not in in_use:
                return ip

    def _worker(self, namespace: str, name: str) -> PodWorker | None:
        with self._lock:
            workers = [w for w in self._workers.values() if w.name == (namespace, name)]
        return workers[-1] if workers else None

    def lookup(self, resource: str, namespace: str, name: str) -> dict[str, Any] | None:
        """A Secret or ConfigMap that a container's env refers to."""
        try:
            obj: dict[str, Any] = self.api.get(f"/api/v1/namespaces/{namespace}/{resource}/{name}")
        except ApiError as error:
            if error.status == 404:
                return None
            raise
        return obj

    # -- Prometheus discovery ----------------------------------------------------------------

    def _publish_targets(self) -> None:
        with self._lock:
            workers = list(self._workers.values())
        groups = [group for worker in workers if (group := worker.scrape_target()) is not None]
        self._publish(sorted(groups, key=lambda group: group["targets"]))

    def _publish(self, groups: list[dict[str, Any]]) -> None:
        """Writes the file_sd file when it changed, atomically (Prometheus may read it any time)."""
        if groups == self._published:
            return
        partial = self.file_sd.with_name(self.file_sd.name + ".partial")
        partial.write_text(json.dumps(groups, indent=2) + "\n")
        partial.replace(self.file_sd)
        self._published = groups

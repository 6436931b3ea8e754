"""Knowledge of inference engines as plain data: one adapter package per engine behind the
`Engine` protocol (`base`), and the one dispatch, on `spec.engine.kind`."""

from __future__ import annotations

from slotune.engine import sglang, vllm
from slotune.engine.base import Engine

ENGINES: dict[str, Engine] = {
    vllm.ENGINE.kind: vllm.ENGINE,
    sglang.ENGINE.kind: sglang.ENGINE,
}

DEFAULT_KIND = vllm.ENGINE.kind


def engine_for(kind: str) -> Engine:
    """The adapter for `spec.engine.kind`; a kind slotune does not know is a `KeyError` that
    names the known ones (the spec's rules report it before anything is rendered)."""
    try:
        return ENGINES[kind]
    except KeyError:
        raise KeyError(f"no engine {kind!r}; slotune knows {', '.join(sorted(ENGINES))}") from None


def engine_or_default(kind: str) -> Engine:
    """The adapter for `kind`, or vLLM's where slotune does not know it: for reading what a spec
    that failed its checks, or a pod of unknown origin, says with the nearest patterns."""
    return ENGINES.get(kind) or ENGINES[DEFAULT_KIND]

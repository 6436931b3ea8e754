"""Reading vLLM's start-up log: the capacity it reports, and why a start failed.

The patterns come from vLLM 0.32's own messages, captured from failed starts of the CPU engine.
"""

from __future__ import annotations

import re

from slotune.engine.startup import Cause, FailureKind, StartFailure, StartupFacts, classify

_KV_TOKENS = re.compile(r"KV cache size: ([\d,]+) tokens")
_CONCURRENCY = re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x")
_INIT = re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s")


def _number(text: str) -> int:
    return int(text.replace(",", ""))


def parse_startup(log: str) -> StartupFacts:
    """The capacity figures from a start-up log (the last occurrence wins)."""
    kv = _KV_TOKENS.findall(log)
    concurrency = _CONCURRENCY.findall(log)
    init = _INIT.findall(log)
    return StartupFacts(
        kv_cache_tokens=_number(kv[-1]) if kv else None,
        concurrency_request_tokens=_number(concurrency[-1][0]) if concurrency else None,
        max_concurrency=float(concurrency[-1][1]) if concurrency else None,
        engine_init_seconds=float(init[-1]) if init else None,
    )


# (kind, patterns, message), in priority order: the first pattern found names the cause, and
# the log line it is on becomes the detail.
CAUSES: tuple[Cause, ...] = (
    Cause(
        FailureKind.INVALID_ARGUMENTS,
        (r"error: unrecognized arguments: .*", r"error: argument .*"),
        "vLLM's argument parser refused the flags",
    ),
    Cause(
        FailureKind.KV_CACHE_TOO_SMALL,
        (
            r"To serve at least one request with the model's max seq len",
            r"KV cache is needed, which is larger than the available KV cache memory",
            r"No available memory for the cache blocks",
            r"Insufficient memory for KV cache",
        ),
        "the KV cache cannot hold one max-model-len sequence",
    ),
    Cause(
        FailureKind.OUT_OF_MEMORY,
        (
            r"CUDA out of memory",
            r"OutOfMemoryError",
            r"Available memory on node .* is less than requested memory",
            r"Free memory on device .* is less than desired",
            r"Cannot allocate memory",
            r"std::bad_alloc",
            r"MemoryError",
        ),
        "the engine ran out of memory while starting",
    ),
    Cause(
        FailureKind.INVALID_ARGUMENTS,
        (
            r"Value error, .*",
            r"ValueError: .*",
            r"No common block size for .*",
            r"Invalid kv_cache_dtype.*",
            r"validation error for \w+Config",
        ),
        "vLLM rejected the configuration",
    ),
)

# vLLM prefixes a worker's lines with its process and time: `(EngineCore_DP0 pid=7) INFO 12-01 ...`
_PROCESS_PREFIX = re.compile(r"^\(\w+ pid=\d+\) \w+ [\d-]+ [\d:]+ \[[^\]]+\] ")


def classify_failure(
    log: str, *, exit_code: int | None, timed_out: bool, seconds: float | None = None
) -> StartFailure:
    """Why a vLLM start failed, from its log and how the process ended."""
    return classify(
        log,
        CAUSES,
        exit_code=exit_code,
        timed_out=timed_out,
        seconds=seconds,
        line_prefix=_PROCESS_PREFIX,
    )

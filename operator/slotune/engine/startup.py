"""Reading a vLLM engine's start-up: the facts it reports, and why a start failed.

Pure: log text in, facts or a classified cause out. A failed start is evidence for the tuner
(an infeasible region), so the cause must be specific — invalid arguments, out of memory, a KV
cache too small for one sequence, a crash, a timeout — and carry the log lines that show it.
The patterns come from vLLM 0.32's own messages, captured from failed starts of the CPU engine.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum


class FailureKind(StrEnum):
    INVALID_ARGUMENTS = "InvalidArguments"
    OUT_OF_MEMORY = "OutOfMemory"
    KV_CACHE_TOO_SMALL = "KVCacheTooSmall"
    CRASH = "Crash"
    TIMEOUT = "Timeout"


@dataclass(frozen=True)
class StartupFacts:
    """What a started engine reported about itself."""

    kv_cache_tokens: int | None = None
    max_concurrency: float | None = None
    concurrency_request_tokens: int | None = None
    engine_init_seconds: float | None = None
    startup_seconds: float | None = None


@dataclass(frozen=True)
class StartFailure:
    """A start that did not reach a healthy engine."""

    kind: FailureKind
    message: str
    evidence: list[str] = field(default_factory=list)
    seconds: float | None = None

    def describe(self) -> str:
        return f"{self.kind}: {self.message}"


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
_CAUSES: list[tuple[FailureKind, list[str], str]] = [
    (
        FailureKind.INVALID_ARGUMENTS,
        [r"error: unrecognized arguments: .*", r"error: argument .*"],
        "vLLM's argument parser refused the flags",
    ),
    (
        FailureKind.KV_CACHE_TOO_SMALL,
        [
            r"To serve at least one request with the model's max seq len",
            r"KV cache is needed, which is larger than the available KV cache memory",
            r"No available memory for the cache blocks",
            r"Insufficient memory for KV cache",
        ],
        "the KV cache cannot hold one max-model-len sequence",
    ),
    (
        FailureKind.OUT_OF_MEMORY,
        [
            r"CUDA out of memory",
            r"OutOfMemoryError",
            r"Available memory on node .* is less than requested memory",
            r"Free memory on device .* is less than desired",
            r"Cannot allocate memory",
            r"std::bad_alloc",
            r"MemoryError",
        ],
        "the engine ran out of memory while starting",
    ),
    (
        FailureKind.INVALID_ARGUMENTS,
        [
            r"Value error, .*",
            r"ValueError: .*",
            r"No common block size for .*",
            r"Invalid kv_cache_dtype.*",
            r"validation error for \w+Config",
        ],
        "vLLM rejected the configuration",
    ),
]

_PROCESS_PREFIX = re.compile(r"^\(\w+ pid=\d+\) \w+ [\d-]+ [\d:]+ \[[^\]]+\] ")


def _line_of(log: str, start: int, limit: int = 400) -> str:
    """The log line around a match, without vLLM's process/time prefix."""
    begin = log.rfind("\n", 0, start) + 1
    end = log.find("\n", start)
    line = log[begin : end if end != -1 else len(log)].strip()
    line = _PROCESS_PREFIX.sub("", line)
    return line if len(line) <= limit else line[: limit - 3] + "..."


_ERROR_LINE = re.compile(r"(Error|error|Exception|Traceback|Killed|unrecognized)")


def _evidence(log: str, limit: int = 8) -> list[str]:
    """The log lines worth showing: errors, without the traceback frames."""
    lines = [
        line.strip()
        for line in log.splitlines()
        if _ERROR_LINE.search(line) and not line.strip().startswith("File ")
    ]
    unique = list(dict.fromkeys(lines))
    return unique[-limit:]


def classify_failure(
    log: str, *, exit_code: int | None, timed_out: bool, seconds: float | None = None
) -> StartFailure:
    """Why a start failed, from its log and how the process ended."""
    evidence = _evidence(log)
    for kind, patterns, message in _CAUSES:
        for pattern in patterns:
            match = re.search(pattern, log)
            if match:
                detail = _line_of(log, match.start())
                return StartFailure(kind, f"{message}: {detail}", evidence, seconds)
    if timed_out:
        return StartFailure(
            FailureKind.TIMEOUT, "the engine was not healthy before the deadline", evidence, seconds
        )
    if exit_code is not None and exit_code in (-9, 137):
        return StartFailure(
            FailureKind.OUT_OF_MEMORY,
            f"the engine was killed (exit {exit_code}), as the OOM killer does",
            evidence,
            seconds,
        )
    return StartFailure(
        FailureKind.CRASH,
        f"the engine exited with code {exit_code}" + (f": {evidence[-1]}" if evidence else ""),
        evidence,
        seconds,
    )

"""What an engine's start-up says, whichever the engine: the facts it reports, and why a
start failed.

Pure: log text in, facts or a classified cause out. A failed start is evidence for the tuner
(an infeasible region), so the cause must be specific — invalid arguments, out of memory, a KV
cache too small for one sequence, a crash, a timeout — and carry the log lines that show it.
Each engine adapter brings its own log patterns (`Cause`s, e.g. `slotune.engine.vllm.startup`);
the rules for how a process ended are the same for all.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
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


@dataclass(frozen=True)
class Cause:
    """A start-up failure an engine's log names: any of `patterns` found means `kind`, and the
    log line it is on becomes the detail after `message`."""

    kind: FailureKind
    patterns: tuple[str, ...]
    message: str


def _line_of(log: str, start: int, prefix: re.Pattern[str] | None, limit: int = 400) -> str:
    """The log line around a match, without the engine's process/time prefix."""
    begin = log.rfind("\n", 0, start) + 1
    end = log.find("\n", start)
    line = log[begin : end if end != -1 else len(log)].strip()
    if prefix is not None:
        line = prefix.sub("", line)
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


def classify(
    log: str,
    causes: Sequence[Cause],
    *,
    exit_code: int | None,
    timed_out: bool,
    seconds: float | None = None,
    line_prefix: re.Pattern[str] | None = None,
) -> StartFailure:
    """Why a start failed, from its log (the first of `causes`, in order, whose pattern is
    found) and how the process ended."""
    evidence = _evidence(log)
    for cause in causes:
        for pattern in cause.patterns:
            match = re.search(pattern, log)
            if match:
                detail = _line_of(log, match.start(), line_prefix)
                return StartFailure(cause.kind, f"{cause.message}: {detail}", evidence, seconds)
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

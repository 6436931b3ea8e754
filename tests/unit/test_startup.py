"""Start-up facts and failure causes, from excerpts of real vLLM 0.32 CPU logs."""

from pathlib import Path

import pytest

from slotune.engine.startup import FailureKind
from slotune.engine.vllm.startup import classify_failure, parse_startup

LOGS = Path(__file__).parent / "data" / "vllm-logs"


def test_capacity_figures_from_a_healthy_start() -> None:
    facts = parse_startup((LOGS / "started.log").read_text())
    assert facts.kv_cache_tokens == 524_288
    assert facts.concurrency_request_tokens == 2048
    assert facts.max_concurrency == 256.0
    assert facts.engine_init_seconds == pytest.approx(33.61)


@pytest.mark.parametrize(
    ("log", "exit_code", "kind", "fragment"),
    [
        (
            "unknown-flag.log",
            2,
            FailureKind.INVALID_ARGUMENTS,
            "unrecognized arguments: --swap-space",
        ),
        ("block-size.log", 1, FailureKind.INVALID_ARGUMENTS, "No common block size for 7"),
        ("batched-below-seqs.log", 1, FailureKind.INVALID_ARGUMENTS, "max_num_batched_tokens (64)"),
        ("kv-too-small.log", 1, FailureKind.KV_CACHE_TOO_SMALL, "max seq len (4096)"),
        ("kv-over-memory.log", 1, FailureKind.OUT_OF_MEMORY, "less than requested memory"),
    ],
)
def test_failed_starts_are_classified_with_their_cause(
    log: str, exit_code: int, kind: FailureKind, fragment: str
) -> None:
    failure = classify_failure((LOGS / log).read_text(), exit_code=exit_code, timed_out=False)
    assert failure.kind == kind
    assert fragment in failure.message
    assert failure.evidence, "the log lines that show the cause come along"


def test_silent_hang_is_a_timeout_and_a_silent_death_is_a_crash() -> None:
    quiet = "INFO starting\nINFO loading weights\n"
    assert classify_failure(quiet, exit_code=None, timed_out=True).kind == FailureKind.TIMEOUT
    crash = classify_failure(quiet + "Segmentation fault\n", exit_code=-11, timed_out=False)
    assert crash.kind == FailureKind.CRASH
    assert "-11" in crash.message
    killed = classify_failure(quiet, exit_code=-9, timed_out=False)
    assert killed.kind == FailureKind.OUT_OF_MEMORY

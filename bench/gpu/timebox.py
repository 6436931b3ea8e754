"""Runs a `slotune tune --local` study inside a device call's time limit.

A study outlives one 10-minute call, and killing it mid-trial throws that trial's device time
away (and a killed CLI leaves its engine, which runs in its own session, holding the GPU). So
this waits for each trial record to land and, when the time left could not hold another
trial, interrupts the study between trials with SIGINT: the tuner stops the engine it is
starting, if any, and the records stay consistent for the next call to resume from.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def _lines(path: Path) -> int:
    try:
        return sum(1 for line in path.read_text().splitlines() if line.strip())
    except FileNotFoundError:
        return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, required=True, help="end within this")
    parser.add_argument(
        "--trial-seconds", type=float, default=150.0, help="what one trial takes at most"
    )
    parser.add_argument("--records", type=Path, required=True)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    began = time.monotonic()
    deadline = began + args.seconds
    seen = _lines(args.records)
    process = subprocess.Popen(command)
    reason = None
    while process.poll() is None:
        time.sleep(1)
        now = time.monotonic()
        count = _lines(args.records)
        if count != seen:
            seen = count
            left = deadline - now
            print(f"[timebox] trial record {count} at {now - began:.0f} s, {left:.0f} s left",
                  flush=True)  # fmt: skip
            if left < args.trial_seconds:
                reason = f"{left:.0f} s left, less than a trial ({args.trial_seconds:.0f} s)"
        if now >= deadline:
            reason = "the deadline passed mid-trial"
        if reason:
            print(f"[timebox] Interrupted the study: {reason}", flush=True)
            process.send_signal(signal.SIGINT)
            break
    try:
        code = process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        code = process.wait()
    print(f"[timebox] study exited {code} after {time.monotonic() - began:.0f} s", flush=True)
    _stop_leftover_engines()
    return 0


def _stop_leftover_engines() -> None:
    """An engine this study started and nobody stopped would hold the GPU into the next call."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if b"vllm.entrypoints.openai.api_server" in cmdline:
            pid = int(proc.name)
            print(f"[timebox] Stopped leftover engine process {pid}", flush=True)
            with contextlib.suppress(OSError):
                os.killpg(os.getpgid(pid), signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(main())

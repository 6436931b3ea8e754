"""A diagnostic for bench/scale.py, not part of slotune: put this folder on the operator's
PYTHONPATH (`--operator-env PYTHONPATH=$PWD/bench/memprobe`) and the operator's log gets, 4 s after
start and then every 15 s, one `MEMPROBE` line: its RSS, the Python blocks allocated
(`sys.getallocatedblocks()`: live objects, whatever the allocators keep), the entries of Kopf's
per-object memory, and its threads. Blocks back at the idle figure with RSS above it means the
allocators keep freed memory; blocks above it means objects are still held."""

import gc
import sys
import threading
import time
from pathlib import Path


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _kopf_memories() -> int:
    return sum(
        len(obj._items) for obj in gc.get_objects() if type(obj).__name__ == "ResourceMemories"
    )


def _probe() -> None:
    time.sleep(4)
    print(f"MEMPROBE idle rss={_rss_mib():.1f} blocks={sys.getallocatedblocks()}", file=sys.stderr)
    while True:
        time.sleep(15)
        print(
            f"MEMPROBE t={time.time():.0f} rss={_rss_mib():.1f} blocks={sys.getallocatedblocks()}"
            f" kopf_memories={_kopf_memories()} threads={threading.active_count()}",
            file=sys.stderr,
            flush=True,
        )


threading.Thread(target=_probe, daemon=True, name="memprobe").start()

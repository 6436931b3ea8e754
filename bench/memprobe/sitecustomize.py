"""A diagnostic for bench/scale.py, not part of slotune: put this folder on the operator's
PYTHONPATH (`--operator-env PYTHONPATH=$PWD/bench/memprobe`) and the operator's log gets, 4 s after
start and then every 15 s, one `MEMPROBE` line: its RSS, the Python blocks allocated
(`sys.getallocatedblocks()`: live objects, whatever the allocators keep), the entries of Kopf's
per-object memory, and its threads. Blocks back at the idle figure with RSS above it means the
allocators keep freed memory; blocks above it means objects are still held.

Small objects only are blocks: a large one (a dict's table, a response's text, over 512 bytes)
comes from malloc and is not counted. `MEMPROBE_TRACE=FRAMES` (e.g. 8) also starts
`tracemalloc`: every Python allocation, large ones too, traced with that many frames. Each probe
then gives the traced total, and the second probe of each quiet spell (Kopf's memories back to
at most one entry for two probes) prints `MEMPROBE_TOP`: the call sites holding the most
memory over the baseline snapshot (the first probe's, if Kopf's memories were empty then:
imports done; else the idle one's). Traced bytes back at idle with RSS above it means the memory is
the allocators' (fragmentation), or native (OpenSSL, threads' stacks), not Python objects held.
Tracing slows the operator and doubles its memory: figures from such a run are not the bench's.

Under jemalloc (the image's allocator, or `LD_PRELOAD` of it) each line also gets jemalloc's own
counts: `je_alloc` (bytes the program holds from malloc: Python's objects under
`PYTHONMALLOC=malloc`, and every native library's), `je_active` (its pages), `je_resident` and
`je_retained` (mapped, unused, kept for reuse). Allocated bytes that climb with traced ones flat
are native memory held; allocated flat with resident climbing is the allocator's. With jemalloc's
profiling on (`MALLOC_CONF=prof:true,...`), `MEMPROBE_JEPROF=PREFIX` dumps a heap profile at
the idle probe (`PREFIX.0.heap`) and each settled one (`PREFIX.N.heap`) for `jeprof --base`:
the native call sites of the growth."""

import ctypes
import gc
import os
import sys
import threading
import time
import tracemalloc
from pathlib import Path

_FRAMES = int(os.environ.get("MEMPROBE_TRACE", "0"))
if _FRAMES:
    tracemalloc.start(_FRAMES)


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _jemalloc() -> ctypes.CDLL | None:
    lib = ctypes.CDLL(None)
    if not hasattr(lib, "mallctl"):  # another allocator
        return None
    lib.mallctl.argtypes = [
        ctypes.c_char_p,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_size_t,
    ]
    return lib


_JE = _jemalloc()
_JEPROF = os.environ.get("MEMPROBE_JEPROF", "")


def _je_stats() -> str:
    if _JE is None:
        return ""
    epoch = ctypes.c_uint64(1)
    _JE.mallctl(b"epoch", None, None, ctypes.byref(epoch), ctypes.sizeof(epoch))
    figures = []
    for name in ("allocated", "active", "resident", "retained"):
        value, size = ctypes.c_size_t(0), ctypes.c_size_t(ctypes.sizeof(ctypes.c_size_t))
        _JE.mallctl(f"stats.{name}".encode(), ctypes.byref(value), ctypes.byref(size), None, 0)
        figures.append(f" je_{name.replace('allocated', 'alloc')}={value.value / 2**20:.1f}")
    return "".join(figures)


def _je_dump(number: int) -> None:
    if _JE is None or not _JEPROF:
        return
    path = ctypes.c_char_p(f"{_JEPROF}.{number}.heap".encode())
    failed = _JE.mallctl(b"prof.dump", None, None, ctypes.byref(path), ctypes.sizeof(path))
    print(f"MEMPROBE_JEPROF {path.value.decode()} rc={failed}", file=sys.stderr, flush=True)


def _walk() -> tuple[int, str]:
    """One pass over the heap: the entries of Kopf's per-object memory, and the sizes of what
    slotune keeps per object (the edge services' maps, the client's cache)."""
    memories, live, applied, clients = 0, 0, 0, 0
    seen, gone, locks = 0, 0, 0
    for obj in gc.get_objects():
        kind = type(obj).__name__
        if kind == "ResourceMemories":
            memories += len(obj._items)
        elif kind == "CachedKube":
            clients += 1
            live, applied = live + len(obj._live), applied + len(obj._applied)
        elif kind == "LastSeen":  # slotune.edge.seen
            seen, gone = seen + len(obj.bodies), gone + len(obj.gone)
        elif kind == "KeyedLocks":
            locks += len(obj)
    if "slotune.handlers" not in sys.modules:
        return memories, ""
    sizes = {"_seen": seen, "_gone": gone, "_locks": locks}
    if clients:
        sizes.update(live=live, applied=applied)
    return memories, " kept=" + ",".join(f"{k}:{v}" for k, v in sizes.items())


def _traced() -> str:
    if not _FRAMES:
        return ""
    current, peak = tracemalloc.get_traced_memory()
    return f" traced={current / 2**20:.1f} traced_peak={peak / 2**20:.1f}"


def _print_top(idle: tracemalloc.Snapshot) -> None:
    filters = [tracemalloc.Filter(False, tracemalloc.__file__)]
    now = tracemalloc.take_snapshot().filter_traces(filters)
    for stat in now.compare_to(idle.filter_traces(filters), "traceback")[:12]:
        frames = " <- ".join(f"{Path(f.filename).name}:{f.lineno}" for f in stat.traceback)
        print(
            f"MEMPROBE_TOP {stat.size_diff / 1024:+.0f} KiB {stat.count_diff:+d} blocks: {frames}",
            file=sys.stderr,
            flush=True,
        )


def _probe() -> None:
    time.sleep(4)
    idle = tracemalloc.take_snapshot() if _FRAMES else None
    print(
        f"MEMPROBE idle rss={_rss_mib():.1f} blocks={sys.getallocatedblocks()}{_traced()}"
        f"{_je_stats()}",
        file=sys.stderr,
    )
    _je_dump(0)  # idle: imports done, no objects yet
    quiet, first, dumps = 0, True, 1
    while True:
        time.sleep(15)
        memories, kept = _walk()
        print(
            f"MEMPROBE t={time.time():.0f} rss={_rss_mib():.1f} blocks={sys.getallocatedblocks()}"
            f" kopf_memories={memories} threads={threading.active_count()}{_traced()}{kept}"
            f"{_je_stats()}",
            file=sys.stderr,
            flush=True,
        )
        quiet = quiet + 1 if memories <= 1 else 0
        if _FRAMES and first and quiet:  # settled, no objects yet: the baseline
            idle = tracemalloc.take_snapshot()
        first = False
        if quiet == 2:  # settled
            if idle is not None:
                _print_top(idle)
            _je_dump(dumps)
            dumps += 1


threading.Thread(target=_probe, daemon=True, name="memprobe").start()

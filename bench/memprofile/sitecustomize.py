"""Memory attribution for a bench run of the operator (a diagnostic, not part of the product).

Put this folder on the operator's PYTHONPATH and set SLOTUNE_PROFILE_OUT to a folder: Python's
allocations are traced (8 frames) and every 30 s the largest holders, by file and by
traceback, and the live objects by type are written there as NNN.txt. Tracing slows the
operator several times over; read its figures as attribution, not as speed or RSS.

    PYTHONPATH=tests .venv/bin/python bench/scale.py --objects 500 --cases steady,delete \
        --operator-env PYTHONPATH=bench/memprofile --operator-env SLOTUNE_PROFILE_OUT=/tmp/prof
"""

import os
from pathlib import Path

OUT = os.environ.get("SLOTUNE_PROFILE_OUT")

if OUT:
    import collections
    import gc
    import threading
    import time
    import tracemalloc

    tracemalloc.start(8)

    def _rss_mib() -> int:
        with Path("/proc/self/status").open() as status:
            line = next(x for x in status if x.startswith("VmRSS:"))
        return int(line.split()[1]) // 1024

    def _dump(out: str) -> None:
        number = 0
        while True:
            time.sleep(30)
            number += 1
            snapshot = tracemalloc.take_snapshot().filter_traces(
                [tracemalloc.Filter(False, tracemalloc.__file__)]
            )
            current, peak = tracemalloc.get_traced_memory()
            lines = [
                f"t={number * 30}s rss={_rss_mib()}MiB traced={current >> 20}MiB "
                f"peak={peak >> 20}MiB"
            ]
            for stat in snapshot.statistics("filename")[:20]:
                where = stat.traceback[0].filename
                lines.append(f"  FILE {stat.size >> 10:8d} KiB {stat.count:8d} {where}")
            for stat in snapshot.statistics("traceback")[:25]:
                lines.append(f"  TB {stat.size >> 10:8d} KiB {stat.count:8d}")
                lines += ["      " + frame.strip() for frame in stat.traceback.format()[-8:]]
            kinds = collections.Counter(type(o).__name__ for o in gc.get_objects())
            lines.append("  objects: " + ", ".join(f"{k} {v}" for k, v in kinds.most_common(15)))
            (Path(out) / f"{number:03d}.txt").write_text("\n".join(lines) + "\n")

    threading.Thread(target=_dump, args=(OUT,), daemon=True, name="memprofile").start()

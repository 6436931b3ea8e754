"""The study report: a table of trials and three plots (`slotune.local.plots`), as PNG files
and one HTML page. Everything is drawn from trial records alone, so a report can be made again
from a finished (or interrupted) study's `trials.jsonl`. The plots need matplotlib, the `plots`
extra (`pip install 'slotune[plots]'`): the operator image leaves it out, and without it the
report is the table alone, and says so.
"""

from __future__ import annotations

import base64
import html
import importlib.util
from collections.abc import Sequence
from pathlib import Path

from slotune.models import SloSpec
from slotune.tuner.records import TrialRecord, record_capacity
from slotune.tuner.space import Space, describe_params

PLOTS = ("capacity.png", "latency.png", "importance.png")
NO_PLOTS = "no plots: they need matplotlib (pip install 'slotune[plots]')"


def plots_available() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f}"


def table_rows(records: Sequence[TrialRecord], slo: SloSpec) -> list[list[str]]:
    header = ["#", "phase", "label", "configuration", "state", "capacity req/s", "probes"]
    header += [
        f"{name} p{t.percentile:g} ms at target (<= {t.max_seconds * 1000:g})"
        for name, t in slo.targets().items()
    ]
    header += ["feasible", "cause"]
    rows = [header]
    for r in records:
        m = r.measurement
        c = record_capacity(r)
        row = [str(r.number), r.phase, r.label or "", describe_params(r.params), str(r.state)]
        if c is None:
            row += ["-", "-"]
        else:
            row += [c.describe(), str(len(c.probes))]
        row += [_ms(m.slo_percentiles.get(name)) if m else "-" for name in slo.targets()]
        row += ["yes" if r.feasible else "no" if m else "-", (r.cause or "")[:160]]
        rows.append(row)
    return rows


def format_table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        for row in rows
    ]
    return "\n".join(line.rstrip() for line in lines)


def write_report(
    out_dir: Path,
    records: Sequence[TrialRecord],
    slo: SloSpec,
    space: Space,
    *,
    title: str,
    summary: str,
    winner: TrialRecord | None = None,
    best: TrialRecord | None = None,
) -> Path:
    """Writes trials.txt and report.html, and the PLOTS where matplotlib is installed."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if plots_available():
        from slotune.local import plots  # noqa: PLC0415 - matplotlib is an extra, slow to load

        plots.write_plots(out_dir, PLOTS, records, slo, space, winner, best=best)
        images = "".join(
            f'<img alt="{name}" src="data:image/png;base64,'
            f'{base64.b64encode((out_dir / name).read_bytes()).decode()}">'
            for name in PLOTS
        )
    else:
        images = f"<p>{html.escape(NO_PLOTS)}</p>"
    rows = table_rows(records, slo)
    (out_dir / "trials.txt").write_text(format_table(rows) + "\n")
    table = (
        "<table>"
        + "".join(
            "<tr>"
            + "".join(
                f"<{'th' if i == 0 else 'td'}>{html.escape(c)}</{'th' if i == 0 else 'td'}>"
                for c in row
            )
            + "</tr>"
            for i, row in enumerate(rows)
        )
        + "</table>"
    )
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse;font-size:12px}}
td,th{{border:1px solid #ccc;padding:3px 6px;text-align:left}}
img{{max-width:48%;margin:4px}}</style>
</head><body><h1>{html.escape(title)}</h1><pre>{html.escape(summary)}</pre>{images}{table}</body></html>
"""
    path = out_dir / "report.html"
    path.write_text(page)
    return path

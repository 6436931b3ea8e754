"""The study report: a table of trials and three plots, as PNG files and one HTML page.

Plots: the optimisation history (score per trial, feasible or not, best so far); the first SLO
metric against throughput with the SLO line, which shows the trade-off the tuner navigated;
and Optuna's parameter importance. Everything is drawn from trial records alone, so a report
can be made again from a finished (or interrupted) study's `trials.jsonl`.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from pathlib import Path

import matplotlib as mpl

mpl.use("Agg")
import matplotlib.pyplot as plt
import optuna

from slotune.models import SloSpec
from slotune.tuner.records import TrialRecord, TrialState
from slotune.tuner.space import PARAM_SHORT, Space, describe_params
from slotune.tuner.study import rebuild


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f}"


def table_rows(records: Sequence[TrialRecord], slo: SloSpec) -> list[list[str]]:
    header = ["#", "phase", "label", "configuration", "state"]
    header += [
        f"{name} p{t.percentile:g} ms (<= {t.max_seconds * 1000:g})"
        for name, t in slo.targets().items()
    ]
    header += ["req/s", "goodput", "SLO", "cause"]
    rows = [header]
    for r in records:
        m = r.measurement
        row = [str(r.number), r.phase, r.label or "", describe_params(r.params), str(r.state)]
        row += [_ms(m.slo_percentiles.get(name)) if m else "-" for name in slo.targets()]
        row += [
            f"{m.request_throughput:.2f}" if m else "-",
            f"{m.goodput:.2f}" if m else "-",
            "met" if r.feasible else "missed" if m else "-",
            (r.cause or "")[:160],
        ]
        rows.append(row)
    return rows


def format_table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        for row in rows
    ]
    return "\n".join(line.rstrip() for line in lines)


def plot_history(records: Sequence[TrialRecord], path: Path) -> None:
    screen = [r for r in records if r.phase == "screen" and r.state != TrialState.REJECTED]
    fig, ax = plt.subplots(figsize=(7, 4))
    best = float("-inf")
    best_line = []
    for r in screen:
        if r.feasible:
            best = max(best, r.score)
        best_line.append(best if best != float("-inf") else None)
    xs = [r.number for r in screen]
    ax.scatter(
        [r.number for r in screen if r.feasible],
        [r.score for r in screen if r.feasible],
        color="tab:green",
        label="SLO met",
        zorder=3,
    )
    ax.scatter(
        [r.number for r in screen if not r.feasible and r.state == TrialState.MEASURED],
        [r.score for r in screen if not r.feasible and r.state == TrialState.MEASURED],
        color="tab:red",
        label="SLO missed",
        zorder=3,
    )
    failed = [r for r in screen if r.state == TrialState.FAILED]
    ax.scatter(
        [r.number for r in failed],
        [0] * len(failed),
        marker="x",
        color="black",
        label="failed to start",
    )
    ax.step(
        xs,
        [b if b is not None else float("nan") for b in best_line],
        where="post",
        color="tab:blue",
        label="best (SLO met)",
    )
    ax.set_xlabel("trial")
    ax.set_ylabel("score (goodput, req/s)")
    ax.set_title("Optimisation history")
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def binding_target(records: Sequence[TrialRecord], slo: SloSpec) -> str:
    """The SLO metric that most often decided a trial's fate (most misses)."""
    names = list(slo.targets())
    measured = [r for r in records if r.measurement is not None]
    misses = {
        name: sum(1 for r in measured if r.constraints and r.constraints[i] > 0)
        for i, name in enumerate(names)
    }
    return max(names, key=lambda name: misses[name])


def plot_slo_tradeoff(records: Sequence[TrialRecord], slo: SloSpec, path: Path) -> None:
    name = binding_target(records, slo)
    target = slo.targets()[name]
    measured = [r for r in records if r.measurement is not None]
    fig, ax = plt.subplots(figsize=(7, 4))
    for feasible, color, label in (
        (True, "tab:green", "SLO met"),
        (False, "tab:red", "SLO missed"),
    ):
        points = [r for r in measured if r.feasible == feasible]
        ax.scatter(
            [r.measurement.request_throughput for r in points if r.measurement],
            [
                (r.measurement.slo_percentiles.get(name) or float("nan"))
                for r in points
                if r.measurement
            ],
            color=color,
            label=label,
            zorder=3,
        )
        for r in points:
            if r.measurement and r.measurement.slo_percentiles.get(name) is not None:
                ax.annotate(
                    str(r.number),
                    (r.measurement.request_throughput, r.measurement.slo_percentiles[name] or 0),
                    fontsize=7,
                    xytext=(3, 3),
                    textcoords="offset points",
                )
    ax.axhline(
        target.max_seconds,
        color="black",
        linestyle="--",
        label=f"SLO: p{target.percentile:g} {name} <= {target.max_seconds:g}s",
    )
    ax.set_xlabel("request throughput (req/s)")
    ax.set_ylabel(f"{name} p{target.percentile:g} (s)")
    ax.set_title(f"{name.upper()} p{target.percentile:g} against throughput")
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_importance(records: Sequence[TrialRecord], space: Space, slo: SloSpec, path: Path) -> str:
    study = optuna.create_study(direction="maximize")
    rebuild(study, space, slo, [r for r in records if r.state == TrialState.MEASURED])
    fig, ax = plt.subplots(figsize=(7, 3.5))
    note = ""
    try:
        # PED-ANOVA: Optuna's own estimator, no scikit-learn needed (fANOVA needs it).
        importances = optuna.importance.get_param_importances(
            study, evaluator=optuna.importance.PedAnovaImportanceEvaluator()
        )
    except (RuntimeError, ValueError, ImportError) as error:
        importances = {}
        note = f"parameter importance needs more measured trials ({error})"
    if importances:
        names = list(importances)[::-1]
        ax.barh(
            [PARAM_SHORT.get(n, n) for n in names],
            [importances[n] for n in names],
            color="tab:blue",
        )
        ax.set_xlabel("importance (PED-ANOVA)")
    else:
        ax.text(0.5, 0.5, note or "no varying parameter", ha="center", va="center", wrap=True)
        ax.set_axis_off()
    ax.set_title("Parameter importance for the score")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return note


def write_report(
    out_dir: Path,
    records: Sequence[TrialRecord],
    slo: SloSpec,
    space: Space,
    *,
    title: str,
    summary: str,
) -> Path:
    """Writes history.png, slo.png, importance.png, trials.txt and report.html."""
    out_dir.mkdir(parents=True, exist_ok=True)
    plot_history(records, out_dir / "history.png")
    plot_slo_tradeoff(records, slo, out_dir / "slo.png")
    plot_importance(records, space, slo, out_dir / "importance.png")
    rows = table_rows(records, slo)
    (out_dir / "trials.txt").write_text(format_table(rows) + "\n")
    images = "".join(
        f'<img alt="{name}" src="data:image/png;base64,'
        f'{base64.b64encode((out_dir / name).read_bytes()).decode()}">'
        for name in ("history.png", "slo.png", "importance.png")
    )
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

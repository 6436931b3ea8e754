"""The study report's plots (matplotlib, the `plots` extra): each trial's capacity with its
interval, against the target rate and the prefill ceiling's rate; latency against offered rate
(each SLO metric at its target percentile, at every probe) for vLLM's defaults and for the
winner, with the SLO lines and the ceiling; and Optuna's parameter importance.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib as mpl

mpl.use("Agg")
import matplotlib.pyplot as plt
import optuna

from slotune.models import SloSpec
from slotune.tuner.records import TrialRecord, TrialState, record_capacity, study_ceiling
from slotune.tuner.sampling import rebuild
from slotune.tuner.space import PARAM_SHORT, Space


def plot_capacity(records: Sequence[TrialRecord], path: Path) -> None:
    """Capacity per launched trial: a dot at the capacity, a thick bar over this engine
    start's interval (the fit's; the bracket of verdicts for records made before the fit) and a
    thin one over the configuration's (widened by the spread between engine starts)."""
    launched = [r for r in records if r.state != TrialState.REJECTED]
    fig, ax = plt.subplots(figsize=(7, 4))
    target = next((c.target_rate for r in launched if (c := record_capacity(r))), None)
    for r in launched:
        c = record_capacity(r)
        color = "tab:green" if r.feasible else "tab:red" if c else "black"
        if c is None:
            ax.scatter([r.number], [0], marker="x", color=color)
            continue
        if c.fitted:
            start_low, start_high = c.low or 0.0, c.high if c.high is not None else c.rate
        else:
            start_low, start_high = c.capacity, c.upper if c.upper is not None else c.capacity
        low, high = c.interval
        ax.plot([r.number, r.number], [low, high if high is not None else start_high],
                color=color, linewidth=1, alpha=0.6)  # fmt: skip
        ax.plot([r.number, r.number], [start_low, start_high], color=color, linewidth=4,
                alpha=0.5)  # fmt: skip
        marker = "s" if r.phase == "finalist" else "o"
        ax.scatter([r.number], [c.rate], color=color, marker=marker, zorder=3)
        if r.label == "vllm-defaults" and r.phase == "screen":
            ax.annotate("vLLM defaults", (r.number, c.rate), fontsize=7, xytext=(4, -10),
                        textcoords="offset points")  # fmt: skip
    if target is not None:
        ax.axhline(target, color="black", linestyle="--", label=f"target {target:.3g} req/s")
    ceiling = study_ceiling(list(records))
    if ceiling is not None and ceiling.prefill_rate:
        ax.axhline(
            ceiling.prefill_rate,
            color="tab:purple",
            linestyle=":",
            label=f"prefill ceiling {ceiling.prefill_rate:.3g} req/s",
        )
    ax.scatter([], [], color="tab:green", label="feasible")
    ax.scatter([], [], color="tab:red", label="infeasible")
    ax.scatter([], [], color="gray", marker="s", label="re-measure")
    ax.set_xlabel("trial")
    ax.set_ylabel("capacity (req/s within every SLO target)")
    ax.set_title("Capacity per trial: [highest rate passed, first rate not passed)")
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_latency(
    records: Sequence[TrialRecord],
    slo: SloSpec,
    winner: TrialRecord | None,
    path: Path,
    *,
    best: TrialRecord | None = None,
) -> None:
    """Each SLO metric at its target percentile against the offered rate, at every probe, for
    vLLM's defaults and the winner (or, with none, the configuration that carried the most):
    the curves whose crossing of the SLO line is the capacity."""
    targets = list(slo.targets().items())
    fig, axes = plt.subplots(1, len(targets), figsize=(6 * len(targets), 4), squeeze=False)
    baseline = next(
        (r for r in records if r.label == "vllm-defaults" and r.phase == "screen"), None
    )
    shown = [(baseline, "vLLM defaults", "tab:red")]
    if winner is not None and winner is not baseline:
        shown.append((winner, f"winner #{winner.number}", "tab:green"))
    elif winner is None and best is not None and best is not baseline:
        shown.append((best, f"best #{best.number} (infeasible)", "tab:orange"))
    ceiling = study_ceiling(list(records))
    for ax, (name, target) in zip(axes[0], targets, strict=True):
        for record, label, color in shown:
            c = record_capacity(record) if record else None
            if c is None:
                continue
            points = sorted(
                (p.rate, p.targets[name].value, p.verdict)
                for p in c.probes
                if name in p.targets and p.targets[name].value is not None
            )
            ax.plot([x for x, _, _ in points], [y for _, y, _ in points], "-o", color=color,
                    label=f"{label}: {c.rate:.3g} req/s in this measurement")  # fmt: skip
        ax.axhline(target.max_seconds, color="black", linestyle="--",
                   label=f"SLO p{target.percentile:g} <= {target.max_seconds:g}s")  # fmt: skip
        if ceiling is not None and ceiling.prefill_rate:
            ax.axvline(ceiling.prefill_rate, color="tab:purple", linestyle=":",
                       label="prefill ceiling")  # fmt: skip
        ax.set_yscale("log")
        ax.set_xlabel("offered rate (req/s)")
        ax.set_ylabel(f"{name} p{target.percentile:g} (s)")
        ax.set_title(f"{name.upper()} p{target.percentile:g} against offered rate")
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
    ax.set_title("Parameter importance for capacity")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return note


def write_plots(  # noqa: PLR0917 - the report's figures, given by position
    out_dir: Path,
    names: Sequence[str],
    records: Sequence[TrialRecord],
    slo: SloSpec,
    space: Space,
    winner: TrialRecord | None,
    *,
    best: TrialRecord | None = None,
) -> None:
    capacity, latency, importance = (out_dir / name for name in names)
    plot_capacity(records, capacity)
    plot_latency(records, slo, winner, latency, best=best)
    plot_importance(records, space, slo, importance)

"""The tuning study in the cluster: one step per reconcile, level-based, as observe → decide →
act.

Every step reads what the API holds — the study's place in `status.tuning`, its trial records
in an owned ConfigMap, the trial pod and load Job, the serving pods (`observe`) — decides from
that plain data what to do (`transitions.decide`, pure), does it (`act`), and returns the
status to write. Nothing lives only in memory, so an operator killed at any point carries on
where it stopped: a trial in flight is picked up by name, a record already kept is not kept
twice, and trial objects that belong to no trial in flight are deleted.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from slotune import render
from slotune.kube import KubeApi
from slotune.models import LLMDeploymentSpec, TuningStatus
from slotune.study.act import execute
from slotune.study.observe import KubeObservation
from slotune.study.transitions import Decision, Live, Settings, Situation, decide, serving_overlay

__all__ = ["Context", "Decision", "Live", "Settings", "serving_overlay", "step"]

log = logging.getLogger(__name__)


@dataclass
class Context:
    """One reconcile's inputs to the study, with the API to observe it in and act through."""

    owner: render.Owner
    spec: LLMDeploymentSpec
    previous: TuningStatus | None
    now: datetime
    kube: KubeApi
    active_hash: str  # config hash the serving Deployment's template runs
    serving_ready: bool  # every replica of that template is ready
    live: Live = field(default_factory=Live)
    settings: Settings = field(default_factory=Settings)


def step(ctx: Context) -> Decision:
    """Observes, decides, acts: one step of the LLMDeployment's study."""
    situation = Situation(
        owner=ctx.owner,
        spec=ctx.spec,
        previous=ctx.previous,
        now=ctx.now,
        active_hash=ctx.active_hash,
        serving_ready=ctx.serving_ready,
        live=ctx.live,
        settings=ctx.settings,
    )
    decision = decide(situation, KubeObservation(ctx.kube, ctx.owner, ctx.spec.engine.kind))
    # The rows that chose the step; a step that changes nothing is logged only when debugging.
    log.log(
        logging.INFO if decision.actions or decision.events else logging.DEBUG,
        "Decided a study step for %s/%s: %s",
        ctx.owner.namespace,
        ctx.owner.name,
        decision.why,
    )
    applied = execute(ctx.kube, decision.actions)
    _record_made(decision, applied)
    return decision


def _record_made(decision: Decision, applied: list[dict[str, Any]]) -> None:
    """The UIDs the server gave the trial pod and load Job this step created, into the trial in
    flight: from then on only those objects count as the trial's (`trials.replaced`)."""
    current = decision.tuning.current if decision.tuning else None
    if current is None:
        return
    for obj in applied:
        meta = obj.get("metadata") or {}
        if obj.get("kind") == "Pod" and meta.get("name") == current.pod:
            current.pod_uid = meta.get("uid") or current.pod_uid
        elif obj.get("kind") == "Job" and meta.get("name") == current.job:
            current.job_uid = meta.get("uid") or current.job_uid

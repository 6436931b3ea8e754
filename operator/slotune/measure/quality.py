"""The quality gate: does a lossy configuration (fp8 weights, an fp8 KV cache) still compute
what the reference computes?

Capacity cannot see quality: an fp8 KV cache that breaks a model serves its wrong tokens as
fast as right ones. So every lossy configuration is compared with a reference, the serving
configuration unquantized, on the same token sequences:

1. The reference generates greedily after seeded prompts in the workload's shape; each prompt
   with its continuation is one sequence.
2. Both engines score every sequence (`prompt_logprobs`: the engine's top-k next tokens at
   every position, teacher-forced, so one early difference does not derail the rest).
3. Per position: the KL divergence of the candidate's next-token distribution from the
   reference's, and whether the two agree on the most likely token.

The KL is taken over the reference's top-k tokens and one bucket for the rest of the
vocabulary. Merging tokens into one bucket can only lower a KL divergence (the log-sum
inequality), so with exact probabilities this is a lower bound of the full-vocabulary figure.
A reference token missing from the candidate's top-k is taken at the candidate's k-th
probability, an upper bound of its own; that raises its term's q and lowers the tail bucket's,
so the estimate is approximately, not provably, a lower bound. Where the top 20 hold nearly
all of the mass, as in a peaked distribution, the approximation is close.

With random weights (`--load-format dummy`) the KL measures numeric perturbation, not task
quality, and a near-uniform distribution makes agreement a tie-break: figures from such runs
say so. The gate's code path is the one real weights take.

This module is the arithmetic; `slotune.measure.scoring` asks the engines.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict

from slotune.models import QualitySpec

TOP_K = 20
"""Next tokens scored per position: vLLM's default --max-logprobs."""

BROKEN_KL = 100.0
"""The KL counted at a position whose log-probabilities are not finite numbers (nats): far
beyond any bound, and a position that does not agree."""


@dataclass(frozen=True)
class NextToken:
    """An engine's k most likely next tokens at one position, by token id, as log-probabilities."""

    top: Mapping[int, float]

    @property
    def argmax(self) -> int:
        return max(self.top, key=lambda token: self.top[token])


def kl_divergence(reference: NextToken, candidate: NextToken) -> float:
    """KL(reference || candidate) over the reference's top tokens and one bucket for the rest."""
    floor = min(candidate.top.values())
    total = 0.0
    p_rest, q_rest = 1.0, 1.0
    for token, logp in reference.top.items():
        logq = min(candidate.top.get(token, floor), 0.0)
        p = math.exp(logp)
        total += p * (logp - logq)
        p_rest -= p
        q_rest -= math.exp(logq)
    p_rest = max(p_rest, 0.0)
    q_rest = max(q_rest, 1e-12)
    if p_rest > 0:
        total += p_rest * math.log(p_rest / q_rest)
    return max(total, 0.0)


class QualityFigures(BaseModel):
    """A candidate against the reference, over every scored position."""

    model_config = ConfigDict(allow_inf_nan=False)

    mean_kl: float
    p99_kl: float
    agreement: float
    positions: int
    sequences: int

    def describe(self) -> str:
        return (
            f"KL mean {self.mean_kl:.4g}, p99 {self.p99_kl:.4g} nats; top token agrees at "
            f"{100 * self.agreement:.1f}% of {self.positions} positions"
        )


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    rank = q / 100 * (len(ordered) - 1)
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def compare(
    reference: Sequence[Sequence[NextToken]], candidate: Sequence[Sequence[NextToken]]
) -> QualityFigures:
    """The figures of a candidate's scores against the reference's, sequence by sequence."""
    if len(reference) != len(candidate) or not reference:
        raise ValueError(f"{len(candidate)} scored sequences against {len(reference)}")
    kls: list[float] = []
    agreed = 0
    for ref_seq, cand_seq in zip(reference, candidate, strict=True):
        if len(ref_seq) != len(cand_seq):
            raise ValueError(f"a sequence scored at {len(cand_seq)} positions, not {len(ref_seq)}")
        for ref, cand in zip(ref_seq, cand_seq, strict=True):
            kl = kl_divergence(ref, cand)
            if not (math.isfinite(kl) and all(math.isfinite(v) for v in cand.top.values())):
                # NaN or infinite log-probabilities: the candidate's numbers are broken there.
                kls.append(BROKEN_KL)
                continue
            kls.append(kl)
            agreed += ref.argmax == cand.argmax
    if not kls:
        raise ValueError("no position was scored")
    return QualityFigures(
        mean_kl=sum(kls) / len(kls),
        p99_kl=_percentile(kls, 99),
        agreement=agreed / len(kls),
        positions=len(kls),
        sequences=len(reference),
    )


def judge(figures: QualityFigures, bounds: QualitySpec) -> str | None:
    """Why a configuration fails the gate, or None when it passes every bound."""
    broken = []
    if figures.mean_kl > bounds.max_mean_kl:
        broken.append(f"mean KL {figures.mean_kl:.4g} > {bounds.max_mean_kl:g}")
    if figures.p99_kl > bounds.max_p99_kl:
        broken.append(f"p99 KL {figures.p99_kl:.4g} > {bounds.max_p99_kl:g}")
    if figures.agreement < bounds.min_agreement:
        broken.append(f"top-token agreement {figures.agreement:.3f} < {bounds.min_agreement:g}")
    return f"quality gate: {'; '.join(broken)}" if broken else None

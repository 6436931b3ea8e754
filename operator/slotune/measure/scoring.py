"""The quality gate's engine side: seeded prompts, the reference's continuations, and each
engine's scores of them (`slotune.measure.quality` judges them)."""

from __future__ import annotations

import json
import math
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slotune.measure import loadgen
from slotune.measure.quality import TOP_K, NextToken, QualityFigures, compare
from slotune.models import QualitySpec, WorkloadSpec


def prompts(
    bounds: QualitySpec, *, prompt_tokens: int, shared_prefix_ratio: float, seed: int
) -> list[list[int]]:
    """Seeded prompts in the workload's shape (token ids, as the load generator sends them)."""
    shape = loadgen.Workload(
        num_requests=bounds.prompts,
        seed=seed,
        rate=math.inf,
        prompt_tokens=prompt_tokens,
        shared_prefix_ratio=shared_prefix_ratio,
    )
    return [
        list(plan.prompt) for plan in loadgen.plan_requests(shape) if isinstance(plan.prompt, list)
    ]


@dataclass(frozen=True)
class Scorer:
    """One engine's OpenAI-compatible completions endpoint, asked one request at a time (so
    that batching does not move its numbers between runs)."""

    url: str
    model: str
    api_key: str | None = None
    timeout: float = 300.0

    def _complete(self, body: dict[str, Any]) -> dict[str, Any]:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(  # noqa: S310 - the trial's own http URL
            loadgen.completions_url(self.url),
            data=json.dumps({"model": self.model, **body}).encode(),
            headers=headers,
        )
        with urllib.request.urlopen(request, timeout=self.timeout) as response:  # noqa: S310
            answer: dict[str, Any] = json.loads(response.read())
        return answer

    def continue_greedily(self, prompt: Sequence[int], tokens: int) -> list[int]:
        """The prompt followed by `tokens` greedily generated tokens."""
        if tokens == 0:
            return list(prompt)
        choice = self._complete(
            {
                "prompt": list(prompt),
                "max_tokens": tokens,
                "min_tokens": tokens,
                "ignore_eos": True,
                "temperature": 0,
                "return_token_ids": True,
            }
        )["choices"][0]
        return [*prompt, *choice["token_ids"]]

    def score(self, sequence: Sequence[int]) -> list[NextToken]:
        """The engine's top-k next tokens at every position of the sequence after the first."""
        choice = self._complete(
            {
                "prompt": list(sequence),
                "max_tokens": 1,
                "temperature": 0,
                "prompt_logprobs": TOP_K,
            }
        )["choices"][0]
        return [_next_token(entry) for entry in choice["prompt_logprobs"][1:]]


def _next_token(entry: Mapping[str, Mapping[str, Any]]) -> NextToken:
    """One position of vLLM's prompt_logprobs: the top-k by rank (the actual token is listed
    too, at its own rank, which may lie outside the top-k)."""
    top = {
        int(token): float(value["logprob"])
        for token, value in entry.items()
        if value.get("rank") is not None and value["rank"] <= TOP_K
    }
    if not top:
        raise ValueError("a position came back without its top tokens")
    return NextToken(top)


@dataclass(frozen=True)
class Reference:
    """The reference's sequences and its scores of them: what every candidate is held to.
    `key` says what it was taken for (the model, the bounds' prompts, the workload's shape):
    a reference kept for another is not used."""

    sequences: list[list[int]]
    scores: list[list[NextToken]]
    key: dict[str, Any]

    @classmethod
    def take(
        cls,
        engine: Scorer,
        prompts: Sequence[Sequence[int]],
        generated: int,
        key: dict[str, Any] | None = None,
    ) -> Reference:
        sequences = [engine.continue_greedily(p, generated) for p in prompts]
        return cls(sequences, [engine.score(s) for s in sequences], key or {})

    def hold(self, candidate: Scorer) -> QualityFigures:
        """The candidate's figures against this reference, on the same sequences."""
        return compare(self.scores, [candidate.score(s) for s in self.sequences])

    def to_json(self) -> str:
        # Log-probabilities to 6 significant digits: a KL of 1e-6 nats is far below any bound.
        scores = [
            [[[t, float(f"{lp:.6g}")] for t, lp in n.top.items()] for n in s] for s in self.scores
        ]
        return json.dumps({"key": self.key, "sequences": self.sequences, "scores": scores})

    @classmethod
    def from_json(cls, text: str) -> Reference:
        saved = json.loads(text)
        scores = [
            [NextToken({int(t): float(lp) for t, lp in n}) for n in scored]
            for scored in saved["scores"]
        ]
        return cls([[int(t) for t in s] for s in saved["sequences"]], scores, saved.get("key", {}))

    def save(self, path: Path) -> None:
        """Written whole or not at all (a temporary file renamed over the old one)."""
        partial = path.with_name(path.name + ".partial")
        partial.write_text(self.to_json())
        partial.replace(path)


def reference_key(
    model: str, bounds: QualitySpec, workload: WorkloadSpec, seed: int
) -> dict[str, Any]:
    """What a reference is taken for: a change to any of it needs another."""
    return {
        "model": model,
        "prompts": bounds.prompts,
        "generated_tokens": bounds.generated_tokens,
        "prompt_tokens": gate_prompt_tokens(bounds, workload),
        "shared_prefix_ratio": workload.shared_prefix_ratio,
        "seed": seed,
    }


def gate_prompt_tokens(bounds: QualitySpec, workload: WorkloadSpec) -> int:
    """The gate's prompt length: the workload's mean (512 where it gives none), at most
    `maxPromptTokens`."""
    mean = workload.prompt_tokens.mean if workload.prompt_tokens else DEFAULT_PROMPT_TOKENS
    return min(mean, bounds.max_prompt_tokens)


def take_reference(
    engine: Scorer, bounds: QualitySpec, workload: WorkloadSpec, seed: int
) -> Reference:
    """The reference for a study: seeded prompts in its workload's shape, continued and scored
    by the reference engine."""
    return Reference.take(
        engine,
        prompts(
            bounds,
            prompt_tokens=gate_prompt_tokens(bounds, workload),
            shared_prefix_ratio=workload.shared_prefix_ratio,
            seed=seed,
        ),
        bounds.generated_tokens,
        reference_key(engine.model, bounds, workload, seed),
    )


SCORING_ERRORS = (OSError, ValueError, KeyError, IndexError, TypeError)
"""What asking an engine for its scores can raise: the connection (urllib's errors are
OSErrors), an answer that is not what was asked for, figures that are not numbers."""


def not_scored(error: Exception) -> str:
    """A gate's cause when the engines could not be scored: the configuration is refused (it
    was not shown to pass), and its capacity is kept."""
    return f"quality gate: could not score: {type(error).__name__}: {str(error)[:200]}"


DEFAULT_PROMPT_TOKENS = 512
"""Prompt length where the workload gives none."""

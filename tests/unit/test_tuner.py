"""The tuner's logic with a scripted runtime: rules checked before launch, failed starts as
infeasible observations, determinism, stopping, finalists, and rebuilding from records.

The runtime and measurement here are fakes of the engine (the real engine's tuning runs are
tests/engine and the benchmark); they answer from the configuration as plain data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from tests.support.specs import llm_spec, tuning

from slotune.engine.startup import FailureKind, StartFailure, StartupFacts
from slotune.measure.capacity import (
    AtTarget,
    Capacity,
    MeasureRequest,
    Probe,
    ProbeVerdict,
    TargetFigures,
    capacity_of,
    next_index,
    next_probe,
)
from slotune.measure.crossing import Difference
from slotune.measure.probe import default_search
from slotune.measure.record import Measurement
from slotune.models import LLMDeploymentSpec
from slotune.runtime import EngineConfig, EngineStartError
from slotune.slo.attainment import wilson_interval
from slotune.tuner import loop
from slotune.tuner.loop import (
    Finished,
    Launch,
    NextTrial,
    Planner,
    Tuner,
    TunerOptions,
    _confirmed,
    versus_defaults,
)
from slotune.tuner.records import RecordStore, TrialRecord, TrialState
from slotune.tuner.space import CPU


def spec(**fields: Any) -> LLMDeploymentSpec:
    return llm_spec(tuning=tuning(**{"maxTrials": 8, "seed": 7, **fields}))


@dataclass
class FakeEngine:
    base_url: str
    facts: StartupFacts = field(default_factory=StartupFacts)

    def stop(self) -> None:
        pass


@dataclass
class ScriptedRuntime:
    """Fails configurations above a token budget (as an OOM would); counts every start."""

    fail_above: int = 1 << 30
    interrupt_at: int | None = None
    started: list[dict[str, Any]] = field(default_factory=list)

    def start(self, config: EngineConfig, *, timeout: float) -> FakeEngine:
        if self.interrupt_at is not None and len(self.started) == self.interrupt_at:
            raise KeyboardInterrupt
        args = config.args.explicit()
        self.started.append(args)
        if args.get("max_num_batched_tokens", 0) > self.fail_above:
            raise EngineStartError(
                StartFailure(FailureKind.OUT_OF_MEMORY, "the engine ran out of memory", ["OOM"])
            )
        return FakeEngine(base_url=f"fake://{len(self.started)}")


def true_capacity(budget: int) -> float:
    """A scripted engine's capacity (req/s): a larger token budget stalls decodes (TPOT gives
    out at a lower rate), a smaller one prefills less per step (TTFT gives out)."""
    tpot_limited = 2.0 * 0.05 / (0.00002 * budget + 0.01)
    ttft_limited = 2.0 * 2.0 / (200.0 / budget + 0.1)
    return min(tpot_limited, ttft_limited)


def scripted_capacity(capacity_rate: float, request: MeasureRequest) -> Measurement:
    """The real capacity search against a scripted engine: a probe passes at or below the
    engine's capacity and fails above it."""
    settings = default_search(request.target_rate, request.ceiling)
    if request.precise:  # as CapacityMeasure brackets the baseline and re-measurements
        settings = replace(settings, infeasible_precision=settings.precision)
    probes: list[Probe] = []
    while (k := next_probe(settings, {p.k: p.verdict for p in probes})) is not None:
        rate = settings.rate(k)
        verdict = ProbeVerdict.PASS if rate <= capacity_rate else ProbeVerdict.FAIL
        probes.append(Probe(k=k, rate=rate, sent_rate=rate, verdict=verdict, requests=80))
    return Measurement(capacity=capacity_of(settings, probes), completed=80 * len(probes))


def measure_by_budget(configs: dict[str, dict[str, Any]]) -> Any:
    def measure(base_url: str, request: MeasureRequest) -> Measurement:
        budget = configs[base_url]["max_num_batched_tokens"]
        return scripted_capacity(true_capacity(budget), request)

    return measure


def make_tuner(
    tmp_path: Path,
    s: LLMDeploymentSpec,
    runtime: ScriptedRuntime,
    gate: Any = None,
    **options: Any,
) -> Tuner:
    started: dict[str, dict[str, Any]] = {}

    class Recording:
        def start(self, config: EngineConfig, *, timeout: float) -> FakeEngine:
            engine = runtime.start(config, timeout=timeout)
            started[engine.base_url] = config.args.explicit()
            return engine

    return Tuner(
        s,
        runtime=Recording(),
        measure=measure_by_budget(started),
        platform=CPU,
        model="tiny",
        served_name="tiny",
        store=RecordStore(tmp_path / "trials.jsonl"),
        options=TunerOptions(**options),
        gate=gate,
    )


class RefusingFp8:
    """A quality gate that refuses an fp8 KV cache (the real gate, against real engines, is
    tests/engine/test_quality_gate.py); it records which trials it saw."""

    def __init__(self) -> None:
        self.seen: list[tuple[str | None, dict[str, Any]]] = []

    def after(
        self, label: str | None, settings: dict[str, Any], url: str, measured: Measurement
    ) -> Measurement:
        self.seen.append((label, settings))
        if settings.get("kv_cache_dtype") == "fp8":
            return measured.model_copy(update={"quality_refused": "quality gate: mean KL 0.12"})
        return measured


def test_a_configuration_that_fails_the_quality_gate_cannot_win(tmp_path: Path) -> None:
    """Every fp8 trial carries the load (its capacity is the same as without fp8) but fails
    the gate: it is recorded as measured, infeasible, with the gate's words; the winner is a
    lossless configuration."""
    s = spec(
        maxTrials=8,
        quality={"allowLossy": True},
        searchSpace={"kvCacheDtype": ["auto", "fp8"]},
    )
    gate = RefusingFp8()
    outcome = make_tuner(tmp_path, s, ScriptedRuntime(), gate=gate, patience=3).run()
    refused = [r for r in outcome.records if r.params.get("kv_cache_dtype") == "fp8"]
    assert refused, "the sampler drew fp8"
    for record in refused:
        assert record.state == TrialState.MEASURED
        assert record.measurement is not None
        assert record.measurement.capacity_rate > 0
        assert not record.feasible
        assert record.cause == "quality gate: mean KL 0.12"
        assert min(record.constraints) >= 1.0
    assert outcome.winner is not None
    assert outcome.winner.params.get("kv_cache_dtype") != "fp8"
    assert len(gate.seen) == sum(1 for r in outcome.records if r.launched)


def test_defaults_miss_and_the_tuner_finds_a_configuration_that_meets_the_slo(
    tmp_path: Path,
) -> None:
    runtime = ScriptedRuntime()
    outcome = make_tuner(tmp_path, spec(maxTrials=12), runtime, patience=3).run()
    assert outcome.baseline is not None
    assert outcome.baseline.label == "vllm-defaults"
    assert outcome.baseline.params["max_num_batched_tokens"] == 2048
    assert not outcome.baseline.feasible  # 2048 tokens: capacity 1.96 req/s < 2.2 needed
    assert outcome.winner is not None
    assert outcome.winner.feasible
    finalists = [r for r in outcome.records if r.phase == "finalist"]
    assert finalists, "the winner was re-measured before it was declared"
    assert outcome.winner.number in {r.of_trial for r in finalists}


def test_with_nothing_feasible_the_study_re_measures_the_best_and_says_how_far_it_falls_short(
    tmp_path: Path,
) -> None:
    # No token budget carries 11 req/s on the scripted engine (its best carries about 5.8).
    runtime = ScriptedRuntime()
    s = spec(
        maxTrials=6,
        workload={**spec().tuning.workload.model_dump(by_alias=True), "requestRate": 10},
    )
    outcome = make_tuner(tmp_path, s, runtime, patience=100).run()
    assert outcome.winner is None
    screened = [r for r in outcome.records if r.phase == "screen" and r.launched]
    assert len(screened) == 4
    assert not any(r.feasible for r in screened)
    finalists = [r for r in outcome.records if r.phase == "finalist"]
    by_capacity = sorted(screened, key=lambda r: -r.measurement.capacity_rate)  # type: ignore[union-attr]
    # The two that carried the most were re-measured, bracketed finely, on a fresh schedule.
    assert [r.of_trial for r in finalists] == [r.number for r in by_capacity[:2]]
    assert all(r.measurement and r.measurement.capacity for r in finalists)
    assert outcome.best is not None
    assert outcome.confirmed is not None
    assert outcome.best.number in {r.of_trial for r in finalists}
    # Its capacity is what both measurements allow (the scripted engine repeats itself, so
    # the fine bracket of the re-measurement refines the coarse one), short of the target.
    again = next(r for r in finalists if r.of_trial == outcome.best.number)
    first, second = outcome.best.measurement, again.measurement
    assert first is not None
    assert second is not None
    assert first.capacity is not None
    assert second.capacity is not None
    assert outcome.confirmed.capacity == max(first.capacity.capacity, second.capacity.capacity)
    assert outcome.confirmed.capacity < outcome.target_rate
    # The fine bracket: the re-measurement's probes bisect to the search's precision.
    if outcome.best.label != "vllm-defaults":  # the baseline is bracketed finely anyway
        assert len(second.capacity.probes) > len(first.capacity.probes)


def test_known_rules_reject_configurations_before_launch(tmp_path: Path) -> None:
    runtime = ScriptedRuntime()
    narrowed = spec(
        searchSpace={
            "maxNumBatchedTokens": {"values": [64, 1024]},
            "maxNumSeqs": {"values": [128]},
            "blockSize": {"values": [24, 128]},
        }
    )
    outcome = make_tuner(tmp_path, narrowed, runtime).run()
    rejected = [r for r in outcome.records if r.state == TrialState.REJECTED]
    assert rejected
    for record in rejected:
        assert record.params["max_num_batched_tokens"] == 64 or record.params["block_size"] == 24
        assert "max-num-batched-tokens >= max-num-seqs" in (record.cause or "") or (
            "24 is not valid on CPU_ATTN" in (record.cause or "")
        )
    # None of them ever reached the runtime.
    for args in runtime.started:
        assert args["max_num_batched_tokens"] >= args["max_num_seqs"]
        assert args["block_size"] % 32 == 0


def test_a_crash_is_an_infeasible_observation_with_its_cause(tmp_path: Path) -> None:
    runtime = ScriptedRuntime(fail_above=1500)
    tuner = make_tuner(tmp_path, spec(), runtime)
    outcome = tuner.run()
    failed = [r for r in outcome.records if r.state == TrialState.FAILED]
    assert failed, "the defaults (2048 tokens) fail to start here"
    assert failed[0].failure_kind == "OutOfMemory"
    assert "ran out of memory" in (failed[0].cause or "")
    assert not failed[0].feasible
    # The sampler saw it as an infeasible observation, not a dropped trial.
    trial = tuner.study.trials[failed[0].number]
    assert trial.state.name == "COMPLETE"
    assert all(c > 0 for c in trial.user_attrs["constraints"])


def test_same_seed_same_study(tmp_path: Path) -> None:
    first = make_tuner(tmp_path / "a", spec(), ScriptedRuntime()).run()
    second = make_tuner(tmp_path / "b", spec(), ScriptedRuntime()).run()
    assert [r.params for r in first.records] == [r.params for r in second.records]


def test_a_study_rebuilt_from_records_continues_where_it_stopped(tmp_path: Path) -> None:
    interrupted = ScriptedRuntime(interrupt_at=3)
    with pytest.raises(KeyboardInterrupt):
        make_tuner(tmp_path, spec(maxTrials=7), interrupted, patience=100).run()
    before = RecordStore(tmp_path / "trials.jsonl").load()
    assert len(before) == 3

    resumed_runtime = ScriptedRuntime()
    resumed = make_tuner(tmp_path, spec(maxTrials=7), resumed_runtime, patience=100)
    assert len(resumed.study.trials) == 3  # rebuilt from the records
    outcome = resumed.run()
    launched = [r for r in outcome.records if r.launched]
    assert len(launched) == 7  # the budget counts the trials before the restart
    assert [r.number for r in outcome.records if r.phase == "screen"] == list(range(5))
    assert [r.label for r in outcome.records].count("vllm-defaults") == 1  # not repeated
    # Trials after the restart are new configurations, not replays of the first three.
    screened = [r.params for r in outcome.records if r.phase == "screen"]
    assert all(params not in screened[:3] for params in screened[3:])


def test_stops_when_the_slo_is_met_and_trials_stop_paying(tmp_path: Path) -> None:
    outcome = make_tuner(tmp_path, spec(maxTrials=30), ScriptedRuntime(), patience=2).run()
    assert "no improvement" in outcome.stopped_because
    assert sum(1 for r in outcome.records if r.launched) < 30


def test_until_confirmed_re_measures_the_first_feasible_trial_at_once_and_stops_on_it(
    tmp_path: Path,
) -> None:
    runtime = ScriptedRuntime()
    outcome = make_tuner(tmp_path, spec(maxTrials=12), runtime, until_confirmed=True).run()
    first = next(r for r in outcome.records if r.feasible)
    assert first.phase == "screen"
    again = outcome.records[outcome.records.index(first) + 1]
    assert (again.phase, again.of_trial, again.params) == ("finalist", first.number, first.params)
    assert again is outcome.records[-1]
    assert outcome.winner is not None
    assert outcome.winner.number == first.number
    assert outcome.stopped_because == "a configuration was confirmed feasible"
    assert [r.number for r in outcome.records] == list(range(len(outcome.records)))


def test_until_confirmed_screening_goes_on_after_a_re_measurement_that_fails(
    tmp_path: Path,
) -> None:
    """The first re-measurement misses (the boundary noise it is there to catch); the study
    screens on and stops at the next configuration whose re-measurement holds."""
    s = spec(maxTrials=12)
    tuner = make_tuner(tmp_path, s, ScriptedRuntime(), until_confirmed=True)
    measure = tuner.measure
    missed: list[int] = []

    def first_re_measure_misses(base_url: str, request: MeasureRequest) -> Measurement:
        if request.seed == s.tuning.seed + 1 and not missed:
            missed.append(1)
            return scripted_capacity(0.1, request)
        return measure(base_url, request)

    tuner.measure = first_re_measure_misses
    outcome = tuner.run()
    finalists = [r for r in outcome.records if r.phase == "finalist"]
    assert [r.feasible for r in finalists] == [False, True]
    assert outcome.winner is not None
    assert outcome.winner.number == finalists[-1].of_trial
    # A later screen's, not the one whose re-measurement missed.
    assert outcome.winner.number > finalists[0].of_trial
    assert [r.number for r in outcome.records] == list(range(len(outcome.records)))


def test_the_report_is_written_from_records(tmp_path: Path) -> None:
    from slotune.local.report import write_report  # noqa: PLC0415 - matplotlib is slow to load

    s = spec(maxTrials=10)
    tuner = make_tuner(tmp_path, s, ScriptedRuntime(fail_above=4000), patience=3)
    outcome = tuner.run()
    assert s.slo is not None
    page = write_report(
        tmp_path / "report", outcome.records, s.slo, tuner.space, title="t", summary="s"
    )
    for name in ("capacity.png", "latency.png", "importance.png", "trials.txt"):
        assert (tmp_path / "report" / name).stat().st_size > 0
    html = page.read_text()
    assert html.count("data:image/png;base64,") == 3
    assert "vllm-defaults" in (tmp_path / "report" / "trials.txt").read_text()


def test_without_matplotlib_the_report_is_the_table_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from slotune.local import report  # noqa: PLC0415

    monkeypatch.setattr(report, "plots_available", lambda: False)
    s = spec(maxTrials=4)
    tuner = make_tuner(tmp_path, s, ScriptedRuntime(), patience=3)
    outcome = tuner.run()
    assert s.slo is not None
    page = report.write_report(
        tmp_path / "r", outcome.records, s.slo, tuner.space, title="t", summary="s"
    )
    assert not (tmp_path / "r" / "capacity.png").exists()
    assert "pip install &#x27;slotune[plots]&#x27;" in page.read_text()
    assert "vllm-defaults" in (tmp_path / "r" / "trials.txt").read_text()


def _stepwise_study(s: LLMDeploymentSpec) -> tuple[list[TrialRecord], Finished]:
    """The study as the operator runs it: a planner rebuilt from the records at every step."""
    records: list[TrialRecord] = []
    configs: dict[str, dict[str, Any]] = {}
    measure = measure_by_budget(configs)
    runtime = ScriptedRuntime(fail_above=3000)
    while True:
        tuner = Planner(
            s,
            platform=CPU,
            model="tiny",
            served_name="tiny",
            records=records,
            options=TunerOptions(patience=100),
        )
        planned = tuner.plan()
        records = [*records, *tuner.rejected]  # with any configuration rejected while planning
        if isinstance(planned, Finished):
            return records, planned
        try:
            engine = runtime.start(tuner._config(planned.params), timeout=1)
        except EngineStartError as error:
            launch = Launch(TrialState.FAILED, cause=error.failure.describe())
        else:
            configs[engine.base_url] = runtime.started[-1]
            request = tuner.measure_request(planned)
            launch = Launch(TrialState.MEASURED, measurement=measure(engine.base_url, request))
        records.append(tuner.record_of(planned, launch, 0.0))


def test_a_planner_rebuilt_from_records_at_every_step_runs_a_whole_study() -> None:
    """The operator keeps nothing in memory between steps: planning from the records alone
    is deterministic (a restart plans the same), never repeats a configuration, and ends
    with re-measured finalists and a winner."""
    s = spec(maxTrials=7)
    records, finished = _stepwise_study(s)
    again, _ = _stepwise_study(s)
    assert [r.params for r in records] == [r.params for r in again]
    screened = [r for r in records if r.phase == "screen"]
    assert len({tuple(sorted(r.params.items())) for r in screened}) == len(screened)
    assert screened[0].label == "vllm-defaults"
    assert sum(1 for r in records if r.launched) == 7
    assert any(r.phase == "finalist" for r in records)
    assert finished.winner is not None
    assert finished.winner.feasible


def measured(number: int, capacity: float, upper: float | None, **fields: Any) -> TrialRecord:
    found = Capacity(capacity=capacity, upper=upper, target_rate=17.6, feasible=False, stopped="-")
    return TrialRecord(
        number=number,
        params={},
        state=TrialState.MEASURED,
        measurement=Measurement(capacity=found),
        **fields,
    )


def test_two_measurements_that_agree_give_the_higher_pass_and_two_that_disagree_the_lower() -> None:
    # The H200 study's #4: screening bracketed it coarsely ([11.1, 17.6): 11.1 is only a bound),
    # its re-measurement finely ([15.7, 17.6)). Nothing contradicts 15.7.
    coarse, fine = measured(4, 11.1, 17.6), measured(7, 15.7, 17.6, phase="finalist", of_trial=4)
    agreed = _confirmed(coarse, fine)
    assert (agreed.capacity, agreed.upper) == (15.7, 17.6)
    assert _confirmed(fine, coarse).capacity == 15.7
    # One start passed 4.84 where the other failed 3.84: the run-to-run spread, so the lower
    # one stands, and the interval covers both.
    high, low = measured(2, 4.84, 5.43), measured(6, 3.42, 3.84, phase="finalist", of_trial=2)
    disagreed = _confirmed(high, low)
    assert (disagreed.capacity, disagreed.upper) == (3.42, 5.43)
    # A measurement that never failed bounds nothing from above.
    assert _confirmed(measured(1, 8.0, None), measured(5, 6.0, 7.0)).capacity == 6.0
    assert _confirmed(measured(1, 6.0, None), measured(5, 6.0, 7.0)).upper is None


# --- fitted capacities ---------------------------------------------------------------------------


def fitted_capacity(capacity_rate: float, request: MeasureRequest) -> Measurement:
    """The real search and fit against a scripted engine whose attainment of both targets
    (p95 TTFT and TPOT) falls smoothly through 95% at its capacity, seen over 200 requests a
    probe."""
    settings = default_search(request.target_rate, request.ceiling)
    if request.precise:
        settings = replace(settings, infeasible_precision=settings.precision)
    percentiles = {"ttft": 95.0, "tpot": 95.0}
    probes: list[Probe] = []
    while (k := next_index(settings, probes, percentiles)) is not None:
        rate = settings.rate(k)
        z = math.log(0.95 / 0.05) - 20 * math.log(rate / capacity_rate)
        good = round(200 / (1 + math.exp(-z)))
        figures = TargetFigures(good=good, total=200, low=0.0, high=1.0, effective=200.0)
        low, _ = wilson_interval(good, 200)
        verdict = ProbeVerdict.PASS if low >= 0.95 else ProbeVerdict.FAIL
        probes.append(
            Probe(k=k, rate=rate, sent_rate=rate, verdict=verdict, requests=200,
                  targets={"ttft": figures, "tpot": figures})
        )  # fmt: skip
    found = capacity_of(settings, probes, percentiles, spread=request.spread)
    return Measurement(capacity=found, completed=200 * len(probes))


def test_fitted_capacities_confirm_a_winner_by_the_paired_verdict(tmp_path: Path) -> None:
    """With every trial's capacity fitted and its interval widened by the platform's spread,
    the study confirms a winner whose pooled interval carries the target, and says by how much
    it beats vLLM's defaults, with the interval of that ratio."""
    started: dict[str, dict[str, Any]] = {}
    runtime = ScriptedRuntime()

    class Recording:
        def start(self, config: EngineConfig, *, timeout: float) -> FakeEngine:
            engine = runtime.start(config, timeout=timeout)
            started[engine.base_url] = config.args.explicit()
            return engine

    def measure(base_url: str, request: MeasureRequest) -> Measurement:
        assert request.spread == replace(CPU, spread=0.05).spread
        return fitted_capacity(true_capacity(started[base_url]["max_num_batched_tokens"]), request)

    tuner = Tuner(
        spec(maxTrials=10),
        runtime=Recording(),
        measure=measure,
        platform=replace(CPU, spread=0.05),
        model="tiny",
        served_name="tiny",
        store=RecordStore(tmp_path / "trials.jsonl"),
        options=TunerOptions(patience=3),
    )
    outcome = tuner.run()
    measured = [r.measurement.capacity for r in outcome.records if r.measurement]
    assert all(c is not None and c.fitted and c.spread == 0.05 for c in measured)
    assert outcome.winner is not None
    assert outcome.confirmed is not None
    assert outcome.confirmed.starts == 2
    assert outcome.confirmed.at_target == AtTarget.FEASIBLE
    true = true_capacity(outcome.winner.params["max_num_batched_tokens"])
    assert outcome.confirmed.rate == pytest.approx(true, rel=0.05)
    found = versus_defaults(outcome.records, outcome.confirmed)
    assert found is not None
    assert found.verdict == Difference.BETTER
    assert found.low > 1
    assert found.ratio == pytest.approx(true / true_capacity(2048), rel=0.08)


def test_a_lossy_record_that_no_gate_passed_cannot_win(tmp_path: Path) -> None:
    """A study resumed from records made before lossy values needed allowLossy (the H200's
    default space drew an fp8 KV cache) holds fp8 records that no gate judged: they stay in the
    records, but are never finalists, so the study cannot promote them."""
    s = spec(maxTrials=3)
    runtime = ScriptedRuntime()
    first = make_tuner(tmp_path, s, runtime)
    defaults = first.run_trial(first.plan())  # type: ignore[arg-type]
    drawn = {**defaults.params, "max_num_batched_tokens": 400, "kv_cache_dtype": "fp8"}
    lossy = first.record_of(
        NextTrial(1, drawn, seed=7),
        Launch(TrialState.MEASURED, measurement=scripted_capacity(5.0, first.measure_request(
            NextTrial(1, drawn, seed=7)))),
        1.0,
    )  # fmt: skip
    assert lossy.feasible  # it carries the load ...
    first.record(lossy)
    assert loop.refused(
        first.spec, first.platform, lossy
    )  # ... but no gate passed its fp8 KV cache
    finalists = loop.finalists(first.spec, first.platform, first.options, first.records)
    assert all(f.number != 1 for f in finalists)

"""Where an engine configuration runs, behind one interface.

`slotune.local.process` starts vLLM processes on this machine (the CPU engine in tests, a GPU
where there is one); `slotune.tuner.landscape.ReplayRuntime` serves recorded trials instead (the
sampler benchmark). The tuner asks a runtime to start a configuration, measures the running engine
over HTTP, and stops it; a start that fails comes back as a classified `StartFailure`, never as a
hang or a bare traceback. In the cluster there is no runtime object: the operator plans each trial
with the same planner (`tuner.loop.Planner`) and runs it as pods step by step across reconciles
(`slotune.study`), recording it the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from slotune.engine.startup import StartFailure, StartupFacts
from slotune.models import EngineArgs


@dataclass(frozen=True)
class EngineConfig:
    """One engine configuration: the model and every flag that shapes the engine."""

    model: str
    served_name: str
    args: EngineArgs = field(default_factory=EngineArgs)
    extra_args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()


class EngineStartError(Exception):
    """A configuration did not become a healthy engine."""

    def __init__(self, failure: StartFailure) -> None:
        super().__init__(failure.describe())
        self.failure = failure


class RunningEngine(Protocol):
    """A healthy engine, reachable over HTTP until stopped."""

    @property
    def base_url(self) -> str: ...

    @property
    def facts(self) -> StartupFacts: ...

    def stop(self) -> None: ...


class Runtime(Protocol):
    def start(self, config: EngineConfig, *, timeout: float) -> RunningEngine:
        """Starts the configuration and waits until it is healthy; raises EngineStartError."""
        ...

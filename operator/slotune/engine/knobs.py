"""What a knob is: an engine setting slotune sets from a typed field of `spec.engine.args`.

An engine adapter lists its knobs in one table (`slotune.engine.vllm.KNOBS`), and everything
that names a knob reads that table: the flags rendered and the ones `extraArgs` may not repeat,
the short names of trial lines, the default search space on each platform, and the engine's
own defaults there. A unit test pins the table to the API's fields. Adding a knob is one entry
there and one field in `EngineArgs` (and in `SearchSpace`, if it is tuned).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class IntSpan:
    """Integers from low to high, drawn on a log scale where `log`."""

    low: int
    high: int
    log: bool = False


@dataclass(frozen=True)
class FloatSpan:
    """Floats from low to high in steps of `step`."""

    low: float
    high: float
    step: float


@dataclass(frozen=True)
class Choices:
    """A set of values, of which a platform keeps those its attention backend accepts."""

    values: tuple[Any, ...]


Range = IntSpan | FloatSpan | Choices


def _render_value(value: Any) -> str:
    if isinstance(value, float):
        return repr(round(value, 6))
    return str(value)


@dataclass(frozen=True)
class Knob:
    """One engine setting: its API field, its flag, how trial lines name it, where it is tuned
    by default and what the engine does when it is unset."""

    field: str
    """The field of `EngineArgs` (and of `SearchSpace` when tuned), in snake case."""
    flag: str
    spec_name: str
    """The field as the spec spells it (camel case)."""
    short: str
    """The name in trial lines and plots."""
    aliases: tuple[str, ...] = ()
    """Other spellings users write for it: the parser's own aliases, and older releases' flags
    (refused in `extraArgs` with a pointer to the field)."""
    negative: str | None = None
    """The flag that turns a boolean knob off."""
    inverted: bool = False
    """A boolean knob whose `flag` turns the setting off (SGLang's `--disable-radix-cache`):
    it renders `flag` for False, and nothing for True, the engine's default."""
    search: Mapping[str, Range] = dataclasses.field(default_factory=dict)
    """The default search range on each platform (by name); a platform without one does not
    tune the knob unless the spec's searchSpace names it."""
    defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """The engine's own resolved default on each platform (by name), where it has one."""
    lossy: Callable[[Any], bool] | None = None
    """Which values change the numbers the model computes (fp8 weights, an fp8 KV cache): a
    study draws them only with `tuning.quality.allowLossy`, and gates them on quality."""
    off: Any = None
    """A value that renders no flag: the engine's own behaviour, where the flag has no
    spelling for it (`--quantization` has none for the checkpoint's own weights)."""
    value_text: Callable[[Any], str] | None = None
    """How a structured value is written on the command line (JSON for a config object)."""

    def render(self, value: Any) -> list[str]:
        """The flags that set this knob to `value`, in full-name form."""
        if isinstance(value, bool):
            chosen = self.flag if value != self.inverted else self.negative
            return [chosen] if chosen else []
        if self.off is not None and value == self.off:
            return []
        if self.value_text is not None:
            return [self.flag, self.value_text(value)]
        return [self.flag, _render_value(value)]

    def is_lossy(self, value: Any) -> bool:
        return self.lossy is not None and value is not None and self.lossy(value)

    def spellings(self) -> tuple[str, ...]:
        """Every spelling the engine's parser maps onto this setting."""
        names = (self.flag, *self.aliases)
        return names if self.negative is None else (*names, self.negative)


def lossy_settings(knobs: tuple[Knob, ...], settings: Mapping[str, Any]) -> list[str]:
    """The settings (by field) whose values change what the model computes."""
    return [k.field for k in knobs if k.is_lossy(settings.get(k.field))]


def render_knobs(knobs: tuple[Knob, ...], explicit: Mapping[str, Any]) -> list[str]:
    """The settings given (`EngineArgs.explicit()`) as the engine's flags, in full-name form and
    in the order of its registry (a stable order: another would roll every engine)."""
    rendered: list[str] = []
    for knob in knobs:
        if knob.field in explicit:
            rendered += knob.render(explicit[knob.field])
    return rendered

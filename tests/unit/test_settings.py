"""The operator's settings from its environment: defaults, values, and errors that name the
variable and what it takes."""

from __future__ import annotations

import re

import pytest

from slotune.settings import OperatorSettings, SettingsError


def test_a_bare_environment_gives_the_defaults() -> None:
    assert OperatorSettings.from_env({}) == OperatorSettings()
    assert OperatorSettings().metrics_port is None  # a local operator binds nothing unasked


def test_every_variable_is_read() -> None:
    settings = OperatorSettings.from_env(
        {
            "SLOTUNE_RESYNC_SECONDS": "3",
            "SLOTUNE_WORKERS": "4",
            "SLOTUNE_PROMETHEUS_URL": " http://prometheus:9090 ",
            "SLOTUNE_METRICS_PORT": "9102",
            "SLOTUNE_IMAGE": "docker.io/slotune/operator:0.1.0",
            "SLOTUNE_TRIAL_STARTUP_SECONDS": "400",
        }
    )
    assert settings == OperatorSettings(
        resync_seconds=3.0,
        workers=4,
        prometheus_url="http://prometheus:9090",
        metrics_port=9102,
        load_image="docker.io/slotune/operator:0.1.0",
        trial_startup_seconds=400.0,
    )
    # Empty is unset, as a chart's blank value is.
    assert OperatorSettings.from_env({"SLOTUNE_METRICS_PORT": ""}).metrics_port is None


@pytest.mark.parametrize(
    ("name", "raw", "says"),
    [
        ("SLOTUNE_METRICS_PORT", "0", "is not a TCP port (1-65535)"),
        ("SLOTUNE_METRICS_PORT", "70000", "is not a TCP port"),
        ("SLOTUNE_METRICS_PORT", "metrics", "is not a TCP port"),
        ("SLOTUNE_WORKERS", "0", "at least 1"),
        ("SLOTUNE_WORKERS", "many", "whole number of threads"),
        ("SLOTUNE_RESYNC_SECONDS", "-5", "above 0"),
        ("SLOTUNE_RESYNC_SECONDS", "soon", "number of seconds"),
        ("SLOTUNE_TRIAL_STARTUP_SECONDS", "nan", "above 0"),
    ],
)
def test_a_value_it_cannot_use_names_the_variable(name: str, raw: str, says: str) -> None:
    with pytest.raises(
        SettingsError, match=re.escape(f"{name}={raw!r}: ") + ".*" + re.escape(says)
    ):
        OperatorSettings.from_env({name: raw})

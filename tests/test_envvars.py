"""hvd_elastic.envvars: one way to read a boolean or seconds from the environment, and training needs no Consul
for it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hvd_elastic import options
from hvd_elastic.envvars import POSITIVE_INT, ConfigError, env_bool, env_seconds, parse_seconds


def test_booleans_read_like_go_with_a_default_when_unset_or_empty():
    assert env_bool("X", True, {}) is True and env_bool("X", False, {"X": ""}) is False
    assert env_bool("X", False, {"X": "t"}) is True and env_bool("X", True, {"X": "0"}) is False
    with pytest.raises(ConfigError, match=r"^X='yes' is not a boolean \(expected one of 1, t, true, 0, f, false\)$"):
        env_bool("X", True, {"X": "yes"})


@pytest.mark.parametrize("raw", ["-1", "inf", "nan", "soon", "1e999"])
def test_bad_seconds_name_the_variable_and_value(raw):
    with pytest.raises(ConfigError) as info:
        env_seconds("HVD_ELASTIC_HEALTH_GRACE", 1.0, {"HVD_ELASTIC_HEALTH_GRACE": raw})
    assert str(info.value) == (f"HVD_ELASTIC_HEALTH_GRACE={raw!r} is not a duration >= 0 "
                               "(seconds, or e.g. 500ms, 15s, 1m30s)")


def test_seconds():
    assert env_seconds("S", 1.5, {}) == 1.5 and env_seconds("S", 1.5, {"S": " 0.25 "}) == 0.25


@pytest.mark.parametrize("text, seconds", [("15", 15.0), ("0.5", 0.5), ("15s", 15.0), ("1m30s", 90.0),
                                           ("500ms", 0.5), ("1h", 3600.0), ("0", 0.0)])
def test_durations_read_as_consul_writes_them_and_bare_numbers_stay_seconds(text, seconds):
    assert parse_seconds(text) == seconds
    assert env_seconds("S", 1.0, {"S": text}) == seconds


@pytest.mark.parametrize("text", ["soon", "15x", "1m30", "s", ""])
def test_a_bad_duration_is_refused(text):
    with pytest.raises(ValueError):
        parse_seconds(text)


def test_training_reads_its_switches_without_the_consul_layer():
    modules = [f"hvd_elastic.training._internal.{m}" for m in ("forksafe", "gloo_hangup", "shared_dir", "health_cut")]
    code = (f"import sys; [__import__(m) for m in {modules!r}]; "
            "print(sorted(m for m in sys.modules if m.startswith('hvd_elastic.consul')))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize("raw", ["", "   ", "\t"])
def test_a_blank_variable_is_unset_for_commands_and_settings_alike(monkeypatch, raw):
    monkeypatch.setenv("HVD_ELASTIC_X", raw)
    assert options.env("HVD_ELASTIC_X", "7") == "7"
    assert POSITIVE_INT.read("HVD_ELASTIC_X", "7") == 7
    monkeypatch.setenv("HVD_ELASTIC_X", " 3 ")
    assert options.env("HVD_ELASTIC_X", "7").variable == "HVD_ELASTIC_X"
    assert POSITIVE_INT.read("HVD_ELASTIC_X", "7") == 3

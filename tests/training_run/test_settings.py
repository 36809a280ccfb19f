"""hvd_elastic.training.settings: one typed object per training process, and no other reader of its variables."""

from __future__ import annotations

import ast
import dataclasses
import logging
from pathlib import Path

import pytest

from hvd_elastic.envvars import ConfigError
from hvd_elastic.training import settings
from hvd_elastic.training.settings import VARIABLES, WorkerSettings, from_environment

PACKAGE = Path(settings.__file__).resolve().parents[1]
NAMES = {v.name for v in VARIABLES}
READERS = {"env_bool", "env_seconds", "get", "getenv", "read", "parse_bool"}  # os.environ.get, Check.read, ...


def test_the_table_and_the_object_agree():
    assert [v.field for v in VARIABLES] == [f.name for f in dataclasses.fields(WorkerSettings)]
    assert from_environment({}) == WorkerSettings()
    assert len(NAMES) == len(VARIABLES) and all(name.startswith("HVD_ELASTIC_") for name in NAMES)


def test_values_are_typed_and_blank_is_unset():
    environ = {"HVD_ELASTIC_JOIN_AHEAD": "0", "HVD_ELASTIC_HEALTH_GRACE": "500ms", "HVD_ELASTIC_CHECKPOINT_LOCAL": "t",
               "HVD_ELASTIC_METRICS_ADDR": ":9404", "HVD_ELASTIC_FORK_SAFETY": "  "}
    assert from_environment(environ) == WorkerSettings(join_ahead=False, health_grace=0.5, checkpoint_local=True,
                                                       metrics_addr=":9404", fork_safety=True)


@pytest.mark.parametrize("name", ["HVD_ELASTIC_JOIN_AHEAD", "HVD_ELASTIC_GLOO_HANGUP", "HVD_ELASTIC_FORK_SAFETY",
                                  "HVD_ELASTIC_CHECKPOINT_LOCAL"])
def test_a_bad_switch_is_an_error_naming_it(name):
    with pytest.raises(ConfigError, match=rf"^{name}='sometimes' is not a boolean \(one of 1, t, true, 0, f, false\)$"):
        from_environment({name: "sometimes"})


def test_the_straggler_settings_are_typed():
    environ = {"HVD_ELASTIC_STRAGGLER": "off", "HVD_ELASTIC_STRAGGLER_THRESHOLD": "2",
               "HVD_ELASTIC_STRAGGLER_WINDOW": "20", "HVD_ELASTIC_STRAGGLER_WINDOWS": " "}
    assert from_environment(environ) == WorkerSettings(straggler="off", straggler_threshold=2.0, straggler_window=20)
    assert (WorkerSettings().straggler, WorkerSettings().straggler_threshold) == ("report", 1.5)


THRESHOLD = "a number > 1"


@pytest.mark.parametrize("name, raw, expected", [
    ("HVD_ELASTIC_STRAGGLER", "drained", "one of off, report, drain"),
    ("HVD_ELASTIC_STRAGGLER", "on", "one of off, report, drain"),
    ("HVD_ELASTIC_STRAGGLER_THRESHOLD", "1", THRESHOLD),
    ("HVD_ELASTIC_STRAGGLER_THRESHOLD", "0.8", THRESHOLD),
    ("HVD_ELASTIC_STRAGGLER_THRESHOLD", "inf", THRESHOLD),
    ("HVD_ELASTIC_STRAGGLER_THRESHOLD", "fast", THRESHOLD),
    ("HVD_ELASTIC_STRAGGLER_WINDOW", "0", "a positive integer"),
    ("HVD_ELASTIC_STRAGGLER_WINDOW", "2.5", "a positive integer"),
    ("HVD_ELASTIC_STRAGGLER_WINDOWS", "0", "a positive integer"),
    ("HVD_ELASTIC_STRAGGLER_WINDOWS", "-2", "a positive integer"),
])
def test_a_straggler_setting_that_makes_no_sense_is_one_line_naming_it(name, raw, expected):
    with pytest.raises(ConfigError) as caught:
        from_environment({name: raw})
    assert str(caught.value) == f"{name}={raw!r} is not {expected}"


@pytest.mark.parametrize("name, raw", [("HVD_ELASTIC_HEALTH_CUT", "maybe"), ("HVD_ELASTIC_HEALTH_GRACE", "-1")])
def test_a_bad_health_setting_turns_the_cut_off_with_one_warning(caplog, name, raw):
    with caplog.at_level(logging.WARNING, logger=settings.__name__):
        found = from_environment({name: raw})
    assert found == WorkerSettings(health_cut=False)
    assert [r.getMessage() for r in caplog.records] == [f"health cut off: {name}={raw!r} is not " +
                                                        settings.BY_FIELD["health_cut" if "CUT" in name
                                                                          else "health_grace"].check.expected]


def names_bound_to_table_variables() -> set[str]:
    """Identifiers the package binds to a table variable's name (``ENV = "HVD_ELASTIC_JOIN_AHEAD"``, imports)."""
    bound = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assign):
                values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
                targets = [t.elts if isinstance(t, ast.Tuple) else [t] for t in node.targets]
                for target_list in targets:
                    for target, value in zip(target_list, values):
                        if isinstance(value, ast.Constant) and value.value in NAMES and isinstance(target, ast.Name):
                            bound.add(target.id)
    bound |= {f"{v.field.upper()}_ENV" for v in VARIABLES} & set(vars(settings))
    return bound | {"ENV", "LOCAL_ENV", "GRACE_ENV", "METRICS_ADDR_ENV"}


def reads_of_table_variables(path: Path, bound: set[str]) -> list[str]:
    """Calls in ``path`` that read a table variable: a reader called with its name or a name bound to it."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        first = node.args[0]
        named = (isinstance(first, ast.Constant) and first.value in NAMES) or \
            (isinstance(first, ast.Name) and first.id in bound) or \
            (isinstance(first, ast.Attribute) and first.attr in bound)
        if func in READERS and named:
            found.append(f"{path.name}:{node.lineno}")
    return found


def test_no_training_module_but_the_settings_reads_its_variables(tmp_path):
    bound = names_bound_to_table_variables()
    probe = tmp_path / "probe.py"  # the reads this test exists to catch
    probe.write_text('import os\nenv_bool(ENV, True)\nos.environ.get("HVD_ELASTIC_JOIN_AHEAD", "")\n'
                     'settings.JOIN_AHEAD_ENV\nos.environ.get("HOROVOD_RANK")\n')
    assert reads_of_table_variables(probe, bound) == ["probe.py:2", "probe.py:3"]
    training = sorted((PACKAGE / "training").rglob("*.py"))
    reads = [hit for path in training if path.name != "settings.py" for hit in reads_of_table_variables(path, bound)]
    assert reads == [], f"read these through hvd_elastic.training.settings instead: {reads}"

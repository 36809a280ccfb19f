"""Discovery's settings from variables alone (:mod:`hvd_elastic.health.variables`), as a worker reads them."""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys

import pytest

from hvd_elastic.commands import discover as cli
from hvd_elastic.health import variables
from hvd_elastic.envvars import ConfigError
from hvd_elastic.options import consul_config
from testbed import REPO

ENVIRONMENT = {
    "HVD_ELASTIC_SERVICE": "trainers", "HVD_ELASTIC_TAGS": "gpu, h100", "HVD_ELASTIC_FILTER": 'Node.Meta.rack == "3"',
    "HVD_ELASTIC_SLOTS_KEY": "gpus", "HVD_ELASTIC_DEFAULT_SLOTS": "4", "HVD_ELASTIC_MAX_SLOTS_PER_HOST": "16",
    "HVD_ELASTIC_HOST_NAME": "node-address", "HVD_ELASTIC_EXCLUDE": "Bad-Node", "HVD_ELASTIC_DISCOVERY_TIMEOUT": "2s",
    "HVD_ELASTIC_STALE": "true", "HVD_ELASTIC_MAX_STALE": "1m", "HVD_ELASTIC_DATACENTER": "dc2",
    "CONSUL_HTTP_ADDR": "10.0.0.9:8501",
}


def parsed_flags(monkeypatch, environ: dict[str, str]) -> argparse.Namespace:
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser, cache=False)
    return parser.parse_args([])


@pytest.mark.parametrize("environ", [{}, ENVIRONMENT], ids=["defaults", "every variable set"])
def test_a_worker_reads_the_settings_discovery_reads_from_its_flags_defaults(monkeypatch, environ):
    args = parsed_flags(monkeypatch, environ)
    from_flags = variables.Settings.from_args(args)
    # The same settings, whichever way they were read; only the names messages give them differ.
    assert dataclasses.replace(from_flags, asked=()) == dataclasses.replace(variables.Settings.from_env(), asked=())
    options = from_flags.options()
    found = variables.from_environment()
    assert found.options == options
    assert found.timeout == args.timeout
    assert found.config == consul_config(args)
    query = from_flags.health_query()
    assert (found.query.service, found.query.tags, found.query.filter, found.query.stale, found.query.max_stale) == \
        (query.service, query.tags, query.filter, query.stale, query.max_stale)
    if environ:
        assert found.options.tags == ("gpu", "h100") and found.options.exclude == frozenset({"bad-node"})
        assert found.timeout == 2.0 and found.query.max_stale == 60.0 and found.config.datacenter == "dc2"


def test_messages_about_a_workers_settings_name_the_variables():
    found = variables.from_environment({})
    assert found.query.settings == {"service": "HVD_ELASTIC_SERVICE", "tags": "HVD_ELASTIC_TAGS",
                                    "filter": "HVD_ELASTIC_FILTER"}


@pytest.mark.parametrize("name,value,expected", [
    ("HVD_ELASTIC_DISCOVERY_TIMEOUT", "soon", "a positive duration"),
    ("HVD_ELASTIC_DEFAULT_SLOTS", "0", "a positive integer"),
    ("HVD_ELASTIC_HOST_NAME", "fqdn", "one of node, service-address, node-address"),
    ("HVD_ELASTIC_STALE", "maybe", "a boolean"),
])
def test_a_bad_variable_is_named_with_its_value_and_what_was_expected(name, value, expected):
    with pytest.raises(ConfigError, match=rf"^{name}='{value}' is not {expected}"):
        variables.from_environment({name: value})


def test_reading_them_loads_no_command_line_parser():
    probe = ("import sys; sys.path.insert(0, sys.argv[1]); "
             "from hvd_elastic.training._internal import health_cut; health_cut._fetch(); "
             "print('argparse' in sys.modules, 'hvd_elastic.options' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe, str(REPO)], capture_output=True, text=True, timeout=60,
                         check=True)
    assert out.stdout.split() == ["False", "False"], out.stdout + out.stderr

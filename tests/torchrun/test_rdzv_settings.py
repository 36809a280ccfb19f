"""hvd_elastic.torchrun.settings: torchrun's rendezvous parameters read once; bad values refused in one line."""

from __future__ import annotations

import pytest

from hvd_elastic.torchrun.settings import RendezvousSettings, RendezvousSettingsError
from tests.torchrun.rdzv_params import parameters


def test_defaults_and_the_endpoint(monkeypatch):
    monkeypatch.delenv("CONSUL_HTTP_ADDR", raising=False)
    monkeypatch.delenv("HVD_ELASTIC_SERVICE", raising=False)
    settings = RendezvousSettings.from_parameters(parameters("", "job-1"))
    assert settings.consul.base_url == "http://127.0.0.1:8500"
    assert settings.run_prefix == "hvd-elastic/torchrun/job-1" and settings.read_timeout == 60
    assert (settings.health_gate, settings.service, settings.leave_grace) == ("auto", "horovod", 2)
    monkeypatch.setenv("CONSUL_HTTP_ADDR", "10.0.0.9:8501")
    assert RendezvousSettings.from_parameters(parameters("", "j")).consul.base_url == "http://10.0.0.9:8501"
    explicit = RendezvousSettings.from_parameters(parameters("https://c1:8443", "j", key_prefix="/x/y/",
                                                             read_timeout="7"))
    assert explicit.consul.base_url == "https://c1:8443" and explicit.run_prefix == "x/y/j"
    assert explicit.read_timeout == 7


@pytest.mark.parametrize("run_id,conf,endpoint,words", [
    ("none", {}, "", "--rdzv-id is torchrun's default 'none'"),
    ("a/b", {}, "", "--rdzv-id='a/b' is not a run id"),
    ("x" * 129, {}, "", "is not a run id (expected 1-128"),
    ("j", {"key_prefix": "a//b"}, "", "key_prefix='a//b' is not a Consul key prefix"),
    ("j", {"read_timeout": "soon"}, "", "read_timeout='soon' is not a number of seconds"),
    ("j", {"read_timeout": "0"}, "", "read_timeout='0' is not a number of seconds"),
    ("j", {"health_gate": "maybe"}, "", "health_gate='maybe' is not one of auto, true, false"),
    ("j", {"leave_grace": "-1"}, "", "leave_grace='-1' is not a number of seconds (expected a whole number of at"),
    ("j", {}, "c1:http", "--rdzv-endpoint='c1:http': port 'http' is not a number"),
    ("j", {}, "ftp://c1", "--rdzv-endpoint='ftp://c1': scheme 'ftp' is not supported"),
])
def test_bad_parameters_are_one_line_naming_the_value(run_id, conf, endpoint, words):
    with pytest.raises(RendezvousSettingsError) as caught:
        RendezvousSettings.from_parameters(parameters(endpoint, run_id, **conf))
    assert words in str(caught.value) and "\n" not in str(caught.value)

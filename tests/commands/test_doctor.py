"""``hvd-elastic doctor``'s findings say what is true: no "ok" for a checkpoint directory that is a file or missing
or for a token file it cannot read; the Consul flags of every other command; a line as soon as each check is done;
CUDA and NCCL looked at; a fix a pip user can follow.

Each check runs in this process on its own (the whole doctor, with ``horovodrun --check-build``, is in test_cli.py).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from hvd_elastic.commands import doctor
from hvd_elastic.cli import build_parser
from hvd_elastic.devagent import DevCluster
from testbed import REPO


def parse(*flags: str):
    return build_parser(only="doctor").parse_args(["doctor", *flags])


@pytest.fixture(autouse=True)
def _no_consul_env(monkeypatch):
    for name in ("CONSUL_HTTP_ADDR", "CONSUL_HTTP_TOKEN", "CONSUL_HTTP_TOKEN_FILE", "CONSUL_HTTP_SSL",
                 "HVD_ELASTIC_CHECKPOINT_DIR"):
        monkeypatch.delenv(name, raising=False)


def test_a_checkpoint_dir_that_is_a_file_fails(tmp_path):
    path = tmp_path / "ckpt"
    path.write_text("")
    finding = doctor.check_disk(parse("--checkpoint-dir", str(path)))
    assert finding.line() == (f"FAIL  disk       --checkpoint-dir={str(path)!r} is not a directory "
                              "(fix: choose a directory as --checkpoint-dir)")


def test_a_missing_checkpoint_dir_fails_naming_the_variable_that_set_it(tmp_path, monkeypatch):
    missing = tmp_path / "shared" / "ckpt"
    monkeypatch.setenv("HVD_ELASTIC_CHECKPOINT_DIR", str(missing))
    finding = doctor.check_disk(parse())
    assert not finding.ok and finding.required
    assert finding.detail == f"HVD_ELASTIC_CHECKPOINT_DIR={str(missing)!r} does not exist"


def test_an_existing_checkpoint_dir_with_room_is_ok(tmp_path):
    finding = doctor.check_disk(parse("--checkpoint-dir", str(tmp_path), "--min-free-gib", "0"))
    assert finding.ok and f"GiB free at {tmp_path}" in finding.detail


@pytest.mark.parametrize("flags, env, source", [
    (["--token-file", "{path}"], {}, "--token-file"),
    ([], {"CONSUL_HTTP_TOKEN_FILE": "{path}"}, "CONSUL_HTTP_TOKEN_FILE"),
])
def test_a_token_file_it_cannot_read_is_never_ok(tmp_path, monkeypatch, flags, env, source):
    path = str(tmp_path / "token")
    for name, value in env.items():
        monkeypatch.setenv(name, value.format(path=path))
    args = parse(*(f.format(path=path) for f in flags))
    for check in (doctor.check_token, doctor.check_consul):
        finding = check(args)
        assert (finding.ok, finding.required, finding.bad_input) == (False, True, True), finding
        assert finding.detail.startswith(f"{source}={path!r} cannot be read: No such file or directory"), finding


def test_a_readable_owner_only_token_file_is_ok(tmp_path):
    token = tmp_path / "token"
    token.write_text("secret\n")
    token.chmod(0o600)
    finding = doctor.check_token(parse("--token-file", str(token)))
    assert finding.line() == f"ok    token      --token-file={str(token)!r}, readable by its owner only"


def test_doctor_takes_the_consul_flags_of_every_other_command(tmp_path):
    with DevCluster(nodes=["gpu-a"]) as cluster:
        finding = doctor.check_consul(parse("--http-addr", cluster.addr("gpu-a"), "--timeout", "2s"))
    assert finding.ok and finding.detail.startswith(f"http://{cluster.addr('gpu-a')} leader "), finding
    finding = doctor.check_consul(parse("--http-addr", "http://h:99999"))
    assert (finding.ok, finding.bad_input) == (False, True)
    assert finding.detail == "--http-addr='http://h:99999': port 99999 is out of range (expected 1-65535)"


def test_each_finding_is_printed_before_the_next_check_runs(monkeypatch, capsys, tmp_path):
    seen = []

    def first(args):
        return doctor.Finding("first", True, "done")

    def second(args):
        seen.append(capsys.readouterr())  # what the terminal shows while this check runs
        return doctor.Finding("second", False, "CONSUL_HTTP_ADDR='x:y' is bad", bad_input=True)

    monkeypatch.setitem(doctor.CHECKS, "horovodrun", [first, second])
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    code = doctor.run(parse("--checkpoint-dir", str(tmp_path)))
    out, err = capsys.readouterr()
    assert seen[0].out == "ok    first      done\n"
    assert seen[0].err.endswith("checking second...\r")  # a terminal sees which check runs meanwhile
    assert out == "FAIL  second     CONSUL_HTTP_ADDR='x:y' is bad\n"
    assert code == 2  # what failed is a setting: bad input, as for every command
    assert err.endswith("hvd-elastic doctor: error: 1 required check(s) failed: second\n")


def test_pip_users_are_not_sent_to_a_checkout_script(tmp_path):
    installed = tmp_path / "site-packages" / "hvd_elastic"
    installed.mkdir(parents=True)
    assert "bootstrap.sh" not in doctor.install_fix(str(installed))
    assert "pip install" in doctor.install_fix(str(installed))
    assert doctor.install_fix(str(REPO / "hvd_elastic")) == "run scripts/bootstrap.sh"


def test_cuda_is_looked_at_and_required_only_for_gpu_nodes():
    import torch

    for flags, required in (([], False), (["--require-gpu"], True)):
        finding = doctor.check_cuda(parse(*flags))
        assert finding.name == "cuda" and finding.required is required
        if not torch.version.cuda:
            assert not finding.ok and finding.detail == f"torch {torch.__version__} is a CPU-only build"


def test_horovod_without_nccl_fails_only_a_gpu_node(monkeypatch):
    """horovodrun --check-build's answer (from test_cli.py's sample, NCCL unticked, MPI and Gloo ticked here)."""
    build = ("Available Frameworks:\n    [X] PyTorch\nAvailable Controllers:\n    [X] MPI\n    [X] Gloo\n"
             "Available Tensor Operations:\n    [ ] NCCL\n    [X] Gloo\n")
    monkeypatch.setattr(doctor.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, build, ""))
    cpu, gpu = doctor.check_horovod(parse()), doctor.check_horovod(parse("--require-gpu"))
    assert cpu.ok and cpu.detail.endswith("PyTorch yes, Gloo yes, MPI yes, NCCL no")
    assert not gpu.ok and gpu.fix.startswith("rebuild Horovod with PyTorch, Gloo, MPI, NCCL: ")

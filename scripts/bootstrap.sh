#!/usr/bin/env bash
# Build hvd-elastic's virtual environment from nothing on a Debian machine.
#
# Idempotent: every step checks before it acts, and the Horovod wheel (several
# minutes of C++ on two cores) is cached outside the checkout, keyed by the
# Horovod, torch and Python versions and the controller set, so CI's fresh
# clone on the same machine reuses it.
#
# The environment is only "ready" once .venv/.hvd-elastic-ready exists, and
# that stamp is written last and records the inputs it was built from.  A
# failed step exits non-zero naming the command and printing its log tail,
# and leaves no stamp, so nothing half-installed ever looks ready.
#
# Environment:
#   HVD_ELASTIC_VENV         virtual environment path   (default: <repo>/.venv)
#   HVD_ELASTIC_WHEEL_CACHE  Horovod wheel cache folder (default: ~/.cache/hvd-elastic/wheels)
#   HVD_ELASTIC_CONSUL_CACHE HashiCorp Consul binary cache (default: ~/.cache/hvd-elastic/consul; scripts/fetch-consul.sh)
#   HVD_ELASTIC_PROMETHEUS_CACHE Prometheus binary cache (default: ~/.cache/hvd-elastic/prometheus; scripts/fetch-prometheus.sh)
#   PYTHON                   interpreter for the venv   (default: python3.11)
#
# `bootstrap.sh --print-digest` prints the digest a ready stamp must hold for
# these inputs and exits (tests use it on throw-away environments).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${HVD_ELASTIC_VENV:-$REPO/.venv}
PYTHON=${PYTHON:-python3.11}
TORCH_VERSION=2.13.0
HOROVOD_VERSION=0.28.1
TORCHFT_VERSION=0.2.0  # a peer of benchmarks/peers.py; its wheel needs these, not pinned by its metadata
TORCHFT_DEPS=(opentelemetry-api==1.45.2 opentelemetry-sdk==1.45.2 opentelemetry-exporter-otlp-proto-http==1.45.2)
# Open MPI for Horovod's MPI controller and mpi4py; sshd for the multi-host test bed's hosts; openssl for
# the TLS tests' certificates; chromium for the docs test (the built site's quickstart rendered headless).
APT_PACKAGES=(libopenmpi-dev openmpi-bin openssh-server openssl munge slurmctld slurmd slurm-client chromium)
WHEEL_CACHE=${HVD_ELASTIC_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hvd-elastic/wheels}
STAMP=$VENV/.hvd-elastic-ready
LOG_DIR=$(mktemp -d -t hvd-elastic-bootstrap.XXXXXX)
trap 'rm -rf "$LOG_DIR"' EXIT

say() { printf 'bootstrap: %s\n' "$*" >&2; }

# run NAME CMD...: run a step with its output in a log; on failure print the
# command and the log's tail and stop.
run() {
    local name=$1; shift
    local log=$LOG_DIR/$name.log
    if ! "$@" >"$log" 2>&1; then
        say "FAILED: $*"
        say "last lines of its log:"
        tail -n 40 "$log" >&2
        exit 1
    fi
}

inputs_digest() {
    {
        echo "python=$("$PYTHON" -c 'import sys; print(sys.version)')"
        echo "torch=$TORCH_VERSION horovod=$HOROVOD_VERSION"
        cat "$REPO/pyproject.toml" "$REPO/setup.cfg" "$REPO/setup.py" "$REPO/hvd_elastic_horovodrun.pth" \
            "$REPO/scripts/bootstrap.sh" "$REPO/scripts/cxx17" \
            "$REPO/scripts/fetch-consul.sh" "$REPO/scripts/fetch-prometheus.sh" "$REPO/scripts/lib/fetch-deb.sh"
    } | sha256sum | cut -d' ' -f1
}

command -v "$PYTHON" >/dev/null || { say "FAILED: interpreter PYTHON=$PYTHON not found (expected a Python 3.11 executable on PATH)"; exit 1; }
digest=$(inputs_digest)
if [[ ${1:-} == --print-digest ]]; then
    echo "$digest"
    exit 0
fi
# Real Consul and Prometheus are optional (the dev agent stands in; metrics are
# off by default): a failed download is one line from fetch-*.sh, retried on the
# next run, and never fails set-up; the tests that need the binary report it.
fetch_tools() {
    [[ -x $VENV/bin/consul ]] || "$REPO/scripts/fetch-consul.sh" "$VENV/bin/consul" || true
    [[ -x $VENV/bin/prometheus && -x $VENV/bin/promtool ]] ||
        "$REPO/scripts/fetch-prometheus.sh" "$VENV/bin/prometheus" || true
}
if [[ -f $STAMP && $(cat "$STAMP") == "$digest" ]]; then
    fetch_tools
    say "environment $VENV is ready (inputs unchanged)"
    exit 0
fi
rm -f "$STAMP"

# 1. Debian packages, only the missing ones.
missing=()
for pkg in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
done
if ((${#missing[@]})); then
    say "installing Debian packages: ${missing[*]}"
    sudo_cmd=(); [[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
    run apt-update "${sudo_cmd[@]}" apt-get update -qq
    run apt-install "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi

# 2. The virtual environment.
if [[ ! -x $VENV/bin/python ]]; then
    say "creating $VENV"
    run venv "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
run pip-tools "${PIP[@]}" install -q --upgrade 'pip>=23.2' 'setuptools>=68' wheel

# 3. torch: pinned exactly, so pip takes the CPU wheel on disk instead of a
#    multi-GB CUDA build.
if ! "$VENV/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH_VERSION')" 2>/dev/null; then
    say "installing torch==$TORCH_VERSION"
    run torch "${PIP[@]}" install -q "torch==$TORCH_VERSION"
fi

# 4. Horovod with PyTorch, Gloo and MPI controllers, from the wheel cache.
py_tag=$("$VENV/bin/python" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
wheel_dir=$WHEEL_CACHE/horovod-$HOROVOD_VERSION-torch$TORCH_VERSION-$py_tag-gloo-mpi
wheel=$(ls "$wheel_dir"/horovod-*.whl 2>/dev/null | head -n1 || true)
if [[ -z $wheel ]]; then
    say "building Horovod $HOROVOD_VERSION (several minutes; cached in $wheel_dir)"
    build_dir=$(mktemp -d "${WHEEL_CACHE%/}.build.XXXXXX" 2>/dev/null || { mkdir -p "$WHEEL_CACHE" && mktemp -d "${WHEEL_CACHE%/}.build.XXXXXX"; })
    run horovod-build env \
        CXX="$REPO/scripts/cxx17" \
        HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
        HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 HOROVOD_CPU_OPERATIONS=gloo \
        MAKEFLAGS="-j$(nproc)" \
        "${PIP[@]}" wheel --no-deps --no-build-isolation --no-cache-dir \
        -w "$build_dir" "horovod==$HOROVOD_VERSION"
    # Publish the wheel with a rename so a concurrent or interrupted build
    # never leaves a truncated wheel in the cache.
    mkdir -p "$(dirname "$wheel_dir")"
    rm -rf "$wheel_dir"
    mv "$build_dir" "$wheel_dir"
    wheel=$(ls "$wheel_dir"/horovod-*.whl | head -n1)
fi
if ! "$VENV/bin/python" -c "import horovod, sys; sys.exit(horovod.__version__ != '$HOROVOD_VERSION')" 2>/dev/null; then
    say "installing $(basename "$wheel")"
    run horovod-install "${PIP[@]}" install -q "$wheel"
fi

# 5. The project and its Python dependencies (mpi4py compiles against Open MPI).
say "installing hvd-elastic (editable) with test, demo and docs extras"
run project "${PIP[@]}" install -q -e "$REPO[test,demo,docs]"

# horovodrun's driver rules (hvd_elastic/horovodrun): a wheel installs this .pth itself, an editable
# install does not (see setup.py).
purelib=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
run pth cp "$REPO/hvd_elastic_horovodrun.pth" "$purelib/"

# 5b. The peers benchmarks/peers.py compares against (torchrun is torch's own): torchft with its Lighthouse, in a
#     folder of its own that only that benchmark puts on PYTHONPATH, so nothing here changes the venv's pins.
PEERS=$VENV/peers
if [ ! -d "$PEERS/torchft-$TORCHFT_VERSION.dist-info" ]; then
    say "installing torchft $TORCHFT_VERSION into $PEERS (benchmarks/peers.py)"
    rm -rf "$PEERS"
    run torchft "${PIP[@]}" install -q --target "$PEERS" --no-deps "torchft==$TORCHFT_VERSION"
    run torchft-deps "${PIP[@]}" install -q --target "$PEERS" "${TORCHFT_DEPS[@]}"
fi

# 6. HashiCorp Consul 1.8.7 for the tests that run against real Consul, and the demo;
#    Prometheus 2.42 for the tests that scrape the exporters.
rm -f "$VENV/bin/consul" "$VENV/bin/prometheus" "$VENV/bin/promtool"  # inputs changed: fetch (from the cache) again
fetch_tools

# 7. Verify before declaring the environment ready.
run check-build "$VENV/bin/horovodrun" --check-build
for need in 'PyTorch' 'MPI' 'Gloo'; do
    if ! grep -Eq "\[X\] $need" "$LOG_DIR/check-build.log"; then
        say "FAILED: horovodrun --check-build does not tick $need:"
        cat "$LOG_DIR/check-build.log" >&2
        exit 1
    fi
done
echo "$digest" >"$STAMP"
say "environment $VENV is ready"

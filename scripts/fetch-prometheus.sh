#!/usr/bin/env bash
# Put Prometheus 2.42 and its promtool (Debian 12's package) at DEST and beside
# it, for the tests that scrape hvd-elastic's exporters with a real Prometheus.
#
#   scripts/fetch-prometheus.sh DEST      (DEST: .../prometheus; promtool goes beside it)
#
# The one .deb comes through a private apt sources list naming only Debian 12
# (bookworm), its sha256 checked, only the two binaries kept (scripts/lib/fetch-deb.sh):
# nothing is installed system-wide and no service is started.
#
# Exit 0: DEST is Prometheus 2.42.0.  Exit 1: it is not, and ONE line on stderr
# says why; DEST is then absent, and the same line is left in DEST.unavailable.
#
# Environment: HVD_ELASTIC_PROMETHEUS_CACHE (default ~/.cache/hvd-elastic/prometheus);
# HVD_ELASTIC_PROMETHEUS_DEB, a local copy of the package to use instead of apt.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib/fetch-deb.sh"

TOOL=fetch-prometheus
WHAT="real Prometheus"
DEST=${1:?usage: fetch-prometheus.sh DEST}
PACKAGE=prometheus_2.42.0+ds-5+deb12u1_amd64.deb
PKG_SPEC=prometheus=2.42.0+ds-5+deb12u1
SUITE=bookworm
SHA256=81d59a24fce84f7fbe97a45a4f2914b6a5881b5cd1db2a6a0e129e515e1a5f55
BINARIES=(usr/bin/prometheus usr/bin/promtool)
CACHE=${HVD_ELASTIC_PROMETHEUS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hvd-elastic/prometheus}/${PACKAGE%.deb}
LOCAL_ENV=HVD_ELASTIC_PROMETHEUS_DEB
LOCAL_DEB=${HVD_ELASTIC_PROMETHEUS_DEB:-}

is_wanted() { [[ -x $1 ]] && [[ $("$1" --version 2>&1 | head -n1) == "prometheus, version 2.42.0"* ]]; }

fetch_deb

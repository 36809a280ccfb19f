#!/usr/bin/env bash
# Put HashiCorp Consul 1.8.7 (Debian 11's package, the oldest Consul hvd-elastic
# supports) at DEST, for the tests that run against real Consul and for the demo.
#
#   scripts/fetch-consul.sh DEST
#
# The one .deb comes through a private apt sources list naming only Debian 11
# (bullseye), its sha256 checked, only usr/bin/consul kept (scripts/lib/fetch-deb.sh).
#
# Exit 0: DEST is Consul v1.8.7.  Exit 1: it is not, and ONE line on stderr says
# why (no network, checksum mismatch, wrong version); DEST is then absent, and
# the same line is left in DEST.unavailable for the tests to report.
#
# Environment: HVD_ELASTIC_CONSUL_CACHE (default ~/.cache/hvd-elastic/consul);
# HVD_ELASTIC_CONSUL_DEB, a local copy of the package to use instead of apt (an
# air-gapped machine), checked the same way.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib/fetch-deb.sh"

TOOL=fetch-consul
WHAT="real Consul"
DEST=${1:?usage: fetch-consul.sh DEST}
PACKAGE=consul_1.8.7+dfsg1-2+b3_amd64.deb
PKG_SPEC=consul=1.8.7+dfsg1-2+b3
SUITE=bullseye
SHA256=e4e888bba104daba1d9161f49bfc52649a7e4efd45b1a7ead5bc54f2cb9c89d9
BINARIES=(usr/bin/consul)
CACHE=${HVD_ELASTIC_CONSUL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hvd-elastic/consul}/${PACKAGE%.deb}
LOCAL_ENV=HVD_ELASTIC_CONSUL_DEB
LOCAL_DEB=${HVD_ELASTIC_CONSUL_DEB:-}

is_wanted() { [[ -x $1 ]] && [[ $("$1" version 2>/dev/null | head -n1) == "Consul v1.8.7" ]]; }

fetch_deb

#!/usr/bin/env bash
# Put HashiCorp Consul 1.8.7 (Debian 11's package, the oldest Consul hvd-elastic
# supports) at DEST, for the tests that run against real Consul and for the demo.
#
#   scripts/fetch-consul.sh DEST
#
# The one .deb is fetched with apt through a PRIVATE sources list naming only
# Debian 11 (bullseye): nothing is added to the system's apt sources, lists or
# cache.  Its sha256 is checked, and only usr/bin/consul is kept, in a cache
# folder outside the checkout (so CI's fresh clone reuses it), then copied to DEST.
#
# Exit 0: DEST is Consul v1.8.7.  Exit 1: it is not, and ONE line on stderr says
# why (no network, checksum mismatch, wrong version); DEST is then absent, and
# the same line is left in DEST.unavailable for the tests to report.
#
# Environment: HVD_ELASTIC_CONSUL_CACHE (default ~/.cache/hvd-elastic/consul);
# HVD_ELASTIC_CONSUL_DEB, a local copy of the package to use instead of apt (an
# air-gapped machine), checked the same way.
set -euo pipefail

DEST=${1:?usage: fetch-consul.sh DEST}
PACKAGE=consul_1.8.7+dfsg1-2+b3_amd64.deb
SHA256=e4e888bba104daba1d9161f49bfc52649a7e4efd45b1a7ead5bc54f2cb9c89d9
VERSION="Consul v1.8.7"
CACHE=${HVD_ELASTIC_CONSUL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hvd-elastic/consul}/${PACKAGE%.deb}
WORK=$(mktemp -d -t hvd-elastic-consul.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

fail() {
    printf 'fetch-consul: %s\n' "$1" >&2
    rm -f "$DEST"
    printf '%s\n' "$1" >"$DEST.unavailable"
    exit 1
}

is_wanted() { [[ -x $1 ]] && [[ $("$1" version 2>/dev/null | head -n1) == "$VERSION" ]]; }

if ! is_wanted "$CACHE/consul" && [[ -n ${HVD_ELASTIC_CONSUL_DEB:-} ]]; then
    [[ -f $HVD_ELASTIC_CONSUL_DEB ]] || fail "real Consul unavailable: HVD_ELASTIC_CONSUL_DEB=$HVD_ELASTIC_CONSUL_DEB is not a file"
    cp "$HVD_ELASTIC_CONSUL_DEB" "$WORK/$PACKAGE"
elif ! is_wanted "$CACHE/consul"; then
    [[ $(dpkg --print-architecture 2>/dev/null) == amd64 ]] ||
        fail "real Consul unavailable: the pinned package $PACKAGE is for amd64, this machine is $(dpkg --print-architecture 2>/dev/null || uname -m)"
    # The mirror of the system's first Debian source, but only the bullseye suite.
    uri=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
    uri=${uri:-http://deb.debian.org/debian}
    mkdir -p "$WORK/sources" "$WORK/lists/partial" "$WORK/cache/archives/partial"
    printf 'Types: deb\nURIs: %s\nSuites: bullseye\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
        "$uri" >"$WORK/sources/bullseye.sources"
    apt=(apt-get -q -o "Dir::Etc::sourcelist=/dev/null" -o "Dir::Etc::sourceparts=$WORK/sources"
         -o "Dir::State::Lists=$WORK/lists" -o "Dir::Cache=$WORK/cache" -o "APT::Sandbox::User=root")
    (cd "$WORK" && "${apt[@]}" update >"$WORK/apt.log" 2>&1 && "${apt[@]}" download "consul=1.8.7+dfsg1-2+b3" >>"$WORK/apt.log" 2>&1) ||
        fail "real Consul unavailable: apt could not download $PACKAGE from $uri (bullseye): $(grep -E '^(E|Err):' "$WORK/apt.log" | head -n1 || tail -n1 "$WORK/apt.log")"
fi
if [[ -f $WORK/$PACKAGE ]]; then
    got=$(sha256sum "$WORK/$PACKAGE" | cut -d' ' -f1)
    [[ $got == "$SHA256" ]] || fail "real Consul unavailable: $PACKAGE has sha256 $got, expected $SHA256"
    dpkg-deb -x "$WORK/$PACKAGE" "$WORK/root"
    is_wanted "$WORK/root/usr/bin/consul" ||
        fail "real Consul unavailable: the binary in $PACKAGE does not print '$VERSION'"
    mkdir -p "$CACHE"
    install -m 0755 "$WORK/root/usr/bin/consul" "$CACHE/consul.tmp"
    mv "$CACHE/consul.tmp" "$CACHE/consul"  # never a truncated binary in the cache
fi
install -m 0755 "$CACHE/consul" "$DEST"
rm -f "$DEST.unavailable"

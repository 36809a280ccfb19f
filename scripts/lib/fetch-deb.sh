# shellcheck shell=bash
# Fetch pinned binaries out of one pinned Debian package, for scripts/fetch-*.sh.
#
# The caller sets, then calls fetch_deb:
#   TOOL      its name, the prefix of its one error line (fetch-consul)
#   WHAT      what is missing when it fails ("real Consul")
#   PACKAGE   the .deb's file name;   PKG_SPEC  apt's name=version
#   SUITE     the Debian suite it comes from;   SHA256  the .deb's digest
#   BINARIES  array: paths inside the package (usr/bin/consul); the first is the
#             one DEST names, the others are installed beside it
#   CACHE     folder outside the checkout that keeps the binaries (CI's fresh
#             clone reuses it);   LOCAL_DEB  a local copy to use instead of apt
#   DEST      where the first binary goes (its folder must exist: a venv's bin)
# and defines is_wanted PATH: true when PATH is the binary wanted (its version).
#
# The package is fetched with apt through a PRIVATE sources list naming only
# SUITE: nothing is added to the system's apt sources, lists or cache.  Its
# sha256 is checked before anything is extracted, and the cache is written
# with renames, so it never holds a truncated or unchecked binary.
#
# On failure: ONE line on stderr, DEST and the binaries beside it removed, the
# same line left in DEST.unavailable for the tests to report, exit 1.

fail() {
    printf '%s: %s\n' "$TOOL" "$1" >&2
    local bin
    for bin in "${BINARIES[@]}"; do rm -f "$(dirname "$DEST")/$(basename "$bin")"; done
    printf '%s\n' "$1" 2>/dev/null >"$DEST.unavailable" || true
    exit 1
}

fetch_deb() {
    [[ -d $(dirname "$DEST") ]] || fail "$WHAT unavailable: the folder of $DEST does not exist"
    local main=$CACHE/$(basename "${BINARIES[0]}")
    local work
    work=$(mktemp -d -t "$TOOL.XXXXXX")
    # shellcheck disable=SC2064  # expand now: $work is local
    trap "rm -rf '$work'" EXIT
    if ! is_wanted "$main" && [[ -n $LOCAL_DEB ]]; then
        [[ -f $LOCAL_DEB ]] || fail "$WHAT unavailable: $LOCAL_ENV=$LOCAL_DEB is not a file"
        cp "$LOCAL_DEB" "$work/$PACKAGE"
    elif ! is_wanted "$main"; then
        [[ $(dpkg --print-architecture 2>/dev/null) == amd64 ]] ||
            fail "$WHAT unavailable: the pinned package $PACKAGE is for amd64, this machine is $(dpkg --print-architecture 2>/dev/null || uname -m)"
        # The mirror of the system's first Debian source, but only SUITE.
        local uri
        uri=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
        uri=${uri:-http://deb.debian.org/debian}
        mkdir -p "$work/sources" "$work/lists/partial" "$work/cache/archives/partial"
        printf 'Types: deb\nURIs: %s\nSuites: %s\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
            "$uri" "$SUITE" >"$work/sources/$SUITE.sources"
        local apt=(apt-get -q -o "Dir::Etc::sourcelist=/dev/null" -o "Dir::Etc::sourceparts=$work/sources"
                   -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache" -o "APT::Sandbox::User=root")
        (cd "$work" && "${apt[@]}" update >"$work/apt.log" 2>&1 && "${apt[@]}" download "$PKG_SPEC" >>"$work/apt.log" 2>&1) ||
            fail "$WHAT unavailable: apt could not download $PACKAGE from $uri ($SUITE): $(grep -E '^(E|Err):' "$work/apt.log" | head -n1 || tail -n1 "$work/apt.log")"
    fi
    local bin
    if [[ -f $work/$PACKAGE ]]; then
        local got
        got=$(sha256sum "$work/$PACKAGE" | cut -d' ' -f1)
        [[ $got == "$SHA256" ]] || fail "$WHAT unavailable: $PACKAGE has sha256 $got, expected $SHA256"
        dpkg-deb -x "$work/$PACKAGE" "$work/root"
        is_wanted "$work/root/${BINARIES[0]}" ||
            fail "$WHAT unavailable: the binary ${BINARIES[0]} in $PACKAGE is not the version pinned"
        mkdir -p "$CACHE"
        # The version-checked binary last: it is what says the cache is complete.
        for bin in "${BINARIES[@]:1}" "${BINARIES[0]}"; do
            install -m 0755 "$work/root/$bin" "$CACHE/$(basename "$bin").tmp"
            mv "$CACHE/$(basename "$bin").tmp" "$CACHE/$(basename "$bin")"
        done
    fi
    for bin in "${BINARIES[@]}"; do
        install -m 0755 "$CACHE/$(basename "$bin")" "$(dirname "$DEST")/$(basename "$bin")"
    done
    rm -f "$DEST.unavailable"
}

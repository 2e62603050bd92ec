#!/usr/bin/env bash
# Installs the clients that tests/compatibility/ runs besides those of
# scripts/install-interop.sh (JS, Python, Rust):
#   flagd          flagd v0.16.0, built from interop/flagd/current   -> $BIN/flagd-v0.16.0/flagd
#   flagd-legacy   flagd v0.4.2 (legacy sync.v1 only), interop/flagd/legacy -> $BIN/flagd-v0.4.2/flagd
#   go             the Go in-process provider client, interop/go     -> $BIN/interop-go/flagd-proxy-interop-go
#                  and its differential program, interop/go/diff -> $BIN/interop-go/flagd-proxy-interop-go-diff
#   go-legacy      an old Go provider (legacy sync.v1), interop/go/legacy
#                                                 -> $BIN/interop-go-legacy/flagd-proxy-interop-go-legacy
#   java           the Java in-process provider client, interop/java -> $CACHE/java/{lib,classes}
# where CACHE=${FLAGD_PROXY_CACHE:-$HOME/.cache/flagd-proxy} and BIN=$CACHE/bin.
#
# Needs go (1.26) and, for java, a JDK 17+ and mvn. Reaches only the Go module proxy and Maven
# Central. Each Go module pins its whole dependency set in its go.sum, so no checksum-database
# lookups are needed; builds run with -mod=readonly.
#
# Why flagd is built from a small module instead of `go install ...flagd@v0.16.0`: see the
# comment in interop/flagd/current/go.mod (two dependencies are not served by the module proxy).
#
# Idempotent: a step is skipped when its output exists and a stamp of its inputs (sources,
# go.mod/go.sum or pom.xml, toolchain version) is unchanged. A step that fails records its error
# in $CACHE/compat/<step>.not-installable (the test shows it as "not installable: <error>"); a
# later successful run removes that file. The script exits non-zero when any step failed.
#
# Usage: scripts/install-compat.sh [flagd] [flagd-legacy] [go] [go-legacy] [java]   (default: all)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${FLAGD_PROXY_CACHE:-$HOME/.cache/flagd-proxy}"
BIN="$CACHE/bin"
STATE="$CACHE/compat"
NICE=(nice -n 10)

FLAGD_VERSION=v0.16.0
FLAGD_LEGACY_VERSION=v0.4.2

log() { printf 'install-compat: %s\n' "$*" >&2; }

hash_of() { cat "$@" | sha256sum | cut -d' ' -f1; }

# Files under a directory, in a stable order, for hash_of.
files_under() { find "$@" -type f \( -name '*.go' -o -name 'go.mod' -o -name 'go.sum' -o -name '*.java' -o -name 'pom.xml' \) | LC_ALL=C sort; }

up_to_date() { # stamp-file wanted-content output...
    local stamp="$1" want="$2"
    shift 2
    [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]] || return 1
    local out
    for out in "$@"; do
        [[ -e "$out" ]] || return 1
    done
}

require_go() {
    command -v go >/dev/null || { echo "go is not installed (Go 1.26 is needed)" >&2; return 1; }
}

# go_build <module dir> <package> <output binary> <ldflags>
go_build() {
    local dir="$1" pkg="$2" out="$3" ldflags="$4"
    local tmp="$out.tmp.$$"
    mkdir -p "$(dirname "$out")"
    (cd "$dir" && GOFLAGS="-mod=readonly -buildvcs=false" "${NICE[@]}" go build -trimpath -ldflags "$ldflags" -o "$tmp" "$pkg") || {
        rm -f "$tmp"
        return 1
    }
    mv -f "$tmp" "$out"
}

# go_step <name> <output> <package> <ldflags> <module dir> [other input dirs...]: builds the
# module's package into the output unless its stamp (the inputs' hash and the Go version) is
# unchanged.
go_step() {
    local name="$1" out="$2" pkg="$3" ldflags="$4" dir="$5"
    shift 4
    require_go
    local want
    want="$(hash_of $(files_under "$@")) $(go env GOVERSION)"
    if up_to_date "$out.stamp" "$want" "$out"; then
        log "$name: up to date"
    else
        log "$name: go build (minutes on a cold cache)"
        go_build "$dir" "$pkg" "$out" "$ldflags"
        printf '%s' "$want" >"$out.stamp"
    fi
}

install_flagd() {
    local out="$BIN/flagd-$FLAGD_VERSION/flagd"
    go_step "flagd $FLAGD_VERSION" "$out" github.com/open-feature/flagd/flagd \
        "-X main.version=$FLAGD_VERSION -X main.commit=module-proxy -X main.date=unknown" \
        "$ROOT/interop/flagd/current" "$ROOT/interop/flagd/operator-api"
    echo "flagd:         $out"
}

install_flagd_legacy() {
    local out="$BIN/flagd-$FLAGD_LEGACY_VERSION/flagd"
    go_step "flagd $FLAGD_LEGACY_VERSION" "$out" github.com/open-feature/flagd \
        "-X main.version=$FLAGD_LEGACY_VERSION -X main.commit=module-proxy -X main.date=unknown" \
        "$ROOT/interop/flagd/legacy"
    echo "old flagd:     $out"
}

install_go() {
    require_go
    local dir="$ROOT/interop/go"
    local out="$BIN/interop-go/flagd-proxy-interop-go"
    local want
    local diff="$BIN/interop-go/flagd-proxy-interop-go-diff"
    want="$(hash_of "$dir/main.go" "$dir/go.mod" "$dir/go.sum" $(find "$dir/diff" -name '*.go' | LC_ALL=C sort) $(files_under "$dir/stdio")) $(go env GOVERSION)"
    if up_to_date "$out.stamp" "$want" "$out" "$diff"; then
        log "go: up to date"
    else
        log "go: go build"
        go_build "$dir" . "$out" ""
        # The differential program (interop/differential.md).
        go_build "$dir" ./diff "$diff" ""
        printf '%s' "$want" >"$out.stamp"
    fi
    echo "go client:     $out"
    echo "go diff:       $diff"
}

install_go_legacy() {
    local out="$BIN/interop-go-legacy/flagd-proxy-interop-go-legacy"
    go_step go-legacy "$out" . "" "$ROOT/interop/go/legacy" "$ROOT/interop/go/stdio"
    echo "old go client: $out"
}

install_java() {
    command -v java >/dev/null || { echo "java is not installed (JDK 17+ is needed)" >&2; return 1; }
    command -v javac >/dev/null || { echo "javac is not installed (JDK 17+ is needed)" >&2; return 1; }
    command -v mvn >/dev/null || { echo "mvn is not installed" >&2; return 1; }
    local dir="$ROOT/interop/java"
    local out="$CACHE/java"
    local want
    want="$(hash_of $(files_under "$dir")) $(javac -version 2>&1)"
    if up_to_date "$out/stamp" "$want" "$out/classes/interop/Client.class" "$out/classes/interop/Diff.class" "$out/lib"; then
        log "java: up to date"
    else
        log "java: resolving dependencies from Maven Central (mvn dependency:copy-dependencies)"
        rm -rf "$out"
        mkdir -p "$out"
        "${NICE[@]}" mvn -B -q -Dstyle.color=never -f "$dir/pom.xml" dependency:copy-dependencies \
            -DincludeScope=runtime -DoutputDirectory="$out/lib" >&2
        log "java: javac"
        "${NICE[@]}" javac --release 17 -nowarn -d "$out/classes" -cp "$out/lib/*" \
            "$dir"/src/main/java/interop/*.java 2>&1 | grep -v '^warning:\|SuppressFBWarnings\|^[0-9]* warnings$' >&2 || true
        [[ -f "$out/classes/interop/Client.class" ]] || { echo "javac produced no class file" >&2; return 1; }
        printf '%s' "$want" >"$out/stamp"
    fi
    echo "java client:   java -cp '$out/classes:$out/lib/*' interop.Client"
}

# run_step <name>: runs one step in a child process (so that `set -e` applies inside it),
# showing its output and recording the end of its error output when it fails.
failed=0
run_step() {
    local name="$1" errlog
    mkdir -p "$STATE"
    errlog="$(mktemp)"
    if { "${BASH_SOURCE[0]}" --step "$name" 2>&1 1>&3 3>&- | tee "$errlog" >&2; } 3>&1; then
        rm -f "$STATE/$name.not-installable"
    else
        # The exact error, not the progress log.
        grep -v '^install-compat: \|^go: downloading ' "$errlog" | tail -n 5 >"$STATE/$name.not-installable" || true
        [[ -s "$STATE/$name.not-installable" ]] || echo "step $name failed" >"$STATE/$name.not-installable"
        log "error: $name could not be installed (recorded in $STATE/$name.not-installable)"
        failed=1
    fi
    rm -f "$errlog"
}

if [[ "${1:-}" == --step ]]; then
    case "${2:-}" in
        flagd) install_flagd ;;
        flagd-legacy) install_flagd_legacy ;;
        go) install_go ;;
        go-legacy) install_go_legacy ;;
        java) install_java ;;
        *) log "error: unknown step '${2:-}'"; exit 2 ;;
    esac
    exit 0
fi

steps=("$@")
[[ ${#steps[@]} -eq 0 ]] && steps=(flagd flagd-legacy go go-legacy java)
for step in "${steps[@]}"; do
    case "$step" in
        flagd | flagd-legacy | go | go-legacy | java) run_step "$step" ;;
        *) log "error: unknown step '$step' (expected flagd, flagd-legacy, go, go-legacy or java)"; exit 2 ;;
    esac
done
exit "$failed"

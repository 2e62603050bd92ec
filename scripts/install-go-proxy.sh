#!/usr/bin/env bash
# Installs the Go flagd-proxy (github.com/open-feature/flagd/flagd-proxy), the system this
# project replaces, for the side-by-side benchmark (flagd-proxy-bench):
#
#   $CACHE/bin/flagd-proxy-go-<version>   the binary
#   $CACHE/bin/flagd-proxy-go             a symlink to it (flagd-proxy-bench looks here)
#
# where CACHE=${FLAGD_PROXY_CACHE:-$HOME/.cache/flagd-proxy}.
#
# The version is FLAGD_PROXY_GO_VERSION if set, else the newest the Go module proxy lists,
# else v0.9.7. Idempotent: an installed version is not built again. Needs Go (1.22+).
#
# Usage: scripts/install-go-proxy.sh        prints the binary's path on success
set -euo pipefail

MODULE=github.com/open-feature/flagd/flagd-proxy
FALLBACK_VERSION=v0.9.7
CACHE="${FLAGD_PROXY_CACHE:-$HOME/.cache/flagd-proxy}"
BIN="$CACHE/bin"

log() { printf 'install-go-proxy: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

command -v go >/dev/null || die "go is not installed"

version="${FLAGD_PROXY_GO_VERSION:-}"
if [[ -z "$version" ]]; then
    # `go list -m -versions` needs a module context only for replacements; run it from /tmp.
    if listed="$(cd /tmp && GOFLAGS=-mod=mod go list -m -versions "$MODULE" 2>/dev/null)"; then
        version="$(tr ' ' '\n' <<<"$listed" | grep -E '^v[0-9]+\.[0-9]+\.[0-9]+$' | sort -V | tail -n1 || true)"
    fi
    if [[ -z "$version" ]]; then
        log "could not list versions of $MODULE; using $FALLBACK_VERSION"
        version="$FALLBACK_VERSION"
    fi
fi

target="$BIN/flagd-proxy-go-$version"
if [[ -x "$target" ]]; then
    log "$MODULE@$version already installed"
else
    mkdir -p "$BIN"
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    log "go install $MODULE@$version"
    if ! (cd /tmp && GOBIN="$tmp" nice -n 10 go install "$MODULE@$version") 2>"$tmp/go.log"; then
        cat "$tmp/go.log" >&2
        die "go install $MODULE@$version failed (is the module served by the Go module proxy here? set GOPROXY or FLAGD_PROXY_GO_VERSION)"
    fi
    mv "$tmp/flagd-proxy" "$target"
fi
ln -sfn "$(basename "$target")" "$BIN/flagd-proxy-go"
"$target" --help >/dev/null 2>&1 || die "$target does not run"
echo "$BIN/flagd-proxy-go"

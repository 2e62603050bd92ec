#!/usr/bin/env bash
# Builds a minimal OpenTelemetry Collector (the OTLP receiver and the file exporter, nothing
# else) from the Go module in tools/otelcol, for the OTLP export test (tests/otlp.rs).
#
#   scripts/install-otelcol.sh
#
# The binary goes to ${FLAGD_PROXY_CACHE:-$HOME/.cache/flagd-proxy}/bin/otelcol-<version>-<key>
# (version: the otelcol module's; key: hash of tools/otelcol's go.mod, go.sum and main.go and of
# the Go version), and bin/otelcol is a symlink to it. Running the script again when it exists
# does nothing but refresh the symlink. Needs Go and the Go module proxy (GOPROXY as configured);
# nothing else is downloaded.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
module_dir="$repo_root/tools/otelcol"
cache_dir="${FLAGD_PROXY_CACHE:-$HOME/.cache/flagd-proxy}"
bin_dir="$cache_dir/bin"

log() { printf '[install-otelcol] %s\n' "$*" >&2; }

if ! command -v go >/dev/null 2>&1; then
  log "error: the 'go' command is not on PATH; install Go (see tools/otelcol/go.mod for the minimum version)"
  exit 1
fi

cd "$module_dir"
version="$(awk '$1 == "go.opentelemetry.io/collector/otelcol" { print $2 }' go.mod)"
key="$( { cat go.mod go.sum main.go; go version; } | sha256sum | cut -c1-12)"
target="$bin_dir/otelcol-$version-$key"
mkdir -p "$bin_dir"

link() {
  ln -sfn "$(basename "$target")" "$bin_dir/otelcol"
  log "ready: $bin_dir/otelcol -> $(basename "$target")"
}

if [[ -x "$target" ]]; then
  log "up to date: $target"
  link
  exit 0
fi

# One build at a time per cache directory.
if command -v flock >/dev/null 2>&1; then
  exec 9>"$cache_dir/.install-otelcol.lock"
  if ! flock -n 9; then
    log "another build holds $cache_dir/.install-otelcol.lock; waiting for it"
    flock 9
  fi
  if [[ -x "$target" ]]; then
    log "up to date: $target (built while waiting)"
    link
    exit 0
  fi
fi

export CGO_ENABLED=0
export GOFLAGS=-trimpath
# Leave GOMODCACHE, GOCACHE and GOPROXY at whatever the environment (or Go's defaults) say.

# Built to a scratch name first, so an interrupted build never leaves a half-written binary
# where the test looks for it.
tmp="$target.partial.$$"
trap 'rm -f "$tmp"' EXIT
log "building the collector $version ($(go version))"
start=$SECONDS
if ! nice -n 10 go build -ldflags "-s -w" -o "$tmp" .; then
  log "error: go build in $module_dir failed"
  exit 1
fi
mv -f "$tmp" "$target"
log "built $target in $((SECONDS - start))s"
link

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

tool=install-otelcol
source "$(dirname "${BASH_SOURCE[0]}")/go-tool.sh"
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
module_dir="$repo_root/tools/otelcol"
require_go "install Go (see tools/otelcol/go.mod for the minimum version)"

cd "$module_dir"
version="$(awk '$1 == "go.opentelemetry.io/collector/otelcol" { print $2 }' go.mod)"
key="$( { cat go.mod go.sum main.go; go version; } | sha256sum | cut -c1-12)"
target="$bin_dir/otelcol-$version-$key"

link() {
  ln -sfn "$(basename "$target")" "$bin_dir/otelcol"
  log "ready: $bin_dir/otelcol -> $(basename "$target")"
}

exit_if_built "$target" test -x "$target"
log "the collector $version ($(go version))"
go_build_binary "$target" . -ldflags "-s -w"
link

#!/usr/bin/env bash
# Builds prometheus and promtool from the Go module github.com/prometheus/prometheus, for the
# alert and dashboard tests (tests/prometheus/). The web UI's assets are not built in, nor are
# the cloud service discoveries (build tag remove_all_sd): the tests use only static targets
# and the HTTP API.
#
#   scripts/install-prometheus.sh                  # builds v0.316.0 once
#   PROMETHEUS_VERSION=v0.316.0 scripts/install-prometheus.sh
#
# The binaries go to ${FLAGD_PROXY_CACHE:-$HOME/.cache/flagd-proxy}/bin/prometheus-<version>-<key>/
# (key: hash of the Go version), and bin/prometheus and bin/promtool are symlinks to them. Running
# the script again when they exist does nothing but refresh the symlinks. Needs Go and the Go
# module proxy (GOPROXY as configured); nothing else is downloaded.
set -euo pipefail

tool=install-prometheus
source "$(dirname "${BASH_SOURCE[0]}")/go-tool.sh"
require_go "install Go to build prometheus"

version="${PROMETHEUS_VERSION:-v0.316.0}"
module="github.com/prometheus/prometheus"
key="$(go version | sha256sum | cut -c1-12)"
target_dir="$bin_dir/prometheus-$version-$key"

link() {
  for cmd in prometheus promtool; do
    ln -sfn "$(basename "$target_dir")/$cmd" "$bin_dir/$cmd"
  done
  log "ready: $bin_dir/prometheus, $bin_dir/promtool -> $(basename "$target_dir")"
}

built() { [[ -x "$target_dir/promtool" && -x "$target_dir/prometheus" ]]; }
exit_if_built "$target_dir" built

# Build into a scratch directory first, so an interrupted build never leaves a half-written
# binary where the tests look for it. Outside any Go module of the caller's, so that only
# prometheus' own go.mod counts.
scratch="$(mktemp -d "$bin_dir/.prometheus-build.XXXXXX")"
trap 'rm -rf "$scratch"' EXIT
cd "$scratch"

log "building $module/cmd/{prometheus,promtool}@$version ($(go version))"
start=$SECONDS
ldflags="-s -w -X github.com/prometheus/common/version.Version=${version#v}"
# Both commands in one `go install`: they share most of their packages.
if ! GOBIN="$scratch" nice -n 10 go install -tags remove_all_sd -ldflags "$ldflags" \
  "$module/cmd/prometheus@$version" "$module/cmd/promtool@$version"; then
  log "error: go install $module/cmd/{prometheus,promtool}@$version failed"
  exit 1
fi
mkdir -p "$target_dir"
mv -f "$scratch/prometheus" "$scratch/promtool" "$target_dir/"
log "built $target_dir in $((SECONDS - start))s"
link

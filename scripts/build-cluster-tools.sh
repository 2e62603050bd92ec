#!/usr/bin/env bash
# Builds the helpers of the cluster tests (tests/cluster/) from the Go module in tools/cluster, in
# one `go build` invocation:
#   coredns   a CoreDNS with only the plugins the cluster's kube-dns needs (no `forward`)
#   crane     go-containerregistry's crane: `crane registry serve` is the in-memory image
#             registry inside the cluster's network namespace, `crane push` fills it
# Binaries go to ${FLAGD_PROXY_CACHE:-$HOME/.cache/flagd-proxy}/bin/cluster-tools-<key>/ (key: hash
# of go.sum, tools/cluster sources and the Go version) with symlinks bin/coredns and bin/crane.
#
# It first installs, when missing, the Debian packages the cluster runs on (apt-get, when run as
# root; otherwise it names the missing ones): containerd, runc, containernetworking-plugins,
# iptables, conntrack, busybox-static, ca-certificates, curl. FLAGD_PROXY_NO_APT=1 skips that.
set -euo pipefail

tool=build-cluster-tools
source "$(dirname "${BASH_SOURCE[0]}")/go-tool.sh"
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
module_dir="$repo_root/tools/cluster"

if [[ "${FLAGD_PROXY_NO_APT:-0}" != 1 ]] && command -v dpkg-query >/dev/null; then
  packages=(containerd runc containernetworking-plugins iptables conntrack busybox-static ca-certificates curl)
  missing=()
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  if [[ ${#missing[@]} -gt 0 ]]; then
    if [[ "$(id -u)" != 0 ]] || ! command -v apt-get >/dev/null; then
      log "missing Debian packages (install them as root): ${missing[*]}"
    else
      log "apt-get install ${missing[*]}"
      export DEBIAN_FRONTEND=noninteractive
      apt-get install -y --no-install-recommends "${missing[@]}" >&2 ||
        { apt-get update >&2 && apt-get install -y --no-install-recommends "${missing[@]}" >&2; }
    fi
  else
    log "Debian packages present"
  fi
fi

require_go "install Go (see tools/cluster/go.mod for the minimum version)"
export GOFLAGS="-trimpath -mod=readonly"
one_build_at_a_time

cd "$module_dir"
key="$( { cat go.sum go.mod coredns/main.go; go version; } | sha256sum | cut -c1-12)"
out="$bin_dir/cluster-tools-$key"
if [[ -x "$out/crane" && -x "$out/coredns" ]]; then
  log "up to date: $out"
else
  go_build_commands "$out" "-s -w" ./coredns github.com/google/go-containerregistry/cmd/crane
fi
for cmd in coredns crane; do
  ln -sfn "$(basename "$out")/$cmd" "$bin_dir/$cmd"
  log "ready: $bin_dir/$cmd"
done

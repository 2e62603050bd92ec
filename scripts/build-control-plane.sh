#!/usr/bin/env bash
# Builds the kube-apiserver and etcd binaries that the integration tests run as a real,
# loopback-only Kubernetes control plane.
#
# The versions come from the Go module in tools/kube (k8s.io/kubernetes, and the etcd server that its
# module graph selects). Binaries go to ${FLAGD_PROXY_CACHE:-$HOME/.cache/flagd-proxy}/bin as
#   kube-apiserver-<version>, etcd-<version>   (versioned, built once)
#   kube-apiserver, etcd                       (symlinks to the versioned files)
# Running the script again when the versioned binaries exist does nothing but refresh the symlinks.
# Needs Go and the Go module proxy (GOPROXY as configured); nothing else is downloaded.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
module_dir="$repo_root/tools/kube"
cache_dir="${FLAGD_PROXY_CACHE:-$HOME/.cache/flagd-proxy}"
bin_dir="$cache_dir/bin"

log() { printf '[build-control-plane] %s\n' "$*" >&2; }

if ! command -v go >/dev/null 2>&1; then
  log "error: the 'go' command is not on PATH; install Go (see tools/kube/go.mod for the minimum version)"
  exit 1
fi

export CGO_ENABLED=0
export GOFLAGS=-trimpath
# Leave GOMODCACHE, GOCACHE and GOPROXY at whatever the environment (or Go's defaults) say.

mkdir -p "$bin_dir"

# One build at a time per cache directory.
if command -v flock >/dev/null 2>&1; then
  exec 9>"$cache_dir/.build-control-plane.lock"
  if ! flock -n 9; then
    log "another build holds $cache_dir/.build-control-plane.lock; waiting for it"
    flock 9
  fi
fi

cd "$module_dir"
log "resolving versions from $module_dir/go.mod ($(go version))"
kube_version="$(go list -m -f '{{.Version}}' k8s.io/kubernetes)"
etcd_version="$(go list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3)"
log "kube-apiserver $kube_version, etcd $etcd_version"

apiserver_bin="$bin_dir/kube-apiserver-$kube_version"
etcd_bin="$bin_dir/etcd-$etcd_version"

# Builds package $2 into $1 unless $1 already exists. Extra arguments go to `go build`.
build() {
  local out="$1" pkg="$2"
  shift 2
  if [[ -x "$out" ]]; then
    log "up to date: $out"
    return 0
  fi
  local tmp="$out.partial.$$"
  log "building $pkg -> $out"
  local start=$SECONDS
  if ! nice -n 10 go build "$@" -o "$tmp" "$pkg"; then
    rm -f "$tmp"
    log "error: go build $pkg failed"
    return 1
  fi
  mv -f "$tmp" "$out"
  log "built $out in $((SECONDS - start))s"
}

kube_minor="${kube_version#v1.}"
kube_minor="${kube_minor%%.*}"
version_ldflags=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  version_ldflags+=" -X $pkg.gitVersion=$kube_version"
  version_ldflags+=" -X $pkg.gitMajor=1"
  version_ldflags+=" -X $pkg.gitMinor=$kube_minor"
  version_ldflags+=" -X $pkg.gitTreeState=clean"
done

build "$apiserver_bin" k8s.io/kubernetes/cmd/kube-apiserver -ldflags "-s -w$version_ldflags"
build "$etcd_bin" go.etcd.io/etcd/server/v3 -ldflags "-s -w"

ln -sfn "$(basename "$apiserver_bin")" "$bin_dir/kube-apiserver"
ln -sfn "$(basename "$etcd_bin")" "$bin_dir/etcd"
log "ready: $bin_dir/kube-apiserver -> $(basename "$apiserver_bin")"
log "ready: $bin_dir/etcd -> $(basename "$etcd_bin")"

#!/usr/bin/env bash
# Builds the Kubernetes binaries and etcd that the integration tests run: kube-apiserver + etcd as a
# loopback-only control plane, and kubelet, kube-controller-manager, kube-scheduler, kube-proxy and
# kubectl for the single-node cluster of the cluster tests.
#
# The versions come from the Go module in tools/kube (k8s.io/kubernetes, and the etcd server that its
# module graph selects). Binaries go to ${FLAGD_PROXY_CACHE:-$HOME/.cache/flagd-proxy}/bin as
#   kube-<version>-<key>/{kube-apiserver,kubelet,...}   (built once, in one `go build`; key = hash of
#                                                       go.sum, Go version and command list)
#   etcd-<version>
#   kube-apiserver, kubelet, ..., kubectl, etcd        (symlinks to the versioned files)
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

etcd_bin="$bin_dir/etcd-$etcd_version"

# Every Kubernetes command comes out of ONE `go build` invocation: they share most of their
# packages, so one invocation compiles each package once. The directory is keyed by everything
# that decides the output: the Kubernetes version, go.sum (the whole module graph), the Go
# toolchain and the command list.
kube_cmds=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl)
kube_key="$( { cat go.sum; go version; printf '%s\n' "${kube_cmds[@]}"; } | sha256sum | cut -c1-12)"
kube_dir="$bin_dir/kube-$kube_version-$kube_key"

kube_minor="${kube_version#v1.}"
kube_minor="${kube_minor%%.*}"
version_ldflags=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  version_ldflags+=" -X $pkg.gitVersion=$kube_version"
  version_ldflags+=" -X $pkg.gitMajor=1"
  version_ldflags+=" -X $pkg.gitMinor=$kube_minor"
  version_ldflags+=" -X $pkg.gitTreeState=clean"
done

if [[ -x "$kube_dir/kubectl" ]]; then
  log "up to date: $kube_dir"
else
  tmp_dir="$kube_dir.partial.$$"
  rm -rf "$tmp_dir"
  mkdir -p "$tmp_dir"
  pkgs=()
  for cmd in "${kube_cmds[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$cmd"); done
  log "building ${kube_cmds[*]} -> $kube_dir (one go build)"
  start=$SECONDS
  if ! nice -n 10 go build -ldflags "-s -w$version_ldflags" -o "$tmp_dir/" "${pkgs[@]}"; then
    rm -rf "$tmp_dir"
    log "error: go build of the Kubernetes commands failed"
    exit 1
  fi
  rm -rf "$kube_dir"
  mv "$tmp_dir" "$kube_dir"
  log "built $kube_dir in $((SECONDS - start))s"
fi

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

build "$etcd_bin" go.etcd.io/etcd/server/v3 -ldflags "-s -w"

# Stable names: bin/<command> for every Kubernetes command, bin/etcd.
for cmd in "${kube_cmds[@]}"; do
  ln -sfn "$(basename "$kube_dir")/$cmd" "$bin_dir/$cmd"
  log "ready: $bin_dir/$cmd -> $(basename "$kube_dir")/$cmd"
done
ln -sfn "$(basename "$etcd_bin")" "$bin_dir/etcd"
log "ready: $bin_dir/etcd -> $(basename "$etcd_bin")"

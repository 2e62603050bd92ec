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

tool=build-control-plane
source "$(dirname "${BASH_SOURCE[0]}")/go-tool.sh"
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
module_dir="$repo_root/tools/kube"
require_go "install Go (see tools/kube/go.mod for the minimum version)"
one_build_at_a_time

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
  go_build_commands "$kube_dir" "-s -w$version_ldflags" "${kube_cmds[@]/#/k8s.io/kubernetes/cmd/}"
fi

go_build_binary "$etcd_bin" go.etcd.io/etcd/server/v3 -ldflags "-s -w"

# Stable names: bin/<command> for every Kubernetes command, bin/etcd.
for cmd in "${kube_cmds[@]}"; do
  ln -sfn "$(basename "$kube_dir")/$cmd" "$bin_dir/$cmd"
  log "ready: $bin_dir/$cmd -> $(basename "$kube_dir")/$cmd"
done
ln -sfn "$(basename "$etcd_bin")" "$bin_dir/etcd"
log "ready: $bin_dir/etcd -> $(basename "$etcd_bin")"

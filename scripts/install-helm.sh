#!/usr/bin/env bash
# Builds the helm command line from Go modules, for the chart tests (tests/helm/).
#
#   scripts/install-helm.sh            # builds helm v3.22.0 once
#   HELM_VERSION=v3.21.4 scripts/install-helm.sh
#
# The binary goes to ${FLAGD_PROXY_CACHE:-$HOME/.cache/flagd-proxy}/bin/helm-<version>/helm, and
# bin/helm is a symlink to it. Running the script again when that binary exists does nothing but
# refresh the symlink. Needs Go and the Go module proxy (GOPROXY as configured); nothing else is
# downloaded.
set -euo pipefail

tool=install-helm
source "$(dirname "${BASH_SOURCE[0]}")/go-tool.sh"

version="${HELM_VERSION:-v3.22.0}"
target_dir="$bin_dir/helm-$version"
target="$target_dir/helm"

link() {
  ln -sfn "helm-$version/helm" "$bin_dir/helm"
  log "ready: $bin_dir/helm -> helm-$version/helm ($("$target" version --short 2>/dev/null || echo '?'))"
}

exit_if_built "$target" test -x "$target"
require_go "install Go to build helm"

# Build into a scratch directory first, so an interrupted build never leaves a half-written
# binary where the tests look for it.
scratch="$(mktemp -d "$bin_dir/.helm-build.XXXXXX")"
trap 'rm -rf "$scratch"' EXIT
# Outside any Go module of the caller's, so that only helm's own go.mod counts.
cd "$scratch"

log "building helm.sh/helm/v3/cmd/helm@$version ($(go version))"
start=$SECONDS

# Set what helm's own Makefile sets at link time: the version it reports, and the Kubernetes
# version `helm template` and `helm lint` assume without a cluster (major+1 and minor of the
# k8s.io/client-go it requires, e.g. v0.35.x -> 1.35). Without the latter helm assumes 1.20 and
# refuses charts that need anything newer.
gomod="$(go mod download -json "helm.sh/helm/v3@$version" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')"
if [[ -z "$gomod" || ! -f "$gomod" ]]; then
  log "error: could not download the go.mod of helm.sh/helm/v3@$version"
  exit 1
fi
client_go="$(awk '$1 == "k8s.io/client-go" { print $2; exit }' "$gomod")"
if [[ ! "$client_go" =~ ^v([0-9]+)\.([0-9]+)\. ]]; then
  log "error: no k8s.io/client-go version in $gomod"
  exit 1
fi
k8s_major=$((BASH_REMATCH[1] + 1))
k8s_minor="${BASH_REMATCH[2]}"
log "k8s.io/client-go $client_go: default Kubernetes version v$k8s_major.$k8s_minor"
ldflags="-s -w"
ldflags+=" -X helm.sh/helm/v3/internal/version.version=$version"
ldflags+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
for pkg in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
  ldflags+=" -X $pkg.k8sVersionMajor=$k8s_major -X $pkg.k8sVersionMinor=$k8s_minor"
done

if ! GOBIN="$scratch" nice -n 10 go install -ldflags "$ldflags" "helm.sh/helm/v3/cmd/helm@$version"; then
  log "error: go install helm.sh/helm/v3/cmd/helm@$version failed"
  exit 1
fi
mkdir -p "$target_dir"
mv -f "$scratch/helm" "$target"
log "built $target in $((SECONDS - start))s"
link

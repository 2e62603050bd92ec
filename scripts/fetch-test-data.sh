#!/usr/bin/env bash
# Fetches the public data the tests read, from the Go module proxy (checksums verified by Go's
# checksum database), and links it under ${FLAGD_PROXY_CACHE:-$HOME/.cache/flagd-proxy}/test-data:
#   flagd-schemas          github.com/open-feature/flagd-schemas (JSON schema + test vectors)
#   open-feature-operator  github.com/open-feature/open-feature-operator (CRDs, RBAC, Helm chart)
# The pinned versions are in tests/data/modules.txt (the flagd-schemas version is the one the
# operator's go.mod pins). Running it again re-links from Go's module cache without downloading.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache_dir="${FLAGD_PROXY_CACHE:-$HOME/.cache/flagd-proxy}"
data_dir="$cache_dir/test-data"

log() { printf '[fetch-test-data] %s\n' "$*" >&2; }

command -v go >/dev/null 2>&1 || { log "error: the 'go' command is not on PATH"; exit 1; }
mkdir -p "$data_dir"

# `go mod download` outside any module: only the named module is fetched.
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

while read -r name module version; do
  [[ -z "$name" || "$name" == \#* ]] && continue
  dir="$(cd "$work" && GOFLAGS=-mod=mod GO111MODULE=on go mod download -json "$module@$version" \
    | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
  if [[ -z "$dir" || ! -d "$dir" ]]; then
    log "error: go mod download $module@$version failed"
    (cd "$work" && go mod download -json "$module@$version") >&2 || true
    exit 1
  fi
  ln -sfn "$dir" "$data_dir/$name"
  log "$name -> $dir"
done <"$repo_root/tests/data/modules.txt"

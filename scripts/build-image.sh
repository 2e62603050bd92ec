#!/usr/bin/env bash
# Builds the flagd-proxy container image as an OCI image layout archive, without a container engine.
#
#   scripts/build-image.sh [OUT.tar [REF]]
#     OUT.tar  default target/image/flagd-proxy.tar
#     REF      default localhost/flagd-proxy:<version from Cargo.toml>
#   BINARY=path/to/flagd-proxy scripts/build-image.sh ...   (package that binary instead of building)
#
# Without BINARY it runs `cargo build --release --locked --bin flagd-proxy`. The image holds the
# binary, the shared libraries it loads, CA certificates and /etc/passwd (scripts/image-rootfs.sh),
# runs as 65532:65532 with entrypoint /flagd-proxy and command `start`, and is reproducible: the same
# binary gives the same archive and manifest digest (scripts/oci-archive.sh). Load it with
#   ctr -n k8s.io images import OUT.tar      or      crane push OUT.tar REGISTRY/flagd-proxy:TAG
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

version="$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n1)"
out="${1:-target/image/flagd-proxy.tar}"
ref="${2:-localhost/flagd-proxy:$version}"

binary="${BINARY:-}"
if [[ -z "$binary" ]]; then
  cargo build --release --locked --bin flagd-proxy >&2
  binary=target/release/flagd-proxy
fi

rootfs="$(mktemp -d)/rootfs"
trap 'rm -rf "$(dirname "$rootfs")"' EXIT
scripts/image-rootfs.sh "$binary" "$rootfs"
digest="$(scripts/oci-archive.sh "$rootfs" "$out" "$ref" '["/flagd-proxy"]' '["start"]' 65532:65532)"
echo "$out: $ref $digest" >&2
echo "$digest"

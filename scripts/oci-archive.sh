#!/usr/bin/env bash
# Packs a root filesystem into a single-layer OCI image layout archive, reproducibly and without a
# container engine:
#
#   scripts/oci-archive.sh ROOTFS OUT.tar REF ENTRYPOINT_JSON [CMD_JSON [USER]]
#   e.g. scripts/oci-archive.sh rootfs flagd-proxy.tar localhost/flagd-proxy:dev '["/flagd-proxy"]' '["start"]' 65532:65532
#
# The same ROOTFS always gives the same bytes: files sorted by name, owner 0:0, every mtime at
# SOURCE_DATE_EPOCH (default 0), gzip without a name or time stamp, no creation date in the
# config. OUT.tar is an OCI image layout (oci-layout, index.json, blobs/sha256/...) with REF as the
# `org.opencontainers.image.ref.name` annotation, the form `ctr images import` and `crane push`
# read. The manifest digest is printed on stdout.
set -euo pipefail

rootfs="${1:?usage: $0 ROOTFS OUT.tar REF ENTRYPOINT_JSON [CMD_JSON [USER]]}"
out="${2:?missing OUT.tar}"
ref="${3:?missing REF}"
entrypoint="${4:?missing ENTRYPOINT_JSON}"
cmd="${5:-null}"
user="${6:-}"
epoch="${SOURCE_DATE_EPOCH:-0}"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
blobs="$work/layout/blobs/sha256"
mkdir -p "$blobs"

# blob FILE MEDIATYPE -> writes the descriptor JSON of FILE (moved into blobs/) to stdout
blob() {
  local file="$1" media="$2" digest size
  digest="$(sha256sum "$file" | cut -d' ' -f1)"
  size="$(stat -c %s "$file")"
  mv "$file" "$blobs/$digest"
  printf '{"mediaType":"%s","digest":"sha256:%s","size":%s}' "$media" "$digest" "$size"
}

tar -C "$rootfs" --sort=name --format=posix \
  --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
  --mtime="@$epoch" --owner=0 --group=0 --numeric-owner \
  -cf "$work/layer.tar" .
diff_id="sha256:$(sha256sum "$work/layer.tar" | cut -d' ' -f1)"
gzip -n -6 "$work/layer.tar"
layer="$(blob "$work/layer.tar.gz" application/vnd.oci.image.layer.v1.tar+gzip)"

user_json=""
[[ -n "$user" ]] && user_json="\"User\":\"$user\","
printf '{"architecture":"amd64","os":"linux","config":{%s"Env":["PATH=/","SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"],"Entrypoint":%s,"Cmd":%s,"WorkingDir":"/"},"rootfs":{"type":"layers","diff_ids":["%s"]},"history":[{"created_by":"scripts/oci-archive.sh"}]}' \
  "$user_json" "$entrypoint" "$cmd" "$diff_id" >"$work/config.json"
config="$(blob "$work/config.json" application/vnd.oci.image.config.v1+json)"

printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":%s,"layers":[%s]}' \
  "$config" "$layer" >"$work/manifest.json"
manifest="$(blob "$work/manifest.json" application/vnd.oci.image.manifest.v1+json)"
manifest_with_ref="${manifest%\}},\"annotations\":{\"org.opencontainers.image.ref.name\":\"$ref\"}}"

printf '{"imageLayoutVersion":"1.0.0"}' >"$work/layout/oci-layout"
printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[%s]}' \
  "$manifest_with_ref" >"$work/layout/index.json"

mkdir -p "$(dirname "$out")"
tar -C "$work/layout" --sort=name --mtime="@$epoch" --owner=0 --group=0 --numeric-owner \
  -cf "$out.partial" oci-layout index.json blobs
mv -f "$out.partial" "$out"
echo "$manifest" | grep -oE 'sha256:[0-9a-f]{64}'

#!/usr/bin/env bash
# Assembles the root filesystem of a minimal, non-root container image around one binary:
#
#   scripts/image-rootfs.sh BINARY DIR
#
#   DIR/<name of BINARY>                      the binary (mode 0755)
#   DIR/<each shared library it loads>        at the path the dynamic loader finds it at (ldd),
#                                             plus the loader itself; nothing for a static binary
#   DIR/etc/ssl/certs/ca-certificates.crt     the CA bundle of the machine that builds the image
#   DIR/etc/passwd, DIR/etc/group             root and nonroot (65532:65532)
#   DIR/tmp                                   empty, mode 1777
#
# Both scripts/build-image.sh (no container engine) and the Dockerfile (its build stage) produce
# the image's root filesystem with this script, so the two images have the same layout. DIR must
# not exist yet. Set STRIP=1 to strip debug information from the copied binary.
set -euo pipefail

binary="${1:?usage: $0 BINARY DIR}"
dir="${2:?usage: $0 BINARY DIR}"
ca_bundle="${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"

[[ -f "$binary" && -x "$binary" ]] || { echo "image-rootfs: not an executable file: $binary" >&2; exit 1; }
[[ -e "$dir" ]] && { echo "image-rootfs: $dir exists already" >&2; exit 1; }
[[ -f "$ca_bundle" ]] || { echo "image-rootfs: no CA bundle at $ca_bundle (install ca-certificates)" >&2; exit 1; }

mkdir -p "$dir/etc/ssl/certs" "$dir/tmp"
chmod 0755 "$dir" "$dir/etc" "$dir/etc/ssl" "$dir/etc/ssl/certs"
chmod 1777 "$dir/tmp"

name="$(basename "$binary")"
install -m 0755 "$binary" "$dir/$name"
if [[ "${STRIP:-0}" == 1 ]]; then
  objcopy --strip-debug "$dir/$name"
fi

# Shared libraries: every absolute path ldd reports (the loader included). A static binary has none.
if ldd "$binary" >/dev/null 2>&1; then
  ldd "$binary" | grep -oE '/[^ ]+' | sort -u | while read -r lib; do
    real="$(readlink -f "$lib")"
    mkdir -p "$dir$(dirname "$lib")"
    install -m 0755 "$real" "$dir$lib"
  done
fi

install -m 0644 "$ca_bundle" "$dir/etc/ssl/certs/ca-certificates.crt"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$dir/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$dir/etc/group"
chmod 0644 "$dir/etc/passwd" "$dir/etc/group"

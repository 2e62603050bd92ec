#!/usr/bin/env bash
# Installs the JS, Python and Rust provider clients used by tests/compatibility/:
#   - interop/js      npm ci (node_modules inside interop/js)
#   - interop/python  a virtualenv at $CACHE/venv with interop/python/requirements.txt
#   - interop/rust    cargo build --locked (debug profile) into $CACHE/target-interop
# where CACHE=${FLAGD_PROXY_CACHE:-$HOME/.cache/flagd-proxy}.
#
# Idempotent: each step is skipped when its inputs have not changed since the last
# successful run. Needs node+npm, python3 (>= 3.10) and cargo; the Rust client's build
# also needs protoc and the protobuf well-known .proto files (installed from Debian's
# protobuf-compiler and libprotobuf-dev when missing and running as root).
#
# Usage: scripts/install-interop.sh [js] [python] [rust]   (default: all three)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${FLAGD_PROXY_CACHE:-$HOME/.cache/flagd-proxy}"
NICE=(nice -n 10)

log() { printf 'install-interop: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

hash_of() { cat "$@" | sha256sum | cut -d' ' -f1; }

install_js() {
    local dir="$ROOT/interop/js"
    command -v node >/dev/null || die "node is not installed"
    command -v npm >/dev/null || die "npm is not installed"
    local want stamp="$dir/node_modules/.interop-install-stamp"
    want="$(hash_of "$dir/package.json" "$dir/package-lock.json") node-$(node --version)"
    if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" && -d "$dir/node_modules/@openfeature/flagd-provider" ]]; then
        log "js: up to date"
    else
        log "js: npm ci"
        (cd "$dir" && "${NICE[@]}" npm ci --no-audit --no-fund --loglevel=error >&2)
        printf '%s' "$want" >"$stamp"
    fi
    echo "js client:     node $dir/client.mjs"
}

install_python() {
    local req="$ROOT/interop/python/requirements.txt"
    local venv="$CACHE/venv"
    local py="${PYTHON:-python3}"
    command -v "$py" >/dev/null || die "$py is not installed"
    "$py" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' \
        || die "$py is older than 3.10"
    mkdir -p "$CACHE"
    if [[ ! -x "$venv/bin/python" ]]; then
        log "python: creating virtualenv $venv"
        "$py" -m venv "$venv"
    fi
    local want stamp="$venv/.interop-install-stamp"
    want="$(hash_of "$req") $("$venv/bin/python" --version 2>&1)"
    if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]] \
        && "$venv/bin/python" -c 'import openfeature.contrib.provider.flagd, grpc' 2>/dev/null; then
        log "python: up to date"
    else
        log "python: pip install -r interop/python/requirements.txt"
        "${NICE[@]}" "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
            --requirement "$req" >&2
        printf '%s' "$want" >"$stamp"
    fi
    echo "python client: $venv/bin/python $ROOT/interop/python/client.py"
}

# The open-feature-flagd build script runs protoc on a .proto file that imports
# google/protobuf/struct.proto.
ensure_protoc() {
    local protoc="${PROTOC:-$(command -v protoc || true)}"
    local include="${PROTOC_INCLUDE:-/usr/include}"
    if [[ -n "$protoc" && -f "$include/google/protobuf/struct.proto" ]]; then
        return
    fi
    if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null; then
        log "rust: installing protoc (Debian protobuf-compiler, libprotobuf-dev)"
        local pkgs=(protobuf-compiler libprotobuf-dev)
        if ! DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${pkgs[@]}" >&2; then
            apt-get update >&2
            DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${pkgs[@]}" >&2
        fi
        return
    fi
    die "protoc and the protobuf well-known types are needed (Debian: protobuf-compiler libprotobuf-dev; or set PROTOC and PROTOC_INCLUDE)"
}

install_rust() {
    local dir="$ROOT/interop/rust"
    local target="$CACHE/target-interop"
    command -v cargo >/dev/null || die "cargo is not installed"
    ensure_protoc
    # The debug profile: the client's speed does not matter to the tests, and an optimised
    # build of its dependency tree costs several times the CPU.
    log "rust: cargo build --locked (target dir $target)"
    (cd "$dir" && "${NICE[@]}" cargo build --locked --target-dir "$target" >&2)
    echo "rust client:   $target/debug/flagd-proxy-interop-rust"
}

steps=("$@")
[[ ${#steps[@]} -eq 0 ]] && steps=(js python rust)
for step in "${steps[@]}"; do
    case "$step" in
        js) install_js ;;
        python) install_python ;;
        rust) install_rust ;;
        *) die "unknown step '$step' (expected js, python or rust)" ;;
    esac
done

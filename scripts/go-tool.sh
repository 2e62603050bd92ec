# Sourced by the scripts that build tools from Go modules into the cache (build-control-plane.sh,
# build-cluster-tools.sh, install-helm.sh, install-prometheus.sh, install-otelcol.sh), once they
# have set `tool` to their name: the cache's folders, the log, the check for Go, the build's
# settings, one build at a time per cache directory, and builds that never leave a half-written
# output where the tests look. What decides whether a build is up to date (each script's key or
# version) stays in the script; nothing here is part of it.

cache_dir="${FLAGD_PROXY_CACHE:-$HOME/.cache/flagd-proxy}"
bin_dir="$cache_dir/bin"
mkdir -p "$bin_dir"

log() { printf '[%s] %s\n' "$tool" "$*" >&2; }

# Static binaries without the build machine's paths. GOMODCACHE, GOCACHE and GOPROXY stay at
# whatever the environment (or Go's defaults) say.
export CGO_ENABLED=0
export GOFLAGS=-trimpath

# require_go <what to do>: exits, saying what to do, unless `go` is on PATH.
require_go() {
  command -v go >/dev/null 2>&1 && return
  log "error: the 'go' command is not on PATH; $1"
  exit 1
}

# one_build_at_a_time: holds $cache_dir/.<tool>.lock until the script ends; another run of the
# same script waits for it.
one_build_at_a_time() {
  command -v flock >/dev/null 2>&1 || return 0
  exec 9>"$cache_dir/.$tool.lock"
  if ! flock -n 9; then
    log "another build holds $cache_dir/.$tool.lock; waiting for it"
    flock 9
  fi
}

# exit_if_built <what> <check...>: when the check passes, says <what> is up to date, runs the
# script's `link` and exits. Otherwise waits for another run of the script
# (one_build_at_a_time), which may have built it, and checks again.
exit_if_built() {
  local what="$1"
  shift
  if "$@"; then
    log "up to date: $what"
    link
    exit 0
  fi
  one_build_at_a_time
  if "$@"; then
    log "up to date: $what (built while waiting)"
    link
    exit 0
  fi
}

# go_build_binary <out> <package> [go build arguments...]: builds the package into the file <out>
# unless it exists (to <out>.partial.<pid> first).
go_build_binary() {
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

# go_build_commands <out dir> <ldflags> <package...>: builds every package's command into the
# directory <out dir> in one `go build` (they share most of their packages, which it then
# compiles once), to <out dir>.partial.<pid> first.
go_build_commands() {
  local out="$1" ldflags="$2"
  shift 2
  local tmp="$out.partial.$$"
  rm -rf "$tmp"
  mkdir -p "$tmp"
  log "building ${*##*/} -> $out (one go build)"
  local start=$SECONDS
  if ! nice -n 10 go build -ldflags "$ldflags" -o "$tmp/" "$@"; then
    rm -rf "$tmp"
    log "error: go build of ${*##*/} failed"
    exit 1
  fi
  rm -rf "$out"
  mv "$tmp" "$out"
  log "built $out in $((SECONDS - start))s"
}

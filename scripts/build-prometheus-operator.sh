#!/usr/bin/env bash
# Build (once) the Prometheus Operator from its Go module
# (github.com/prometheus-operator/prometheus-operator, the version whose CRDs
# scripts/fetch-platform-crds.sh fetches), so that tests can check what it makes of slotune's
# PodMonitors and PrometheusRule: the Prometheus configuration and rule files it writes.
#
#   scripts/build-prometheus-operator.sh          build if needed; last stdout line = binary
#   scripts/build-prometheus-operator.sh --print  print the binary's path only (no build)
#
# The binary goes to ${XDG_CACHE_HOME:-$HOME/.cache}/slotune/bin/prometheus-operator-<version>/.
# Later calls return at once.
set -euo pipefail

VERSION="$(sed -n 's/^PROMETHEUS_OPERATOR="\(.*\)"$/\1/p' "$(dirname "$0")/fetch-platform-crds.sh")"
CACHE_ROOT="${XDG_CACHE_HOME:-$HOME/.cache}/slotune/bin"
DIR="$CACHE_ROOT/prometheus-operator-$VERSION"
BIN="$DIR/operator"

log() { printf '[build-prometheus-operator] %s\n' "$*" >&2; }

case "${1:-}" in
  --print) echo "$BIN"; exit 0 ;;
  "") ;;
  *) echo "usage: $0 [--print]" >&2; exit 2 ;;
esac

if [[ -x "$BIN" ]]; then
  log "up to date: $BIN"
  echo "$BIN"
  exit 0
fi

command -v go >/dev/null || export PATH="/usr/local/go/bin:$PATH"
command -v go >/dev/null || { log "go not found"; exit 1; }

mkdir -p "$CACHE_ROOT"
TMP="$(mktemp -d "$CACHE_ROOT/.tmp-prometheus-operator.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT
# Never write into the repository: build inside the module cache's copy of the module.
export GOFLAGS="-mod=mod -buildvcs=false" CGO_ENABLED=0 GOTOOLCHAIN=local
start=$SECONDS
# The module replaces its nested modules (pkg/apis/monitoring, pkg/client) with folders its
# zip does not hold, so it is built as a dependency of a module of our own, which takes the
# nested modules at the same version from the module proxy.
mod="$TMP/module"
mkdir -p "$mod"
log "fetching github.com/prometheus-operator/prometheus-operator@$VERSION"
(
  cd "$mod"
  go mod init slotune.local/prometheus-operator >/dev/null 2>&1
  upstream=github.com/prometheus-operator/prometheus-operator
  go get "$upstream@$VERSION" "$upstream/pkg/apis/monitoring@$VERSION" "$upstream/pkg/client@$VERSION"
  log "building the operator"
  go build -trimpath -ldflags="-s -w" -o "$TMP/operator" "$upstream/cmd/operator"
)
rm -rf "$mod"
chmod 755 "$TMP"
if ! mv -T "$TMP" "$DIR" 2>/dev/null; then
  [[ -x "$BIN" ]] || { rm -rf "$DIR"; mv -T "$TMP" "$DIR"; }
fi
log "built in $((SECONDS - start))s: $BIN"
echo "$BIN"

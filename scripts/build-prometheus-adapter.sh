#!/usr/bin/env bash
# Build (once) prometheus-adapter, the external metrics API server an HPA reads slotune's
# metrics through, from its Go module (sigs.k8s.io/prometheus-adapter).
#
#   scripts/build-prometheus-adapter.sh              build if needed; last stdout line = binary
#   scripts/build-prometheus-adapter.sh --print      print the binary's path only (no build)
#
# The binary goes to ${XDG_CACHE_HOME:-$HOME/.cache}/slotune/bin/prometheus-adapter-<version>/.
# A build takes about 7 minutes on two cores; later calls return at once.
set -euo pipefail

VERSION="v0.12.0"
CACHE_ROOT="${XDG_CACHE_HOME:-$HOME/.cache}/slotune/bin"
DIR="$CACHE_ROOT/prometheus-adapter-$VERSION"
BIN="$DIR/adapter"

log() { printf '[build-prometheus-adapter] %s\n' "$*" >&2; }

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
TMP="$(mktemp -d "$CACHE_ROOT/.tmp-prometheus-adapter.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT
# Never write into the repository: build inside the module cache's copy of the module.
export GOFLAGS="-mod=mod -buildvcs=false" CGO_ENABLED=0 GOTOOLCHAIN=local
start=$SECONDS
log "fetching sigs.k8s.io/prometheus-adapter@$VERSION"
src="$(go mod download -json "sigs.k8s.io/prometheus-adapter@$VERSION" \
  | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
[[ -d "$src" ]] || { log "module not found"; exit 1; }
log "building the adapter"
(cd "$src" && go build -trimpath -ldflags="-s -w" -o "$TMP/adapter" ./cmd/adapter)
chmod 755 "$TMP"
if ! mv -T "$TMP" "$DIR" 2>/dev/null; then
  [[ -x "$BIN" ]] || { rm -rf "$DIR"; mv -T "$TMP" "$DIR"; }
fi
log "built in $((SECONDS - start))s: $BIN"
echo "$BIN"

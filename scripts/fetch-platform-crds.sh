#!/usr/bin/env bash
# Fetch (once) the CustomResourceDefinitions of the platform projects slotune renders objects
# for, from their pinned Go modules, as the control plane itself comes from Kubernetes' module:
#
# - the Prometheus Operator (github.com/prometheus-operator/prometheus-operator): PodMonitor,
#   PrometheusRule, and the rest of its kinds, which its operator watches when it runs
#   (scripts/build-prometheus-operator.sh);
# - the Gateway API Inference Extension (sigs.k8s.io/gateway-api-inference-extension):
#   InferencePool (inference.networking.k8s.io/v1).
#
#   scripts/fetch-platform-crds.sh               fetch if needed; last stdout line = the folder
#   scripts/fetch-platform-crds.sh --print-dir   print the folder only (no fetch)
#
# The CRDs go to ${XDG_CACHE_HOME:-$HOME/.cache}/slotune/crds/<versions>/, one file per CRD,
# named as the projects name them. Later calls return at once.
set -euo pipefail

PROMETHEUS_OPERATOR="v0.93.0"
INFERENCE_EXTENSION="v1.6.2"
CACHE_ROOT="${XDG_CACHE_HOME:-$HOME/.cache}/slotune/crds"
DIR="$CACHE_ROOT/prometheus-operator-$PROMETHEUS_OPERATOR+inference-extension-$INFERENCE_EXTENSION"

log() { printf '[fetch-platform-crds] %s\n' "$*" >&2; }

case "${1:-}" in
  --print-dir) echo "$DIR"; exit 0 ;;
  "") ;;
  *) echo "usage: $0 [--print-dir]" >&2; exit 2 ;;
esac

if [[ -f "$DIR/.complete" ]]; then
  log "up to date: $DIR"
  echo "$DIR"
  exit 0
fi

command -v go >/dev/null || export PATH="/usr/local/go/bin:$PATH"
command -v go >/dev/null || { log "go not found"; exit 1; }
export GOFLAGS="-mod=mod" GOTOOLCHAIN=local

module_dir() {  # the module cache's copy of $1 (downloaded once, read-only)
  go mod download -json "$1" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p'
}

mkdir -p "$CACHE_ROOT"
TMP="$(mktemp -d "$CACHE_ROOT/.tmp-crds.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT
log "fetching github.com/prometheus-operator/prometheus-operator@$PROMETHEUS_OPERATOR"
src="$(module_dir "github.com/prometheus-operator/prometheus-operator@$PROMETHEUS_OPERATOR")"
cp "$src"/example/prometheus-operator-crd/monitoring.coreos.com_*.yaml "$TMP/"
log "fetching sigs.k8s.io/gateway-api-inference-extension@$INFERENCE_EXTENSION"
src="$(module_dir "sigs.k8s.io/gateway-api-inference-extension@$INFERENCE_EXTENSION")"
cp "$src/config/crd/bases/inference.networking.k8s.io_inferencepools.yaml" "$TMP/"
chmod 644 "$TMP"/*.yaml
touch "$TMP/.complete"
chmod 755 "$TMP"
if ! mv -T "$TMP" "$DIR" 2>/dev/null; then
  [[ -f "$DIR/.complete" ]] || { rm -rf "$DIR"; mv -T "$TMP" "$DIR"; }
fi
log "fetched: $DIR"
echo "$DIR"

#!/usr/bin/env bash
# Build (once) the upstream control-plane binaries used by the integration
# tests: etcd, kube-apiserver, kube-controller-manager, kubectl and helm.
#
#   scripts/build-control-plane.sh              build if needed; last stdout line = bin dir
#   scripts/build-control-plane.sh --print-dir  print the bin dir only (no build)
#   scripts/build-control-plane.sh --check      exit 0 iff all binaries are present
#
# Binaries go to ${XDG_CACHE_HOME:-$HOME/.cache}/slotune/bin/<key>/, where <key>
# names the pinned versions. Everything is built from Go modules (see
# tools/k8s/go.mod); the only toolchain needed is Go >= 1.26.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODDIR="$ROOT/tools/k8s"

K8S_VERSION="$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ {print $2; exit}' "$MODDIR/go.mod")"
ETCD_VERSION="$(awk '$1 == "go.etcd.io/etcd/server/v3" && $2 ~ /^v/ {print $2; exit}' "$MODDIR/go.mod")"
HELM_VERSION="v3.22.0"

KEY="k8s-${K8S_VERSION}-etcd-${ETCD_VERSION}-helm-${HELM_VERSION}"
CACHE_ROOT="${XDG_CACHE_HOME:-$HOME/.cache}/slotune/bin"
BIN_DIR="$CACHE_ROOT/$KEY"
BINARIES=(etcd kube-apiserver kube-controller-manager kubectl helm)

log() { printf '[build-control-plane] %s\n' "$*" >&2; }

complete() {
  local b
  for b in "${BINARIES[@]}"; do [[ -x "$BIN_DIR/$b" ]] || return 1; done
}

case "${1:-}" in
  --print-dir) echo "$BIN_DIR"; exit 0 ;;
  --check) complete; exit $? ;;
  "") ;;
  *) echo "usage: $0 [--print-dir|--check]" >&2; exit 2 ;;
esac

if complete; then
  log "up to date: $BIN_DIR"
  echo "$BIN_DIR"
  exit 0
fi

command -v go >/dev/null || export PATH="/usr/local/go/bin:$PATH"
command -v go >/dev/null || { log "go not found"; exit 1; }

mkdir -p "$CACHE_ROOT"
TMP="$(mktemp -d "$CACHE_ROOT/.tmp-$KEY.XXXXXX")"
chmod 755 "$TMP"
trap 'rm -rf "$TMP"' EXIT

# Never write anything into the repo; keep caches at their default places.
export GOFLAGS="-mod=mod -buildvcs=false"
export CGO_ENABLED=0
K8S_MINOR="$(echo "$K8S_VERSION" | cut -d. -f2)"
BUILD_DATE="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
KV=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  KV+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$K8S_MINOR"
  KV+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$BUILD_DATE"
done

start=$SECONDS
cd "$MODDIR"
log "building etcd $ETCD_VERSION"
go build -trimpath -ldflags="-s -w" -o "$TMP/etcd" go.etcd.io/etcd/server/v3
for cmd in kube-apiserver kube-controller-manager kubectl; do
  log "building $cmd $K8S_VERSION"
  go build -trimpath -ldflags="-s -w$KV" -o "$TMP/$cmd" "k8s.io/kubernetes/cmd/$cmd"
done

log "building helm $HELM_VERSION"
(
  cd "$TMP"
  export GOFLAGS="-buildvcs=false" GOBIN="$TMP"
  go install -trimpath \
    -ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X helm.sh/helm/v3/internal/version.gitTreeState=clean" \
    "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
)

for b in "${BINARIES[@]}"; do [[ -x "$TMP/$b" ]] || { log "missing $b after build"; exit 1; }; done

# Atomic publish: rename the complete temp dir into place. If another build
# won the race, keep its result.
if ! mv -T "$TMP" "$BIN_DIR" 2>/dev/null; then
  complete || { rm -rf "$BIN_DIR"; mv -T "$TMP" "$BIN_DIR"; }
fi
log "built in $((SECONDS - start))s: $BIN_DIR"
echo "$BIN_DIR"

#!/usr/bin/env bash
# make image: builds the operator image with no Docker daemon and no container registry, and
# exports it as an OCI archive (what `kind load image-archive` and `ctr images import` take).
#
#   1. A Debian base (bookworm: python3, python3-venv, ca-certificates, tzdata, libstdc++6,
#      libjemalloc2),
#      bootstrapped once by mmdebstrap from Debian's archive and imported as
#      localhost/slotune-base:<key>; the tarball is cached in ~/.cache/slotune/image.
#   2. `buildah build --layers` of the Dockerfile with BASE set to it (layers cached in
#      containers-storage, so a code change rebuilds only the last steps). pip reaches PyPI
#      with the host's CA bundle, passed as the build secret `cacert`.
#   3. Tagged with the full name the chart uses, docker.io/slotune/operator:<version> (a short
#      name would be stored as localhost/..., which the chart's reference does not match), and
#      written to build/slotune-operator-<version>.oci.tar.
#
# Prints the image name as its last line. --print-name prints it and builds nothing.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
version="$(python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')"
image="docker.io/slotune/operator:$version"
if [[ "${1:-}" == "--print-name" ]]; then echo "$image"; exit 0; fi

scripts/setup-image-tools.sh
export CONTAINERS_CONF="$root/scripts/containers/containers.conf"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/slotune/image"
mkdir -p "$cache" build

suite=bookworm
packages=python3,python3-venv,ca-certificates,tzdata,libstdc++6,libjemalloc2
key="$(echo "$suite $packages" | sha256sum | cut -c1-12)"
base="localhost/slotune-base:$suite-$key"
if ! podman image exists "$base"; then
  tarball="$cache/base-$suite-$key.tar"
  if [[ ! -s "$tarball" ]]; then
    echo "Bootstrapping the Debian $suite base (once, about a minute)" >&2
    SECONDS=0
    mmdebstrap --quiet --variant=essential --format=tar --include="$packages" \
      --customize-hook='rm -rf "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/*' \
      "$suite" "$tarball.part"
    mv "$tarball.part" "$tarball"
    echo "Base bootstrapped in ${SECONDS} s" >&2
  fi
  podman import --quiet "$tarball" "$base" >/dev/null
fi

cacert=/etc/ssl/certs/ca-certificates.crt
echo "Building $image on $base" >&2
SECONDS=0
buildah build --quiet --layers --build-arg "BASE=$base" \
  --secret "id=cacert,src=$cacert" --tag "$image" --file Dockerfile . >/dev/null
echo "Built in ${SECONDS} s" >&2
archive="build/slotune-operator-$version.oci.tar"
rm -f "$archive"
skopeo copy --quiet "containers-storage:$image" "oci-archive:$archive:$image"
echo "Wrote $archive ($(du -h "$archive" | cut -f1); $(podman image inspect --format '{{.Size}}' "$image" | awk '{printf "%.0f MB unpacked", $1 / 1e6}'))" >&2
echo "$image"

#!/usr/bin/env bash
# Installs (once) what `make image` and the image tests use, from Debian's packages: buildah
# (builds), podman (runs), skopeo (exports the OCI archive), runc (the OCI runtime), mmdebstrap
# (bootstraps the Debian base). Idempotent: with every tool present it touches nothing.
set -euo pipefail
tools=(buildah podman skopeo runc mmdebstrap)
missing=()
for tool in "${tools[@]}"; do command -v "$tool" >/dev/null || missing+=("$tool"); done
(( ${#missing[@]} == 0 )) && exit 0
if [[ "$(id -u)" != 0 ]]; then
  echo "Installing ${missing[*]} needs root (or install them yourself)" >&2
  exit 1
fi
echo "Installing ${missing[*]} from Debian's packages (once)" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >&2
apt-get install -y -q --no-install-recommends buildah podman skopeo runc mmdebstrap \
  containernetworking-plugins uidmap ca-certificates >&2

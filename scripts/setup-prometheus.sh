#!/usr/bin/env bash
# Installs (once) the real Prometheus server from Debian's `prometheus` package, for the engine
# tests that scrape a real vLLM. The tests start their own Prometheus on a free port with a
# generated config, so the package's own service is kept from starting (policy-rc.d during the
# install) and stopped if it runs anyway. Prints the path of the prometheus binary as the last
# line. Idempotent: an installed binary is reused without touching apt.
set -euo pipefail

if [[ "${1:-}" == "--print-path" ]]; then command -v prometheus; exit 0; fi

find_binary() {
  command -v prometheus 2>/dev/null || { [[ -x /usr/bin/prometheus ]] && echo /usr/bin/prometheus; }
}

if binary="$(find_binary)" && [[ -n "$binary" ]]; then
  echo "$binary"
  exit 0
fi

if [[ "$(id -u)" != 0 ]]; then
  echo "Installing the Debian package prometheus needs root (or install it yourself)" >&2
  exit 1
fi

echo "Installing the Debian package prometheus (once)" >&2
export DEBIAN_FRONTEND=noninteractive
# Keep maintainer scripts from starting the packaged service: exit 101 = "action forbidden".
policy=/usr/sbin/policy-rc.d
had_policy=0
[[ -e "$policy" ]] && had_policy=1
if [[ "$had_policy" == 0 ]]; then
  printf '#!/bin/sh\nexit 101\n' > "$policy"
  chmod +x "$policy"
  trap 'rm -f "$policy"' EXIT
fi

if ! apt-get install -y -q --no-install-recommends prometheus >&2; then
  apt-get update -q >&2
  apt-get install -y -q --no-install-recommends prometheus >&2
fi

# Where a service manager started it anyway, stop it: the tests run their own instances.
if command -v systemctl > /dev/null && systemctl is-active --quiet prometheus 2> /dev/null; then
  systemctl stop prometheus >&2 || true
  systemctl disable prometheus >&2 || true
fi

binary="$(find_binary)"
[[ -n "$binary" ]] || { echo "The prometheus package installed no prometheus binary" >&2; exit 1; }
echo "$binary"

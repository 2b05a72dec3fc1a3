#!/usr/bin/env bash
# The distribution's Prometheus, promtool and node_exporter for the tests (Debian's packages, unpacked; nothing is
# installed on this machine, no service starts): prints the directory that holds usr/bin/{prometheus,promtool} and
# usr/bin/prometheus-node-exporter. Cached in the test bed's cache; a second call only prints the directory.
set -euo pipefail
CACHE=${TESTBED_CACHE:-/var/cache/llmfleet-testbed}
PACKAGES=(prometheus prometheus-node-exporter)
dir=$CACHE/prometheus-debs
if [[ -x $dir/root/usr/bin/promtool && -x $dir/root/usr/bin/prometheus-node-exporter ]]; then echo "$dir/root"; exit 0; fi
mkdir -p "$dir/debs"
(
  cd "$dir/debs"
  apt-get download -q "${PACKAGES[@]}" >/dev/null 2>&1 || { apt-get update -qq && apt-get download -q "${PACKAGES[@]}" >/dev/null; }
)
rm -rf "$dir/root.tmp" && mkdir -p "$dir/root.tmp"
for deb in "$dir"/debs/*.deb; do dpkg-deb -x "$deb" "$dir/root.tmp"; done
rm -rf "$dir/root" && mv "$dir/root.tmp" "$dir/root"
echo "$dir/root"

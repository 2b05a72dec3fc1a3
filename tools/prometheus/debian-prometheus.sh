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
# A fresh machine may have no package lists yet, and another apt-get (the test bed's tools) may hold their lock.
fetched=0
for attempt in 1 2 3 4 5; do
  if (cd "$dir/debs" && apt-get download -q "${PACKAGES[@]}" >/dev/null 2>&1); then fetched=1; break; fi
  apt-get update -qq >/dev/null 2>&1 || sleep $((attempt * 10))
done
((fetched)) || { echo "apt-get download ${PACKAGES[*]} failed (Debian's package index unreachable?)" >&2; exit 1; }
rm -rf "$dir/root.tmp" && mkdir -p "$dir/root.tmp"
for deb in "$dir"/debs/*.deb; do dpkg-deb -x "$deb" "$dir/root.tmp"; done
rm -rf "$dir/root" && mv "$dir/root.tmp" "$dir/root"
echo "$dir/root"

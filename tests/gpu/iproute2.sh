#!/usr/bin/env bash
# The GPU machine has no iproute2 (`ip`), which the network-namespace fetch tests need, and nothing can be installed
# there. Here (a Debian machine with apt): `tests/gpu/iproute2.sh download` fetches the Debian packages of iproute2 and
# the libraries it needs into .ipr/ (git-ignored; carry it to the GPU machine). There, `source tests/gpu/iproute2.sh`
# unpacks them under /tmp (never into /) and puts an `ip` wrapper first on PATH.
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
if [ "${1:-}" = download ]; then
  mkdir -p "$here/.ipr" && cd "$here/.ipr" &&
    apt-get download iproute2 libmnl0 libbpf1 libelf1 libcap2 libxtables12 libbsd0 libmd0
  grep -qs '^/.ipr/' "$here/.git/info/exclude" 2>/dev/null || { mkdir -p "$here/.git/info"; echo "/.ipr/" >>"$here/.git/info/exclude"; }
  exit $?
fi
if ! command -v ip >/dev/null && ls "$here"/.ipr/*.deb >/dev/null 2>&1; then
  mkdir -p /tmp/kvcomm-ipr /tmp/kvcomm-ipbin
  for f in "$here"/.ipr/*.deb; do dpkg -x "$f" /tmp/kvcomm-ipr; done
  printf '#!/bin/sh\nLD_LIBRARY_PATH=/tmp/kvcomm-ipr/lib/x86_64-linux-gnu:/tmp/kvcomm-ipr/usr/lib/x86_64-linux-gnu exec /tmp/kvcomm-ipr/bin/ip "$@"\n' \
    >/tmp/kvcomm-ipbin/ip
  chmod +x /tmp/kvcomm-ipbin/ip
  export PATH=/tmp/kvcomm-ipbin:$PATH
  echo "iproute2: using the carried packages ($(ip -V 2>&1))"
fi

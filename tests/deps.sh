#!/bin/sh
# deps.sh - installs the Debian packages weft needs that are missing (as root),
# or says exactly which to install.
missing=""
for p in "$@"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
if [ "$(id -u)" = 0 ]; then
  echo "deps: installing$missing"
  export DEBIAN_FRONTEND=noninteractive
  { apt-get update -qq && apt-get install -y -qq --no-install-recommends $missing; } >/tmp/weft-deps.log 2>&1 || {
    cat /tmp/weft-deps.log; echo "deps: apt-get failed" >&2; exit 1; }
else
  echo "deps: missing Debian packages:$missing" >&2
  echo "deps: run as root: apt-get install$missing" >&2
  exit 1
fi

#!/usr/bin/env bash
# deps.sh PACKAGE...: installs the Debian packages a make target needs and the
# machine lacks, through apt-get when run as root; otherwise it names them
# and stops.
set -euo pipefail

if ! command -v go >/dev/null; then
    echo "deps.sh: Go is not on PATH; install Go 1.26 (https://go.dev/dl) first" >&2
    exit 1
fi
missing=()
for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
    echo "deps.sh: missing Debian packages: ${missing[*]}" >&2
    echo "deps.sh: run as root, or: sudo apt-get install -y ${missing[*]}" >&2
    exit 1
fi
echo "deps.sh: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null

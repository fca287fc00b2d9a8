#!/usr/bin/env bash
# Install the Debian 12 packages kvoffload needs to build and test.
# Run as root (or with sudo available).  Safe to run again.
set -euo pipefail
PKGS="cmake ninja-build gcc make binutils pkg-config libxxhash-dev libjansson-dev liburing-dev libcairo2-dev libhiredis-dev libssl-dev redis-server redis-tools python3 python3-venv python3-dev"
missing=""
for p in $PKGS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null

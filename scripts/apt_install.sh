#!/usr/bin/env bash
# Installs Debian packages quietly, through sudo unless run as root: the install_*.sh scripts' one way to do it.
# Usage: bash scripts/apt_install.sh PACKAGE...
set -euo pipefail
sudo=""
if [ "$(id -u)" -ne 0 ]; then
    sudo="sudo"
fi
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "$@" >/dev/null

#!/usr/bin/env bash
# Installs Debian's Docker engine (docker.io: dockerd, containerd, runc, docker-proxy) and debootstrap for
# tests/test_docker.py, which starts a private dockerd and makes its base image with debootstrap (no image
# registry is reachable from CI). Idempotent: does nothing when both are there. Starts no daemon.
set -euo pipefail
# /usr/bin/docker: the package's client, which builds with BuildKit without the buildx plugin (a docker client
# elsewhere on the PATH may lack it)
have_docker() {
    command -v dockerd >/dev/null 2>&1 && command -v docker-proxy >/dev/null 2>&1 \
        && [ -x /usr/bin/docker ] && command -v debootstrap >/dev/null 2>&1
}
if have_docker; then
    exit 0
fi
bash "$(dirname "$0")/apt_install.sh" docker.io debootstrap
have_docker || { echo "docker.io and debootstrap are installed but dockerd, docker-proxy or debootstrap is missing" >&2; exit 1; }
echo "Docker engine and debootstrap installed"

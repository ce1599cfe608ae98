#!/usr/bin/env bash
# Makes a local Debian bookworm image with python3 and venv (debootstrap, then `docker import`), for building the
# Dockerfile where no image registry is reachable:
#   bash scripts/make_base_image.sh halfmq-base:bookworm
#   docker build --network host --build-arg BASE_IMAGE=halfmq-base:bookworm -t halfmq .
# Uses the `docker` on PATH and DOCKER_HOST as given; DEBIAN_MIRROR overrides the mirror. Needs root and the
# debootstrap package (scripts/install_docker.sh installs it). The image trusts the certificate authorities this
# machine added locally (/usr/local/share/ca-certificates), so pip in the build trusts what the host's pip does.
set -euo pipefail
tag="${1:?usage: make_base_image.sh TAG}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
work="$(mktemp -d "${TMPDIR:-/tmp}/halfmq-base.XXXXXX")"
root="$work/root"
cleanup() {
    # debootstrap mounts /proc and /sys in the tree while it works: unmount whatever is left before deleting
    local mount
    for mount in $(findmnt -rn -o TARGET | grep -F "$root/" | sort -r || true); do umount -l "$mount" || true; done
    rm -rf "$work"
}
trap cleanup EXIT
# minbase: essential packages and apt only (1-2 min); venv brings the pip wheel bootstrap.sh needs. Its own
# package cache, deleted with the rest: the host's apt cache is neither read nor filled.
mkdir -p "$work/debs"
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates --cache-dir="$work/debs" \
    bookworm "$root" "$mirror" \
    >"$work/debootstrap.log" 2>&1 || { tail -n 30 "$work/debootstrap.log" >&2; exit 1; }
if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
    # TMPDIR may name a folder of the host, which the chroot does not have
    TMPDIR=/tmp chroot "$root" update-ca-certificates >"$work/ca.log" 2>&1 || { cat "$work/ca.log" >&2; exit 1; }
fi
# What an image needs no copy of: downloaded packages, package lists, documentation, translations.
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* \
    "$root"/usr/share/man/* "$root"/usr/share/locale/*
# PIP_CERT: pip trusts the system bundle (with the CAs above) rather than its own copy.
tar -C "$root" -c . | docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt' \
    --change 'CMD ["python3"]' \
    - "$tag" >/dev/null
echo "base image $tag made"

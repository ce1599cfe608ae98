#!/usr/bin/env bash
# Installs FUSE 3 (libfuse3 and fusermount3, Debian package fuse3) for the power-loss tests and the slow-disk
# benchmark (tests/support/powerfs.py mounts through it). Idempotent: does nothing when both are there.
set -euo pipefail
have_fuse() {
    command -v fusermount3 >/dev/null 2>&1 \
        && { ldconfig -p 2>/dev/null || /sbin/ldconfig -p; } | grep -q 'libfuse3\.so\.3 '
}
if have_fuse; then
    exit 0
fi
bash "$(dirname "$0")/apt_install.sh" fuse3
have_fuse || { echo "fuse3 is installed but libfuse3.so.3 or fusermount3 is still missing" >&2; exit 1; }
[ -c /dev/fuse ] || echo "warning: /dev/fuse is missing: the power-loss tests cannot mount" >&2
echo "FUSE 3 installed"

#!/usr/bin/env bash
# Installs Debian's etcd (etcd-server: the etcd binary; etcd-client: etcdctl) for the failover tests, which start
# their own 3-member etcd on fresh loopback ports (tests/support/etcd.py). Idempotent: does nothing when both are
# there. Starts no daemon: the package's postinst runs `invoke-rc.d etcd start`, which would leave a system etcd on
# the default ports 2379/2380, so a /usr/sbin/policy-rc.d that forbids every service start (exit 101) is in place
# for the install, and whatever was there before is put back afterwards.
set -euo pipefail
have_etcd() {
    command -v etcd >/dev/null 2>&1 && command -v etcdctl >/dev/null 2>&1
}
if have_etcd; then
    exit 0
fi
sudo=""
if [ "$(id -u)" -ne 0 ]; then
    sudo="sudo"
fi
policy=/usr/sbin/policy-rc.d
saved=""
if [ -e "$policy" ]; then
    saved="$($sudo mktemp /usr/sbin/.policy-rc.d.halfmq.XXXXXX)"
    $sudo cp -p "$policy" "$saved"
fi
restore() {
    if [ -n "$saved" ]; then
        $sudo mv -f "$saved" "$policy"
    else
        $sudo rm -f "$policy"
    fi
}
trap restore EXIT
printf '#!/bin/sh\n# scripts/install_etcd.sh: no service starts while etcd installs\nexit 101\n' \
    | $sudo tee "$policy" >/dev/null
$sudo chmod 0755 "$policy"
bash "$(dirname "$0")/apt_install.sh" etcd-server etcd-client
have_etcd || { echo "etcd-server and etcd-client are installed but etcd or etcdctl is missing" >&2; exit 1; }
echo "etcd installed: $(etcd --version | head -n1)"

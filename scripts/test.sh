#!/usr/bin/env bash
# Runs the whole test suite (unit, broker, client, C++ client interoperability), installing what it needs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh test,pipeline,grpc
bash scripts/install_fuse.sh  # the power-loss tests mount a FUSE filesystem
bash scripts/install_docker.sh  # tests/test_docker.py builds and runs the image under a private dockerd
bash scripts/install_chromium.sh  # the dashboard's browser tests drive a headless Chromium
bash scripts/install_etcd.sh  # the failover tests start their own 3-member etcd (tests/support/etcd.py)
exec .venv/bin/python -m pytest -q "$@"

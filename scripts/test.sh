#!/usr/bin/env bash
# Runs the test suite, installing what it needs:
#   bash scripts/test.sh           every test: unit, broker, client, cluster, Spark, Docker, C++ client interop
#   bash scripts/test.sh --quick   all but the tests marked slow (pyproject.toml's markers say which)
# Other arguments go to pytest: a path, -k EXPR, -x, -n 0 (one process, no workers).
# The tests run on HALFMQ_TEST_WORKERS xdist workers (default 3, 4 for --quick; most tests wait on sockets and child
# processes rather than the CPU, so 3 finish sooner than 2 even on a 2-core machine). --dist loadgroup keeps the tests that
# share a Spark session, a Docker daemon or the C++ client on one worker (tests/conftest.py).
set -euo pipefail
cd "$(dirname "$0")/.."
tier=()
workers="${HALFMQ_TEST_WORKERS:-3}"
if [ "${1:-}" = "--quick" ]; then
    shift
    tier=(-m "not slow")
    workers="${HALFMQ_TEST_WORKERS:-4}"  # no Spark JVM, Docker or C++ client beside them: a fourth worker pays
fi
# The brokers the tests start read HALFMQ_<key> variables as configuration and refuse a name that is no key.
unset HALFMQ_TEST_WORKERS
bash scripts/bootstrap.sh test,pipeline,grpc
bash scripts/install_fuse.sh  # the power-loss tests mount a FUSE filesystem
bash scripts/install_docker.sh  # tests/test_docker.py builds and runs the image under a private dockerd
bash scripts/install_chromium.sh  # the dashboard's browser tests drive a headless Chromium
bash scripts/install_etcd.sh  # the failover tests start their own 3-member etcd (tests/support/etcd.py)
exec .venv/bin/python -m pytest -q -n "$workers" --dist loadgroup "${tier[@]}" "$@"

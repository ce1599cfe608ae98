#!/usr/bin/env bash
# Installs the real RocketMQ client (Apache rocketmq-client-python 2.0.0 over the C++ core 2.1.0) into
# .peers/cpp-client, for the interoperability tests. Idempotent; only PyPI is used (see shared/peers/README.md).
set -euo pipefail
cd "$(dirname "$0")/.."
V=.peers/cpp-client
ARCHIVE_SHA=99e4ce8008554a74193a3ad94b60f939a4666c48ffabbf4c4417a109daf1419d
LIB_SHA=ed3fce39f2b926637637a2b8b9122799f207b0cdf98dbd9110505bf43170fa30
export ROCKETMQ_CLIENT_LOG_DIR="$PWD/.peers/logs/"

check() {
    "$V/bin/python" -c "from rocketmq.client import TransactionMQProducer, PushConsumer, Producer" 2>/dev/null
}
if [ -x "$V/bin/python" ] && check; then
    exit 0
fi
python3 -m venv "$V"
"$V/bin/pip" install --quiet rocketmq-client-python==2.0.0
"$V/bin/pip" download --quiet --no-deps --no-binary :all: -d "$V/dl" rocketmq-python-cvs==2.1.0.3
archive="$V/dl/rocketmq-python-cvs-2.1.0.3.tar.gz"
echo "$ARCHIVE_SHA  $archive" | sha256sum --check --quiet || { echo "checksum mismatch: $archive" >&2; exit 1; }
SITE=$("$V/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
tar xzf "$archive" -O rocketmq-python-cvs-2.1.0.3/rocketmq/librocketmq.so > "$SITE/rocketmq/librocketmq.so"
echo "$LIB_SHA  $SITE/rocketmq/librocketmq.so" | sha256sum --check --quiet \
    || { echo "checksum mismatch: librocketmq.so" >&2; exit 1; }
mkdir -p .peers/logs
check || { echo "the RocketMQ C++ client does not import after installation" >&2; exit 1; }
echo "RocketMQ C++ client installed in $V"

#!/usr/bin/env bash
# Starts the broker on its defaults (broker 10911, built-in name server 9876, LMDB under ./store_data),
# installing halfmq into .venv first. Extra arguments are --KEY=VALUE overrides.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
exec .venv/bin/halfmq broker -c conf/broker.conf "$@"

#!/usr/bin/env bash
# Starts the broker on its defaults (broker 10911, built-in name server 9876, gRPC for RocketMQ 5 clients 8081, LMDB
# under ./store_data), installing halfmq (with its grpc extra) into .venv first. Extra arguments are --KEY=VALUE
# overrides.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh grpc
exec .venv/bin/halfmq broker -c conf/broker.conf "$@"

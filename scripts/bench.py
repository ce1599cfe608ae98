"""halfmq's benchmarks, one subcommand each (docs/benchmarks.md says what each measures):

    .venv/bin/python scripts/bench.py send --spawn-broker --duration 10
    .venv/bin/python scripts/bench.py alternate --trees main HEAD --rounds 3
    .venv/bin/python scripts/bench.py <benchmark> --help

Every benchmark writes its measurements as JSON lines on stdout (benchmark, params, metric, value, unit, revision)
and, at the end, the same as a table on stderr, with its progress; its brokers, name servers and checkouts come from
scripts/benchlib/harness.py. A benchmark's helper processes (a client, a probe, an attacker) are this command too,
with a hidden ``--helper-*`` option: they talk to the benchmark that started them on stdout.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # halfmq's packages, for a checkout run in place

from benchlib.results import Results  # noqa: E402 - scripts/ is on the path as this file's folder

#: subcommand → (module of scripts/benchlib/, what it measures)
BENCHMARKS = {
    "send": ("send", "sends/s and latency of one broker or group (the project's client or the raw one)"),
    "consume": ("send", "pulled messages/s draining a filled topic"),
    "transactions": ("send", "transactions/s with local and check-back decisions"),
    "compare": ("send", "plain against transactional sends in the same run"),
    "alternate": ("alternate", "sends and transactions of several checkouts or group sizes, in turn"),
    "instructions": ("instructions", "CPU instructions per send and per transaction under valgrind"),
    "grpc": ("grpc_sends", "gRPC sends/s beside remoting sends/s"),
    "cluster": ("cluster", "sends/s of 1 broker against several behind one name server"),
    "hostile": ("hostile", "a good client's errors, p99 and the broker's RSS under each hostile-client attack"),
    "check-pass": ("check_pass", "one check-back pass over a long transaction history"),
    "retention": ("retention", "send latency while retention deletes a large backlog"),
    "slow-disk": ("slow_disk", "sends/s and pull latency while every fsync takes long"),
    "dashboard": ("dashboard", "dashboard page times and the broker's event loop on a full broker"),
    "spark": ("spark", "rows/s between the broker and Spark against parquet"),
    "spark-ceiling": ("spark_ceiling", "what PySpark's Python data sources allow at all, no broker"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="benchmark", required=True, metavar="benchmark")
    chosen = next((arg for arg in sys.argv[1:] if not arg.startswith("-")), None)
    module = None
    for name, (module_name, summary) in BENCHMARKS.items():
        sub = commands.add_parser(name, help=summary, formatter_class=argparse.RawDescriptionHelpFormatter)
        if name == chosen:  # only its module is imported: others need Spark, grpc or aiohttp
            module = importlib.import_module(f"benchlib.{module_name}")
            sub.description = module.__doc__
            module.add_arguments(sub)
    args = parser.parse_args()
    if any(value for key, value in vars(args).items() if key.startswith("helper_")):
        module.run(args, Results(args.benchmark))  # a helper process: its stdout is its answer
        return
    results = Results(args.benchmark)
    try:
        with contextlib.redirect_stdout(sys.stderr):  # progress and notes; the measurements keep stdout
            module.run(args, results)
    finally:
        print(results.table(), file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()

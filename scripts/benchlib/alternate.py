"""Sends and transactions of several checkouts (or broker group sizes) in turn, to compare them.

    scripts/bench.py alternate --trees /tmp/base . --rounds 3          # two checkouts (a folder or a revision)
    scripts/bench.py alternate --trees main HEAD --client raw
    scripts/bench.py alternate --replicas-alternate 1 2 --rounds 3    # a broker alone against a group of 2

Runs ``send --spawn-broker`` and ``transactions --spawn-broker`` (every transaction committed; ``--what`` picks
one) against the broker of each checkout in turn (each run with its own .venv when it has one: ``--broker-tree``),
``--rounds`` times: a kind's runs of every checkout back to back, in reverse order every other round. The load comes
from this checkout's client in every run, an independent load generator, so a change to the client does not move
the broker's figures. It prints each run's TPS, p50/p99 and CPU per message (per transaction) of the client, the
broker and the broker's helper processes (the store's writer), read from /proc between the run's first and last
progress lines: on a busy machine TPS swings, CPU per message much less. Its figures are each checkout's median
TPS, latency and CPU, their ratio to the first checkout, and each checkout's transactions/s over its sends/s;
``paired_ratio`` and ``paired_tx_plain_ratio`` are the medians of the same ratios taken round by round (runs
minutes apart on a shared machine differ by more than the checkouts do).
"""
from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import time

from .harness import REPO, child_pids, cpu_seconds, helper, remove_temp_stores, tree as checkout
from .results import Results, revision
from .send import add_load_arguments

#: a run's kind → the benchmark that runs it
KINDS = {"producer": "send", "transaction": "transactions"}
PROGRESS = re.compile(r"\[(?:producer|transaction)\] tps=([\d,]+)")


def cpu_sample(client: int) -> dict[str, float]:
    """CPU seconds of a benchmark client, the brokers it spawned and their helper processes."""
    brokers = child_pids(client)
    return {"client": cpu_seconds(client), "broker": sum(map(cpu_seconds, brokers)),
            "helpers": sum(cpu_seconds(h) for b in brokers for h in child_pids(b))}


def load_run(tree: str, what: str, args, replicas: int = 1) -> dict:
    """One ``producer`` or ``transaction`` (all commits) ``--spawn-broker`` run against checkout ``tree``'s broker:
    its TPS, p50/p99 and CPU microseconds per message (or per transaction) of the client, the broker and its
    writer."""
    cmd = helper(KINDS[what], "--spawn-broker", f"--broker-tree={os.path.abspath(tree)}",
                 f"--duration={args.duration}", f"--size={args.size}", f"--inflight={args.inflight}",
                 f"--client={args.client}", f"--replicas={replicas}")
    if what == "transaction":
        cmd += ["--unknown=0", "--rollback=0"]
    first = last = None
    messages, summary = 0, None
    # the run's progress (stderr) and figures (stdout, JSON lines) in the order they came
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        for line in proc.stdout:
            match = PROGRESS.match(line)
            if match:
                sample = {**cpu_sample(proc.pid), "wall": time.monotonic()}
                if first is None:
                    first = sample  # the window starts at the first progress line: start-up is not counted
                else:
                    messages += int(match.group(1).replace(",", "")) * 3  # a progress line covers 3 s
                    last = sample
            elif line.startswith("{"):
                row = json.loads(line)
                if row["metric"] in ("tps", "p50_ms", "p99_ms"):
                    summary = {**(summary or {}), row["metric"]: row["value"]}
    if proc.returncode or summary is None or last is None or not messages:
        raise SystemExit(f"the {what} run of {tree} failed (exit {proc.returncode}); run it alone to see why")
    wall = last.pop("wall") - first.pop("wall")
    cpu = {k: (last[k] - first[k]) / messages * 1e6 for k in first}
    # Cores each process kept busy: the broker's event loop is one thread, so a broker near 1.0 is the limit,
    # whatever the disk does.
    busy = {f"{k}_busy": (last[k] - first[k]) / wall for k in first}
    return {**summary, **cpu, **busy, "server": cpu["broker"] + cpu["helpers"]}


def run(args, results: Results) -> None:
    """Each kind (sends, then transactions; ``--what`` picks one) of every variant back to back, ``--rounds``
    times, the variants' order reversed every other round: the machine's speed drifts over minutes (a shared host),
    so each round's runs of one kind are compared with each other (``paired_ratio``, the median of the rounds'
    ratios) besides the ratio of the medians. The variants are checkouts (``--trees``) or, with
    ``--replicas-alternate``, broker group sizes of the first checkout (1: a broker alone)."""
    try:
        kinds = ["producer", "transaction"] if args.what == "both" else [args.what]
        if args.replicas_alternate:
            variants = [(f"replicas={n}", checkout(args.trees[0]), n) for n in args.replicas_alternate]
        else:
            variants = [(spec, checkout(spec), 1) for spec in args.trees]
        labels = [label for label, _tree, _n in variants]
        trees = {label: folder for label, folder, _n in variants}
        runs: dict[tuple[str, str], list[dict]] = {(label, kind): [] for label in labels for kind in kinds}
        for round_no in range(1, args.rounds + 1):
            for kind in kinds:
                for label, tree, replicas in (variants if round_no % 2 else variants[::-1]):
                    run = load_run(tree, kind, args, replicas)
                    runs[(label, kind)].append(run)
                    print(f"[round {round_no}] {label} {kind}: tps={run['tps']:,.0f} p50_ms={run['p50_ms']:.2f} "
                          f"p99_ms={run['p99_ms']:.2f} cpu_us_per_msg client={run['client']:.1f} "
                          f"broker={run['broker']:.1f} writer={run['helpers']:.1f} server={run['server']:.1f} "
                          f"cores_busy client={run['client_busy']:.2f} broker={run['broker_busy']:.2f} "
                          f"writer={run['helpers_busy']:.2f}", flush=True)
        median = {key: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for key, rs in runs.items()}

        def paired(numerator: list[dict], denominator: list[dict]) -> float:
            return statistics.median(n["tps"] / d["tps"] for n, d in zip(numerator, denominator))

        for kind in kinds:
            base = median[(labels[0], kind)]
            for label in labels:
                m = median[(label, kind)]
                extra = {}
                if kind == "transaction" and "producer" in kinds:
                    extra = {"tx_plain_ratio": (m["tps"] / median[(label, "producer")]["tps"], ""),
                             "paired_tx_plain_ratio": (paired(runs[(label, kind)], runs[(label, "producer")]), "")}
                results.add_all({
                    "median_tps": (m["tps"], "msg/s"), "tps_ratio": (m["tps"] / base["tps"], ""),
                    "paired_ratio": (paired(runs[(label, kind)], runs[(labels[0], kind)]), ""), **extra,
                    "p50_ms": (m["p50_ms"], "ms"), "p99_ms": (m["p99_ms"], "ms"),
                    "median_server_cpu_us": (m["server"], "us/msg"),
                    "server_cpu_ratio": (m["server"] / base["server"], ""),
                    "median_broker_cpu_us": (m["broker"], "us/msg"),
                    "median_writer_cpu_us": (m["helpers"], "us/msg"),
                    "median_client_cpu_us": (m["client"], "us/msg"),
                    "broker_cores_busy": (m["broker_busy"], "cores"),
                    "writer_cores_busy": (m["helpers_busy"], "cores"),
                    "client_cores_busy": (m["client_busy"], "cores")},
                    revision(trees[label]), kind=kind, tree=label, rounds=args.rounds)

    finally:
        remove_temp_stores()  # the checkouts of revisions

def add_arguments(parser) -> None:
    add_load_arguments(parser)
    parser.add_argument("--trees", nargs="+", default=[str(REPO)],
                        help="checkouts to run in turn, each a folder or a git revision (the first is the reference)")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each checkout")
    parser.add_argument("--what", choices=["both", "producer", "transaction"], default="both",
                        help="sends, transactions (all commits), or both")
    parser.add_argument("--replicas-alternate", type=int, nargs="+", default=None,
                        help="compare these broker group sizes of the first checkout (e.g. 1 2) instead of checkouts")

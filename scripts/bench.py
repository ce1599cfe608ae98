"""halfmq benchmark: producer, consumer and transactional producer, modelled on RocketMQ's benchmarks.

    python scripts/bench.py producer    --spawn-broker --size 1024 --inflight 64 --duration 10
    python scripts/bench.py consumer    --spawn-broker --messages 300000
    python scripts/bench.py transaction --spawn-broker --unknown 0.1 --rollback 0.1 --check-timeout 1000
    python scripts/bench.py compare     --spawn-broker   # plain vs transactional sends, same run
    python scripts/bench.py alternate   --trees /tmp/base . --rounds 3   # sends and transactions of two checkouts
    python scripts/bench.py alternate   --replicas-alternate 1 2 --rounds 3  # a broker alone against a group of 2

Prints TPS and RT p50/p99/max every few seconds and a SUMMARY line at the end. With --spawn-broker a broker
is started in a subprocess on free ports over a temporary store (SYNC_FLUSH unless --async-flush), removed when
the benchmark ends (also on an error or Ctrl-C). Filling and draining phases print their progress every second.

``alternate`` runs ``producer --spawn-broker`` and ``transaction --spawn-broker`` (every transaction committed;
``--what`` picks one) against the broker of each checkout in turn (each run with its own .venv when it has one:
``--broker-tree``), ``--rounds`` times: a kind's runs of every checkout back to back, in reverse order every other
round. The load comes from this checkout's client in every run, an independent load
generator, so a change to the client does not move the broker's figures. It
prints each run's TPS, p50/p99 and CPU per message (per transaction) of the client, the broker and the broker's
helper processes (the store's writer), read from /proc between the run's first and last progress lines: on a busy
machine TPS swings, CPU per message much less. It ends with each checkout's median TPS, latency and CPU, their
ratio to the first checkout, and each checkout's transactions/s over its sends/s; ``paired_ratio`` and
``paired_tx_plain_ratio`` are the medians of the same ratios taken round by round (runs minutes apart on a shared
machine differ by more than the checkouts do).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from halfmq.broker.loop import new_event_loop  # noqa: E402
from halfmq.client import (LocalTransactionState, Message, MessageQueue, Producer, PullConsumer,  # noqa: E402
                           TransactionProducer)
from halfmq.client.route import DEFAULT_QUEUE_NUMS  # noqa: E402
from rawload import RawProducer  # noqa: E402

READY = re.compile(rb"halfmq ready: broker (\S+) namesrv (\S+) metrics (\S+)")
S = LocalTransactionState


def percentile(values: list[float], p: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


@dataclass
class Stats:
    name: str
    latencies: list[float] = field(default_factory=list)
    window: list[float] = field(default_factory=list)
    count: int = 0
    errors: int = 0
    started: float = field(default_factory=time.perf_counter)
    finished: float | None = None  #: end of the measured load; what follows (waiting out checks) is not timed

    def record(self, seconds: float) -> None:
        self.count += 1
        self.latencies.append(seconds)
        self.window.append(seconds)

    def report(self, interval: float) -> None:
        w, self.window = self.window, []
        print(f"[{self.name}] tps={len(w) / interval:,.0f} p50_ms={percentile(w, 50) * 1000:.2f} "
              f"p99_ms={percentile(w, 99) * 1000:.2f} max_ms={max(w, default=0) * 1000:.2f} errors={self.errors}",
              flush=True)

    def summary(self, **extra) -> float:
        elapsed = (self.finished or time.perf_counter()) - self.started
        tps = self.count / elapsed
        fields = " ".join(f"{k}={v}" for k, v in extra.items())
        print(f"SUMMARY mode={self.name} tps={tps:,.0f} count={self.count} errors={self.errors} "
              f"p50_ms={percentile(self.latencies, 50) * 1000:.2f} p99_ms={percentile(self.latencies, 99) * 1000:.2f} "
              f"max_ms={max(self.latencies, default=0) * 1000:.2f} {fields}".rstrip(), flush=True)
        return tps


async def reporter(stats: Stats, stop: asyncio.Event, every: float = 3.0) -> None:
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), every)
        except asyncio.TimeoutError:
            stats.report(every)


#: Temporary store folders this run made: removed at its end (remove_temp_stores), and only these.
TEMP_STORES: list[str] = []


def temp_store(prefix: str = "halfmq-bench-") -> str:
    path = tempfile.mkdtemp(prefix=prefix)
    TEMP_STORES.append(path)
    return path


def remove_temp_stores() -> None:
    """Remove the store folders made by temp_store (call once whatever used them has stopped)."""
    while TEMP_STORES:
        shutil.rmtree(TEMP_STORES.pop(), ignore_errors=True)


def run_main(coro) -> None:
    """Run a benchmark's main coroutine: Ctrl-C or SIGTERM cancel it (its ``finally`` blocks stop the brokers it
    spawned), then the temporary stores are removed."""
    loop = new_event_loop()
    task = loop.create_task(coro)
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, task.cancel)
    try:
        loop.run_until_complete(task)
    except asyncio.CancelledError:
        print("interrupted", file=sys.stderr, flush=True)
        raise SystemExit(130) from None
    finally:
        loop.close()
        remove_temp_stores()


async def progress(label: str, done, total: int | None = None, every: float = 1.0) -> None:
    """Print ``done()`` every ``every`` seconds until cancelled: live progress of a long phase."""
    started = last_time = time.perf_counter()
    last = 0
    while True:
        await asyncio.sleep(every)
        now, count = time.perf_counter(), done()
        of = f"/{total:,}" if total else ""
        print(f"[{label}] {count:,}{of} messages in {now - started:.0f} s ({(count - last) / (now - last_time):,.0f}/s)",
              flush=True)
        last, last_time = count, now


class Progress:
    """``async with Progress(label, done, total):`` prints progress while the block runs."""

    def __init__(self, label: str, done, total: int | None = None):
        self.args = (label, done, total)
        self.task: asyncio.Task | None = None

    async def __aenter__(self):
        self.task = asyncio.get_running_loop().create_task(progress(*self.args))
        return self

    async def __aexit__(self, *exc):
        self.task.cancel()
        try:
            await self.task
        except asyncio.CancelledError:
            pass


async def start_broker(*flags: str, dashboard: bool = True, grpc: bool = True, python: str = sys.executable,
                       cwd: str | None = None) -> tuple[asyncio.subprocess.Process, re.Match]:
    """A broker subprocess on free loopback ports over a temporary store (removed by remove_temp_stores), with
    ``flags`` added (gRPC off unless a flag turns it on, the dashboard off; ``dashboard=False``: a broker from before
    the dashboard, which knows no such key; ``grpc=False``: one from before the gRPC door), run by ``python`` in
    ``cwd`` (another checkout's broker): (process, the match of its ready line: broker, namesrv and metrics
    addresses)."""
    cmd = [python, "-m", "halfmq.broker.cli", "broker", "--bindAddress=127.0.0.1", "--listenPort=0",
           "--namesrvListenPort=0", *(["--grpcListenPort=-1"] if grpc else []),
           *(["--dashboardPort=-1"] if dashboard else []),
           f"--storePathRootDir={temp_store()}", *flags]
    proc = await asyncio.create_subprocess_exec(*cmd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
                                                cwd=cwd)
    said: list[bytes] = []
    try:
        while True:
            line = await asyncio.wait_for(proc.stdout.readline(), 30)
            if not line:
                raise SystemExit("the broker exited before it was ready; its last words:\n"
                                 + b"".join(said[-20:]).decode(errors="replace"))
            said.append(line)
            match = READY.search(line)
            if match:
                return proc, match
    except BaseException:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        raise


async def spawn_broker(args) -> tuple[list[asyncio.subprocess.Process], str, str]:
    """The broker of ``--broker-tree`` (this checkout's by default); with ``--replicas N`` above 1, a name server and
    a broker group of N members (every write waits for all of them: minInSyncReplicas N), the load going to its
    leader. Returns (processes, name server, the leader's metrics address)."""
    tree = args.broker_tree
    python = os.path.join(tree, ".venv", "bin", "python") if tree else sys.executable
    python = python if os.path.exists(python) else sys.executable
    flags = ["--metricsPromExporterPort=0", f"--flushDiskType={'ASYNC_FLUSH' if args.async_flush else 'SYNC_FLUSH'}",
             "--logLevel=WARNING", f"--transactionTimeOut={args.check_timeout}",
             f"--transactionCheckInterval={args.check_interval}"]
    procs = []
    if args.replicas > 1:
        namesrv = await start_namesrv(python, tree or None)
        procs.append(namesrv[0])
        flags += [f"--namesrvAddr={namesrv[1]}", "--haListenPort=0", f"--minInSyncReplicas={args.replicas}",
                  "--brokerName=bench-group"]
    proc, ready = await start_broker(
        *flags, *(["--brokerId=0"] if args.replicas > 1 else []), python=python, cwd=tree or None,
        dashboard=not tree or os.path.isdir(os.path.join(tree, "dashboard")),
        grpc=not tree or os.path.isdir(os.path.join(tree, "broker", "grpc")))
    procs.append(proc)
    args.broker = ready.group(1).decode()
    for broker_id in range(1, args.replicas):
        procs.append((await start_broker(*flags, f"--brokerId={broker_id}", python=python, cwd=tree or None))[0])
    if args.replicas > 1:
        await in_sync(args.broker, args.replicas)
    return procs, namesrv[1] if args.replicas > 1 else ready.group(2).decode(), ready.group(3).decode()


async def start_namesrv(python: str, cwd: str | None) -> tuple[asyncio.subprocess.Process, str]:
    proc = await asyncio.create_subprocess_exec(python, "-m", "halfmq.broker.cli", "namesrv",
                                                "--bindAddress=127.0.0.1", "--listenPort=0",
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
                                                cwd=cwd)
    while line := await asyncio.wait_for(proc.stdout.readline(), 30):
        match = re.search(rb"halfmq namesrv ready: (\S+)", line)
        if match:
            return proc, match.group(1).decode()
    raise SystemExit("the name server exited before it was ready")


async def in_sync(leader: str, members: int, timeout: float = 60.0) -> None:
    """Wait until every member of the leader's group is in sync (HALFMQ_GET_REPLICATION)."""
    import json
    from halfmq.client.remoting import Connection
    from halfmq.protocol.codes import RequestCode
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        conn = await Connection.open(leader)
        try:
            status = json.loads((await conn.request(RequestCode.HALFMQ_GET_REPLICATION)).body)
        finally:
            await conn.close()
        if len(status.get("inSync", ())) == members:
            return
        await asyncio.sleep(0.2)
    raise SystemExit(f"the broker group of {leader} did not get {members} members in sync within {timeout} s")


async def timed_loop(inflight: int, duration: float, op, stats: Stats) -> None:
    deadline = time.perf_counter() + duration

    async def worker():
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            try:
                await op()
            except Exception as exc:  # noqa: BLE001 - counted and reported
                stats.errors += 1
                if stats.errors < 5:
                    print(f"error: {exc!r}", flush=True)
                continue
            stats.record(time.perf_counter() - t0)

    stop = asyncio.Event()
    rep = asyncio.get_running_loop().create_task(reporter(stats, stop))
    try:
        await asyncio.gather(*(worker() for _ in range(inflight)))
    finally:  # also when interrupted: the reporter ends with the load
        stats.finished = time.perf_counter()
        stop.set()
        await rep


async def run_raw(args, namesrv: str, topic: str, transactional: bool, name: str,
                  metrics_addr: str | None = None) -> float:
    """``--client raw``: the load of scripts/rawload.py (a lean generator) over one connection to the broker."""
    if not args.broker:
        raise SystemExit("--client raw needs --spawn-broker or --broker")
    body = os.urandom(args.size)
    async with Producer("BENCH_PG", namesrv) as producer:
        await producer.send(Message(topic, body))  # creates the topic, with the client's DEFAULT_QUEUE_NUMS queues
    raw = RawProducer(topic, body, DEFAULT_QUEUE_NUMS, transactional, "BENCH_TX_PG" if transactional else "BENCH_PG")
    await raw.connect(args.broker)
    try:
        stats = Stats(name)
        await timed_loop(args.inflight, args.duration, raw.send, stats)
        # Halves still pending once the load stops would be decisions the broker never applied.
        extra = {"pending_halves": await settled_pending(metrics_addr)} if transactional else {}
        return stats.summary(size=args.size, inflight=args.inflight, client="raw", **extra)
    finally:
        raw.close()


async def run_producer(args, namesrv: str, topic: str | None = None) -> float:
    if args.client == "raw":
        return await run_raw(args, namesrv, topic or args.topic, False, "producer")
    body = os.urandom(args.size)
    async with Producer("BENCH_PG", namesrv) as producer:
        await producer.send(Message(topic or args.topic, body))  # creates the topic
        stats = Stats("producer")
        await timed_loop(args.inflight, args.duration, lambda: producer.send(Message(topic or args.topic, body)), stats)
        return stats.summary(size=args.size, inflight=args.inflight)


async def run_consumer(args, namesrv: str) -> float:
    body = os.urandom(args.size)
    topic = f"{args.topic}Drain"
    async with Producer("BENCH_PG", namesrv) as producer:
        # The first send creates the topic; its queues are then read from the name server (the sends before
        # used the template route, which has fewer queues). Every message sent is counted, this one too.
        await producer.send(Message(topic, body))
        sent = 1
        queues = (await producer.instance.routes.fetch(topic)).write_queues
        t0 = time.perf_counter()
        per_batch = max(1, min(256, (1 << 20) // (args.size + 200)))

        async def fill(queue: MessageQueue, count: int):
            nonlocal sent
            for start in range(0, count, per_batch):
                n = min(per_batch, count - start)
                await producer.send_batch([Message(topic, body)] * n, queue)
                sent += n

        remaining = max(0, args.messages - sent)
        shares = [remaining // len(queues) + (i < remaining % len(queues)) for i in range(len(queues))]
        async with Progress("fill", lambda: sent, args.messages):
            await asyncio.gather(*(fill(q, n) for q, n in zip(queues, shares, strict=True)))
        print(f"filled {sent:,} messages in {time.perf_counter() - t0:.1f} s", flush=True)
    async with PullConsumer("BENCH_CG", namesrv) as consumer:
        queues = await consumer.fetch_subscribe_queues(topic)
        stats = Stats("consumer")
        stats.started = time.perf_counter()

        async def drain(queue: MessageQueue):
            offset = 0
            end = await consumer.max_offset(queue)
            while offset < end:
                t0 = time.perf_counter()
                result = await consumer.pull(queue, offset, max_nums=args.pull_batch)
                stats.latencies.append(time.perf_counter() - t0)
                stats.count += len(result.messages)
                offset = result.next_begin_offset

        async with Progress("drain", lambda: stats.count, sent):
            await asyncio.gather(*(drain(q) for q in queues))
        if stats.count != sent:
            print(f"WARNING: drained {stats.count:,} messages but filled {sent:,}", flush=True)
        return stats.summary(size=args.size, filled=sent, pull_batch=args.pull_batch)


class BenchListener:
    """Local decisions and check answers drawn at the configured rates; counts checks by kind."""

    def __init__(self, args):
        self.args = args
        self.local: dict[str, S] = {}
        self.unknown_at: dict[str, float] = {}
        self.decided_by_check: set[str] = set()
        self.checks = 0
        self.unexpected = 0
        self.duplicated = 0
        self.resolve_times: list[float] = []

    async def execute_local_transaction(self, msg, arg):
        r = random.random()
        state = (S.ROLLBACK_MESSAGE if r < self.args.rollback else
                 S.UNKNOW if r < self.args.rollback + self.args.unknown else S.COMMIT_MESSAGE)
        self.local[msg.keys] = state
        if state is S.UNKNOW:
            self.unknown_at[msg.keys] = time.perf_counter()
        return state

    async def check_local_transaction(self, msg):
        key = msg.keys
        self.checks += 1
        if self.local.get(key, S.UNKNOW) is not S.UNKNOW:
            self.unexpected += 1  # the broker asked about a message the producer already decided
        if key in self.decided_by_check:
            self.duplicated += 1  # asked again after a check already decided it
        r = random.random()
        answer = (S.UNKNOW if r < self.args.check_unknown else
                  S.ROLLBACK_MESSAGE if r < self.args.check_unknown + self.args.check_rollback else S.COMMIT_MESSAGE)
        if answer is not S.UNKNOW:
            self.decided_by_check.add(key)
            if key in self.unknown_at:
                self.resolve_times.append(time.perf_counter() - self.unknown_at[key])
        return answer


def scrape_pending(metrics_addr: str) -> int:
    text = urllib.request.urlopen(f"http://{metrics_addr}/metrics", timeout=5).read().decode()
    return int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("rocketmq_half_messages{")))


async def settled_pending(metrics_addr: str | None) -> str:
    """Pending halves once the last oneway END_TRANSACTIONs of the run reached the broker (at most 3 s)."""
    if not metrics_addr:
        return "?"
    pending, deadline = scrape_pending(metrics_addr), time.perf_counter() + 3
    while pending and time.perf_counter() < deadline:
        await asyncio.sleep(0.1)  # a benchmark waiting out its tail, not test synchronisation
        pending = scrape_pending(metrics_addr)
    return str(pending)


async def run_transaction(args, namesrv: str, metrics_addr: str | None, name: str = "transaction") -> float:
    if args.client == "raw":
        return await run_raw(args, namesrv, args.topic + "Tx", True, name, metrics_addr)
    body = os.urandom(args.size)
    listener = BenchListener(args)
    counter = iter(range(1 << 62))
    async with TransactionProducer("BENCH_TX_PG", listener, namesrv) as producer:
        await producer.send(Message(args.topic + "Tx", body))
        stats = Stats(name)
        await timed_loop(args.inflight, args.duration,
                         lambda: producer.send_message_in_transaction(
                             Message(args.topic + "Tx", body, keys=f"k{next(counter)}")), stats)
        unknown = len(listener.unknown_at)
        if unknown:  # let the outstanding checks arrive: they are part of the measurement
            deadline = time.perf_counter() + args.check_timeout / 1000 + 5
            while len(listener.resolve_times) < unknown * (1 - args.check_unknown) * 0.99 \
                    and time.perf_counter() < deadline:
                await asyncio.sleep(0.1)  # a benchmark waiting out its tail, not test synchronisation
        times = listener.resolve_times
        pending = await settled_pending(metrics_addr)
        return stats.summary(size=args.size, inflight=args.inflight, checks=listener.checks,
                             unexpected_checks=listener.unexpected, duplicated_checks=listener.duplicated,
                             unknown=unknown, resolved=len(times),
                             unknown_to_decision_p50_ms=f"{percentile(times, 50) * 1000:.0f}",
                             unknown_to_decision_p99_ms=f"{percentile(times, 99) * 1000:.0f}",
                             pending_halves=pending)


TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PROGRESS = re.compile(r"\[(?:producer|transaction)\] tps=([\d,]+)")


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


def child_pids(pid: int) -> list[int]:
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    out = []
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(x) for x in f.read().split()]
        except OSError:
            pass
    return out


def cpu_sample(client: int) -> dict[str, float]:
    """CPU seconds of a benchmark client, the brokers it spawned and their helper processes."""
    brokers = child_pids(client)
    return {"client": cpu_seconds(client), "broker": sum(map(cpu_seconds, brokers)),
            "helpers": sum(cpu_seconds(h) for b in brokers for h in child_pids(b))}


def load_run(tree: str, what: str, args, replicas: int = 1) -> dict:
    """One ``producer`` or ``transaction`` (all commits) ``--spawn-broker`` run against checkout ``tree``'s broker:
    its TPS, p50/p99 and CPU microseconds per message (or per transaction) of the client, the broker and its
    writer."""
    cmd = [sys.executable, os.path.abspath(__file__), what, "--spawn-broker", f"--broker-tree={os.path.abspath(tree)}",
           f"--duration={args.duration}", f"--size={args.size}", f"--inflight={args.inflight}",
           f"--client={args.client}", f"--replicas={replicas}"]
    if what == "transaction":
        cmd += ["--unknown=0", "--rollback=0"]
    first = last = None
    messages, summary = 0, None
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) as proc:
        for line in proc.stdout:
            match = PROGRESS.match(line)
            if match:
                sample = {**cpu_sample(proc.pid), "wall": time.monotonic()}
                if first is None:
                    first = sample  # the window starts at the first progress line: start-up is not counted
                else:
                    messages += int(match.group(1).replace(",", "")) * 3  # a progress line covers 3 s
                    last = sample
            elif line.startswith("SUMMARY"):
                summary = {k: float(v.replace(",", "")) for k, v in re.findall(r" (tps|p50_ms|p99_ms)=([\d.,]+)", line)}
    if proc.returncode or summary is None or last is None or not messages:
        raise SystemExit(f"the {what} run of {tree} failed (exit {proc.returncode}); run it alone to see why")
    wall = last.pop("wall") - first.pop("wall")
    cpu = {k: (last[k] - first[k]) / messages * 1e6 for k in first}
    # Cores each process kept busy: the broker's event loop is one thread, so a broker near 1.0 is the limit,
    # whatever the disk does.
    busy = {f"{k}_busy": (last[k] - first[k]) / wall for k in first}
    return {**summary, **cpu, **busy, "server": cpu["broker"] + cpu["helpers"]}


def alternate(args) -> None:
    """Each kind (sends, then transactions; ``--what`` picks one) of every variant back to back, ``--rounds``
    times, the variants' order reversed every other round: the machine's speed drifts over minutes (a shared host),
    so each round's runs of one kind are compared with each other (``paired_ratio``, the median of the rounds'
    ratios) besides the ratio of the medians. The variants are checkouts (``--trees``) or, with
    ``--replicas-alternate``, broker group sizes of the first checkout (1: a broker alone)."""
    kinds = ["producer", "transaction"] if args.what == "both" else [args.what]
    if args.replicas_alternate:
        variants = [(f"replicas={n}", args.trees[0], n) for n in args.replicas_alternate]
    else:
        variants = [(tree, tree, 1) for tree in args.trees]
    labels = [label for label, _tree, _n in variants]
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
            extra = ""
            if kind == "transaction" and "producer" in kinds:
                extra = (f" tx_plain_ratio={m['tps'] / median[(label, 'producer')]['tps']:.2f}"
                         f" paired_tx_plain_ratio={paired(runs[(label, kind)], runs[(label, 'producer')]):.2f}")
            print(f"SUMMARY mode=alternate kind={kind} tree={label} rounds={args.rounds} median_tps={m['tps']:,.0f} "
                  f"tps_ratio={m['tps'] / base['tps']:.2f} "
                  f"paired_ratio={paired(runs[(label, kind)], runs[(labels[0], kind)]):.2f}{extra} "
                  f"p50_ms={m['p50_ms']:.2f} p99_ms={m['p99_ms']:.2f} "
                  f"median_server_cpu_us={m['server']:.1f} server_cpu_ratio={m['server'] / base['server']:.2f} "
                  f"median_broker_cpu_us={m['broker']:.1f} median_writer_cpu_us={m['helpers']:.1f} "
                  f"median_client_cpu_us={m['client']:.1f} broker_cores_busy={m['broker_busy']:.2f} "
                  f"writer_cores_busy={m['helpers_busy']:.2f} client_cores_busy={m['client_busy']:.2f}", flush=True)


async def main_async(args) -> None:
    procs = []
    metrics_addr = None
    namesrv = args.namesrv
    if args.spawn_broker:
        procs, namesrv, metrics_addr = await spawn_broker(args)
    try:
        if args.mode == "producer":
            await run_producer(args, namesrv)
        elif args.mode == "consumer":
            await run_consumer(args, namesrv)
        elif args.mode == "transaction":
            await run_transaction(args, namesrv, metrics_addr)
        else:
            plain = await run_producer(args, namesrv, args.topic + "Plain")
            args.unknown = args.rollback = 0.0
            tx = await run_transaction(args, namesrv, metrics_addr, "transaction-commit")
            print(f"SUMMARY mode=compare plain_tps={plain:,.0f} transactional_tps={tx:,.0f} ratio={tx / plain:.2f}")
    finally:
        for proc in reversed(procs):
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
                await proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["producer", "consumer", "transaction", "compare", "alternate"])
    parser.add_argument("--trees", nargs="+", default=[str(Path(__file__).resolve().parents[1])],
                        help="alternate mode: checkouts to run in turn (the first is the reference)")
    parser.add_argument("--rounds", type=int, default=3, help="alternate mode: runs of each checkout")
    parser.add_argument("--what", choices=["both", "producer", "transaction"], default="both",
                        help="alternate mode: sends, transactions (all commits), or both")
    parser.add_argument("--namesrv", default="127.0.0.1:9876")
    parser.add_argument("--client", choices=["halfmq", "raw"], default="halfmq",
                        help="producer and transaction modes: the project's client, or the lean load generator of "
                             "scripts/rawload.py (one connection; needs --spawn-broker or --broker)")
    parser.add_argument("--broker", default="", help="--client raw without --spawn-broker: the broker's address")
    parser.add_argument("--spawn-broker", action="store_true")
    parser.add_argument("--broker-tree", default="",
                        help="--spawn-broker: the checkout whose broker is spawned (with its .venv when it has one)")
    parser.add_argument("--async-flush", action="store_true")
    parser.add_argument("--replicas", type=int, default=1,
                        help="--spawn-broker: a broker group of this many members (a name server, a leader taking "
                             "the load and followers); alternate: --replicas-alternate compares group sizes")
    parser.add_argument("--replicas-alternate", type=int, nargs="+", default=None,
                        help="alternate mode: compare these group sizes of this checkout (e.g. 1 2) instead of "
                             "--trees")
    parser.add_argument("--topic", default="BenchTopic")
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--inflight", type=int, default=64)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--messages", type=int, default=300_000, help="consumer mode: messages to drain")
    parser.add_argument("--pull-batch", type=int, default=1000)
    parser.add_argument("--rollback", type=float, default=0.0, help="share of local ROLLBACK")
    parser.add_argument("--unknown", type=float, default=0.1, help="share of local UNKNOW")
    parser.add_argument("--check-rollback", type=float, default=0.5, help="share of check answers ROLLBACK")
    parser.add_argument("--check-unknown", type=float, default=0.0, help="share of check answers UNKNOW")
    parser.add_argument("--check-timeout", type=int, default=1000, help="broker transactionTimeOut, ms")
    parser.add_argument("--check-interval", type=int, default=30_000, help="broker transactionCheckInterval, ms")
    args = parser.parse_args()
    if args.mode == "alternate":
        alternate(args)
        return
    run_main(main_async(args))


if __name__ == "__main__":
    main()

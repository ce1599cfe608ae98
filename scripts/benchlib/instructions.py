"""Broker CPU instructions per send and per transaction, counted by valgrind (callgrind): a figure that does not move
with the machine's noise, unlike sends/s on this shared two-core box (±15% run to run, the same checkout).

    scripts/bench.py instructions --trees main . --what both

For each checkout (a folder, with its own .venv when it has one, or a revision) and each kind, the broker runs in a
helper process under
callgrind: a real Broker over a temporary store, with its writer process (not counted: valgrind follows no child),
and one connection fed pre-built frames through an in-memory transport, 64 in flight, as ``bench.py send --client raw``
sends them: SEND_MESSAGE_V2 of 1 KiB with JSON headers; for a transaction a half, then, once it is stored, a oneway
END_TRANSACTION commit (the loop also decodes each half's answer and builds the commit: a few thousand instructions
per transaction counted with the broker's); for a half, the half alone, left pending (``--what all`` prints a
decision's count as a transaction's less a half's). The garbage collector is settled as the broker process settles it.
Each count is the difference of a short and a long run divided by the requests between them, so start-up and
shutdown cancel out; two runs of one checkout agree within 0.2%. Prints instructions per request (per transaction)
and the first checkout's count over each one's (above 1: fewer than the first). valgrind is installed by
scripts/apt_install.sh when missing; a run takes about a minute per checkout and kind.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import struct
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor

from .harness import ENTRY, REPO, remove_temp_stores, tree as checkout, tree_command
from .results import Results, revision

SHORT, LONG = 640, 3840  # requests (transactions) of the two runs; rounded to the 64 in flight
MAP_SIZE = 256 << 20  # valgrind cannot map the default map sizes
TOPIC, GROUP = "BenchInstructions", "BENCH_TX_PG"
INFLIGHT = 64
_PREFIX = struct.Struct(">II")


# --- the harness: runs inside the checkout's Python, under callgrind ---

def _frame(header: dict, body: bytes = b"") -> bytes:
    import orjson
    raw = orjson.dumps(header)
    return _PREFIX.pack(4 + len(raw) + len(body), len(raw)) + raw + body


def _send_frame(i: int, transactional: bool) -> bytes:
    props = {"UNIQ_KEY": "%032X" % i, "WAIT": "true"}
    if transactional:
        props.update(TRAN_MSG="true", PGROUP=GROUP)
    ext = {"a": GROUP, "b": TOPIC, "c": "TBW102", "d": "4", "e": str(i % 4), "f": "4" if transactional else "0",
           "g": "1700000000000", "h": "0", "i": "".join(f"{k}\x01{v}\x02" for k, v in props.items()),
           "j": "0", "k": "false", "m": "false"}
    return _frame({"code": 310, "language": "JAVA", "version": 401, "opaque": i, "flag": 0, "extFields": ext,
                   "serializeTypeCurrentRPC": "JSON"}, b"x" * 1024)


def _commit_frame(opaque: int, ext: dict) -> bytes:
    msg_id = ext["msgId"]
    return _frame({"code": 37, "language": "JAVA", "version": 401, "opaque": opaque, "flag": 2,
                   "extFields": {"producerGroup": GROUP, "tranStateTableOffset": ext["queueOffset"],
                                 "commitLogOffset": str(int(msg_id[-16:], 16)), "commitOrRollback": "8",
                                 "fromTransactionCheck": "false", "msgId": msg_id,
                                 "transactionId": ext.get("transactionId", msg_id)},
                   "serializeTypeCurrentRPC": "JSON"})


class _Client:
    """The far end of the in-memory transport: counts answers, and for a half builds its commit."""

    def __init__(self, transactional: bool, decide: bool):
        self.transactional = transactional
        self.decide = decide  # commit each half once it is stored (kind "transaction"; "half" leaves them pending)
        self.buffer = bytearray()
        self.answers = 0
        self.wanted = 0
        self.commits: list[bytes] = []
        self.event = asyncio.Event()

    def received(self, data: bytes) -> None:
        import orjson
        buffer = self.buffer
        buffer += data
        pos = 0
        while len(buffer) - pos >= 8:
            length, word = _PREFIX.unpack_from(buffer, pos)
            if len(buffer) - pos - 4 < length:
                break
            header = orjson.loads(bytes(buffer[pos + 8:pos + 8 + (word & 0xFFFFFF)]))
            if header.get("code") != 0:
                raise SystemExit(f"the broker refused a request: {header}")
            if self.decide:
                self.commits.append(_commit_frame(header["opaque"] + 10_000_000, header["extFields"]))
            pos += 4 + length
            self.answers += 1
        del buffer[:pos]
        if self.answers >= self.wanted:
            self.event.set()


class _Transport:
    def __init__(self, client: _Client):
        self.client = client

    def get_extra_info(self, name, default=None):
        return ("127.0.0.1", 5555) if name == "peername" else default

    def set_write_buffer_limits(self, high=None, low=None): pass
    def get_write_buffer_size(self): return 0
    def is_closing(self): return False
    def pause_reading(self): pass
    def resume_reading(self): pass
    def close(self): pass
    def abort(self): pass

    def write(self, data) -> None:
        self.client.received(data)

    def writelines(self, parts) -> None:
        self.client.received(b"".join(parts))


async def _harness(kind: str, count: int) -> None:
    from halfmq.broker.cli import settle_garbage_collector
    from halfmq.broker.config import BrokerConfig, build_config
    from halfmq.broker.server import Broker

    transactional = kind in ("transaction", "half")
    with tempfile.TemporaryDirectory() as folder:
        settings = {"bindAddress": "127.0.0.1", "listenPort": 0, "namesrvListenPort": 0, "storePathRootDir": folder,
                    "mapSize": MAP_SIZE, "maxMapSize": MAP_SIZE, "metricsPromExporterPort": 0, "grpcListenPort": -1,
                    "dashboardPort": -1, "transactionTimeOut": 600_000, "transactionCheckInterval": 600_000}
        # an older checkout may not know every key (a door it does not have is off anyway)
        config = build_config({k: v for k, v in settings.items() if k in BrokerConfig.__dataclass_fields__})
        broker = Broker(config)
        await broker.start()
        try:
            await broker.ctx.topics.ensure_for_send(TOPIC, "TBW102", 4)
            settle_garbage_collector()
            client = _Client(transactional, kind == "transaction")
            proto = broker._protocol_factory(broker.dispatcher, broker.connections)()
            proto.connection_made(_Transport(client))
            frames = [_send_frame(i + 1, transactional) for i in range(count)]
            for start in range(0, count, INFLIGHT):
                client.wanted = min(start + INFLIGHT, count)
                client.event.clear()
                chunk = b"".join(client.commits + frames[start:start + INFLIGHT])
                client.commits = []
                proto.data_received(chunk)
                await asyncio.wait_for(client.event.wait(), 600)
            if client.commits:
                proto.data_received(b"".join(client.commits))
            await asyncio.sleep(0.2)  # the last commits are applied
        finally:
            await broker.stop()


# --- the driver: runs each checkout's harness under valgrind ---

def _instructions(tree: str, kind: str, count: int) -> int:
    python, env = tree_command(tree)
    run = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", python, str(ENTRY),
                          "instructions", "--helper-harness", kind, str(count)], cwd=tree, capture_output=True,
                         text=True, env={**os.environ, **env} if env else None)
    found = re.search(r"Collected : (\d+)", run.stderr)
    if run.returncode != 0 or found is None:
        raise SystemExit(f"{tree} {kind}: the harness failed:\n{run.stdout[-2000:]}\n{run.stderr[-3000:]}")
    return int(found.group(1))


def add_arguments(parser) -> None:
    parser.add_argument("--trees", nargs="+", default=[str(REPO)],
                        help="checkouts to measure, each a folder or a git revision")
    parser.add_argument("--what", choices=["both", "all", "send", "half", "transaction"], default="both",
                        help="both: send and transaction; all: send, half and transaction, and a transaction's "
                             "decision (transaction - half); half: halves left pending")
    parser.add_argument("--helper-harness", nargs=2, metavar=("KIND", "COUNT"), help=argparse.SUPPRESS)


def run(args, results: Results) -> None:
    if args.helper_harness:
        try:
            import uvloop
            uvloop.install()
        except ImportError:
            pass
        asyncio.run(_harness(args.helper_harness[0], int(args.helper_harness[1])))
        return
    if shutil.which("valgrind") is None:
        subprocess.run(["bash", str(REPO / "scripts" / "apt_install.sh"), "valgrind"], check=True)
    try:
        measure(args, results)
    finally:
        remove_temp_stores()  # the checkouts of revisions


def measure(args, results: Results) -> None:
    kinds = {"both": ["send", "transaction"], "all": ["send", "half", "transaction"]}.get(args.what, [args.what])
    counts: dict[tuple[str, str], float] = {}
    for kind in kinds:
        first = None
        for spec in args.trees:
            tree = checkout(spec)
            with ThreadPoolExecutor(2) as pool:  # one valgrind per core: a count does not depend on the timing
                short, long = pool.map(lambda count: _instructions(tree, kind, count), (SHORT, LONG))
            per_request = counts[kind, tree] = (long - short) / (LONG - SHORT)
            first = first or per_request
            results.add_all({f"instructions_per_{kind}": (per_request, "instructions"),
                             "first_over_this": (first / per_request, "")}, revision(tree), kind=kind, tree=spec)
    if "half" in kinds and "transaction" in kinds:
        first = None
        for spec in args.trees:
            tree = checkout(spec)
            decision = counts["transaction", tree] - counts["half", tree]
            first = first or decision
            results.add_all({"instructions_per_decision": (decision, "instructions"),
                             "first_over_this": (first / decision, "")}, revision(tree), kind="decision", tree=spec)

"""halfmq admin COMMAND: mqadmin's commands and option letters over the Admin API (client/admin.py).

Options go before or after the command (halfmq admin topicList -n 127.0.0.1:9876); -n defaults to the
NAMESRV_ADDR environment variable, and takes several name servers as HOST:PORT;HOST:PORT. In a cluster, changes
go to every master broker (of -c's cluster, or the one -b names) and per-broker tables cover every broker.
Readable tables by default, --json for scripts; halfmq admin COMMAND -h explains every option. Examples:

    halfmq admin clusterList
    halfmq admin updateTopic -t Orders -r 8 -w 8 -c DefaultCluster
    halfmq admin sendMessage -t Orders -p '{"id": 1}' -k order-1
    halfmq admin consumerProgress -g orders-consumer
    halfmq admin halfStatus
"""
from __future__ import annotations

import argparse
import asyncio
import heapq
import json
import os
import ssl
import sys
import time
from typing import Any

from halfmq.protocol.codes import ResponseCode
from halfmq.protocol.errors import MessageFormatError

from .admin import Admin
from .admin_format import cell, message_row, render
from .admin_messages import TOOLS_CONSUMER_GROUP, MessageTools, Range
from .errors import ClientError
from .remoting import Credentials

DEFAULT_NAMESRV = "127.0.0.1:9876"


def parse_time(text: str) -> int | None:
    """mqadmin's timestamps: epoch milliseconds, ``yyyy-MM-dd#HH:mm:ss:SSS`` (local time), or ``now`` (None)."""
    if text == "now":
        return None
    if text.isdigit():
        return int(text)
    try:
        parsed = time.strptime(text[:19], "%Y-%m-%d#%H:%M:%S")
        millis = int(text[20:] or 0) if text[19:20] in (":", "") else None
    except ValueError:
        millis = None
    if millis is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a time: write epoch milliseconds, "
                                         "yyyy-MM-dd#HH:mm:ss:SSS or now")
    return int(time.mktime(parsed)) * 1000 + millis


def time_arg(text: str) -> int:
    value = parse_time(text)
    if value is None:
        raise argparse.ArgumentTypeError("now is not allowed here")
    return value


def boolean(text: str) -> bool:
    value = {"true": True, "false": False}.get(text.lower())
    if value is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not true or false")
    return value


def non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative")
    return value


# --- the commands: each takes (admin, tools, args) and returns what render() shows ---------------------------
async def topic_list(admin, tools, args):
    return [{"topic": t} for t in await admin.topic_list()]


async def update_topic(admin, tools, args):
    await admin.update_topic(args.topic, args.read_queues, args.write_queues, args.perm, args.attributes)
    return {"updated": args.topic}


async def delete_topic(admin, tools, args):
    await admin.delete_topic(args.topic)
    return {"deleted": args.topic}


async def half_status(admin, tools, args):
    async def halves(broker) -> list[dict]:
        rows = []
        async for row in admin.pending_halves(args.page_size or None, broker.addr):
            rows.append({"brokerName": broker.name, **row})
            if args.limit and len(rows) >= args.limit:
                break
        return rows
    found = await admin.on_each(await admin.brokers(), halves)
    # Each broker's come oldest check due first: merged so, the first --limit of them all are the oldest.
    merged = heapq.merge(*(rows for _broker, rows in found), key=lambda row: row["nextCheckInMillis"])
    return list(merged)[:args.limit or None]


async def per_broker(admin, fetch, one_cluster: bool = False):
    """``fetch(addr)`` of every broker ``admin.brokers`` names: its table, led by its name and address; a lone
    broker's (or -b's) is the table itself."""
    found = await admin.on_each(await admin.brokers(one_cluster), lambda broker: fetch(broker.addr))
    tables = [{"brokerName": broker.name, "brokerAddr": broker.addr, **table} for broker, table in found]
    return tables[0] if len(tables) == 1 else tables


async def broker_status(admin, tools, args):
    return await per_broker(admin, admin.broker_status)


async def delete_expired_commit_log(admin, tools, args):
    return await per_broker(admin, lambda addr: admin.delete_expired_commit_log(addr=addr), one_cluster=True)


async def resume_half(admin, tools, args):
    await admin.resume_half(args.id)
    return {"resumed": args.id}


async def send_message(admin, tools, args):
    result = await tools.send(args.topic, args.body, args.keys, args.tags, args.broker_name, args.queue_id)
    return {"brokerName": result.queue.broker_name, "queueId": result.queue.queue_id,
            "queueOffset": result.queue_offset, "sendStatus": result.status.name, "msgId": result.msg_id,
            "offsetMsgId": result.offset_msg_id}


async def consume_message(admin, tools, args):
    rng = Range(args.broker_name, args.queue_id, args.offset, args.begin, args.end)
    return [message_row(m) async for m in tools.read(args.topic, rng, args.count, args.group)]


async def print_msg(admin, tools, args):
    # Printed as read: a topic can hold more than fits in memory.
    rng = Range(begin_ms=args.begin, end_ms=args.end, expression=args.subexpression)
    count = 0
    async for message in tools.read(args.topic, rng):
        count += 1
        row = message_row(message, args.charset if args.print_body else None)
        print(json.dumps(row) if args.json else
              " ".join(f"{k.upper()}: {cell(v)}" for k, v in row.items() if v is not None), flush=True)
    return None if args.json else {"printed": count}


async def query_msg_by_id(admin, tools, args):
    return [message_row(m) for m in await tools.by_id(args.id, args.topic)]


async def query_msg_by_unique_key(admin, tools, args):
    return [message_row(m) for m in await tools.by_unique_key(args.id, args.topic)]


async def query_msg_by_key(admin, tools, args):
    found = await admin.on_each(await admin.brokers(),
                                lambda broker: admin.query_msg_by_key(args.topic, args.key, addr=broker.addr),
                                absent=ResponseCode.QUERY_NOT_FOUND)
    return [{"brokerName": broker.name, **message_row(m)} for broker, messages in found for m in messages]


async def query_msg_by_offset(admin, tools, args):
    return [message_row(await tools.by_offset(args.topic, args.broker_name, args.queue_id, args.offset))]


async def reset_offset_by_time(admin, tools, args):
    return await tools.reset_offset_by_time(args.group, args.topic, args.timestamp, args.force)


async def get_broker_config(admin, tools, args):
    return await per_broker(admin, admin.broker_config)


async def stats_all(admin, tools, args):
    return await tools.stats_all(args.topic)


async def update_sub_group(admin, tools, args):
    await admin.update_sub_group(args.group)
    return {"updated": args.group}


async def delete_sub_group(admin, tools, args):
    await admin.delete_sub_group(args.group)
    return {"deleted": args.group}


def _call(method: str, *names: str):
    """A command that is one Admin method called with these attributes of the arguments."""
    async def command(admin, tools, args):
        return await getattr(admin, method)(*(getattr(args, n) for n in names))
    return command


# --- options ------------------------------------------------------------------------------------------------
# name → (argparse flags, keywords); commands list the names they take (and "queues": updateTopic's -r -w -p).
# mqadmin's letters throughout; a trailing ! marks the required form, ? the optional one; one letter can mean
# different things in different commands, as in mqadmin (-b: a broker name, printMsg's begin time).
OPTIONS: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = {
    "topic": (("-t", "--topic"), {"required": True, "help": "topic name"}),
    "topic?": (("-t", "--topic"), {"help": "topic name (default: every topic)"}),
    "group": (("-g", "--group"), {"required": True, "help": "consumer group"}),
    "producer_group": (("-g", "--group"), {"required": True, "help": "producer group"}),
    "key": (("-k", "--key"), {"required": True, "help": "message key (one of the KEYS it was sent with)"}),
    "id": (("-i", "--id"), {"required": True, "help": "message id: the msgId a send returns (UNIQ_KEY) or the "
                                                       "offsetMsgId"}),
    "unique_key": (("-i", "--id"), {"required": True, "help": "the msgId a send returns (UNIQ_KEY)"}),
    "offset_id": (("-i", "--id"), {"required": True, "help": "the half message's offsetMsgId (halfStatus "
                                                             "shows it)"}),
    "body": (("-p", "--body"), {"required": True, "help": "message body (UTF-8 text)"}),
    "keys": (("-k", "--keys"), {"help": "message keys, space separated (default: none)"}),
    "tags": (("-c", "--tags"), {"help": "message tag (default: none)"}),
    "broker_name": (("-b", "--broker-name"), {"help": "broker name (default: any broker of the topic)"}),
    "broker_name!": (("-b", "--broker-name"), {"required": True, "help": "broker name (clusterList shows it)"}),
    "queue_id": (("-i", "--queue-id"), {"type": non_negative, "help": "queue id (default: every queue)"}),
    "queue_id!": (("-i", "--queue-id"), {"type": non_negative, "required": True, "help": "queue id"}),
    "offset": (("-o", "--offset"), {"type": non_negative, "help": "first queue offset to read (default: the "
                                                                   "queue's first, or -s)"}),
    "offset!": (("-o", "--offset"), {"type": non_negative, "required": True, "help": "queue offset"}),
    "consume_group": (("-g", "--group"), {"default": TOOLS_CONSUMER_GROUP,
                                          "help": "consumer group the reads are made as (no offset is stored)"}),
    "begin": (("-s", "--begin"), {"type": time_arg, "help": "first store time: epoch ms or "
                                                            "yyyy-MM-dd#HH:mm:ss:SSS (default: the start)"}),
    "begin_b": (("-b", "--begin"), {"type": time_arg, "help": "first store time: epoch ms or "
                                                              "yyyy-MM-dd#HH:mm:ss:SSS (default: the start)"}),
    "end": (("-e", "--end"), {"type": parse_time, "help": "store time to stop before: epoch ms, "
                                                          "yyyy-MM-dd#HH:mm:ss:SSS or now (default: the end)"}),
    "count": (("-c", "--count"), {"type": non_negative, "default": 128, "help": "most messages shown"}),
    "charset": (("-c", "--charset"), {"default": "UTF-8", "help": "charset of the bodies"}),
    "subexpression": (("-s", "--subexpression"), {"default": "*", "help": "tag expression, e.g. 'a || b'"}),
    "print_body": (("-d", "--print-body"), {"type": boolean, "default": True,
                                            "help": "print the bodies (true/false)"}),
    "timestamp": (("-s", "--timestamp"), {"type": parse_time, "required": True,
                                          "help": "epoch ms, yyyy-MM-dd#HH:mm:ss:SSS, or now (the end)"}),
    "force": (("-f", "--force"), {"action": "store_true",
                                  "help": "reset even while the group has consumers online (they may write "
                                          "their own offsets over it)"}),
    "limit": (("--limit",), {"type": non_negative, "default": 0, "help": "most rows shown (0: all)"}),
    "page_size": (("--page-size",), {"type": non_negative, "default": 0,
                                     "help": "rows per request (0: the broker's page, its most)"}),
    "to": (("--to",), {"type": non_negative, "required": True,
                       "help": "brokerId of the follower to take over (replicationStatus shows them)"}),
    "cluster": (("-c", "--cluster"), {"help": "only the master brokers of this cluster (clusterList shows them) "
                                              "(default: every broker; a change needs -c or -b when the name "
                                              "servers know several clusters)"}),
}

#: command → (function, option names, description). The option letters are mqadmin's.
COMMANDS: dict[str, tuple[Any, list[str], str]] = {
    "clusterList": (_call("cluster_list"), [], "brokers the name servers know"),
    "topicList": (topic_list, [], "topics the name servers know"),
    "topicRoute": (_call("topic_route", "topic"), ["topic"], "a topic's brokers and queues"),
    "topicStatus": (_call("topic_status", "topic"), ["topic", "cluster"],
                    "a topic's queues on every broker: min and max offset"),
    "updateTopic": (update_topic, ["topic", "queues", "cluster"],
                    "create or change a topic on every master broker of the cluster (-c), or on one (-b)"),
    "deleteTopic": (delete_topic, ["topic", "cluster"],
                    "delete a topic on every broker that has it (of -c's cluster, or -b alone) and in the name "
                    "servers' routes"),
    "consumerProgress": (_call("consumer_progress", "group", "topic"), ["group", "topic?", "cluster"],
                         "per queue of every broker: broker offset, consumer offset, difference"),
    "producerConnection": (_call("producer_connections", "group"), ["producer_group"],
                           "a producer group's live clients"),
    "consumerConnection": (_call("consumer_connections", "group"), ["group"],
                           "a consumer group's live clients and subscriptions"),
    "sendMessage": (send_message, ["topic", "body", "keys", "tags", "broker_name", "queue_id"], "send a message"),
    "consumeMessage": (consume_message, ["topic", "broker_name", "queue_id", "offset", "consume_group", "begin",
                                         "end", "count"],
                       "read messages (no consumer offset is stored)"),
    "printMsg": (print_msg, ["topic", "charset", "subexpression", "begin_b", "end", "print_body"],
                 "print every message of a topic, one line each"),
    "queryMsgById": (query_msg_by_id, ["id", "topic?"], "a message by msgId or offsetMsgId"),
    "queryMsgByUniqueKey": (query_msg_by_unique_key, ["unique_key", "topic?"], "a message by msgId (UNIQ_KEY)"),
    "queryMsgByKey": (query_msg_by_key, ["topic", "key", "cluster"], "messages by key, of every broker"),
    "queryMsgByOffset": (query_msg_by_offset, ["topic", "broker_name!", "queue_id!", "offset!"],
                         "a message by queue and offset"),
    "resetOffsetByTime": (reset_offset_by_time, ["group", "topic", "timestamp", "force"],
                          "move a group's offsets to a time"),
    "updateSubGroup": (update_sub_group, ["group", "cluster"],
                       "create a subscription group (its retry topic) on every master broker"),
    "deleteSubGroup": (delete_sub_group, ["group", "cluster"],
                       "delete a subscription group (its retry and DLQ topics) on every broker that has it"),
    "getBrokerConfig": (get_broker_config, ["cluster"], "each broker's configuration"),
    "brokerStatus": (broker_status, ["cluster"], "each broker's runtime figures, one table per broker"),
    "deleteExpiredCommitLog": (delete_expired_commit_log, ["cluster"],
                               "run a retention pass now on every master broker: delete expired messages (and "
                               "over-ratio ones)"),
    "statsAll": (stats_all, ["topic?", "cluster"], "per topic: messages held and each group's backlog"),
    "halfStatus": (half_status, ["limit", "page_size", "cluster"],
                   "pending half messages of every broker, oldest check due first: age, checks, group, next "
                   "check"),
    "resumeHalf": (resume_half, ["offset_id"], "check a discarded half message again"),
    "replicationStatus": (_call("replication"), ["cluster"],
                          "every broker group's members: role, epoch, last and committed record, in sync, lag"),
    "switchLeader": (_call("switch_leader", "broker_name", "to"), ["broker_name!", "to"],
                     "hand a broker group's leadership to one of its followers (maintenance): it takes over once "
                     "it holds every record, the old leader follows it"),
}


class _Help(argparse.HelpFormatter):
    """Every option's help says its default, or that it is required."""

    def _get_help_string(self, action) -> str:
        text = action.help or ""
        if action.required:
            return f"{text} (required)"
        if "(default" in text or action.default in (None, argparse.SUPPRESS) or action.dest == "help":
            return text
        return f"{text} (default: %(default)s)"


def _common(parser: argparse.ArgumentParser, suppress: bool, skip: set[str]) -> None:
    """The connection options every command takes, before or after its name. After it (``suppress``), an
    absent option leaves what was given before the name (argparse would otherwise reset it to its default)."""
    namesrv = os.environ.get("NAMESRV_ADDR") or DEFAULT_NAMESRV

    def add(*flags, **kw):
        if flags[0] in skip:
            return
        if suppress:
            kw["default"] = argparse.SUPPRESS
        parser.add_argument(*flags, **kw)
    add("-n", "--namesrv", default=namesrv,
        help=f"name server address HOST:PORT, several as HOST:PORT;HOST:PORT (one that is down is skipped) "
             f"(default: $NAMESRV_ADDR, else {DEFAULT_NAMESRV}; now {namesrv})")
    add("-b", "--broker", help="the one broker to ask, by address HOST:PORT or name (clusterList shows both) "
                                "(default: every broker, or the first for a request to one broker)")
    add("--json", action="store_true", default=False, help="print JSON instead of a table (default: a table)")
    add("--access-key", help="ACL access key to sign requests with (default: unsigned)")
    add("--secret-key", help="ACL secret key (default: none)")
    add("--tls", action="store_true", default=False, help="connect with TLS (default: plain TCP)")
    add("--cafile", help="CA certificate to verify the broker with (default: the system's)")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="halfmq admin", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(p, suppress=False, skip=set())
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (_function, options, description) in COMMANDS.items():
        c = sub.add_parser(name, help=description, description=description,
                           formatter_class=_Help)
        flags = set()
        for option in options:
            if option == "queues":
                c.add_argument("-r", "--read-queues", type=non_negative, default=8, help="read queues")
                c.add_argument("-w", "--write-queues", type=non_negative, default=8, help="write queues")
                c.add_argument("-p", "--perm", type=non_negative, default=6,
                               help="permission: 2 write, 4 read, 6 both")
                c.add_argument("-a", "--attributes", default=None,
                               help="RocketMQ 5 topic attributes: +message.type=NORMAL|FIFO|DELAY|TRANSACTION|"
                                    "MIXED declares the type the topic takes, -message.type removes it "
                                    "(default: unchanged)")
                flags |= {"-r", "-w", "-p", "-a"}
                continue
            option_flags, kw = OPTIONS[option]
            c.add_argument(*option_flags, **kw)  # dest: the long flag's name (--broker-name: broker_name)
            flags.add(option_flags[0])
        _common(c, suppress=True, skip=flags)
    return p


async def run(args) -> Any:
    credentials = Credentials(args.access_key, args.secret_key) if args.access_key else None
    tls = ssl.create_default_context(cafile=args.cafile) if args.tls else None
    admin = Admin(args.namesrv, args.broker, credentials, tls, cluster=getattr(args, "cluster", None))
    tools = MessageTools(admin)
    try:
        return await COMMANDS[args.command][0](admin, tools, args)
    finally:
        await tools.close()
        await admin.close()


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        result = asyncio.run(run(args))
    except (ClientError, MessageFormatError) as exc:
        print(f"halfmq admin: {exc}", file=sys.stderr)
        return 1
    try:
        if result is not None:
            print(json.dumps(result, indent=2) if args.json else render(args.command, result), flush=True)
    except BrokenPipeError:  # the reader stopped early (| head): not an error; quiet at exit too
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (held until exit)
    return 0

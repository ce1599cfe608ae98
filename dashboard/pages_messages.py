"""Messages: browse a queue of a topic by offset, search by key, by offsetMsgId or by store time; a message's page
(properties, body as text, JSON or hex, which consumer groups have consumed past it); re-sending a dead-lettered
message to the topic it came from.

Every search reads at most a page of messages: browsing pulls one queue's page (Admin.read_queue, no consumer
offset committed); a time range is found per queue with SEARCH_OFFSET_BY_TIMESTAMP and read queue after queue, a
page at a time; a key search answers the newest ``size`` messages with that key on each broker (QUERY_MESSAGE
answers no older ones)."""
from __future__ import annotations

import asyncio
import json
import re
import zlib
from dataclasses import dataclass
from urllib.parse import quote, urlencode

from aiohttp import web

from halfmq.client import Message, Producer
from halfmq.client.errors import BrokerError
from halfmq.client.message import MessageExt
from halfmq.protocol import properties as P
from halfmq.protocol.codes import RequestCode, ResponseCode, SysFlag
from halfmq.protocol.headers import ConsumeStatsRequestHeader
from halfmq.protocol.message import decode_offset_msg_id
from halfmq.protocol.rules import DLQ_PREFIX, MAX_MESSAGE_KEY_BYTES, is_message_key

from .page import SESSION, SETTINGS, admin_for
from .params import Refused, acted, choice, integer, served, text, timestamp, topic_name, utc

routes = web.RouteTableDef()
NAV = ("/messages", "Messages")
MAX_SIZE = 100
MAX_GROUPS_PAGE = 50
RESEND_GROUP = "halfmq_dashboard"
OFFSET_MSG_ID = re.compile(r"[0-9A-Fa-f]{32}|[0-9A-Fa-f]{56}")
VIEWS = ("auto", "text", "json", "hex")
PREVIEW_CHARS = 120
TEXT_SHOWN = 256 * 1024  #: characters of a body shown as text or JSON
HEX_SHOWN = 64 * 1024  #: bytes of a body shown as hex
JSON_PARSED = 1 << 20  #: bodies up to this size are tried as JSON
MAX_INFLATED = 4 << 20  #: a compressed body inflated beyond the broker's default maxMessageSize is cut there


def body_of(msg: MessageExt) -> tuple[bytes, bool]:
    """The message's body as its producer sent it (a zlib-compressed one inflated, at most MAX_INFLATED bytes),
    and whether it was stored compressed."""
    if not msg.sys_flag & SysFlag.COMPRESSED:
        return msg.body, False
    try:
        return zlib.decompressobj().decompress(msg.body, MAX_INFLATED), True
    except zlib.error:
        return msg.body, False  # flagged but not zlib: shown as stored


def _preview(body: bytes) -> str:
    """The body's first PREVIEW_CHARS characters, or the hex of its first bytes when it is not UTF-8 text."""
    head = body[:PREVIEW_CHARS * 4]
    try:
        shown = head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if len(head) == len(body) or exc.start < len(head) - 3:  # not a character cut by the head's end
            half = PREVIEW_CHARS // 2
            return "0x" + body[:half].hex() + ("…" if len(body) > half else "")
        shown = head[:exc.start].decode("utf-8")
    shown = shown[:PREVIEW_CHARS]
    return shown + ("…" if len(shown.encode()) < len(body) else "")


def summary(msg: MessageExt, broker: str) -> dict:
    body, _compressed = body_of(msg)
    return {"offsetMsgId": msg.offset_msg_id, "msgId": msg.uniq_key or "", "topic": msg.topic, "broker": broker,
            "queueId": msg.queue_id, "queueOffset": msg.queue_offset, "tags": msg.tags or "", "keys": msg.keys or "",
            "storeTimestamp": msg.store_timestamp, "storeTime": utc(msg.store_timestamp), "bodySize": len(body),
            "preview": _preview(body)}


def hexdump(data: bytes) -> str:
    lines = []
    for at in range(0, len(data), 16):
        chunk = data[at:at + 16]
        printable = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(f"{at:08x}  {chunk.hex(' '):<47}  |{printable}|")
    return "\n".join(lines)


def render_body(body: bytes, view: str) -> dict:
    """The body as ``view`` shows it: text (UTF-8), json (pretty-printed, when it parses), hex; "auto" picks the
    first of json, text, hex that applies."""
    try:
        as_text = body.decode("utf-8")
    except UnicodeDecodeError:
        as_text = None
    pretty = None
    if as_text is not None and len(body) <= JSON_PARSED:
        try:
            pretty = json.dumps(json.loads(as_text), indent=2, ensure_ascii=False)
        except (ValueError, RecursionError):
            pretty = None
    shown = {"json": pretty, "text": as_text, "hex": None}
    views = [v for v in ("json", "text") if shown[v] is not None] + ["hex"]
    if view == "auto":
        view = views[0]
    if view not in views:
        raise Refused(400, f"this body cannot be shown as {view} (it can as {', '.join(views)})")
    if view == "hex":
        return {"view": view, "views": views, "content": hexdump(body[:HEX_SHOWN]), "size": len(body),
                "truncated": len(body) > HEX_SHOWN}
    content = shown[view]
    return {"view": view, "views": views, "content": content[:TEXT_SHOWN], "size": len(body),
            "truncated": len(content) > TEXT_SHOWN}


# --- searches ---
@dataclass(frozen=True)
class QueueRange:
    broker: str
    addr: str
    queue: int
    start: int  #: first offset in the range
    end: int  #: offset after the last


def _key(values) -> str:
    key = text(values, "key", max_length=MAX_MESSAGE_KEY_BYTES)
    if not is_message_key(key):  # as the brokers accept one: a bad key is a 400, not a broker's refusal
        raise Refused(400, f"key must be 1-{MAX_MESSAGE_KEY_BYTES} UTF-8 bytes without whitespace or control "
                           f"characters")
    return key


async def _by_id(request: web.Request, msg_id: str) -> dict:
    msg, broker, _addr = await find_message(request, msg_id)
    return {"mode": "id", "id": msg_id, "messages": [summary(msg, broker)]}


async def _by_key(request: web.Request, topic: str, key: str, size: int) -> dict:
    admin = admin_for(request)

    async def query(broker):
        return await admin.query_msg_by_key(topic, key, size, broker.addr)
    found, failed = await admin.on_each_answering(await admin.masters(), query, absent=ResponseCode.QUERY_NOT_FOUND)
    rows = [summary(m, broker.name) for broker, msgs in found for m in msgs]
    if not rows and not failed:
        await admin.topic_stats(topic)  # no broker holds the topic: a 404 saying so, not an empty answer
    rows.sort(key=lambda r: r["storeTimestamp"], reverse=True)
    return {"mode": "key", "topic": topic, "key": key, "messages": rows[:size],
            "errors": {b.name: str(exc) for b, exc in failed}}


async def _queues(request: web.Request, topic: str) -> tuple[list[dict], dict]:
    rows, errors = await admin_for(request).topic_stats(topic)
    return [{"broker": row["brokerName"], "addr": row["brokerAddr"], **q} for row in rows for q in row["queues"]], \
        errors


async def _browse(request: web.Request, topic: str, size: int) -> dict:
    """A page of one queue: from ``offset`` (default: the queue's newest page); ``prev`` and ``next`` are the
    offsets of the pages before and after it (None at either end)."""
    q = request.query
    queues, errors = await _queues(request, topic)
    broker = text(q, "broker", max_length=255) or queues[0]["broker"]
    queue_id = integer(q, "queue", queues[0]["queueId"], 0, 1 << 16)
    chosen = next((row for row in queues if row["broker"] == broker and row["queueId"] == queue_id), None)
    if chosen is None:
        raise Refused(404, f"topic {topic} has no queue {queue_id} on broker {broker}")
    low, high = chosen["minOffset"], chosen["maxOffset"]
    offset = integer(q, "offset", max(low, high - size), 0, 1 << 62)
    offset = min(max(offset, low), high)
    msgs, low, high = await admin_for(request).read_queue(chosen["addr"], topic, queue_id, offset, size)
    end = msgs[-1].queue_offset + 1 if msgs else offset
    return {"mode": "browse", "topic": topic, "broker": broker, "queue": queue_id, "offset": offset,
            "minOffset": low, "maxOffset": high, "messages": [summary(m, broker) for m in msgs],
            "prev": max(low, offset - size) if offset > low else None, "next": end if end < high else None,
            "queues": [{k: row[k] for k in ("broker", "queueId", "minOffset", "maxOffset")} for row in queues],
            "errors": errors}


async def _time_ranges(request: web.Request, topic: str, begin: int, end: int | None
                      ) -> tuple[list[QueueRange], dict]:
    """Each queue's offsets stored in [begin, end]: from the first stored at or after ``begin`` to the first
    stored after ``end`` (None: to the queue's end)."""
    admin = admin_for(request)
    queues, errors = await _queues(request, topic)
    queues = [row for row in queues if row["maxOffset"] > row["minOffset"]]

    async def bounds(row) -> QueueRange:
        start = await admin.search_offset(row["addr"], topic, row["queueId"], begin)
        stop = row["maxOffset"] if end is None else await admin.search_offset(row["addr"], topic, row["queueId"],
                                                                              end + 1)
        return QueueRange(row["broker"], row["addr"], row["queueId"], start, stop)
    ranges = await asyncio.gather(*(bounds(row) for row in queues))
    return [r for r in ranges if r.end > r.start], errors


def _cursor(after: str, ranges: list[QueueRange]) -> tuple[int, int]:
    """``broker:queue:offset`` → (index of its range, offset)."""
    try:
        broker, queue, offset = after.rsplit(":", 2)
        queue_id, at = int(queue), int(offset)
    except ValueError:
        raise Refused(400, f"after {after[:60]!r} is not a cursor this search gave (broker:queue:offset)") from None
    for index, r in enumerate(ranges):
        if (r.broker, r.queue) == (broker, queue_id):
            return index, max(at, r.start)
    raise Refused(400, f"after {after[:60]!r} names no queue with messages in this time range")


async def _by_time(request: web.Request, topic: str, begin: int, end: int | None, size: int) -> dict:
    """A page of the messages stored in [begin, end], queue after queue (each in offset order); ``next`` is the
    ``after`` of the next page."""
    admin = admin_for(request)
    ranges, errors = await _time_ranges(request, topic, begin, end)
    after = text(request.query, "after", max_length=300)
    index, offset = _cursor(after, ranges) if after else (0, ranges[0].start if ranges else 0)
    rows: list[dict] = []
    cursor = None
    for i in range(index, len(ranges)):
        r = ranges[i]
        at = offset if i == index else r.start
        while at < r.end and len(rows) < size:
            msgs, _low, _high = await admin.read_queue(r.addr, topic, r.queue, at, min(size - len(rows), r.end - at))
            msgs = [m for m in msgs if m.queue_offset < r.end]
            if not msgs:
                break  # the rest of the range is gone (retention)
            rows.extend(summary(m, r.broker) for m in msgs)
            at = msgs[-1].queue_offset + 1
        if len(rows) >= size:
            if at < r.end:
                cursor = f"{r.broker}:{r.queue}:{at}"
            elif i + 1 < len(ranges):
                cursor = f"{ranges[i + 1].broker}:{ranges[i + 1].queue}:{ranges[i + 1].start}"
            break
    return {"mode": "time", "topic": topic, "begin": begin, "end": end, "beginTime": utc(begin),
            "endTime": utc(end), "messages": rows, "next": cursor, "total": sum(r.end - r.start for r in ranges),
            "ranges": [{"broker": r.broker, "queueId": r.queue, "fromOffset": r.start, "toOffset": r.end,
                        "messages": r.end - r.start} for r in ranges], "errors": errors}


async def search(request: web.Request) -> dict:
    """What the query asks: ``id`` (an offsetMsgId); else ``topic`` with ``key``, or ``begin``/``end`` (store
    time), or neither (browse ``broker``, ``queue`` from ``offset``); ``size`` messages a page."""
    q = request.query
    size = integer(q, "size", 20, 1, MAX_SIZE)
    msg_id = text(q, "id", max_length=64)
    if msg_id:
        return await _by_id(request, msg_id)
    if not q.get("topic", "").strip():
        return {"mode": "none", "messages": []}
    topic = topic_name(text(q, "topic", max_length=127))
    if q.get("key", "").strip():
        return await _by_key(request, topic, _key(q), size)
    begin, end = timestamp(q, "begin"), timestamp(q, "end")
    if begin is not None or end is not None:
        begin = begin or 0
        if end is not None and begin > end:
            raise Refused(400, "begin is after end")
        return await _by_time(request, topic, begin, end, size)
    return await _browse(request, topic, size)


# --- one message ---
async def find_message(request: web.Request, msg_id: str) -> tuple[MessageExt, str, str]:
    """The message an offsetMsgId names, with its broker's name and address.

    Raises:
        Refused: 400 not an offsetMsgId; 404 no broker the name servers know stored it, or it is not there.
    """
    if not OFFSET_MSG_ID.fullmatch(msg_id):
        raise Refused(400, f"{msg_id[:64]!r} is not an offsetMsgId (32 or 56 hex digits)")
    admin = admin_for(request)
    host, _offset = decode_offset_msg_id(msg_id)
    by_addr = {addr: name for name, addr in (await admin.broker_addrs()).items()}
    if host not in by_addr:
        raise Refused(404, f"no message {msg_id}: it names {host}, not a broker the name servers know (a client's "
                           f"msgId? halfmq indexes KEYS, not msgIds: search by key or store time)")
    try:
        msg = await admin.view_message(msg_id)
    except BrokerError as exc:
        if exc.code == ResponseCode.SYSTEM_ERROR and (exc.remark or "").startswith("can not find message"):
            raise Refused(404, f"no message {msg_id} on {by_addr[host]}") from None
        raise
    return msg, by_addr[host], host


async def _trace(request: web.Request, msg: MessageExt, addr: str) -> dict:
    """A page of the groups consuming the message's topic on its broker, each "consumed" when its committed offset
    in the message's queue is past the message, else "not yet"."""
    admin = admin_for(request)
    page = integer(request.query, "groups_page", 1, 1, 1 << 20)
    groups = await admin.topic_consumers(msg.topic, addr)
    shown = groups[(page - 1) * MAX_GROUPS_PAGE:page * MAX_GROUPS_PAGE]

    async def progress(group: str) -> dict:
        ext = ConsumeStatsRequestHeader(consumerGroup=group, topic=msg.topic).to_ext()
        try:
            rows = (await admin.json_call(addr, RequestCode.GET_CONSUME_STATS, ext))["offsetTable"]
        except BrokerError as exc:
            return {"group": group, "consumerOffset": None, "state": "unknown", "error": str(exc)}
        offset = next((r["consumerOffset"] for r in rows if r["queueId"] == msg.queue_id), -1)
        return {"group": group, "consumerOffset": offset,
                "state": "consumed" if offset > msg.queue_offset else "not yet"}
    return {"groups": list(await asyncio.gather(*(progress(g) for g in shown))), "total": len(groups),
            "page": page, "pages": max(1, -(-len(groups) // MAX_GROUPS_PAGE))}


async def message(request: web.Request) -> dict:
    """A message: where it is stored, its properties, its body shown as ``view`` asks (auto, text, json, hex), the
    groups that consumed it, and for a dead-lettered one the topic a re-send goes to."""
    view = choice(request.query, "view", VIEWS, "auto")
    msg, broker, addr = await find_message(request, request.match_info["msg_id"])
    body, compressed = body_of(msg)
    origin = msg.properties.get(P.RETRY_TOPIC) if msg.topic.startswith(DLQ_PREFIX) else None
    return {"offsetMsgId": msg.offset_msg_id, "msgId": msg.uniq_key or "", "topic": msg.topic, "broker": broker,
            "addr": addr, "queueId": msg.queue_id, "queueOffset": msg.queue_offset, "tags": msg.tags or "",
            "keys": msg.keys or "", "storeTimestamp": msg.store_timestamp, "storeTime": utc(msg.store_timestamp),
            "bornTimestamp": msg.born_timestamp, "bornTime": utc(msg.born_timestamp), "bornHost": msg.born_host,
            "storeHost": msg.store_host, "reconsumeTimes": msg.reconsume_times, "flag": msg.flag,
            "sysFlag": msg.sys_flag, "compressed": compressed, "properties": dict(sorted(msg.properties.items())),
            "body": render_body(body, view), "trace": await _trace(request, msg, addr),
            "deadLetter": msg.topic.startswith(DLQ_PREFIX), "resendTopic": origin}


async def resend(request: web.Request) -> dict:
    """Send a dead-lettered message again, to its original topic (its RETRY_TOPIC property): same body, tags, keys
    and user properties, a new msgId."""
    msg, _broker, _addr = await find_message(request, request.match_info["msg_id"])
    if not msg.topic.startswith(DLQ_PREFIX):
        raise Refused(400, f"message {msg.offset_msg_id} is in {msg.topic}, not a dead-letter (%DLQ%) topic")
    origin = msg.properties.get(P.RETRY_TOPIC)
    if not origin:
        raise Refused(400, f"message {msg.offset_msg_id} carries no RETRY_TOPIC property: its topic is unknown")
    body, _compressed = body_of(msg)
    user = {k: v for k, v in msg.properties.items() if k not in P.RESERVED_KEYS}
    settings = request.app[SETTINGS]
    async with Producer(RESEND_GROUP, settings.namesrv, auto_create=False, credentials=request[SESSION].credentials,
                        send_timeout=settings.request_timeout_s) as producer:
        sent = await producer.send(Message(origin, body, tags=msg.tags, keys=msg.keys, properties=user,
                                           flag=msg.flag))
    return {"resentFrom": msg.offset_msg_id, "topic": origin, "msgId": sent.msg_id,
            "offsetMsgId": sent.offset_msg_id, "broker": sent.queue.broker_name, "queueId": sent.queue.queue_id,
            "queueOffset": sent.queue_offset}


def _page_url(request: web.Request, **changes) -> str:
    query = {k: v for k, v in request.query.items() if k not in changes}
    query.update({k: v for k, v in changes.items() if v is not None})
    return "/messages?" + urlencode(query)


async def _search_links(request: web.Request, data: dict) -> dict:
    """The search page's links to the pages before and after, and the query its form shows again."""
    links = {}
    if data["mode"] == "browse":
        links = {"prev_url": _page_url(request, offset=data["prev"]) if data["prev"] is not None else "",
                 "next_url": _page_url(request, offset=data["next"]) if data["next"] is not None else "",
                 "newest_url": _page_url(request, offset=None)}
    elif data["mode"] == "time":
        links = {"next_url": _page_url(request, after=data["next"]) if data["next"] else "",
                 "first_url": _page_url(request, after=None) if request.query.get("after") else ""}
    return {**links, "q": request.query}


async def _resent(request: web.Request, data: dict) -> dict:
    """The message a re-send of which this page shows (after the resend form)."""
    resent = request.query.get("resent", "")
    return {"resent": resent if OFFSET_MSG_ID.fullmatch(resent) else ""}


served(routes, "/messages", search, "messages.html", _search_links)
served(routes, "/messages/{msg_id}", message, "message.html", _resent)
acted(routes, "/messages/{msg_id}/resend", resend,
      lambda _request, sent: f"/messages/{quote(sent['offsetMsgId'], safe='')}?" + urlencode(
          {"resent": sent["resentFrom"]}))

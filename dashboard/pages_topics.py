"""Topics: a paged list (name filter, kind), a topic's page (per broker and queue: offsets, last store time), and
creating, changing and deleting a topic on every broker of the cluster or on one.

A page of the list is one HALFMQ_GET_TOPIC_STATS per broker (Admin.topic_stats_page); "in/s" is the rate of a
topic's messages-in count between this session's previous reading of it and this one (the brokers keep counts,
not rates)."""
from __future__ import annotations

import time
from urllib.parse import quote, urlencode

from aiohttp import web

from halfmq.client.admin import Admin
from halfmq.protocol.rules import MAX_QUEUES, MAX_TOPIC_LENGTH, is_topic

from .page import SESSION, admin_for
from .params import Refused, acted, choice, form_of, integer, served, text, topic_name, utc

routes = web.RouteTableDef()
NAV = ("/topics", "Topics")
#: the list's kind filter → the broker's kinds
KINDS = {"normal": "NORMAL", "retry": "RETRY", "dlq": "DLQ", "system": "SYSTEM", "all": None}
MESSAGE_TYPES = ("NORMAL", "FIFO", "DELAY", "TRANSACTION", "MIXED")
#: permissions a topic may be given here: read and write, read only, write only, none
PERMS = {6: "read and write", 4: "read only", 2: "write only", 0: "none"}
MAX_SIZE = 200
READINGS_KEPT = 5_000  #: topics per session whose last messages-in reading is kept for "in/s"
MIN_RATE_WINDOW_S = 1.0


def perm_text(perm: int) -> str:
    return ("R" if perm & 4 else "") + ("W" if perm & 2 else "") or "-"


def _rate(session, broker: str, topic: str, count: int | None) -> float | None:
    """Messages in per second since this session last read this topic's count (None: no earlier reading, or the
    broker restarted in between)."""
    if count is None:
        return None
    readings = session.data.setdefault("topic_readings", {})
    key = (broker, topic)
    now = time.monotonic()
    last = readings.get(key)
    if last is not None and now - last[0] < MIN_RATE_WINDOW_S:
        return last[2]  # too soon for a rate of its own: the previous one stands
    rate = (count - last[1]) / (now - last[0]) if last is not None and count >= last[1] else None
    if len(readings) >= READINGS_KEPT and key not in readings:
        readings.clear()
    readings[key] = (now, count, rate)
    return rate


def _broker_row(session, row: dict) -> dict:
    queues = row["queues"]
    return {"broker": row["brokerName"], "readQueues": row["readQueueNums"], "writeQueues": row["writeQueueNums"],
            "perm": row["perm"], "permText": perm_text(row["perm"]), "messageType": row["messageType"],
            "minOffset": sum(q["minOffset"] for q in queues), "maxOffset": sum(q["maxOffset"] for q in queues),
            "messages": sum(q["maxOffset"] - q["minOffset"] for q in queues), "messagesIn": row["messagesIn"],
            "inPerSecond": _rate(session, row["brokerName"], row["topic"], row["messagesIn"])}


def _sum(values) -> float | None:
    values = list(values)
    return None if any(v is None for v in values) else sum(values)


def _topic_row(session, entry: dict) -> dict:
    brokers = [_broker_row(session, row) for row in entry["brokers"]]
    return {"topic": entry["topic"], "kind": entry["kind"],
            "messageTypes": sorted({b["messageType"] or "" for b in brokers}),
            "messages": sum(b["messages"] for b in brokers), "messagesIn": _sum(b["messagesIn"] for b in brokers),
            "inPerSecond": _sum(b["inPerSecond"] for b in brokers), "brokers": brokers}


async def topics(request: web.Request) -> dict:
    """A page of the topics: ``topics``, ``next`` (the ``after`` of the next page, or None), ``totals`` (topics
    matching on each broker), ``errors`` (brokers that did not answer), and the ``filter`` used."""
    q = request.query
    kind = choice(q, "kind", tuple(KINDS), "normal")
    contains = text(q, "contains", max_length=MAX_TOPIC_LENGTH)
    size = integer(q, "size", 50, 1, MAX_SIZE)
    after = text(q, "after", max_length=MAX_TOPIC_LENGTH) or None
    page = await admin_for(request).topic_stats_page(size, after, contains, KINDS[kind])
    session = request[SESSION]
    return {"topics": [_topic_row(session, entry) for entry in page["topics"]], "next": page["next"],
            "totals": page["totals"], "errors": page["errors"],
            "filter": {"contains": contains, "kind": kind, "size": size, "after": after or ""}}


async def topic(request: web.Request) -> dict:
    """A topic on each broker holding it, with each queue's offsets and last store time."""
    name = topic_name(request.match_info["name"])
    rows, errors = await admin_for(request).topic_stats(name)
    session = request[SESSION]
    brokers = []
    for row in rows:
        queues = [{**q, "messages": q["maxOffset"] - q["minOffset"], "lastStoreTime": utc(q["lastStoreTimestamp"])}
                  for q in row["queues"]]
        brokers.append({**_broker_row(session, row), "addr": row["brokerAddr"], "queues": queues})
    return {"topic": name, "kind": rows[0]["kind"], "brokers": brokers, "errors": errors,
            "messages": sum(b["messages"] for b in brokers)}


async def _target(admin: Admin, form) -> Admin:
    """The admin client aimed at the form's ``broker`` (a master's name) or ``cluster``; neither: the one cluster."""
    broker, cluster = text(form, "broker", max_length=255), text(form, "cluster", max_length=255)
    masters = await admin.masters()
    if broker and broker not in {b.name for b in masters}:
        raise Refused(400, f"broker {broker!r} is unknown: the name servers know "
                           f"{', '.join(b.name for b in masters)}")
    if cluster and cluster not in {b.cluster for b in masters}:
        raise Refused(400, f"cluster {cluster!r} is unknown")
    return admin.scoped(broker or None, cluster or None)


async def save_topic(request: web.Request) -> dict:
    """Create or change a topic: ``topic``, ``readQueues``, ``writeQueues`` (default: readQueues), ``perm`` (6, 4,
    2 or 0), ``messageType`` (empty: undeclared, any type), on ``broker`` or every master of ``cluster`` (neither:
    every master of the one cluster)."""
    form = await form_of(request)
    name = topic_name(text(form, "topic", max_length=MAX_TOPIC_LENGTH))
    read = integer(form, "readQueues", 8, 1, MAX_QUEUES)
    write = integer(form, "writeQueues", read, 1, MAX_QUEUES)
    perm = integer(form, "perm", 6, 0, 7)
    if perm not in PERMS:
        raise Refused(400, f"perm {perm} is not one of {', '.join(f'{p} ({t})' for p, t in PERMS.items())}")
    kind = choice(form, "messageType", ("", *MESSAGE_TYPES), "")
    target = await _target(admin_for(request), form)
    brokers = await target.brokers(one_cluster=True)
    await target.update_topic(name, read, write, perm, f"+message.type={kind}" if kind else "-message.type")
    return {"topic": name, "brokers": [b.name for b in brokers]}


async def delete_topic(request: web.Request) -> dict:
    """Delete a topic on every broker holding it (and in the name servers), or on ``broker`` alone."""
    name = topic_name(request.match_info["name"])
    form = await form_of(request)
    await (await _target(admin_for(request), form)).delete_topic(name)
    return {"deleted": name}


async def _topics_more(request: web.Request, data: dict) -> dict:
    """The list page's choices, the flash of a deletion and its pages' links."""
    deleted = request.query.get("deleted", "")
    query = {k: v for k, v in data["filter"].items() if k != "after"}
    return {"kinds": tuple(KINDS), "message_types": MESSAGE_TYPES, "perms": PERMS,
            "brokers": await admin_for(request).masters(), "deleted": deleted if is_topic(deleted) else "",
            "first_url": "/topics?" + urlencode(query) if data["filter"]["after"] else "",
            "next_url": "/topics?" + urlencode({**query, "after": data["next"]}) if data["next"] else ""}


async def _topic_more(request: web.Request, data: dict) -> dict:
    """A topic's page: its form's choices, and whether it was just saved."""
    return {"message_types": MESSAGE_TYPES, "perms": PERMS, "brokers_known": await admin_for(request).masters(),
            "saved": bool(request.query.get("saved"))}


served(routes, "/topics", topics, "topics.html", _topics_more)
acted(routes, "/topics", save_topic, lambda _request, saved: f"/topics/{quote(saved['topic'], safe='')}?saved=1")
served(routes, "/topics/{name}", topic, "topic.html", _topic_more)
acted(routes, "/topics/{name}/delete", delete_topic,
      lambda _request, deleted: "/topics?" + urlencode({"deleted": deleted["deleted"]}))

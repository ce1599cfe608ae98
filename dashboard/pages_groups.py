"""Consumer groups: the groups of every broker, paged and filtered, with consumers online and lag; a group's page
with its members and subscriptions, its lag per broker and queue, a lag chart, its retry and dead-letter topics,
and a reset of its offsets to a time (mqadmin resetOffsetByTime)."""
from __future__ import annotations

from urllib.parse import quote

from aiohttp import web

from halfmq.client.errors import BrokerError
from halfmq.protocol.codes import ResponseCode
from halfmq.protocol.rules import DLQ_PREFIX, MAX_GROUP_LENGTH, MAX_TOPIC_LENGTH, RETRY_PREFIX, is_group

from .page import HISTORY, SESSION, admin_for
from .params import Refused, acted, answered, form_of, integer, served, text, timestamp, utc

routes = web.RouteTableDef()
NAV = ("/groups", "Groups")
MAX_SIZE = 100
DEFAULT_SIZE = 50
MAX_FILTER = MAX_GROUP_LENGTH  #: a filter is (part of) a group name


def group_name(value: str, name: str = "group") -> str:
    """A group name as the brokers accept one (protocol/rules.py): anything else is a bad request, not a lookup."""
    if not is_group(value):
        raise Refused(400, f"{name} {value[:40]!r} is not a group name (1-{MAX_GROUP_LENGTH} of A-Z a-z 0-9 _ - % |)")
    return value


def _page(rows: list, page: int, size: int) -> list:
    return rows[(page - 1) * size:page * size]


async def groups(request: web.Request) -> dict:
    """A page of the groups in name order: ``size`` of them after the name ``after``, those whose name contains
    ``q``."""
    query = request.query
    size = integer(query, "size", DEFAULT_SIZE, 1, MAX_SIZE)
    after = text(query, "after", max_length=MAX_FILTER) or None
    if after is not None:
        group_name(after, "after")
    q = text(query, "q", max_length=MAX_FILTER)
    page = await admin_for(request).consumer_groups_page(size, after, q or None)
    return {**page, "size": size, "after": after, "q": q}


async def group(request: web.Request) -> dict:
    """One group over every broker: consumers online, total lag, members (``mpage``), subscriptions, lag per broker
    and per queue (``page``), each list ``size`` rows a page; its retry and dead-letter topics. Viewing it has its
    lag sampled for the chart (History.watch)."""
    name = group_name(request.match_info["group"])
    query = request.query
    size = integer(query, "size", DEFAULT_SIZE, 1, MAX_SIZE)
    page = integer(query, "page", 1, 1, 1_000_000)
    members_page = integer(query, "mpage", 1, 1, 1_000_000)
    try:
        held, errors = await admin_for(request).consumer_group(name)
    except BrokerError as exc:
        if exc.code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST:
            raise Refused(404, f"no broker knows consumer group {name}") from None
        raise
    request.app[HISTORY].watch(name)
    members: dict[str, dict] = {}
    subscriptions: dict[str, str] = {}
    queues, brokers = [], []
    for broker in held:
        for member in broker["members"]:  # GET_CONSUMER_CONNECTION_LIST lists remoting consumers only
            members.setdefault(member["clientId"], {**member, "protocol": "remoting", "brokers": []})[
                "brokers"].append(broker["brokerName"])
        subscriptions.update(broker["subscriptions"])
        lag = 0
        for row in broker["queues"]:
            queue_lag = max(0, row["diff"])
            lag += queue_lag
            queues.append({"brokerName": broker["brokerName"], "topic": row["topic"], "queueId": row["queueId"],
                           "brokerOffset": row["brokerOffset"], "consumerOffset": row["consumerOffset"],
                           "lag": queue_lag})
        brokers.append({"brokerName": broker["brokerName"], "brokerAddr": broker["brokerAddr"], "lag": lag,
                        "online": broker["summary"]["online"]})
    queues.sort(key=lambda r: (r["topic"], r["brokerName"], r["queueId"]))
    listed = [members[c] for c in sorted(members)]
    summaries = [b["summary"] for b in held]
    return {"group": name, "online": max(b["online"] for b in brokers), "lag": sum(b["lag"] for b in brokers),
            "messageModel": next((s["messageModel"] for s in summaries if s["messageModel"]), None),
            "retryTopic": RETRY_PREFIX + name if any(s["retryTopic"] for s in summaries) else None,
            "dlqTopic": DLQ_PREFIX + name if any(s["dlqTopic"] for s in summaries) else None,
            "brokers": brokers, "errors": errors,
            "subscriptions": [{"topic": t, "expression": subscriptions[t]} for t in sorted(subscriptions)],
            "topics": sorted({r["topic"] for r in queues}),
            "members": _page(listed, members_page, size), "membersTotal": len(listed), "mpage": members_page,
            "queues": _page(queues, page, size), "queuesTotal": len(queues), "page": page, "size": size}


async def lag_series(request: web.Request) -> dict:
    """{group: {"lag": [[unix ms, lag], ...]}}. An open chart keeps a viewed group sampled (History.watch); asking
    for a group nobody viewed does not start sampling it."""
    name = group_name(request.match_info["group"])
    history = request.app[HISTORY]
    if name in history.watched:
        history.watch(name)
    return {name: {"lag": history.get(f"group:{name}:lag")}}


async def reset(request: web.Request) -> dict:
    """Reset the group's offsets to the time ``time`` (epoch ms or ISO 8601) on ``topic``, or on every topic of the
    group but its retry topic (Admin.reset_offset_by_time). Refused (409) while consumers are online: halfmq's
    consumers keep their position in memory and commit it with their next pull, over the reset."""
    form = await form_of(request)
    detail = await group(request)
    when = timestamp(form, "time")
    if when is None:
        raise Refused(400, "time is missing: epoch milliseconds or an ISO 8601 time")
    topic = text(form, "topic", max_length=MAX_TOPIC_LENGTH) or None
    if topic is not None and topic not in detail["topics"]:
        raise Refused(400, f"topic {topic!r} is not one the group reads: {', '.join(detail['topics']) or 'none'}")
    if detail["online"]:
        raise Refused(409, f"consumer group {detail['group']} has {detail['online']} consumer(s) online: stop them "
                           f"first (a consumer commits its own position over a reset)")
    rows = await admin_for(request).reset_offset_by_time(detail["group"], when, topic)
    return {"group": detail["group"], "timestamp": when, "topic": topic, "queues": rows}


async def _flash(request: web.Request, data: dict) -> dict:
    """What a form just did, said once (a reload does not say it again)."""
    return {"flash": request[SESSION].data.pop("flash", None)}


def _reset_done(request: web.Request, done: dict) -> str:
    """After the page's reset form: back to the group's page, which says what was done."""
    request[SESSION].data["flash"] = (f"Reset {len(done['queues'])} queue(s) of {done['topic'] or 'every topic'} "
                                        f"to {utc(done['timestamp'])} UTC.")
    return f"/groups/{quote(done['group'], safe='')}"


answered(routes, "GET", "/api/groups/{group}/lag/series", lag_series)
served(routes, "/groups", groups, "groups.html")
served(routes, "/groups/{group}", group, "group.html", _flash)
acted(routes, "/groups/{group}/reset", reset, _reset_done)

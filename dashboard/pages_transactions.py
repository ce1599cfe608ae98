"""Transactions: each broker's pending halves (paged, by next check or by age), its discarded halves with a Resume
action, one half's record, and per producer group how its newest transactions ended, over time.

Every list is one broker's (``broker``, default the first master): its pages come from that broker's admin requests
(HALFMQ_GET_HALF_STATUS, HALFMQ_GET_TRANSACTION_RECORDS), which page and sort themselves, so a page costs a page of
rows whatever the number of halves. The per group figures read a bounded window, the broker's newest
AUDIT_WINDOW transaction records: the whole table could be millions of rows (the audit job reads it all)."""
from __future__ import annotations

import asyncio
import re
import time

from aiohttp import web

from halfmq.client.admin import Admin, Broker
from halfmq.client.errors import IllegalOperationError
from halfmq.protocol.errors import MessageFormatError
from halfmq.protocol.message import decode_offset_msg_id

from .page import HISTORY, SESSION, SETTINGS, admin_for
from .params import Refused, acted, answered, choice, integer, served

routes = web.RouteTableDef()
NAV = ("/transactions", "Transactions")

PAGE_SIZE, MAX_PAGE_SIZE = 50, 200
#: sorts of the pending list: the broker's orders (due index, or store order of the halves table)
PENDING_SORTS = {"due": "next check, soonest first", "-due": "next check, latest first",
                 "store": "oldest first", "-store": "newest first"}
DISCARDED_SORTS = {"-store": "newest first", "store": "oldest first"}
_CURSOR = {"due": re.compile(r"\d{1,20}:\d{1,20}"), "store": re.compile(r"\d{1,20}")}
#: broker requests one page of discarded halves may take: each passes over at most the broker's MAX_SCAN halves of
#: other states, so a page is bounded however few of the halves are discarded (its Next link goes on from there)
DISCARDED_REQUESTS = 4
#: the newest transaction records the per group figures read per broker (two broker pages)
AUDIT_WINDOW = 2_000
AUDIT_CHART_GROUPS = 8  #: groups with a line of their own in the charts; the rest are summed as "(other)"
OTHER = "(other)"
BUCKETS_S = (1, 5, 10, 30, 60, 300, 900, 3_600, 21_600, 86_400)
MAX_BUCKETS = 60
DECISIONS = {"COMMITTED": "committed", "ROLLED_BACK": "rolledBack", "DISCARDED": "discarded"}


def _size(request: web.Request) -> int:
    return integer(request.query, "size", PAGE_SIZE, 1, MAX_PAGE_SIZE)


def _after(request: web.Request, sort: str) -> str | None:
    """The cursor of a page (the previous page's ``next``); its form depends on the sort it was made for."""
    after = request.query.get("after") or None
    if after is not None and not _CURSOR[sort.lstrip("-")].fullmatch(after):
        raise Refused(400, f"after {after[:60]!r} is not a cursor this list gave (sort {sort})")
    return after


async def _broker(request: web.Request, admin: Admin) -> tuple[Broker, list[Broker]]:
    """The broker a list is of (``broker``: its name; default the first master) and every master."""
    masters = await admin.masters()
    if not masters:
        raise Refused(404, "the name servers know no broker")
    name = request.query.get("broker")
    if name is None:
        return masters[0], masters
    for broker in masters:
        if broker.name == name:
            return broker, masters
    raise Refused(400, f"unknown broker {name[:60]!r}: the name servers know {', '.join(b.name for b in masters)}")


async def _listing(request: web.Request, sorts: dict[str, str], default: str
                   ) -> tuple[int, str, str | None, Admin, Broker, list[Broker]]:
    """What a list of one broker's halves is asked for: its page's size, its sort (one of ``sorts``) and cursor; and
    the admin client, that broker and every master."""
    size = _size(request)
    sort = choice(request.query, "sort", sorts, default)
    after = _after(request, sort)
    admin = admin_for(request)
    broker, masters = await _broker(request, admin)
    return size, sort, after, admin, broker, masters


async def _summaries(admin: Admin, masters: list[Broker]) -> list[dict]:
    """Each broker's transaction figures from its runtime info: pending, checks sent, discarded so far."""
    tables = await asyncio.gather(*(admin.broker_status(b.addr) for b in masters), return_exceptions=True)
    rows = []
    for broker, table in zip(masters, tables):
        if isinstance(table, BaseException):
            rows.append({"name": broker.name, "addr": broker.addr, "up": False, "error": str(table)})
            continue
        rows.append({"name": broker.name, "addr": broker.addr, "up": True,
                     "pending": int(table.get("pendingHalfMessages", 0)),
                     "checkBacksSent": int(table.get("checkBacksSent", 0)),
                     "checkBacksUndeliverable": int(table.get("checkBacksUndeliverable", 0)),
                     "discarded": int(table.get("halfMessagesDiscarded", 0)),
                     "lastCheckPassMillis": float(table.get("lastCheckPassMillis", 0))})
    return rows


def _now_ms() -> int:
    return int(time.time() * 1000)


# --- pending halves ---
async def pending(request: web.Request) -> dict:
    """One page of one broker's pending halves, with every broker's transaction figures."""
    size, sort, after, admin, broker, masters = await _listing(request, PENDING_SORTS, "due")
    summaries, page = await asyncio.gather(_summaries(admin, masters),
                                           admin.half_status_page(broker.addr, sort, after, size))
    return {"now": _now_ms(), "brokers": summaries, "broker": broker.name, "sort": sort, "sorts": PENDING_SORTS,
            "size": size, "after": after, "pending": page["pending"], "halves": page["halves"],
            "next": page["next"]}


served(routes, "/transactions", pending, "transactions.html")


@routes.get("/api/transactions/series")
async def api_series(request: web.Request) -> web.Response:
    """Each broker's pending halves and check-backs/s as sampled: {broker: {pending|checks: [[unix ms, value]]}}."""
    return web.json_response(request.app[HISTORY].broker_series(("pending", "checks")))


# --- discarded halves ---
async def discarded(request: web.Request) -> dict:
    """One page of one broker's discarded halves (checks used up, or no producer for too long): resumable."""
    size, sort, after, admin, broker, masters = await _listing(request, DISCARDED_SORTS, "-store")
    rows: list[dict] = []
    for _ in range(DISCARDED_REQUESTS):
        page = await admin.transaction_records_page(broker.addr, "DISCARDED", sort, after, size - len(rows))
        rows += page["records"]
        after = page["next"]
        if after is None or len(rows) >= size:
            break
    return {"now": _now_ms(), "brokers": [b.name for b in masters], "broker": broker.name, "sort": sort,
            "sorts": DISCARDED_SORTS, "size": size, "after": request.query.get("after") or None, "halves": rows,
            "next": after}


served(routes, "/transactions/discarded", discarded, "transactions_discarded.html")


# --- one half ---
def _msg_id(request: web.Request) -> str:
    msg_id = request.match_info["msg_id"]
    try:
        decode_offset_msg_id(msg_id)
    except MessageFormatError as exc:
        raise Refused(400, str(exc)) from None
    return msg_id


async def _record(admin: Admin, msg_id: str) -> tuple[str, dict]:
    found = await admin.half_record(msg_id)
    if found is None:
        raise Refused(404, f"no half message {msg_id}: its broker keeps no transaction at that offset")
    return found


async def half(request: web.Request) -> dict:
    """A half's transaction record (not its body: brokers show no half as a message before it is committed)."""
    msg_id = _msg_id(request)
    addr, record = await _record(admin_for(request), msg_id)
    return {"now": _now_ms(), "addr": addr, "record": record, "resumed": "resumed" in request.query}


served(routes, "/transactions/half/{msg_id}", half, "transactions_half.html")


async def _resume(request: web.Request) -> dict:
    """RESUME_CHECK_HALF_MESSAGE on the half's broker: it gets a fresh set of checks, the first one now."""
    msg_id = _msg_id(request)
    admin = admin_for(request)
    addr, record = await _record(admin, msg_id)
    if record["state"] not in ("DISCARDED", "PREPARED"):
        raise Refused(409, f"the transaction is already {record['state']}: there is nothing to resume")
    try:
        await admin.resume_half(msg_id)
    except IllegalOperationError as exc:  # decided between the two requests
        raise Refused(409, exc.remark or str(exc)) from None
    return {"resumed": msg_id, "broker": addr}


# the Resume button: resumes, then shows the half's page saying so
acted(routes, "/transactions/half/{msg_id}/resume", _resume,
      lambda _request, done: f"/transactions/half/{done['resumed']}?resumed=1")


# --- per producer group ---
def _bucket_s(span_ms: int) -> int:
    for seconds in BUCKETS_S:
        if span_ms <= seconds * 1000 * MAX_BUCKETS:
            return seconds
    return BUCKETS_S[-1]


def audit(records: list[dict], now_ms: int) -> dict:
    """Per producer group of ``records`` (a broker's newest): how many committed, rolled back, were discarded or
    are pending, messages committed, check-backs; and the decisions per time bucket, for the charts."""
    groups: dict[str, dict] = {}
    for row in records:
        figures = groups.get(row["producerGroup"])
        if figures is None:
            figures = groups[row["producerGroup"]] = {"group": row["producerGroup"], "committed": 0,
                                                      "rolledBack": 0, "discarded": 0, "pending": 0,
                                                      "messagesCommitted": 0, "checks": 0}
        key = DECISIONS.get(row["state"], "pending")
        figures[key] += 1
        figures["checks"] += row["checks"]
        if key == "committed":
            figures["messagesCommitted"] += row["messages"]
    ranked = sorted(groups.values(), key=lambda g: (-(g["committed"] + g["rolledBack"] + g["discarded"]),
                                                    g["group"]))
    since = min((row["storeTimestamp"] for row in records), default=now_ms)
    bucket_ms = _bucket_s(now_ms - since) * 1000
    # older decisions than MAX_BUCKETS buckets of the largest size are left out of the charts
    first = max(since, now_ms - bucket_ms * MAX_BUCKETS) // bucket_ms * bucket_ms
    charted = {g["group"] for g in ranked[:AUDIT_CHART_GROUPS]}
    times = range(first, now_ms + 1, bucket_ms)
    series: dict[str, dict[str, dict[int, int]]] = {}
    for row in records:
        kind = DECISIONS.get(row["state"])
        decided = row["decidedTimestamp"]
        if kind is None or decided is None or decided < first:
            continue
        name = row["producerGroup"] if row["producerGroup"] in charted else OTHER
        counts = series.setdefault(name, {k: {} for k in DECISIONS.values()})[kind]
        at = decided // bucket_ms * bucket_ms
        counts[at] = counts.get(at, 0) + 1
    return {"records": len(records), "since": since, "bucketSeconds": bucket_ms // 1000, "groups": ranked,
            "series": {name: {kind: [[t, counts.get(t, 0)] for t in times] for kind, counts in kinds.items()}
                       for name, kinds in series.items()}}


async def _audit(request: web.Request, admin: Admin, broker: Broker) -> dict:
    """The audit of ``broker``'s newest AUDIT_WINDOW records, kept in the session for a sample interval: charts
    refresh every few seconds and must not read the window each time."""
    cache = request[SESSION].data.setdefault("transaction_audit", {})
    kept = cache.get(broker.addr)
    if kept is not None and time.monotonic() - kept[0] < request.app[SETTINGS].sample_interval_s:
        return kept[1]
    records: list[dict] = []
    after = None
    while len(records) < AUDIT_WINDOW:
        page = await admin.transaction_records_page(broker.addr, order="-store", after=after,
                                                    limit=AUDIT_WINDOW - len(records))
        records += page["records"]
        after = page["next"]
        if after is None:
            break
    result = {**audit(records, _now_ms()), "complete": after is None, "window": AUDIT_WINDOW}
    cache[broker.addr] = (time.monotonic(), result)
    return result


async def groups(request: web.Request) -> dict:
    """Per producer group of one broker: how its newest transactions ended (a page of the groups, most decisions
    first)."""
    size = _size(request)
    page = integer(request.query, "page", 1, 1, 1_000_000)
    admin = admin_for(request)
    broker, masters = await _broker(request, admin)
    result = await _audit(request, admin, broker)
    rows = result["groups"]
    return {"brokers": [b.name for b in masters], "broker": broker.name, "records": result["records"],
            "window": result["window"], "complete": result["complete"], "since": result["since"],
            "bucketSeconds": result["bucketSeconds"], "total": len(rows), "page": page, "size": size,
            "groups": rows[(page - 1) * size:page * size], "now": _now_ms()}


served(routes, "/transactions/groups", groups, "transactions_groups.html")


async def group_series(request: web.Request) -> dict:
    """Decisions per time bucket of one broker's newest transactions, per group (the busiest AUDIT_CHART_GROUPS,
    the rest as "(other)"): {group: {committed|rolledBack|discarded: [[unix ms, count]]}}."""
    admin = admin_for(request)
    broker, _masters = await _broker(request, admin)
    return (await _audit(request, admin, broker))["series"]


answered(routes, "GET", "/api/transactions/groups/series", group_series)

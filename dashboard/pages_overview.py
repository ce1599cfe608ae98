"""Overview: the brokers (up, version, uptime, store use and limit, sends/s and pulls/s), the broker groups'
members (role, epoch, records, in-sync set, lag) and the name servers."""
from __future__ import annotations

import asyncio

from aiohttp import web

from halfmq.protocol.codes import RequestCode

from .page import HISTORY, admin_for, render

routes = web.RouteTableDef()
NAV = ("/", "Overview")
SERIES = ("sends", "pulls", "checks", "pending")


async def overview(request: web.Request) -> dict:
    admin = admin_for(request)
    brokers = await admin.masters()
    tables = await asyncio.gather(*(admin.broker_status(b.addr) for b in brokers), return_exceptions=True)
    rows = []
    for broker, table in zip(brokers, tables):
        row = {"name": broker.name, "addr": broker.addr, "cluster": broker.cluster,
               "up": not isinstance(table, BaseException)}
        if row["up"]:
            row.update({"version": table.get("brokerVersionDesc", ""), "uptime": table.get("runtime", ""),
                        "storeUsedBytes": int(table.get("storeDataBytes", 0)),
                        "storeLimitBytes": int(table.get("storeLimitBytes", 0)),
                        "storeUseRatio": float(table.get("storeUseRatio", 0)),
                        "pendingHalfMessages": int(table.get("pendingHalfMessages", 0)),
                        "topics": int(table.get("topics", 0))})
        else:
            row["error"] = str(table)
        rows.append(row)
    return {"brokers": rows, "groups": await _groups(admin), "namesrvs": await _namesrvs(admin)}


async def _groups(admin) -> list[dict]:
    """Every member of every broker group with followers, as it reports itself (``halfmq admin
    replicationStatus``); brokers alone are left out."""
    try:
        rows = await admin.replication()
    except Exception:  # noqa: BLE001 - no broker answers: the brokers' table says why
        return []
    grouped = {row["brokerName"] for row in rows if row.get("role") in ("leader", "follower")}
    return [row for row in rows if row["brokerName"] in grouped]


async def _namesrvs(admin) -> list[dict]:
    """Each name server: answering or not, and how many brokers it lists."""
    async def probe(addr: str) -> dict:
        try:
            info = await admin.json_call(addr, RequestCode.GET_BROKER_CLUSTER_INFO)
        except Exception as exc:  # noqa: BLE001 - shown as down, with the reason
            return {"addr": addr, "up": False, "error": str(exc)}
        return {"addr": addr, "up": True, "brokers": len(info.get("brokerAddrTable") or {})}
    return list(await asyncio.gather(*(probe(a) for a in admin.namesrvs)))


@routes.get("/api/overview")
async def api_overview(request: web.Request) -> web.Response:
    return web.json_response(await overview(request))


@routes.get("/api/overview/series")
async def api_series(request: web.Request) -> web.Response:
    """Each broker's sends/s, pulls/s, check-backs/s and pending halves: {broker: {series: [[unix ms, value]]}}."""
    return web.json_response(request.app[HISTORY].broker_series(SERIES))


@routes.get("/")
async def overview_page(request: web.Request) -> web.Response:
    return render(request, "overview.html", await overview(request))

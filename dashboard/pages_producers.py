"""Producers: the live producer groups of every broker and their clients, remoting and gRPC (a 5.x producer has no
group: it is listed under each topic it publishes to), paged and filtered."""
from __future__ import annotations

from aiohttp import web

from .page import admin_for
from .pages_groups import DEFAULT_SIZE, MAX_FILTER, MAX_SIZE
from .params import integer, served, text

routes = web.RouteTableDef()
NAV = ("/producers", "Producers")
#: an ``after`` is a group name as a broker registered it: gRPC's are %GRPC%<topic>, and topics are up to 127 long
MAX_AFTER = 140


async def producers(request: web.Request) -> dict:
    """A page of the producer groups in name order: ``size`` of them after the name ``after``, those whose name
    contains ``q``."""
    query = request.query
    size = integer(query, "size", DEFAULT_SIZE, 1, MAX_SIZE)
    after = text(query, "after", max_length=MAX_AFTER) or None
    q = text(query, "q", max_length=MAX_FILTER)
    page = await admin_for(request).producer_groups_page(size, after, q or None)
    return {**page, "size": size, "after": after, "q": q}


served(routes, "/producers", producers, "producers.html")

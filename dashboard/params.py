"""Request parameters (a query string or a form) for the page modules: a bad value is refused with 400 and a
message saying which, a thing that does not exist with 404, as JSON under /api/ and as the error page elsewhere."""
from __future__ import annotations

import functools
from datetime import datetime, timezone

from aiohttp import web

from halfmq.client.errors import TopicNotExistError
from halfmq.protocol.rules import MAX_TOPIC_LENGTH, is_topic

from .page import error_page, json_error, render

MAX_MS = int(datetime(9999, 12, 31, 23, 59, 59, tzinfo=timezone.utc).timestamp() * 1000)


class Refused(Exception):
    """Answered as ``status`` with ``message`` by a handler wrapped in ``refusals``."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def refusal(request: web.Request, status: int, message: str) -> web.Response:
    return json_error(status, message) if request.path.startswith("/api/") else error_page(request, status, message)


def refusals(handler):
    """A handler whose Refused (and a topic no broker holds: 404) is answered as such."""
    @functools.wraps(handler)
    async def wrapped(request: web.Request) -> web.Response:
        try:
            return await handler(request)
        except Refused as exc:
            return refusal(request, exc.status, str(exc))
        except TopicNotExistError as exc:
            return refusal(request, 404, exc.remark or str(exc))
    return wrapped


async def form_of(request: web.Request) -> dict[str, str]:
    """A POST's fields: a JSON object's (API clients) or the form's (pages)."""
    if request.content_type == "application/json":
        try:
            data = await request.json()
        except ValueError:
            raise Refused(400, "the body is not JSON") from None
        if not isinstance(data, dict):
            raise Refused(400, "the body is not a JSON object")
        return {str(k): "" if v is None else str(v) for k, v in data.items()}
    return {k: str(v) for k, v in (await request.post()).items()}


def text(values, name: str, default: str = "", max_length: int = 512) -> str:
    value = values.get(name, default).strip()
    if len(value) > max_length:
        raise Refused(400, f"{name} is longer than {max_length} characters")
    return value


def integer(values, name: str, default: int | None, low: int, high: int) -> int | None:
    raw = values.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise Refused(400, f"{name} {raw[:40]!r} is not a whole number") from None
    if not low <= value <= high:
        raise Refused(400, f"{name} {value} is outside {low}..{high}")
    return value


def choice(values, name: str, choices, default: str) -> str:
    value = values.get(name, "").strip() or default
    if value not in choices:
        raise Refused(400, f"{name} {value[:40]!r} is not one of {', '.join(choices)}")
    return value


def topic_name(value: str, name: str = "topic") -> str:
    """A topic name as the brokers accept one (protocol/rules.py): a typo is a 400, not a broker's refusal."""
    if not is_topic(value):
        raise Refused(400, f"{name} {value[:140]!r} is not a topic name (1-{MAX_TOPIC_LENGTH} of A-Z a-z 0-9 _ - % |)")
    return value


def timestamp(values, name: str) -> int | None:
    """Epoch milliseconds, or an ISO 8601 date and time (UTC unless it names its offset)."""
    raw = values.get(name, "").strip()
    if not raw:
        return None
    if raw.isdecimal() and len(raw) <= 15:
        ms = int(raw)
    else:
        try:
            moment = datetime.fromisoformat(raw)
        except ValueError:
            raise Refused(400, f"{name} {raw[:40]!r} is neither epoch milliseconds nor an ISO 8601 time") from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=timezone.utc)
        ms = int(moment.timestamp() * 1000)
    if not 0 <= ms <= MAX_MS:
        raise Refused(400, f"{name} {raw[:40]!r} is outside the years 1970-9999")
    return ms


def utc(ms: int | None) -> str:
    """Epoch milliseconds as UTC text ("" for none)."""
    if not ms:
        return ""
    return datetime.fromtimestamp(ms / 1000, timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def answered(routes: web.RouteTableDef, method: str, path: str, build) -> None:
    """``build`` (a data or an action function of the request) answered as JSON at ``path`` (an /api/ one)."""
    async def api(request: web.Request) -> web.Response:
        return web.json_response(await build(request))

    routes.route(method, path)(refusals(api))


async def _nothing_more(request: web.Request, data: dict) -> dict:
    return {}


def served(routes: web.RouteTableDef, path: str, build, template: str, more=_nothing_more) -> None:
    """``build`` (a page's data function) served as JSON at /api``path`` and rendered with ``template`` at ``path``:
    a page shows what its endpoint answers, and both refuse bad parameters alike. ``await more(request, data)``:
    what the page shows besides (links, choices of its forms, what was just done)."""
    async def page(request: web.Request) -> web.Response:
        data = await build(request)
        return render(request, template, {**data, **await more(request, data)})

    answered(routes, "GET", "/api" + path, build)
    routes.get(path)(refusals(page))


def acted(routes: web.RouteTableDef, path: str, act, then) -> None:
    """``act`` (an action function of the request) answered as JSON at POST /api``path``, and at POST ``path`` (a
    page's form) followed by ``then(request, done)``: the page to see next (303, so that a reload does not act
    again)."""
    async def form(request: web.Request) -> web.Response:
        raise web.HTTPSeeOther(then(request, await act(request)))

    answered(routes, "POST", "/api" + path, act)
    routes.post(path)(refusals(form))

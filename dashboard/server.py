"""The dashboard's HTTP server (aiohttp): sessions and CSRF for every request, the pages and the JSON API of each
page module, static files, and the History sampler. Started by the broker (``dashboardPort``) or by
``halfmq dashboard -n <name servers>``."""
from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import jinja2
from aiohttp import web

from halfmq.client.admin import Admin
from halfmq.client.errors import ClientError, NoPermissionError

from . import (pages_config, pages_groups, pages_login, pages_messages, pages_overview, pages_producers, pages_topics,
               pages_transactions)
from .auth import COOKIE, SAFE_METHODS, LoginFailures, Sessions, csrf_ok
from .history import History
from .page import HISTORY, NAV, SESSION, SESSIONS, SETTINGS, SHARED_ADMIN, TEMPLATES, error_page, json_error
from .settings import DashboardSettings

log = logging.getLogger(__name__)
HERE = Path(__file__).parent
#: Page modules: each has ``routes`` (a web.RouteTableDef of its pages and /api endpoints) and, optionally,
#: ``NAV`` (its menu entry: (path, title)).
PAGE_MODULES = [pages_login, pages_overview, pages_topics, pages_groups, pages_producers, pages_messages,
                pages_transactions, pages_config]
PUBLIC = ("/login", "/static/")  #: served before sign-in


@web.middleware
async def session_middleware(request: web.Request, handler):
    """Attaches the session, refuses a state change without its CSRF token, asks to sign in when ACL is on."""
    app = request.app
    sessions = app[SESSIONS]
    session = sessions.get(request.cookies.get(COOKIE))
    created = session is None
    if created:
        session = sessions.new()
    request[SESSION] = session
    api = request.path.startswith("/api/")
    try:
        if request.method not in SAFE_METHODS:
            form = await request.post() if request.content_type in (
                "application/x-www-form-urlencoded", "multipart/form-data") else {}
            if not csrf_ok(request, session, form.get("csrf") if form else None):
                response = json_error(403, "missing or wrong CSRF token: reload the page") if api else \
                    web.Response(status=403, text="Missing or wrong CSRF token: reload the page and try again.")
                return _with_cookie(response, session, created)
        if app[SETTINGS].acl and session.credentials is None and not request.path.startswith(PUBLIC):
            if api:
                return _with_cookie(json_error(401, "sign in first (an admin account)"), session, created)
            raise web.HTTPFound(f"/login?next={request.path_qs}" if request.path != "/" else "/login")
        response = await handler(request)
    except web.HTTPException as exc:  # a redirect, or a refusal: answered as a response of its own, cookies kept
        response = web.Response(status=exc.status, reason=exc.reason, headers=exc.headers, body=exc.body)
        for name, morsel in exc.cookies.items():
            response.cookies[name] = morsel
    except NoPermissionError as exc:
        response = json_error(403, str(exc)) if api else error_page(request, 403, str(exc))
    except ClientError as exc:  # a broker or name server refused or did not answer: say which, keep serving
        response = json_error(502, str(exc)) if api else error_page(request, 502, str(exc))
    return _with_cookie(response, session, created)


def _with_cookie(response, session, created: bool):
    if created:
        response.set_cookie(COOKIE, session.token, httponly=True, samesite="Strict", path="/")
    return response


def build_app(settings: DashboardSettings) -> web.Application:
    app = web.Application(middlewares=[session_middleware], client_max_size=1 << 20)
    app[SETTINGS] = settings
    app[SESSIONS] = Sessions(settings.session_ttl_s)
    app[SHARED_ADMIN] = Admin(settings.namesrv, timeout=settings.request_timeout_s)
    app[HISTORY] = History(settings)
    app[pages_login.LOGIN_FAILURES] = LoginFailures()
    app[TEMPLATES] = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"),
                                        autoescape=True)
    app[NAV] = [module.NAV for module in PAGE_MODULES if hasattr(module, "NAV")]
    for module in PAGE_MODULES:
        app.add_routes(module.routes)
    app.router.add_static("/static/", HERE / "static")
    return app


class DashboardServer:
    """``await start()`` binds ``settings.port`` (0 = any free port); ``addr`` is the address bound."""

    def __init__(self, settings: DashboardSettings):
        self.settings = settings
        self.app = build_app(settings)
        self.runner: web.AppRunner | None = None
        self.addr = ""
        self.port = 0

    async def start(self) -> None:
        self.runner = web.AppRunner(self.app, access_log=None, handle_signals=False)
        await self.runner.setup()
        site = web.TCPSite(self.runner, self.settings.host, self.settings.port, reuse_address=True)
        await site.start()
        sockname = site._server.sockets[0].getsockname()
        self.port = sockname[1]
        host = sockname[0]
        self.addr = f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"
        self.app[HISTORY].start(self.app[SHARED_ADMIN], self._signed_admin if self.settings.acl else None)

    def _signed_admin(self):
        """With ACL on, charts are sampled with the account that signed in last (no account: no samples yet)."""
        sessions = [s for s in self.app[SESSIONS].by_token.values() if "admin" in s.data]
        return max(sessions, key=lambda s: s.expires).data["admin"] if sessions else None

    async def stop(self) -> None:
        await self.app[HISTORY].stop()
        if self.runner is not None:
            await self.runner.cleanup()
        admins = [self.app[SHARED_ADMIN]] + [s.data["admin"] for s in self.app[SESSIONS].by_token.values()
                                             if "admin" in s.data]
        await asyncio.gather(*(a.close() for a in admins), return_exceptions=True)

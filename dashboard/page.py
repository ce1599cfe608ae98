"""What every page module uses: the application's keys, rendering a page with what every page shows, the admin
client acting for the request, JSON errors."""
from __future__ import annotations

import jinja2
from aiohttp import web

from halfmq.client.admin import Admin

from .auth import Session, Sessions
from .history import History
from .settings import DashboardSettings

SETTINGS = web.AppKey("settings", DashboardSettings)
SESSIONS = web.AppKey("sessions", Sessions)
HISTORY = web.AppKey("history", History)
SHARED_ADMIN = web.AppKey("admin", Admin)
TEMPLATES = web.AppKey("templates", jinja2.Environment)
#: the menu: (path, title) of every page that has one, in order; filled by server.build_app from the page modules
NAV = web.AppKey("nav", list)
#: the signed-in session of the request (set by server's session middleware)
SESSION = web.RequestKey("session", Session)


def json_error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def render(request: web.Request, template: str, context: dict, status: int = 200) -> web.Response:
    """A page: the template with what every page shows (menu, account, CSRF token for its forms)."""
    session = request[SESSION]
    env = request.app[TEMPLATES]
    html = env.get_template(template).render(
        nav=request.app[NAV], path=request.path, csrf=session.csrf, account=session.access_key,
        acl=request.app[SETTINGS].acl, **context)
    return web.Response(text=html, content_type="text/html", status=status)


def error_page(request: web.Request, status: int, message: str) -> web.Response:
    return render(request, "error.html", {"status": status, "message": message}, status=status)


def admin_for(request: web.Request) -> Admin:
    """The admin client acting for this request: the signed-in account's (ACL on) or the dashboard's own."""
    session = request[SESSION]
    if session.credentials is None:
        return request.app[SHARED_ADMIN]
    admin = session.data.get("admin")
    if admin is None:
        settings = request.app[SETTINGS]
        admin = session.data["admin"] = Admin(settings.namesrv, credentials=session.credentials,
                                              timeout=settings.request_timeout_s)
    return admin

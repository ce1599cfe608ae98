"""Sign-in (ACL on): an account is let in when an admin request signed with it succeeds at a broker."""
from __future__ import annotations

from aiohttp import web

from halfmq.client.admin import Admin
from halfmq.client.errors import ClientError, NoPermissionError
from halfmq.client.remoting import Credentials

from .auth import COOKIE
from .auth import LoginFailures
from .page import SESSION, SESSIONS, SETTINGS, render

LOGIN_FAILURES = web.AppKey("login_failures", LoginFailures)

routes = web.RouteTableDef()


def _safe_next(target: str | None) -> str:
    """Only a path on this server: an open redirect would make the login page a phishing tool."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


@routes.get("/login")
async def login_page(request: web.Request) -> web.Response:
    return render(request, "login.html", {"error": "", "next": _safe_next(request.query.get("next"))})


@routes.post("/login")
async def login(request: web.Request) -> web.Response:
    form = await request.post()
    target = _safe_next(form.get("next"))
    settings = request.app[SETTINGS]
    if not settings.acl:
        raise web.HTTPFound(target)
    failures = request.app[LOGIN_FAILURES]
    host = request.remote or ""
    if failures.refused(host):
        return render(request, "login.html", {"error": f"Too many failed sign-ins from {host}: wait a minute.",
                                              "next": target}, status=429)
    credentials = Credentials(str(form.get("accessKey", "")), str(form.get("secretKey", "")))
    admin = Admin(settings.namesrv, credentials=credentials, timeout=settings.request_timeout_s)
    try:
        await admin.broker_status((await admin.brokers())[0].addr)  # an admin request: only admins get an answer
    except NoPermissionError:
        await admin.close()
        failures.failed(host)
        return render(request, "login.html", {"error": "This account is unknown, its secret key is wrong, or it is "
                                                        "not an admin account.", "next": target}, status=403)
    except ClientError as exc:
        await admin.close()
        return render(request, "login.html", {"error": f"No broker answered: {exc}", "next": target}, status=502)
    # A new session for the signed-in account: a token set before sign-in (a planted cookie) is worth nothing.
    sessions = request.app[SESSIONS]
    old = request[SESSION]
    if "admin" in old.data:
        await old.data.pop("admin").close()
    sessions.end(old)
    session = sessions.new()
    session.credentials, session.access_key = credentials, credentials.access_key
    session.data["admin"] = admin
    response = web.HTTPFound(target)
    response.set_cookie(COOKIE, session.token, httponly=True, samesite="Strict", path="/")
    raise response


@routes.post("/logout")
async def logout(request: web.Request) -> web.Response:
    session = request[SESSION]
    admin = session.data.pop("admin", None)
    if admin is not None:
        await admin.close()
    request.app[SESSIONS].end(session)
    response = web.HTTPFound("/login")
    response.del_cookie(COOKIE, path="/")
    raise response

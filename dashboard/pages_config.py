"""Configuration: each broker's effective configuration, read-only, secrets masked."""
from __future__ import annotations

from aiohttp import web

from .page import admin_for, render

routes = web.RouteTableDef()
NAV = ("/config", "Configuration")
#: keys whose values are never shown (a secret, or a file whose contents are)
SECRET_WORDS = ("secret", "password", "keypath")


def masked(config: dict[str, str]) -> dict[str, str]:
    return {k: "••••••" if any(w in k.lower() for w in SECRET_WORDS) and v else v for k, v in sorted(config.items())}


async def configs(request: web.Request) -> list[dict]:
    admin = admin_for(request)
    out = []
    for broker in await admin.masters():
        try:
            out.append({"broker": broker.name, "addr": broker.addr, "config": masked(await admin.broker_config(
                broker.addr))})
        except Exception as exc:  # noqa: BLE001 - a broker down is shown as such
            out.append({"broker": broker.name, "addr": broker.addr, "error": str(exc), "config": {}})
    return out


@routes.get("/api/config")
async def api_config(request: web.Request) -> web.Response:
    return web.json_response({"brokers": await configs(request)})


@routes.get("/config")
async def config_page(request: web.Request) -> web.Response:
    return render(request, "config.html", {"brokers": await configs(request)})

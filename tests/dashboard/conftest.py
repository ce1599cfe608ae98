"""Dashboard fixtures: a real broker with its dashboard on a free loopback port, HTTP clients that keep cookies,
and a real headless Chromium (Debian's chromium and chromedriver, driven by Selenium)."""
from __future__ import annotations

import re
import shutil
from dataclasses import dataclass

import aiohttp
import pytest

from halfmq.broker.server import Broker

from tests.conftest import broker_config


@dataclass
class Dashboard:
    broker: Broker
    url: str  #: http://127.0.0.1:PORT

    @property
    def namesrv(self) -> str:
        return self.broker.namesrv_addr


@pytest.fixture
async def dashboard_factory(tmp_path):
    """``await dashboard_factory(**broker_config)``: a broker serving its dashboard; stopped at the end."""
    started: list[Broker] = []

    async def start(**overrides) -> Dashboard:
        broker = Broker(broker_config(tmp_path / f"store{len(started)}", **{"dashboardPort": 0, **overrides}))
        await broker.start()
        started.append(broker)
        return Dashboard(broker, f"http://{broker.dashboard_addr}")

    yield start
    for broker in reversed(started):
        await broker.stop()


@pytest.fixture
async def dashboard(dashboard_factory) -> Dashboard:
    return await dashboard_factory()


#: one admin account, "ops", signing in with "ops-secret-1"
ADMIN_ACL = "accounts:\n  - accessKey: ops\n    secretKey: ops-secret-1\n    admin: true\n"


@pytest.fixture
def acl_dashboard_factory(dashboard_factory, tmp_path):
    """``await acl_dashboard_factory(accounts=ADMIN_ACL)``: a dashboard with ACL on and these accounts."""
    async def start(accounts: str = ADMIN_ACL) -> Dashboard:
        acl = tmp_path / "plain_acl.yml"
        acl.write_text(accounts)
        return await dashboard_factory(aclEnable=True, aclConfigFile=str(acl), dashboardBindAddress="127.0.0.1")

    return start


class Http:
    """An HTTP client with its own cookie jar (one browser session); ``csrf`` is read from the last page."""

    def __init__(self, base: str):
        self.base = base
        self.session = aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))
        self.csrf = ""

    async def page(self, path: str) -> tuple[int, str]:
        async with self.session.get(self.base + path, allow_redirects=False) as resp:
            text = await resp.text()
            match = re.search(r'name="csrf-token" content="([^"]+)"', text)
            if match:
                self.csrf = match.group(1)
            return resp.status, text

    async def get_json(self, path: str) -> tuple[int, dict]:
        async with self.session.get(self.base + path, allow_redirects=False) as resp:
            return resp.status, await resp.json(content_type=None)

    async def post(self, path: str, data: dict | None = None, csrf: bool = True) -> tuple[int, str, str]:
        """(status, body, Location) of a form post, with the session's CSRF token unless ``csrf`` is False."""
        form = dict(data or {})
        if csrf:
            form["csrf"] = self.csrf
        async with self.session.post(self.base + path, data=form, allow_redirects=False) as resp:
            return resp.status, await resp.text(), resp.headers.get("Location", "")

    async def close(self) -> None:
        await self.session.close()


@pytest.fixture
async def http_factory():
    clients: list[Http] = []

    def make(base: str) -> Http:
        clients.append(Http(base))
        return clients[-1]

    yield make
    for client in clients:
        await client.close()


@pytest.fixture(scope="session")
def _chromium_paths() -> tuple[str, str]:
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not chromium or not driver:
        pytest.fail("chromium and chromedriver are needed (bash scripts/install_chromium.sh)")
    return chromium, driver


@pytest.fixture
def browser(_chromium_paths):
    """A headless Chromium through Selenium; quit at the end (its processes with it)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, driver = _chromium_paths
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000",
                "--disable-gpu"):
        options.add_argument(arg)
    drv = webdriver.Chrome(service=Service(driver), options=options)
    drv.set_page_load_timeout(30)
    try:
        yield drv
    finally:
        drv.quit()

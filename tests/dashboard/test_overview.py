"""The overview page and the dashboard's common rules (sessions, CSRF, sign-in with ACL) against a real broker."""
from __future__ import annotations

import asyncio

from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import WebDriverWait

from halfmq.client import Message, Producer

from .conftest import ADMIN_ACL


async def test_overview_in_a_browser_shows_the_broker_and_its_traffic(dashboard, browser):
    async with Producer("PG_OVERVIEW", dashboard.namesrv) as producer:
        await producer.send(Message("Seen", b"x"))
    await asyncio.to_thread(browser.get, dashboard.url + "/")
    rows = await asyncio.to_thread(browser.find_elements, By.CSS_SELECTOR, "#brokers tbody tr")
    assert [r.get_attribute("data-broker") for r in rows] == ["broker-a"]
    assert "up" in rows[0].text and dashboard.broker.addr.split(":")[1] in rows[0].text
    namesrvs = await asyncio.to_thread(browser.find_element, By.ID, "namesrvs")
    assert "up" in namesrvs.text
    # The charts are drawn by uPlot from the JSON API, in the page.
    await asyncio.to_thread(WebDriverWait(browser, 10).until, EC.presence_of_element_located(
        (By.CSS_SELECTOR, ".chart .uplot")))


async def test_api_overview_and_config_mask_secrets(dashboard_factory, http_factory):
    dash = await dashboard_factory(namesrvSecretKey="top-secret-1")
    http = http_factory(dash.url)
    status, data = await http.get_json("/api/overview")
    assert status == 200 and [b["name"] for b in data["brokers"]] == ["broker-a"] and data["brokers"][0]["up"]
    status, data = await http.get_json("/api/config")
    config = data["brokers"][0]["config"]
    assert config["namesrvSecretKey"] == "••••••" and config["listenPort"] == "0"
    status, text = await http.page("/config")
    assert status == 200 and "top-secret-1" not in text


async def test_a_state_change_without_the_csrf_token_is_refused(dashboard, http_factory):
    http = http_factory(dashboard.url)
    await http.page("/")
    status, _body, _ = await http.post("/logout", csrf=False)
    assert status == 403
    other = http_factory(dashboard.url)
    await other.page("/")
    status, _body, _ = await http.post("/logout", {"csrf": other.csrf}, csrf=False)  # another session's token
    assert status == 403


async def test_with_acl_only_admin_accounts_sign_in(acl_dashboard_factory, http_factory):
    dash = await acl_dashboard_factory(ADMIN_ACL + "  - accessKey: app\n    secretKey: app-secret-1\n"
                                                   "    defaultTopicPerm: PUB|SUB\n")
    http = http_factory(dash.url)
    status, _text = await http.page("/")
    assert status == 302
    status, data = await http.get_json("/api/overview")
    assert status == 401
    await http.page("/login")
    for key, secret, want in (("app", "app-secret-1", 403), ("ops", "wrong-secret", 403)):
        status, text, _ = await http.post("/login", {"accessKey": key, "secretKey": secret})
        assert status == want and "not an admin account" in text
    before = http.csrf
    status, _text, location = await http.post("/login", {"accessKey": "ops", "secretKey": "ops-secret-1",
                                                          "next": "//evil.example/"})
    assert status == 302 and location == "/"  # never off this server
    status, data = await http.get_json("/api/overview")
    assert status == 200 and data["brokers"][0]["up"]
    status, text = await http.page("/")
    assert status == 200 and "ops" in text and http.csrf != before  # a new session after sign-in


async def test_sign_in_attempts_are_limited_per_client(acl_dashboard_factory, http_factory):
    dash = await acl_dashboard_factory()
    http = http_factory(dash.url)
    await http.page("/login")
    for _ in range(5):
        status, _text, _ = await http.post("/login", {"accessKey": "ops", "secretKey": "guess"})
        assert status == 403
    status, text, _ = await http.post("/login", {"accessKey": "ops", "secretKey": "ops-secret-1"})
    assert status == 429 and "Too many failed sign-ins" in text  # even the right key waits out the window


async def test_halfmq_dashboard_serves_a_cluster_from_a_process_of_its_own(dashboard_factory, http_factory):
    import re
    import signal
    import sys

    dash = await dashboard_factory(dashboardPort=-1)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "halfmq.broker.cli", "dashboard", "-n", dash.namesrv, "--dashboardPort=0",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
        match = re.search(rb"halfmq dashboard ready: (http://127\.0\.0\.1:\d+)/", line)
        assert match, line
        http = http_factory(match.group(1).decode())
        status, data = await http.get_json("/api/overview")
        assert status == 200 and [b["addr"] for b in data["brokers"]] == [dash.broker.addr]
    finally:
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 20) == 0


async def test_halfmq_dashboard_refuses_a_bad_port():
    import sys
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "halfmq.broker.cli", "dashboard", "-n", "127.0.0.1:9876", "--dashboardPort=70000",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 2 and b"--dashboardPort" in err

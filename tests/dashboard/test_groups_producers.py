"""The consumer groups and producers pages and their API against a real broker, real clients (halfmq's remoting
PushConsumer and Producer, the official RocketMQ 5 gRPC producer) and a real headless Chromium."""
from __future__ import annotations

import asyncio
import inspect
import time

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

from halfmq.client import Message, Producer
from halfmq.client.admin import Admin
from halfmq.client.push import ConsumeFrom, PushConsumer
from halfmq.dashboard.server import DashboardServer
from halfmq.dashboard.settings import DashboardSettings

SAMPLE_S = 0.2  #: the History's sample interval here: the lag chart gets a point every 0.2 s


async def eventually(probe, what: str, timeout: float = 20.0):
    """Polls ``probe`` (a function, or a coroutine function) until it returns something true (state another task or
    process changes)."""
    deadline = time.monotonic() + timeout
    while True:
        result = probe()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}; last: {result!r}")
        await asyncio.sleep(0.05)


@pytest.fixture
async def sampled(broker_factory):
    """``await sampled(**broker_config)``: (broker, dashboard URL) for a broker and a dashboard of its own whose
    History samples every SAMPLE_S."""
    servers: list[DashboardServer] = []

    async def start(**config):
        broker = await broker_factory(**config)
        server = DashboardServer(DashboardSettings(namesrv=broker.namesrv_addr, port=0, sample_interval_s=SAMPLE_S))
        await server.start()
        servers.append(server)
        return broker, f"http://{server.addr}"

    yield start
    for server in servers:
        await server.stop()


class Consumed:
    """A PushConsumer of ``topic`` in ``group`` and the bodies it consumed."""

    def __init__(self, namesrv: str, group: str, topic: str):
        self.bodies: list[bytes] = []
        self.consumer = PushConsumer(group, namesrv, self._listener, consume_from=ConsumeFrom.FIRST_OFFSET)
        self.consumer.subscribe(topic)

    async def _listener(self, messages) -> None:
        self.bodies.extend(m.body for m in messages)


@pytest.fixture
async def consumers():
    """``await consumers(namesrv, group, topic)`` starts a Consumed; ``stop(c)`` closes one; the rest close at the
    end."""
    running: list[Consumed] = []

    async def start(namesrv: str, group: str, topic: str) -> Consumed:
        consumed = Consumed(namesrv, group, topic)
        await consumed.consumer.start()
        running.append(consumed)
        return consumed

    async def stop(consumed: Consumed) -> None:
        running.remove(consumed)
        await consumed.consumer.close()

    start.stop = stop
    yield start
    for consumed in running:
        await consumed.consumer.close()


def _refreshed_text(browser, element_id: str, want: str):
    """Reloads the page until the element shows ``want`` (the page shows what the brokers answer at load)."""
    def shown(driver):
        driver.refresh()
        return driver.find_element(By.ID, element_id).text == want
    WebDriverWait(browser, 30, poll_frequency=0.3).until(shown, f"#{element_id} to show {want}")


async def test_a_groups_lag_grows_when_its_consumer_stops_and_falls_when_it_resumes(sampled, consumers, browser,
                                                                                 http_factory):
    broker, url = await sampled()
    http = http_factory(url)
    async with Producer("PG_LAG", broker.namesrv_addr) as producer:
        await producer.send(Message("Lagging", b"first"))
        first = await consumers(broker.namesrv_addr, "CG_LAG", "Lagging")
        await eventually(lambda: _lag(http, "CG_LAG", 0, first.bodies), "the first message consumed and committed")
        await asyncio.to_thread(browser.get, url + "/groups/CG_LAG")
        await asyncio.to_thread(_refreshed_text, browser, "total-lag", "0")
        assert (await asyncio.to_thread(browser.find_element, By.ID, "online")).text == "1"

        await consumers.stop(first)
        for i in range(5):
            await producer.send(Message("Lagging", f"while stopped {i}".encode()))
        await asyncio.to_thread(_refreshed_text, browser, "total-lag", "5")
        assert (await asyncio.to_thread(browser.find_element, By.ID, "online")).text == "0"
        # The chart's data: the sampled lag reached 5 while the consumer was stopped.
        await eventually(lambda: _series_has(http, "CG_LAG", lambda values: 5.0 in values), "a lag sample of 5")
        chart = await asyncio.to_thread(browser.find_element, By.ID, "lag-chart")
        await asyncio.to_thread(WebDriverWait(browser, 10).until,
                                lambda _d: int(chart.get_attribute("data-points") or 0) > 0, "the chart drawn")
        # The list shows it too.
        await asyncio.to_thread(browser.get, url + "/groups?q=CG_LAG")
        row = await asyncio.to_thread(browser.find_element, By.CSS_SELECTOR, 'tr[data-group="CG_LAG"] .lag')
        assert row.text == "5"

        resumed = await consumers(broker.namesrv_addr, "CG_LAG", "Lagging")
        await asyncio.to_thread(browser.get, url + "/groups/CG_LAG")
        await asyncio.to_thread(_refreshed_text, browser, "total-lag", "0")
        assert sorted(resumed.bodies) == [f"while stopped {i}".encode() for i in range(5)]
        await eventually(lambda: _series_has(http, "CG_LAG", lambda values: values[-1] == 0.0 and 5.0 in values),
                         "the sampled lag back at 0 after 5")


async def _lag(http, group: str, want: int, consumed: list) -> bool:
    status, data = await http.get_json(f"/api/groups/{group}")
    return bool(consumed) and status == 200 and data["lag"] == want


async def _series_has(http, group: str, test) -> bool:
    status, data = await http.get_json(f"/api/groups/{group}/lag/series")
    values = [value for _ms, value in data[group]["lag"]]
    return status == 200 and bool(values) and test(values)


async def test_a_groups_page_lists_members_subscriptions_queues_and_its_retry_topic(dashboard, consumers,
                                                                                   http_factory, browser):
    async with Producer("PG_SHOWN", dashboard.namesrv) as producer:
        await producer.send(Message("Shown", b"x"))
    member = await consumers(dashboard.namesrv, "CG_SHOWN", "Shown")
    await eventually(lambda: member.bodies, "the message consumed")
    await asyncio.to_thread(browser.get, dashboard.url + "/groups/CG_SHOWN")
    members = await asyncio.to_thread(browser.find_element, By.ID, "members")
    assert member.consumer.instance.client_id in members.text and "PYTHON" in members.text
    assert "remoting" in members.text and "V4_9_8" in members.text
    subscriptions = (await asyncio.to_thread(browser.find_element, By.ID, "subscriptions")).text
    assert "Shown" in subscriptions and "%RETRY%CG_SHOWN" in subscriptions
    queues = (await asyncio.to_thread(browser.find_element, By.ID, "queues")).text
    assert "Shown" in queues and "broker-a" in queues
    retry = await asyncio.to_thread(browser.find_element, By.CSS_SELECTOR, "#retry-topic a")
    assert retry.get_attribute("href") == dashboard.url + "/topics/%25RETRY%25CG_SHOWN"
    links = await asyncio.to_thread(browser.find_elements, By.CSS_SELECTOR, "#retry-topic a")
    assert links[1].get_attribute("href") == dashboard.url + "/messages?topic=%25RETRY%25CG_SHOWN"
    assert (await asyncio.to_thread(browser.find_element, By.ID, "dlq-topic")).text.startswith("none")
    # The menu leads there.
    await asyncio.to_thread(browser.get, dashboard.url + "/")
    await asyncio.to_thread(lambda: browser.find_element(By.LINK_TEXT, "Groups").click())
    await asyncio.to_thread(lambda: browser.find_element(By.LINK_TEXT, "CG_SHOWN").click())
    assert (await asyncio.to_thread(browser.find_element, By.ID, "group-name")).text == "CG_SHOWN"


async def test_reset_offsets_to_a_time_from_the_page(dashboard, consumers, browser):
    admin = Admin(dashboard.namesrv)
    async with Producer("PG_RESET", dashboard.namesrv) as producer:
        for i in range(3):
            sent = await producer.send(Message("Replayed", f"old {i}".encode()))
        last_old = (await admin.view_message(sent.offset_msg_id)).store_timestamp
        await admin.close()
        # The time to reset to: after the last old message's store time, before the new ones' (one host, one clock).
        cut = await eventually(lambda: (now := int(time.time() * 1000)) > last_old and now, "the clock to move on")
        for i in range(3):
            await producer.send(Message("Replayed", f"new {i}".encode()))
    first = await consumers(dashboard.namesrv, "CG_RESET", "Replayed")
    await eventually(lambda: len(first.bodies) == 6, "every message consumed")
    await consumers.stop(first)

    await asyncio.to_thread(browser.get, dashboard.url + "/groups/CG_RESET")
    await asyncio.to_thread(_refreshed_text, browser, "total-lag", "0")

    def submit():
        browser.find_element(By.NAME, "time").send_keys(str(cut))
        Select(browser.find_element(By.NAME, "topic")).select_by_value("Replayed")
        browser.find_element(By.CSS_SELECTOR, "#reset button").click()
        alert = WebDriverWait(browser, 10).until(lambda d: d.switch_to.alert)
        assert "CG_RESET" in alert.text
        alert.accept()
        WebDriverWait(browser, 10).until(lambda d: d.find_elements(By.ID, "flash"))
    await asyncio.to_thread(submit)
    flash = (await asyncio.to_thread(browser.find_element, By.ID, "flash")).text
    assert flash.startswith("Reset ") and "of Replayed" in flash
    assert (await asyncio.to_thread(browser.find_element, By.ID, "total-lag")).text == "3"

    again = await consumers(dashboard.namesrv, "CG_RESET", "Replayed")
    await eventually(lambda: len(again.bodies) == 3, "the messages after the time again")
    assert sorted(again.bodies) == [b"new 0", b"new 1", b"new 2"]


async def test_api_reset_and_its_refusals(dashboard, consumers, http_factory):
    async with Producer("PG_API_RESET", dashboard.namesrv) as producer:
        for i in range(4):
            await producer.send(Message("Rewound", f"m{i}".encode()))
    member = await consumers(dashboard.namesrv, "CG_API_RESET", "Rewound")
    await eventually(lambda: len(member.bodies) == 4, "every message consumed")
    http = http_factory(dashboard.url)
    await http.page("/groups/CG_API_RESET")

    async def post(group: str, body, csrf: bool = True):
        headers = {"X-CSRF-Token": http.csrf} if csrf else {}
        async with http.session.post(f"{dashboard.url}/api/groups/{group}/reset", json=body,
                                     headers=headers) as resp:
            return resp.status, await resp.json(content_type=None)

    status, data = await post("CG_API_RESET", {"time": "0"})
    assert status == 409 and "1 consumer(s) online" in data["error"]
    await consumers.stop(member)
    assert (await post("CG_API_RESET", {"time": "0"}, csrf=False))[0] == 403
    for body, want in (({}, "time is missing"), ({"time": "yesterday"}, "ISO 8601"),
                       ({"time": "0", "topic": "Other"}, "not one the group reads")):
        status, data = await post("CG_API_RESET", body)
        assert status == 400 and want in data["error"], data
    status, data = await post("NO_SUCH_GROUP", {"time": "0"})
    assert status == 404
    status, data = await post("bad name", {"time": "0"})
    assert status == 400

    status, data = await post("CG_API_RESET", {"time": "1970-01-01T00:00:00Z"})  # to the first message kept
    assert status == 200 and data["topic"] is None
    rewound = [r for r in data["queues"] if r["topic"] == "Rewound"]
    assert sum(r["previousOffset"] for r in rewound) == 4 and sum(r["offset"] for r in rewound) == 0
    assert all(not r["topic"].startswith("%RETRY%") for r in data["queues"])
    status, data = await http.get_json("/api/groups/CG_API_RESET")
    assert status == 200 and data["lag"] == 4


async def test_api_groups_pages_filters_and_refuses_bad_parameters(dashboard, http_factory):
    admin = Admin(dashboard.namesrv)
    try:
        for name in ("CG_PAGE_1", "CG_PAGE_2", "CG_PAGE_3", "CG_PAGE_4", "CG_PAGE_5", "OTHER_GROUP"):
            await admin.update_sub_group(name)
    finally:
        await admin.close()
    http = http_factory(dashboard.url)
    seen, after = [], ""
    while True:
        status, data = await http.get_json(f"/api/groups?size=2&q=cg_page&after={after}")
        assert status == 200 and len(data["groups"]) <= 2 and data["totals"] == {"broker-a": 5}
        seen += [g["group"] for g in data["groups"]]
        if data["next"] is None:
            break
        after = data["next"]
    assert seen == [f"CG_PAGE_{i}" for i in range(1, 6)]
    row = data["groups"][0]
    assert row["online"] == 0 and row["lag"] == 0 and row["retryTopic"] and row["brokers"] == ["broker-a"]
    status, data = await http.get_json("/api/groups")
    assert status == 200 and "OTHER_GROUP" in [g["group"] for g in data["groups"]]
    for query, want in (("size=0", "size"), ("size=101", "size"), ("size=x", "size"), ("after=a%20b", "after"),
                        ("q=" + "x" * 121, "q")):
        status, data = await http.get_json(f"/api/groups?{query}")
        assert status == 400 and data["error"].startswith(want), (query, data)
    status, text = await http.page("/groups?size=2&q=CG_PAGE")
    assert status == 200 and "CG_PAGE_1" in text and "CG_PAGE_3" not in text and 'id="next"' in text
    status, data = await http.get_json("/api/groups/NO_SUCH_GROUP")
    assert status == 404 and "NO_SUCH_GROUP" in data["error"]
    status, text = await http.page("/groups/NO_SUCH_GROUP")
    assert status == 404 and "no broker knows consumer group NO_SUCH_GROUP" in text
    status, data = await http.get_json("/api/groups/CG_PAGE_1?page=0")
    assert status == 400
    status, data = await http.get_json("/api/groups/has%20space/lag/series")
    assert status == 400
    status, data = await http.get_json("/api/groups/CG_PAGE_1/lag/series")
    assert status == 200 and data == {"CG_PAGE_1": {"lag": []}}  # not viewed yet: not sampled


async def test_producers_page_shows_remoting_and_grpc_producers(dashboard_factory, browser, http_factory):
    from rocketmq import ClientConfiguration, Credentials
    from rocketmq import Producer as GrpcProducer

    dash = await dashboard_factory(grpcListenPort=0)
    async with Producer("PG_REMOTING", dash.namesrv) as producer:
        await producer.send(Message("Published", b"x"))
        grpc = GrpcProducer(ClientConfiguration(f"127.0.0.1:{dash.broker.grpc_port}", Credentials("", ""),
                                                request_timeout=5), ("Published",))
        await asyncio.to_thread(grpc.startup)
        try:
            await asyncio.to_thread(browser.get, dash.url + "/producers")

            def both_shown(driver):
                driver.refresh()
                return {r.get_attribute("data-protocol"): r.text
                        for r in driver.find_elements(By.CSS_SELECTOR, "#producers tbody tr[data-group]")}
            rows = await asyncio.to_thread(WebDriverWait(browser, 30, poll_frequency=0.3).until,
                                           lambda d: (shown := both_shown(d)) and len(shown) == 2 and shown,
                                           "a remoting and a gRPC producer")
            assert "PG_REMOTING" in rows["remoting"] and producer.instance.client_id in rows["remoting"]
            assert "PYTHON" in rows["remoting"] and "V4_9_8" in rows["remoting"]
            assert "topic Published" in rows["grpc"] and "gRPC" in rows["grpc"] and "PYTHON" in rows["grpc"]
            assert "5.1.2" in rows["grpc"]  # the official client's user agent version
            http = http_factory(dash.url)
            status, data = await http.get_json("/api/producers?q=%25GRPC%25")
            assert status == 200 and [g["topic"] for g in data["groups"]] == ["Published"]
            assert data["groups"][0]["protocol"] == "grpc" and data["groups"][0]["clients"][0]["protocol"] == "grpc"
        finally:
            await asyncio.to_thread(grpc.shutdown)


async def test_api_producers_pages_filters_and_refuses_bad_parameters(dashboard, http_factory):
    producers = [Producer(f"PG_LIST_{i}", dashboard.namesrv) for i in range(3)]
    try:
        for producer in producers:
            await producer.start()
            await producer.send(Message("Listed", b"x"))
        http = http_factory(dashboard.url)
        seen, after = [], ""
        while True:
            status, data = await http.get_json(f"/api/producers?size=2&q=pg_list&after={after}")
            assert status == 200 and len(data["groups"]) <= 2
            seen += [(g["group"], g["protocol"], g["clientCount"]) for g in data["groups"]]
            if data["next"] is None:
                break
            after = data["next"]
        assert seen == [(f"PG_LIST_{i}", "remoting", 1) for i in range(3)]
        client = data["groups"][0]["clients"][0]
        assert client["clientId"] == producers[2].instance.client_id and client["language"] == "PYTHON"
        assert client["brokers"] == ["broker-a"]
        for query in ("size=0", "size=abc", "after=" + "x" * 141, "q=" + "x" * 121):
            status, data = await http.get_json(f"/api/producers?{query}")
            assert status == 400 and data["error"], query
        status, text = await http.page("/producers?q=PG_LIST_1")
        assert status == 200 and "PG_LIST_1" in text and "PG_LIST_0" not in text
    finally:
        for producer in producers:
            await producer.close()


async def test_with_acl_the_groups_and_producers_api_ask_to_sign_in(acl_dashboard_factory, http_factory):
    dash = await acl_dashboard_factory()
    http = http_factory(dash.url)
    for path in ("/api/groups", "/api/groups/CG_ANY", "/api/groups/CG_ANY/lag/series", "/api/producers"):
        status, data = await http.get_json(path)
        assert status == 401 and "sign in" in data["error"], path
    for path in ("/groups", "/groups/CG_ANY", "/producers"):
        status, _text = await http.page(path)
        assert status == 302, path
    await http.page("/login")
    status, _body, _ = await http.post("/api/groups/CG_ANY/reset", {"time": "0"})
    assert status == 401
    status, _body, _ = await http.post("/api/groups/CG_ANY/reset", {"time": "0"}, csrf=False)
    assert status == 403
    status, _text, _ = await http.post("/login", {"accessKey": "ops", "secretKey": "ops-secret-1"})
    assert status == 302
    status, data = await http.get_json("/api/groups")
    assert status == 200 and data["errors"] == {}
    status, data = await http.get_json("/api/groups/CG_ANY")
    assert status == 404


@pytest.fixture
async def two_brokers(broker_factory, tmp_path):
    """(name server address, dashboard URL) of a cluster: a name server and brokers broker-a and broker-b that
    register with it, in this process, and a dashboard over it."""
    from halfmq.broker.namesrv.config import load_namesrv_config
    from halfmq.broker.namesrv.server import NameServer

    namesrv = NameServer(load_namesrv_config(None, ["--bindAddress=127.0.0.1", "--listenPort=0"]))
    await namesrv.start()
    server = None
    try:
        for name in ("broker-a", "broker-b"):
            await broker_factory(tmp_path / name, brokerName=name, namesrvAddr=namesrv.addr, namesrvListenPort=-1)
        server = DashboardServer(DashboardSettings(namesrv=namesrv.addr, port=0, sample_interval_s=SAMPLE_S))
        await server.start()
        yield namesrv.addr, f"http://{server.addr}"
    finally:
        if server is not None:
            await server.stop()
        await namesrv.stop()


async def test_groups_and_producers_span_every_broker_of_a_cluster(two_brokers, consumers, http_factory):
    namesrv, url = two_brokers
    async with Admin(namesrv) as admin:
        await admin.update_topic("Spread", 2, 2)
        await eventually(lambda: _route_brokers(admin, "Spread"), "the topic's route over both brokers")
        for name in ("CG_SPAN_1", "CG_SPAN_3"):
            await admin.update_sub_group(name)
        await admin.scoped(broker="broker-b").update_sub_group("CG_SPAN_2")  # one broker's group only
    http = http_factory(url)
    async with Producer("PG_SPAN", namesrv) as producer:
        member = await consumers(namesrv, "CG_SPAN_1", "Spread")
        await producer.send(Message("Spread", b"warm-up"))
        await eventually(lambda: _lag(http, "CG_SPAN_1", 0, member.bodies), "the warm-up consumed and committed")
        await consumers.stop(member)
        placed = [(await producer.send(Message("Spread", f"m{i}".encode()))).queue.broker_name for i in range(8)]
        assert set(placed) == {"broker-a", "broker-b"}  # the producer spreads sends over both brokers' queues

        names, after = [], ""
        while True:  # a page of one group at a time: each page merges both brokers' first names
            status, data = await http.get_json(f"/api/groups?size=1&q=CG_SPAN&after={after}")
            assert status == 200 and data["errors"] == {}
            names += [(g["group"], g["brokers"], g["lag"]) for g in data["groups"]]
            if data["next"] is None:
                break
            after = data["next"]
        assert names == [("CG_SPAN_1", ["broker-a", "broker-b"], 8), ("CG_SPAN_2", ["broker-b"], 0),
                         ("CG_SPAN_3", ["broker-a", "broker-b"], 0)]
        assert data["totals"] == {"broker-a": 2, "broker-b": 3}

        status, group = await http.get_json("/api/groups/CG_SPAN_1")
        assert status == 200 and group["lag"] == 8
        assert {b["brokerName"]: b["lag"] for b in group["brokers"]} == {
            name: placed.count(name) for name in ("broker-a", "broker-b")}
        assert {q["brokerName"] for q in group["queues"]} == {"broker-a", "broker-b"}

        status, data = await http.get_json("/api/producers?q=PG_SPAN")
        assert status == 200 and [g["group"] for g in data["groups"]] == ["PG_SPAN"]
        [client] = data["groups"][0]["clients"]  # one client, registered with both brokers
        assert client["clientId"] == producer.instance.client_id and client["brokers"] == ["broker-a", "broker-b"]

        await http.page("/groups/CG_SPAN_1")
        async with http.session.post(f"{url}/api/groups/CG_SPAN_1/reset", json={"time": "0", "topic": "Spread"},
                                     headers={"X-CSRF-Token": http.csrf}) as resp:
            reset = await resp.json()
        assert resp.status == 200 and {r["brokerName"] for r in reset["queues"]} == {"broker-a", "broker-b"}
        status, group = await http.get_json("/api/groups/CG_SPAN_1")
        assert group["lag"] == 9  # every message of both brokers again, the warm-up too


async def _route_brokers(admin: Admin, topic: str) -> bool:
    route = await admin.topic_route(topic)
    return {d["brokerName"] for d in route["queueDatas"]} == {"broker-a", "broker-b"}

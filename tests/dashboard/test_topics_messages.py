"""The Topics and Messages pages and their JSON API against a real broker; the issue's flows ("send a message and
find it by key", "delete a topic") in a real headless Chromium."""
from __future__ import annotations

import asyncio
import json
import time
from urllib.parse import quote, urlencode

from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import WebDriverWait

from halfmq.broker.processors import inspect as inspect_processor
from halfmq.client import Message, MessageQueue, Producer, PullConsumer, TopicNotExistError
from halfmq.client.admin import Admin
from halfmq.dashboard.server import DashboardServer
from halfmq.dashboard.settings import DashboardSettings
from halfmq.protocol.message import create_offset_msg_id

from tests.support.cluster import LocalCluster, until


async def _send(namesrv: str, *messages: Message, queue: MessageQueue | None = None):
    async with Producer("PG_DASH_TM", namesrv) as producer:
        return [await producer.send(m, queue) for m in messages]


def _listed(browser) -> list[str]:
    return [r.get_attribute("data-topic") for r in browser.find_elements(By.CSS_SELECTOR, "#topics tr[data-topic]")]


def _find(browser, css: str, timeout: float = 10):
    return WebDriverWait(browser, timeout).until(EC.presence_of_element_located((By.CSS_SELECTOR, css)))


# --- the flows, in a browser ---
async def test_a_message_sent_is_found_by_its_key_and_shown_in_the_browser(dashboard, browser):
    body = {"order": 42, "item": "book"}
    sent, _other = await _send(dashboard.namesrv,
                               Message("DashKeys", json.dumps(body).encode(), keys="order-42",
                                       properties={"region": "eu-west"}),
                               Message("DashKeys", b"another", keys="order-43"))

    def search_and_open():
        browser.get(dashboard.url + "/messages")
        form = browser.find_element(By.ID, "by-key")
        form.find_element(By.NAME, "topic").send_keys("DashKeys")
        form.find_element(By.NAME, "key").send_keys("order-42")
        form.find_element(By.CSS_SELECTOR, "button").click()
        _find(browser, "#messages tbody tr[data-msg-id]")
        rows = browser.find_elements(By.CSS_SELECTOR, "#messages tbody tr[data-msg-id]")
        ids = [r.get_attribute("data-msg-id") for r in rows]
        row_text = rows[0].text
        rows[0].find_element(By.TAG_NAME, "a").click()
        shown = _find(browser, "#body").text
        region = browser.find_element(By.CSS_SELECTOR, '#properties tr[data-property="region"]').text
        browser.find_element(By.CSS_SELECTOR, 'a[data-view="hex"]').click()
        WebDriverWait(browser, 10).until(EC.text_to_be_present_in_element((By.ID, "body"), "7b 22 6f 72"))
        return ids, row_text, shown, region
    ids, row_text, shown, region = await asyncio.to_thread(search_and_open)
    assert ids == [sent.offset_msg_id] and "order-42" in row_text and '{"order": 42' in row_text
    assert json.loads(shown) == body and '\n  "order": 42' in shown  # pretty-printed JSON
    assert "eu-west" in region


async def test_a_topic_created_then_deleted_in_the_browser(dashboard, browser):
    name = "DashDoomed"

    def create_and_list():
        browser.get(dashboard.url + "/topics")
        form = browser.find_element(By.ID, "save-topic")
        form.find_element(By.NAME, "topic").send_keys(name)
        queues = form.find_element(By.NAME, "readQueues")
        queues.clear()
        queues.send_keys("3")
        form.find_element(By.CSS_SELECTOR, "button").click()
        WebDriverWait(browser, 10).until(EC.text_to_be_present_in_element((By.ID, "topic-name"), name))
        queue_rows = len(browser.find_elements(By.CSS_SELECTOR, "table.queues tbody tr"))
        browser.get(dashboard.url + "/topics?contains=Doomed")
        return queue_rows, _listed(browser)
    queue_rows, listed = await asyncio.to_thread(create_and_list)
    assert queue_rows == 3 and listed == [name]

    def delete(accept: bool):
        browser.get(f"{dashboard.url}/topics/{name}")
        browser.find_element(By.CSS_SELECTOR, "#delete-topic button").click()
        alert = WebDriverWait(browser, 10).until(EC.alert_is_present())
        question = alert.text
        if not accept:
            alert.dismiss()
            return question, browser.current_url, ""
        alert.accept()
        flash = _find(browser, "#flash").text
        return question, browser.current_url, flash
    question, url, _ = await asyncio.to_thread(delete, False)
    assert question == f"Delete topic {name} and all its messages?" and url.endswith(f"/topics/{name}")
    async with Admin(dashboard.namesrv) as admin:
        assert (await admin.topic_stats(name))[0]  # a dismissed confirmation deletes nothing

    question, url, flash = await asyncio.to_thread(delete, True)
    assert "/topics?deleted=" in url and flash == f"Topic {name} deleted."
    await asyncio.to_thread(browser.get, dashboard.url + "/topics?contains=Doomed")
    assert await asyncio.to_thread(_listed, browser) == []
    async with Admin(dashboard.namesrv) as admin:
        try:
            await admin.topic_stats(name)
            raise AssertionError("the topic is still there")
        except TopicNotExistError:
            pass


# --- the topics API ---
async def test_api_topics_pages_through_filters_and_counts(dashboard, http_factory, monkeypatch):
    async with Admin(dashboard.namesrv) as admin:
        for i in range(5):
            await admin.update_topic(f"PageT{i}", 4, 4)
    await _send(dashboard.namesrv, *[Message("PageT1", b"x") for _ in range(3)])
    http = http_factory(dashboard.url)
    names, after = [], ""
    for _page in range(4):
        status, data = await http.get_json("/api/topics?" + urlencode({"contains": "PageT", "size": 2, "after": after}))
        assert status == 200
        names += [t["topic"] for t in data["topics"]]
        if data["next"] is None:
            break
        after = data["next"]
    assert names == [f"PageT{i}" for i in range(5)]
    status, data = await http.get_json("/api/topics?contains=PageT1")
    [row] = data["topics"]
    assert row["kind"] == "NORMAL" and row["messages"] == 3 and row["messagesIn"] == 3
    assert row["brokers"][0]["readQueues"] == 4 and row["brokers"][0]["permText"] == "RW"
    assert row["inPerSecond"] is None  # no earlier reading in this session

    # A rate once a second has passed since the first reading, with messages sent in between.
    await _send(dashboard.namesrv, *[Message("PageT1", b"y") for _ in range(2)])
    deadline = time.monotonic() + 10
    while True:
        status, data = await http.get_json("/api/topics?contains=PageT1")
        rate = data["topics"][0]["inPerSecond"]
        if rate is not None or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.2)
    assert rate is not None and 0 < rate <= 2 and data["topics"][0]["messagesIn"] == 5

    # Topics of many queues make shorter pages (at most MAX_TOPIC_PAGE_QUEUES queue rows), never skipping one.
    monkeypatch.setattr(inspect_processor, "MAX_TOPIC_PAGE_QUEUES", 5)  # 4 queues a topic: one topic a page
    pages, after = [], ""
    for _page in range(7):
        status, data = await http.get_json("/api/topics?" + urlencode({"contains": "PageT", "after": after}))
        pages.append([t["topic"] for t in data["topics"]])
        after = data["next"]
        if not after:
            break
    assert pages == [[f"PageT{i}"] for i in range(5)]
    monkeypatch.undo()

    # System topics only when asked for.
    status, data = await http.get_json("/api/topics?size=200")
    assert "TBW102" not in [t["topic"] for t in data["topics"]]
    status, data = await http.get_json("/api/topics?kind=system&size=200")
    assert "TBW102" in [t["topic"] for t in data["topics"]] and {t["kind"] for t in data["topics"]} == {"SYSTEM"}

    for bad in ("size=0", "size=201", "size=many", "kind=bogus", "contains=" + "x" * 200):
        status, data = await http.get_json("/api/topics?" + bad)
        assert status == 400 and data["error"], bad
    status, text = await http.page("/topics?size=0")
    assert status == 400 and "size 0 is outside 1..200" in text


async def test_api_topic_page_shows_each_queue(dashboard, http_factory):
    async with Admin(dashboard.namesrv) as admin:
        await admin.update_topic("DetailT", 2, 2, attributes="+message.type=NORMAL")
    await _send(dashboard.namesrv, Message("DetailT", b"x"), queue=MessageQueue("DetailT", "broker-a", 1))
    http = http_factory(dashboard.url)
    status, data = await http.get_json("/api/topics/DetailT")
    assert status == 200 and data["messages"] == 1
    [broker] = data["brokers"]
    assert broker["messageType"] == "NORMAL" and [q["queueId"] for q in broker["queues"]] == [0, 1]
    q0, q1 = broker["queues"]
    assert (q0["maxOffset"], q0["lastStoreTimestamp"]) == (0, 0)
    assert q1["maxOffset"] == 1 and abs(q1["lastStoreTimestamp"] - time.time() * 1000) < 60_000
    status, text = await http.page("/topics/DetailT")
    assert status == 200 and q1["lastStoreTime"] in text and "message type NORMAL" in text

    status, data = await http.get_json("/api/topics/NoSuchTopic")
    assert status == 404 and "NoSuchTopic" in data["error"]
    status, data = await http.get_json("/api/topics/" + quote("bad name!"))
    assert status == 400 and "not a topic name" in data["error"]
    status, text = await http.page("/topics/NoSuchTopic")
    assert status == 404 and 'id="error"' in text


async def test_api_creates_changes_and_deletes_a_topic(dashboard, http_factory):
    http = http_factory(dashboard.url)
    await http.page("/topics")
    form = {"topic": "ApiT", "readQueues": "2", "writeQueues": "3", "perm": "4", "messageType": "FIFO"}
    status, _body, _ = await http.post("/api/topics", form, csrf=False)
    assert status == 403  # without the CSRF token: refused, nothing created
    status, data = await http.get_json("/api/topics/ApiT")
    assert status == 404

    status, body, _ = await http.post("/api/topics", form)
    assert status == 200 and json.loads(body) == {"topic": "ApiT", "brokers": ["broker-a"]}
    status, data = await http.get_json("/api/topics/ApiT")
    broker = data["brokers"][0]
    assert (broker["readQueues"], broker["writeQueues"], broker["perm"], broker["messageType"]) == (2, 3, 4, "FIFO")

    # A change as JSON (the token in its header), on the one broker named.
    async with http.session.post(dashboard.url + "/api/topics", headers={"X-CSRF-Token": http.csrf}, json={
            "topic": "ApiT", "readQueues": 5, "perm": 6, "messageType": "", "broker": "broker-a"}) as resp:
        assert resp.status == 200
    status, data = await http.get_json("/api/topics/ApiT")
    broker = data["brokers"][0]
    assert (broker["readQueues"], broker["writeQueues"], broker["perm"], broker["messageType"]) == (5, 5, 6, None)

    for bad, word in (({"readQueues": "0"}, "readQueues"), ({"readQueues": "x"}, "readQueues"),
                      ({"perm": "5"}, "perm"), ({"messageType": "BOGUS"}, "messageType"),
                      ({"topic": "bad name"}, "topic"), ({"topic": ""}, "topic"), ({"broker": "broker-z"}, "broker")):
        status, body, _ = await http.post("/api/topics", {**form, **bad})
        assert status == 400 and word in json.loads(body)["error"], bad

    status, _body, _ = await http.post("/api/topics/ApiT/delete", csrf=False)
    assert status == 403
    status, body, _ = await http.post("/api/topics/ApiT/delete")
    assert status == 200 and json.loads(body) == {"deleted": "ApiT"}
    status, data = await http.get_json("/api/topics/ApiT")
    assert status == 404
    status, body, _ = await http.post("/api/topics/ApiT/delete")
    assert status == 404
    status, body, _ = await http.post("/api/topics/" + quote("bad name") + "/delete")
    assert status == 400

    # The pages' forms: a redirect to the topic, and to the list after a deletion.
    status, _body, location = await http.post("/topics", {"topic": "FormT", "readQueues": "1"})
    assert status == 303 and location == "/topics/FormT?saved=1"
    status, _body, location = await http.post("/topics/FormT/delete")
    assert status == 303 and location == "/topics?deleted=FormT"


# --- the messages API ---
async def test_api_messages_browses_a_queue_both_ways_and_searches_store_time(dashboard, http_factory):
    async with Admin(dashboard.namesrv) as admin:
        await admin.update_topic("BrowseT", 1, 1)
    sent = await _send(dashboard.namesrv, *[Message("BrowseT", f"m{i}".encode(), tags=f"t{i}") for i in range(7)])
    http = http_factory(dashboard.url)

    def offsets(data):
        return [m["queueOffset"] for m in data["messages"]]
    status, data = await http.get_json("/api/messages?topic=BrowseT&size=3")
    assert status == 200 and data["mode"] == "browse" and offsets(data) == [4, 5, 6]  # the newest page first
    assert (data["prev"], data["next"], data["minOffset"], data["maxOffset"]) == (1, None, 0, 7)
    assert [m["preview"] for m in data["messages"]] == ["m4", "m5", "m6"] and data["messages"][0]["tags"] == "t4"
    assert data["messages"][2]["offsetMsgId"] == sent[6].offset_msg_id
    status, data = await http.get_json("/api/messages?topic=BrowseT&size=3&offset=1")
    assert offsets(data) == [1, 2, 3] and (data["prev"], data["next"]) == (0, 4)
    status, data = await http.get_json("/api/messages?topic=BrowseT&size=3&offset=0&broker=broker-a&queue=0")
    assert offsets(data) == [0, 1, 2] and data["prev"] is None
    status, text = await http.page("/messages?topic=BrowseT&size=3&offset=1")
    assert status == 200 and 'id="prev"' in text and 'id="next"' in text and text.count("data-msg-id=") == 3

    # Store time: the messages stored in [begin, end], a page at a time.
    status, data = await http.get_json("/api/messages?topic=BrowseT&size=7&offset=0")
    stamps = [m["storeTimestamp"] for m in data["messages"]]
    begin, end = stamps[2], stamps[4]
    want = [i for i, ts in enumerate(stamps) if begin <= ts <= end]
    got, after = [], ""
    for _page in range(8):
        query = {"topic": "BrowseT", "begin": str(begin), "end": str(end), "size": "2"}
        status, data = await http.get_json("/api/messages?" + urlencode({**query, "after": after}))
        assert status == 200 and data["mode"] == "time" and data["total"] == len(want)
        got += offsets(data)
        after = data["next"]
        if not after:
            break
    assert got == want
    iso = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(end / 1000 + 3600))
    status, data = await http.get_json("/api/messages?" + urlencode({"topic": "BrowseT", "begin": iso}))
    assert status == 200 and data["messages"] == [] and data["total"] == 0

    for bad, want_status in (("topic=BrowseT&queue=abc", 400), ("topic=BrowseT&queue=9", 404),
                             ("topic=BrowseT&broker=broker-z", 404), ("topic=BrowseT&size=101", 400),
                             ("topic=BrowseT&begin=5&end=4", 400), ("topic=BrowseT&begin=yesterday", 400),
                             ("topic=BrowseT&begin=1&after=nonsense", 400), ("topic=NoSuchTopic", 404),
                             ("topic=" + quote("bad name"), 400)):
        status, data = await http.get_json("/api/messages?" + bad)
        assert status == want_status and data["error"], bad


async def test_api_message_search_by_key_and_id_and_its_page(dashboard, http_factory):
    async with Admin(dashboard.namesrv) as admin:
        await admin.update_topic("ShowT", 1, 1)
    first, second, binary = await _send(
        dashboard.namesrv, Message("ShowT", b'{"a": [1, 2]}', keys="k-1 shared", properties={"color": "blue"}),
        Message("ShowT", "plain text, é".encode(), keys="shared"), Message("ShowT", b"\xff\x00\xfe", keys="bin"))
    # Two groups: one has consumed past the first message, one has not yet.
    async with PullConsumer("G_DONE", dashboard.namesrv) as done, PullConsumer("G_LATER", dashboard.namesrv) as later:
        queue = MessageQueue("ShowT", "broker-a", 0)
        await done.update_offset(queue, first.queue_offset + 1)
        await later.update_offset(queue, first.queue_offset)
    http = http_factory(dashboard.url)

    status, data = await http.get_json("/api/messages?topic=ShowT&key=shared")
    assert status == 200 and data["mode"] == "key"
    assert [m["offsetMsgId"] for m in data["messages"]] == [second.offset_msg_id, first.offset_msg_id]  # newest first
    status, data = await http.get_json("/api/messages?topic=ShowT&key=nobody")
    assert status == 200 and data["messages"] == []
    status, data = await http.get_json(f"/api/messages?id={first.offset_msg_id}")
    assert status == 200 and [m["msgId"] for m in data["messages"]] == [first.msg_id]

    status, data = await http.get_json(f"/api/messages/{first.offset_msg_id}")
    assert status == 200 and data["topic"] == "ShowT" and data["broker"] == "broker-a"
    assert data["properties"]["color"] == "blue" and data["keys"] == "k-1 shared"
    assert data["body"]["view"] == "json" and data["body"]["views"] == ["json", "text", "hex"]
    assert json.loads(data["body"]["content"]) == {"a": [1, 2]} and "\n" in data["body"]["content"]
    assert {g["group"]: g["state"] for g in data["trace"]["groups"]} == {"G_DONE": "consumed", "G_LATER": "not yet"}
    assert data["deadLetter"] is False and data["resendTopic"] is None
    status, data = await http.get_json(f"/api/messages/{first.offset_msg_id}?view=hex")
    assert data["body"]["content"].startswith("00000000  7b 22 61 22")
    status, data = await http.get_json(f"/api/messages/{second.offset_msg_id}")
    assert data["body"]["view"] == "text" and data["body"]["content"] == "plain text, é"
    status, data = await http.get_json(f"/api/messages/{binary.offset_msg_id}")
    assert data["body"]["view"] == "hex" and data["body"]["views"] == ["hex"]
    status, text = await http.page(f"/messages/{first.offset_msg_id}")
    assert status == 200 and "G_DONE" in text and "consumed" in text and "blue" in text

    unknown = create_offset_msg_id(dashboard.broker.addr, 1 << 40)
    for path, want_status in ((f"/api/messages/{binary.offset_msg_id}?view=json", 400),
                              (f"/api/messages/{first.offset_msg_id}?view=pdf", 400),
                              ("/api/messages/not-an-id", 400), (f"/api/messages/{unknown}", 404),
                              (f"/api/messages/{first.msg_id}", 404),  # a client's msgId names no broker
                              (f"/api/messages?id={unknown}", 404), ("/api/messages?topic=ShowT&key=two%20words", 400),
                              ("/api/messages?topic=NoSuchTopic&key=k", 404)):
        status, data = await http.get_json(path)
        assert status == want_status and data["error"], path
    status, text = await http.page(f"/messages/{unknown}")
    assert status == 404 and "no message" in text


async def test_a_dead_lettered_message_is_resent_to_its_topic(dashboard, http_factory):
    async with Admin(dashboard.namesrv) as admin:
        await admin.update_topic("OrdersT", 1, 1)
    [original] = await _send(dashboard.namesrv, Message("OrdersT", b"refund 7", tags="refund", keys="order-7",
                                                         properties={"attempt": "first"}))
    async with PullConsumer("G_DEAD", dashboard.namesrv) as consumer:
        pulled = await consumer.pull(MessageQueue("OrdersT", "broker-a", 0), 0)
        await consumer.send_back(pulled.messages[0], delay_level=-1)  # straight to the group's dead-letter topic
    http = http_factory(dashboard.url)
    status, data = await http.get_json("/api/messages?" + urlencode({"topic": "%DLQ%G_DEAD", "size": 5}))
    assert status == 200
    [dead] = data["messages"]
    status, data = await http.get_json(f"/api/messages/{dead['offsetMsgId']}")
    assert data["deadLetter"] is True and data["resendTopic"] == "OrdersT"
    status, text = await http.page(f"/messages/{dead['offsetMsgId']}")
    assert 'data-confirm="Send this message again to OrdersT?"' in text

    path = f"/api/messages/{dead['offsetMsgId']}/resend"
    status, _body, _ = await http.post(path, csrf=False)
    assert status == 403
    status, body, _ = await http.post(path)
    assert status == 200
    resent = json.loads(body)
    assert resent["topic"] == "OrdersT" and resent["resentFrom"] == dead["offsetMsgId"]
    status, data = await http.get_json(f"/api/messages/{resent['offsetMsgId']}")
    assert (data["topic"], data["tags"], data["keys"], data["properties"]["attempt"], data["body"]["content"]) == (
        "OrdersT", "refund", "order-7", "first", "refund 7")
    assert data["msgId"] != original.msg_id
    status, data = await http.get_json("/api/messages?topic=OrdersT&key=order-7")
    assert len(data["messages"]) == 2

    status, body, _ = await http.post(f"/api/messages/{original.offset_msg_id}/resend")  # not a dead letter
    assert status == 400 and "not a dead-letter" in json.loads(body)["error"]
    status, body, location = await http.post(f"/messages/{dead['offsetMsgId']}/resend")  # the page's form
    assert status == 303 and location.startswith("/messages/") and "resent=" in location


async def test_with_acl_the_topic_and_message_api_needs_a_signed_in_admin(acl_dashboard_factory, http_factory):
    dash = await acl_dashboard_factory()
    http = http_factory(dash.url)
    await http.page("/login")
    some_id = create_offset_msg_id(dash.broker.addr, 0)
    for path in ("/api/topics", "/api/topics/T", f"/api/messages?id={some_id}", f"/api/messages/{some_id}",
                 "/api/messages?topic=T"):
        status, data = await http.get_json(path)
        assert status == 401, path
    for path in ("/api/topics", "/api/topics/T/delete", f"/api/messages/{some_id}/resend"):
        status, _body, _ = await http.post(path, {"topic": "T"})
        assert status == 401, path
    status, _text, _ = await http.post("/login", {"accessKey": "ops", "secretKey": "ops-secret-1"})
    assert status == 302
    await http.page("/topics")
    status, _body, _ = await http.post("/api/topics", {"topic": "AclT", "readQueues": "1"})
    assert status == 200
    status, data = await http.get_json("/api/topics?contains=AclT")
    assert [t["topic"] for t in data["topics"]] == ["AclT"]
    status, data = await http.get_json("/api/messages?topic=AclT")
    assert status == 200 and data["messages"] == []


async def test_in_a_cluster_pages_merge_every_brokers_topics_and_messages(tmp_path, http_factory):
    """Two brokers with their own name server, the dashboard served apart from them (halfmq dashboard -n)."""
    cluster = await LocalCluster(tmp_path, namesrvs=1, brokers=2, broker_flags=("--dashboardPort=-1",)).start()
    server = DashboardServer(DashboardSettings(namesrv=cluster.namesrv_addr, port=0))
    await server.start()
    try:
        async with Admin(cluster.namesrv_addr) as admin:
            await admin.update_topic("MergeBoth", 2, 2)  # on both brokers
            for name in ("MergeA1", "MergeA2", "MergeA3"):
                await admin.scoped("broker-0").update_topic(name, 1, 1)
            for name in ("MergeB1", "MergeB2"):
                await admin.scoped("broker-1").update_topic(name, 1, 1)

            async def routed():
                return {q["brokerName"] for q in (await admin.topic_route("MergeBoth"))["queueDatas"]} == {
                    "broker-0", "broker-1"}
            await until(routed, 15, "MergeBoth routed to both brokers")
        http = http_factory(f"http://{server.addr}")
        pages, after = [], ""
        for _page in range(6):
            status, data = await http.get_json("/api/topics?" + urlencode({"contains": "Merge", "size": 2,
                                                                           "after": after}))
            assert status == 200
            pages.append([(t["topic"], [b["broker"] for b in t["brokers"]]) for t in data["topics"]])
            after = data["next"]
            if not after:
                break
        listed = [row for page in pages for row in page]
        assert listed == [("MergeA1", ["broker-0"]), ("MergeA2", ["broker-0"]), ("MergeA3", ["broker-0"]),
                          ("MergeB1", ["broker-1"]), ("MergeB2", ["broker-1"]),
                          ("MergeBoth", ["broker-0", "broker-1"])]
        assert all(len(page) <= 2 for page in pages) and data["totals"] == {"broker-0": 4, "broker-1": 3}

        # Messages on both brokers: a key search finds them on each, browsing reads the queue of the one named.
        sent = await _send(cluster.namesrv_addr, *[Message("MergeBoth", f"m{i}".encode(), keys="both")
                                                   for i in range(4)])
        assert {r.queue.broker_name for r in sent} == {"broker-0", "broker-1"}
        status, data = await http.get_json("/api/messages?topic=MergeBoth&key=both")
        assert sorted(m["offsetMsgId"] for m in data["messages"]) == sorted(r.offset_msg_id for r in sent)
        on_b1 = [r for r in sent if r.queue.broker_name == "broker-1"]
        status, data = await http.get_json("/api/messages?" + urlencode({
            "topic": "MergeBoth", "broker": "broker-1", "queue": on_b1[0].queue.queue_id, "offset": 0}))
        assert on_b1[0].offset_msg_id in [m["offsetMsgId"] for m in data["messages"]]
        assert {m["broker"] for m in data["messages"]} == {"broker-1"}
        status, data = await http.get_json(f"/api/messages/{on_b1[0].offset_msg_id}")
        assert data["broker"] == "broker-1" and data["body"]["content"] == f"m{sent.index(on_b1[0])}"
        status, data = await http.get_json("/api/topics/MergeBoth")
        assert [b["broker"] for b in data["brokers"]] == ["broker-0", "broker-1"] and data["messages"] == 4

        # A change on one broker, a deletion everywhere.
        await http.page("/topics")
        status, _body, _ = await http.post("/api/topics", {"topic": "MergeB1", "readQueues": "3", "broker": "broker-1"})
        assert status == 200
        status, data = await http.get_json("/api/topics/MergeB1")
        assert [(b["broker"], b["readQueues"]) for b in data["brokers"]] == [("broker-1", 3)]
        status, _body, _ = await http.post("/api/topics/MergeBoth/delete")
        assert status == 200
        status, data = await http.get_json("/api/topics/MergeBoth")
        assert status == 404
    finally:
        await server.stop()
        await cluster.stop()

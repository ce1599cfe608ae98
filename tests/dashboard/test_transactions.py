"""The Transactions pages against a real broker: pending halves paged and sorted, discarded halves resumed from the
browser, one half's page, the per group figures, and every endpoint's refusals."""
from __future__ import annotations

import asyncio
import time

from selenium.common.exceptions import NoSuchElementException
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import WebDriverWait

from halfmq.broker.processors import inspect as inspect_processor
from halfmq.client import LocalTransactionState, Message, PullConsumer, PullStatus, TransactionProducer
from halfmq.protocol import properties as P
from halfmq.protocol.codes import TransactionResolution
from halfmq.protocol.message import MessageRecord, create_offset_msg_id

HOUR_MS = 3_600_000
GET_ENDPOINTS = ("/api/transactions", "/api/transactions/series", "/api/transactions/discarded",
                 "/api/transactions/groups", "/api/transactions/groups/series",
                 "/api/transactions/half/" + "0" * 32)


class Listener:
    """Answers every check-back with ``answer`` (UNKNOW at first: the producer does not know yet)."""

    def __init__(self):
        self.answer = LocalTransactionState.UNKNOW
        self.checks = 0

    def execute_local_transaction(self, msg, arg):
        return LocalTransactionState.UNKNOW

    async def check_local_transaction(self, msg):
        self.checks += 1
        return self.answer


class GoneProducer:
    """The connection halves came from, as the broker keeps it (weakly) after its producer left."""

    client_id = None


async def prepare(broker, count: int, group: str = "PG_DASH", topic: str = "DashTx") -> list[int]:
    """``count`` pending halves written through the broker's transaction service (one store group): their
    offsets, in store order."""
    completions = [broker.ctx.transactions.prepare(
        MessageRecord(topic, b"x", properties={P.UNIQ_KEY: f"TX{group}{i:06d}", P.PGROUP: group, P.TRAN_MSG: "true"}),
        group, GoneProducer()) for i in range(count)]
    return [result.physical_offset for result, _state in await asyncio.gather(*completions)]


def msg_id(broker, offset: int) -> str:
    return create_offset_msg_id(broker.ctx.store_host, offset)


async def until(predicate, timeout: float = 20.0, what: str = "the condition"):
    """Poll ``predicate`` (a coroutine function) until it returns a true value, or fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = await predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout} s"
        await asyncio.sleep(0.1)


def row_text(browser, url: str, css: str) -> str:
    """The text of the element ``css`` on a fresh load of ``url`` ('' when it is absent)."""
    browser.get(url)
    try:
        return browser.find_element(By.CSS_SELECTOR, css).text
    except NoSuchElementException:
        return ""


async def test_a_half_pending_then_discarded_then_resumed_and_committed_in_a_browser(dashboard_factory, browser):
    dash = await dashboard_factory(transactionTimeOut=200, transactionCheckInterval=200, transactionCheckMax=2)
    # The half's producer leaves before its first check: the half waits for a producer of its group.
    async with TransactionProducer("PG_FLOW", Listener(), dash.namesrv) as gone:
        sent = await gone.send_half(Message("FlowTx", b"flow body"))
    row = f'#pending tr[data-msg-id="{sent.offset_msg_id}"]'
    await asyncio.to_thread(browser.get, dash.url + "/transactions")
    assert sent.transaction_id in await asyncio.to_thread(lambda: browser.find_element(By.CSS_SELECTOR, row).text)
    await until(lambda: asyncio.to_thread(lambda: "waiting for a producer" in row_text(
        browser, dash.url + "/transactions", row + " td.producer")), what="the half waiting for a producer")

    # A producer of the group shows up but cannot tell (UNKNOW): after transactionCheckMax checks it is discarded.
    listener = Listener()
    async with TransactionProducer("PG_FLOW", listener, dash.namesrv):
        discarded_row = f'#discarded tr[data-msg-id="{sent.offset_msg_id}"]'
        text = await until(lambda: asyncio.to_thread(lambda: row_text(browser, dash.url + "/transactions/discarded",
                                                                      discarded_row)), what="the half discarded")
        assert "PG_FLOW" in text and listener.checks >= 1
        checks_before = listener.checks
        text = await asyncio.to_thread(lambda: row_text(browser, dash.url + "/transactions", "#pending tbody"))
        assert sent.offset_msg_id not in text and "No pending half" in text

        # It can tell now: Resume (confirmed) gives the half a new check, answered COMMIT.
        listener.answer = LocalTransactionState.COMMIT_MESSAGE
        await asyncio.to_thread(browser.get, dash.url + "/transactions/discarded")
        button = await asyncio.to_thread(browser.find_element, By.CSS_SELECTOR, discarded_row + " form.resume button")
        await asyncio.to_thread(button.click)
        await asyncio.to_thread(WebDriverWait(browser, 10).until, EC.alert_is_present())
        alert = browser.switch_to.alert
        assert "Resume transaction" in alert.text and "PG_FLOW" in alert.text
        await asyncio.to_thread(alert.accept)
        await asyncio.to_thread(WebDriverWait(browser, 10).until, EC.presence_of_element_located((By.ID, "flash")))
        assert f"/transactions/half/{sent.offset_msg_id}" in browser.current_url
        half_url = dash.url + f"/transactions/half/{sent.offset_msg_id}"
        await until(lambda: asyncio.to_thread(lambda: row_text(browser, half_url, "#half-state") == "COMMITTED"),
                    what="the resumed half committed")
        assert listener.checks > checks_before
    # Committed: its message is readable in its topic.
    async with PullConsumer("CG_FLOW", dash.namesrv) as consumer:
        pulled = await consumer.pull(sent.queue, 0)
    assert pulled.status is PullStatus.FOUND and [m.body for m in pulled.messages] == [b"flow body"]


async def test_pending_halves_are_paged_and_sorted_by_next_check_and_by_age(dashboard_factory, http_factory):
    dash = await dashboard_factory(transactionTimeOut=HOUR_MS)
    offsets = await prepare(dash.broker, 25)
    # One checked sooner than the rest: first by next check, though stored last but one.
    soon = await prepare(dash.broker, 1, group="PG_SOON")
    http = http_factory(dash.url)

    async def every(sort: str) -> list[str]:
        ids, after = [], None
        while True:
            status, data = await http.get_json(f"/api/transactions?size=10&sort={sort}"
                                               + (f"&after={after}" if after else ""))
            assert status == 200 and len(data["halves"]) <= 10 and data["pending"] == 26
            ids += [h["offsetMsgId"] for h in data["halves"]]
            after = data["next"]
            if after is None:
                return ids

    stored = [msg_id(dash.broker, o) for o in offsets + soon]
    assert await every("store") == stored  # oldest first
    assert await every("-store") == stored[::-1]
    by_due = await every("due")
    assert sorted(by_due) == sorted(stored) and len(set(by_due)) == 26
    assert await every("-due") == by_due[::-1]
    # Ages follow store order.
    _status, data = await http.get_json("/api/transactions?size=5&sort=store")
    ages = [h["ageMillis"] for h in data["halves"]]
    assert ages == sorted(ages, reverse=True)
    assert data["brokers"][0]["pending"] == 26 and data["broker"] == "broker-a"
    status, text = await http.page("/transactions?size=5&sort=-store")
    assert status == 200 and text.count('data-msg-id="') == 5 and stored[-1] in text and 'id="next-page"' in text


async def test_discarded_halves_resume_over_the_api_with_its_refusals(dashboard_factory, http_factory):
    dash = await dashboard_factory(transactionTimeOut=HOUR_MS)
    broker = dash.broker
    offsets = await prepare(broker, 5)
    for offset in offsets[1:4]:
        await broker.ctx.transactions.discard(offset, max_checks=0)
    http = http_factory(dash.url)
    status, data = await http.get_json("/api/transactions/discarded?size=2")
    assert status == 200 and [h["offsetMsgId"] for h in data["halves"]] == [msg_id(broker, offsets[3]),
                                                                            msg_id(broker, offsets[2])]
    status, rest = await http.get_json(f"/api/transactions/discarded?size=2&after={data['next']}")
    assert [h["offsetMsgId"] for h in rest["halves"]] == [msg_id(broker, offsets[1])] and rest["next"] is None
    assert all(h["state"] == "DISCARDED" for h in data["halves"] + rest["halves"])

    target = msg_id(broker, offsets[2])
    await http.page("/transactions/discarded")
    status, _body, _ = await http.post(f"/api/transactions/half/{target}/resume", csrf=False)
    assert status == 403
    assert broker.store.get_half(offsets[2]).status.value == "DISCARDED"
    status, body, _ = await http.post(f"/api/transactions/half/{target}/resume")
    assert status == 200, body
    status, half = await http.get_json(f"/api/transactions/half/{target}")
    assert status == 200 and half["record"]["state"] == "PREPARED" and half["record"]["checks"] == 0
    # The form's answer is the half's page, saying so.
    status, _body, location = await http.post(f"/transactions/half/{msg_id(broker, offsets[3])}/resume")
    assert status == 303 and location == f"/transactions/half/{msg_id(broker, offsets[3])}?resumed=1"

    committed = offsets[4]
    state = broker.store.get_half(committed)
    await broker.ctx.transactions.decide(committed, "PG_DASH", state.queue_offset, TransactionResolution.COMMIT,
                                         False)
    status, data, _ = await http.post(f"/api/transactions/half/{msg_id(broker, committed)}/resume")
    assert status == 409 and "COMMITTED" in data
    unknown = msg_id(broker, offsets[4] + 1)  # inside the half's record: no half starts there
    for path in (f"/api/transactions/half/{unknown}/resume", f"/transactions/half/{unknown}/resume"):
        status, data, _ = await http.post(path)
        assert status == 404 and "no half message" in data
    status, data = await http.get_json(f"/api/transactions/half/{unknown}")
    assert status == 404 and "no half message" in data["error"]
    status, data, _ = await http.post("/api/transactions/half/not-an-id/resume")
    assert status == 400 and "offsetMsgId" in data
    status, text = await http.page("/transactions/half/zz")
    assert status == 400 and "offsetMsgId" in text


async def test_a_page_of_discarded_halves_looks_at_a_bounded_part_of_the_table(dashboard_factory, http_factory,
                                                                               monkeypatch):
    dash = await dashboard_factory(transactionTimeOut=HOUR_MS)
    # Each broker request passes over 10 rows at most here: a page of the dashboard (4 requests) over 40.
    monkeypatch.setattr(inspect_processor, "MAX_SCAN", 10)
    offsets = await prepare(dash.broker, 60)
    await dash.broker.ctx.transactions.discard(offsets[45], max_checks=0)
    http = http_factory(dash.url)
    status, first = await http.get_json("/api/transactions/discarded?sort=store")
    assert status == 200 and first["halves"] == [] and first["next"] == str(offsets[39])
    status, text = await http.page("/transactions/discarded?sort=store")
    assert "No discarded half in this part of the table" in text and 'id="next-page"' in text
    status, second = await http.get_json(f"/api/transactions/discarded?sort=store&after={first['next']}")
    assert [h["offsetMsgId"] for h in second["halves"]] == [msg_id(dash.broker, offsets[45])]
    assert second["next"] is None


async def test_per_group_figures_count_how_the_newest_transactions_ended(dashboard_factory, http_factory):
    dash = await dashboard_factory(transactionTimeOut=HOUR_MS)
    broker = dash.broker
    committed = await prepare(broker, 4, group="PG_ONE")
    rolled = await prepare(broker, 2, group="PG_TWO")
    lost = await prepare(broker, 1, group="PG_TWO")
    await prepare(broker, 3, group="PG_THREE")
    for group, offsets, decision in (("PG_ONE", committed, TransactionResolution.COMMIT),
                                     ("PG_TWO", rolled, TransactionResolution.ROLLBACK)):
        for offset in offsets:
            state = broker.store.get_half(offset)
            await broker.ctx.transactions.decide(offset, group, state.queue_offset, decision, False)
    await broker.ctx.transactions.discard(lost[0], max_checks=0)
    http = http_factory(dash.url)
    status, data = await http.get_json("/api/transactions/groups")
    assert status == 200 and data["records"] == 10 and data["complete"] and data["total"] == 3
    figures = {g["group"]: (g["committed"], g["rolledBack"], g["discarded"], g["pending"]) for g in data["groups"]}
    assert figures == {"PG_ONE": (4, 0, 0, 0), "PG_TWO": (0, 2, 1, 0), "PG_THREE": (0, 0, 0, 3)}
    assert [g["group"] for g in data["groups"]] == ["PG_ONE", "PG_TWO", "PG_THREE"]  # most decisions first
    status, page2 = await http.get_json("/api/transactions/groups?size=2&page=2")
    assert [g["group"] for g in page2["groups"]] == ["PG_THREE"]
    status, series = await http.get_json("/api/transactions/groups/series")
    assert status == 200 and sum(v for _t, v in series["PG_ONE"]["committed"]) == 4
    assert sum(v for _t, v in series["PG_TWO"]["rolledBack"]) == 2
    assert sum(v for _t, v in series["PG_TWO"]["discarded"]) == 1 and "PG_THREE" not in series
    status, text = await http.page("/transactions/groups")
    assert status == 200 and 'data-group="PG_TWO"' in text and "Every transaction broker-a keeps (10)" in text


async def test_the_pending_chart_is_fed_from_the_sampled_history(dashboard_factory, http_factory, browser):
    dash = await dashboard_factory(transactionTimeOut=HOUR_MS)
    http = http_factory(dash.url)
    series = await until(lambda: _series(http), what="a sample of the pending halves")
    assert series["broker-a"]["pending"][-1][1] == 0
    await asyncio.to_thread(browser.get, dash.url + "/transactions")
    await asyncio.to_thread(WebDriverWait(browser, 10).until, EC.presence_of_element_located(
        (By.CSS_SELECTOR, '.chart[data-series="pending"] .uplot')))


async def _series(http):
    _status, data = await http.get_json("/api/transactions/series")
    return data if data.get("broker-a", {}).get("pending") else None


async def test_bad_parameters_are_refused_with_a_message(dashboard, http_factory):
    http = http_factory(dashboard.url)
    for path, words in (("/api/transactions?size=0", "size"), ("/api/transactions?size=x", "size"),
                        ("/api/transactions?size=201", "size"), ("/api/transactions?sort=age", "sort"),
                        ("/api/transactions?sort=due&after=12", "cursor"),
                        ("/api/transactions?sort=store&after=1:2", "cursor"),
                        ("/api/transactions?broker=nope", "unknown broker"),
                        ("/api/transactions/discarded?sort=due", "sort"),
                        ("/api/transactions/groups?page=0", "page"),
                        ("/api/transactions/groups/series?broker=nope", "unknown broker"),
                        ("/api/transactions/half/" + "g" * 32, "hex")):
        status, data = await http.get_json(path)
        assert status == 400 and words in data["error"], (path, data)
    status, text = await http.page("/transactions?sort=bogus")
    assert status == 400 and "sort &#39;bogus&#39; is not one of" in text


async def test_with_acl_every_endpoint_wants_a_signed_in_admin(acl_dashboard_factory, http_factory):
    dash = await acl_dashboard_factory()
    http = http_factory(dash.url)
    for path in GET_ENDPOINTS:
        status, data = await http.get_json(path)
        assert status == 401 and "sign in" in data["error"], path
    status, _text = await http.page("/transactions")
    assert status == 302
    await http.page("/login")
    target = "/api/transactions/half/" + "0" * 32 + "/resume"
    status, _body, _ = await http.post(target, csrf=False)
    assert status == 403
    status, body, _ = await http.post(target)
    assert status == 401 and "sign in" in body
    status, _text, _ = await http.post("/login", {"accessKey": "ops", "secretKey": "ops-secret-1"})
    assert status == 302
    status, data = await http.get_json("/api/transactions")
    assert status == 200 and data["pending"] == 0 and data["brokers"][0]["up"]

"""The real RocketMQ C++ client (through its Python wrapper) against a halfmq broker started by the test."""
from __future__ import annotations

import asyncio

import pytest

pytestmark = pytest.mark.interop


def offsets_caught_up(broker, group: str, topic: str):
    """A coroutine function returning once ``group`` has committed every queue of ``topic`` up to its end.

    Wakes on each offset commit (instrumentation around the broker's real offset manager), never polls."""
    manager = broker.ctx.offsets
    changed = asyncio.Event()
    for name in ("commit", "commit_durable"):
        original = getattr(manager, name)

        def wrapper(*a, _original=original):
            result = _original(*a)
            changed.set()
            return result

        setattr(manager, name, wrapper)

    def done() -> bool:
        queues = broker.store.queue_ids(topic)
        return bool(queues) and all(manager.get(group, topic, q) == broker.store.max_offset(topic, q)
                                    for q in queues)

    async def wait():
        while not done():
            changed.clear()
            await changed.wait()

    return wait


def halves_all_decided(broker, count: int):
    """A coroutine function returning once the broker holds ``count`` half messages and none is pending.

    Wakes on each stored half and each applied decision (instrumentation around the broker's real transaction
    states), never polls: the peer must stay alive until then, since the C++ client answers a check only after
    our listener returned. Counting the halves matters: before the peer's first send nothing is pending either."""
    states = broker.ctx.transactions
    changed = asyncio.Event()
    original = states.decide

    def decide(*a, **kw):
        completion = original(*a, **kw)
        completion.add_done_callback(lambda _c: changed.set())
        return completion

    states.decide = decide
    states.on_due.append(lambda _due: changed.set())

    def done() -> bool:
        return sum(1 for _ in broker.store.iter_halves()) >= count and not broker.store.pending_halves_count()

    async def wait():
        while not done():
            changed.clear()
            await changed.wait()

    return wait


def expected(i: int, prefix: str = "") -> dict:
    return {"topic": "InteropTopic", "tags": f"tag{i % 3}", "keys": f"{prefix}key{i}", "body": f"{prefix}body-{i}",
            "idx": str(i), "prefix": prefix}


def without_ids(received: list[dict]) -> list[dict]:
    return sorted(({k: v for k, v in m.items() if k != "id"} for m in received), key=lambda m: int(m["idx"]))


async def test_produce_consume_and_resume_after_restart(broker_factory, run_peer, tmp_path):
    store = tmp_path / "store"
    broker = await broker_factory(store_dir=store)
    sent = await run_peer("produce", {"namesrv": broker.namesrv_addr, "group": "PG_INTEROP",
                                      "topic": "InteropTopic", "count": 200})
    results = [line for line in sent if "i" in line]
    assert len(results) == 200 and all(r["status"] == 0 for r in results)
    assert len({r["msg_id"] for r in results}) == 200

    (first,) = await run_peer("consume", {"namesrv": broker.namesrv_addr, "group": "CG_INTEROP",
                                          "topic": "InteropTopic", "expect": 200, "timeout": 40},
                              until=offsets_caught_up(broker, "CG_INTEROP", "InteropTopic"))
    assert without_ids(first["received"]) == [expected(i) for i in range(200)]
    assert {m["id"] for m in first["received"]} == {r["msg_id"] for r in results}

    await broker.stop()  # offsets the consumer committed are flushed; restart on the same store
    broker = await broker_factory(store_dir=store)
    await run_peer("produce", {"namesrv": broker.namesrv_addr, "group": "PG_INTEROP", "topic": "InteropTopic",
                               "count": 50, "prefix": "new-"})
    (second,) = await run_peer("consume", {"namesrv": broker.namesrv_addr, "group": "CG_INTEROP",
                                           "topic": "InteropTopic", "expect": 50, "timeout": 40})
    assert without_ids(second["received"]) == [expected(i, "new-") for i in range(50)]


PLAN = [{"local": "commit", "check": "rollback"}, {"local": "rollback", "check": "commit"},
        {"local": "unknown", "check": "commit"}, {"local": "unknown", "check": "rollback"},
        {"local": "commit", "check": "rollback"}, {"local": "unknown", "check": "commit"}]


async def test_transactions_commit_rollback_and_check_back(broker_factory, run_peer):
    broker = await broker_factory(transactionTimeOut=1000, transactionCheckInterval=1000)
    (tx,) = await run_peer("tx", {"namesrv": broker.namesrv_addr, "group": "PG_TX_INTEROP", "topic": "InteropTopic",
                                  "plan": PLAN, "timeout": 30},
                          until=halves_all_decided(broker, len(PLAN)))
    assert [s["status"] for s in tx["sent"]] == [0] * len(PLAN)
    unknown = [i for i, p in enumerate(PLAN) if p["local"] == "unknown"]
    first_check = {}
    for check in tx["checks"]:
        first_check.setdefault(check["i"], check["t"])
    assert sorted(first_check) == unknown  # only undecided messages are ever checked
    sent_at = {s["i"]: s["t"] for s in tx["sent"]}
    for i in unknown:
        assert first_check[i] - sent_at[i] < 2.0, (i, first_check[i] - sent_at[i])
    committed = [i for i, p in enumerate(PLAN)
                 if p["local"] == "commit" or p["local"] == "unknown" and p["check"] == "commit"]
    (got,) = await run_peer("consume", {"namesrv": broker.namesrv_addr, "group": "CG_TX_INTEROP",
                                        "topic": "InteropTopic", "expect": len(committed), "timeout": 30,
                                        "quiet": 2.0})
    assert sorted(int(m["idx"]) for m in got["received"]) == committed  # exactly the committed ones, once each
    for i, p in enumerate(PLAN):
        state = [s for off, s in broker.store.iter_halves() if s.uniq == tx["sent"][i]["msg_id"]]
        want = "COMMITTED" if i in committed else "ROLLED_BACK"
        assert [s.status.value for s in state] == [want], (i, p, state)

"""The tests' own 3-member etcd (tests/support/etcd.py): on fresh loopback ports, never etcd's defaults, and its
faults are real: a member killed or paused stops answering, two of three down leave no quorum, and heal brings
all three back."""
from __future__ import annotations

import asyncio
import base64
import os

import aiohttp
import pytest

from halfmq.broker.local_cluster import ETCD_DEFAULT_PORTS as DEFAULT_PORTS

from tests.support.cluster import until

pytestmark = pytest.mark.slow


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


async def put_get(endpoint: str, key: str, value: str) -> str:
    """A put through one member and a linearizable read back: both need etcd's quorum."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3)) as http:
        async with http.post(f"http://{endpoint}/v3/kv/put", json={"key": b64(key), "value": b64(value)}) as put:
            put.raise_for_status()
        async with http.post(f"http://{endpoint}/v3/kv/range", json={"key": b64(key)}) as got:
            got.raise_for_status()
            return base64.b64decode((await got.json())["kvs"][0]["value"]).decode()


async def test_three_members_on_fresh_loopback_ports_share_one_store(etcd):
    assert len(etcd.members) == 3 and all(member.health() for member in etcd.members)
    ports = {port for member in etcd.members for port in (member.client_port, member.peer_port)}
    assert len(ports) == 6 and not ports & DEFAULT_PORTS
    assert all(endpoint.startswith("127.0.0.1:") for endpoint in etcd.endpoints)
    assert await put_get(etcd.endpoints[0], "/test/shared", "one") == "one"
    async with aiohttp.ClientSession() as http:
        async with http.post(f"http://{etcd.endpoints[2]}/v3/kv/range", json={"key": b64("/test/shared")}) as got:
            assert base64.b64decode((await got.json())["kvs"][0]["value"]) == b"one"


async def test_a_killed_member_restarts_on_its_data_and_the_rest_keep_quorum(etcd):
    pid = etcd.members[1].pid
    etcd.kill(1)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert not etcd.members[1].health()
    etcd.wait_healthy([0, 2])  # if it led etcd, the other two elect a leader of their own first
    assert await put_get(etcd.endpoints[0], "/test/while-one-down", "two") == "two"
    etcd.restart(1)
    assert etcd.members[1].pid != pid and etcd.members[1].health()
    assert await put_get(etcd.endpoints[1], "/test/while-one-down", "three") == "three"


async def test_two_paused_members_leave_no_quorum_until_healed(etcd):
    etcd.pause(0)
    etcd.pause(1)
    # A member that led etcd counts itself leader until its election timeout passes without its followers.
    await until(lambda: asyncio.to_thread(lambda: not etcd.members[2].health()), 15, "the lone member unhealthy")
    with pytest.raises((aiohttp.ClientError, TimeoutError)):
        await put_get(etcd.endpoints[2], "/test/no-quorum", "lost")
    etcd.heal()
    assert all(member.health() for member in etcd.members)
    assert etcd.members[etcd.leader_index()].running()
    assert await put_get(etcd.endpoints[2], "/test/no-quorum", "back") == "back"

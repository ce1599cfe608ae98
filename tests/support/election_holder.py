"""A leader in a process of its own, for tests that SIGKILL or SIGSTOP it: it campaigns until it wins, adds the
given members to the in-sync set, prints ``leading <epoch>`` and keeps its lease alive until its stdin closes.
Meanwhile it answers one JSON line per line read: ``status`` (whether it counts itself leader, its epoch) and
``shrink <member>`` (the outcome of removing that member from the in-sync set).

Usage: python -m tests.support.election_holder ENDPOINTS CLUSTER GROUP ID [MEMBER...]
(ENDPOINTS comma-separated ``host:port``; each MEMBER is added to the in-sync set once leading)
"""
from __future__ import annotations

import asyncio
import json
import sys

from halfmq.broker.replication.election import ElectionError, EtcdUnavailable, GroupElection


async def answer(election: GroupElection, line: str) -> dict:
    command, *args = line.split()
    if command == "status":
        return {"leading": election.is_leading(), "epoch": election.epoch}
    if command == "shrink":
        try:
            isr = await election.shrink_isr(args)
        except ElectionError as exc:
            return {"error": type(exc).__name__, "message": str(exc)}
        return {"members": list(isr.members)}
    return {"error": f"unknown command {command!r}"}


async def patiently(call):
    """``await call()``, again while etcd gives no answer in time, as a broker's failover loop does (CI: at the
    suite's start, a lease grant found all three members slower than the election's 1 s request timeout)."""
    while True:
        try:
            return await call()
        except EtcdUnavailable:
            await asyncio.sleep(0.1)


async def main(endpoints: str, cluster: str, group: str, member_id: str, *members: str) -> None:
    async with GroupElection(endpoints.split(","), cluster, group, member_id, f"{member_id}.addr") as election:
        while (epoch := await patiently(election.campaign)) is None:
            await asyncio.sleep(0.05)  # another member leads: try again
        for member in members:
            await patiently(lambda: election.grow_isr(member))
        print(f"leading {epoch}", flush=True)
        loop = asyncio.get_running_loop()
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            print(json.dumps(await answer(election, line)), flush=True)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:]))

"""A leader in a process of its own, for tests that SIGKILL or SIGSTOP it: it campaigns until it wins, adds the
given members to the in-sync set, prints ``leading <epoch>`` and keeps its lease alive until its stdin closes.

Usage: python -m tests.support.election_holder ENDPOINTS CLUSTER GROUP ID [MEMBER...]
(ENDPOINTS comma-separated ``host:port``; each MEMBER is added to the in-sync set once leading)
"""
from __future__ import annotations

import asyncio
import sys

from halfmq.broker.replication.election import GroupElection


async def main(endpoints: str, cluster: str, group: str, member_id: str, *members: str) -> None:
    async with GroupElection(endpoints.split(","), cluster, group, member_id, f"{member_id}.addr") as election:
        while (epoch := await election.campaign()) is None:
            await asyncio.sleep(0.05)  # another member leads: try again
        for member in members:
            await election.grow_isr(member)
        print(f"leading {epoch}", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:]))

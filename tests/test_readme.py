"""The README's runnable transaction example works as written against a real broker."""
from __future__ import annotations

import asyncio
import os
import re
import sqlite3
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


async def test_database_transaction_example_runs(broker, tmp_path):
    (example,) = [b for b in python_blocks() if "producer.transaction(" in b and "asyncio.run" in b]
    script = tmp_path / "example.py"
    script.write_text(example)
    published = asyncio.Event()
    broker.store.add_arrival_listener(lambda topic, q, m: published.set() if topic == "OrderEvents" else None)
    proc = await asyncio.create_subprocess_exec(sys.executable, str(script), cwd=tmp_path,
                                                env={**os.environ, "NAMESRV_ADDR": broker.namesrv_addr},
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    assert b"committed order and message" in out
    assert sqlite3.connect(tmp_path / "shop.db").execute("SELECT item FROM orders").fetchall() == [("book",)]
    await asyncio.wait_for(published.wait(), 10)  # END_TRANSACTION is oneway: wait for the commit to land
    assert [s.status.value for _o, s in broker.store.iter_halves()] == ["COMMITTED"]

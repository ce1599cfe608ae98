"""A committed half is stored once (store/committed.py) and still reads as the copy d4f4493 stored: the check-back,
the pull, the view by id and the query by key of committed halves — one committed by its check-back, one by its
producer, a batch half's two messages — are the records d4f4493 serves, save offsets, ids, timestamps and hosts
(golden/committed_records.json, written by committed_scenario.py run with d4f4493)."""
from __future__ import annotations

import json
from pathlib import Path

from .committed_scenario import scenario, with_broker

GOLDEN = Path(__file__).parent / "golden" / "committed_records.json"


async def test_committed_halves_read_as_the_copies_d4f4493_stored():
    expected = json.loads(GOLDEN.read_text())
    served = json.loads(json.dumps(await with_broker(scenario)))  # the golden file's form (tuples → lists)
    assert served["lossless"], "a record read does not re-encode to its bytes: comparing fields would miss a change"
    for kind in ("check", "pull", "view", "query"):
        assert served[kind] == expected[kind], kind

"""The broker process's cyclic garbage collector, once started (broker/cli.py, settle_garbage_collector)."""
from __future__ import annotations

import gc
import time

from halfmq.broker.cli import settle_garbage_collector


def test_a_started_broker_does_not_walk_its_long_lived_objects_again():
    thresholds = gc.get_threshold()
    kept = [[i] for i in range(500_000)]  # what a started broker holds for its life (tables, caches, modules)
    try:
        settle_garbage_collector()
        started = time.perf_counter()
        gc.collect()
        full = time.perf_counter() - started
        assert gc.get_freeze_count() >= len(kept)
        assert gc.get_threshold()[0] >= 10_000  # a request's objects die by reference count before a collection
        assert full < 0.005, f"a full collection took {full * 1000:.1f} ms: it walked what the broker keeps"
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)
        del kept

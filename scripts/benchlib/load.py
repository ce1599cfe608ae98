"""Putting load on and timing it: latency statistics, a loop of requests kept in flight, progress lines."""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from .results import Results


def percentile(values: list[float], p: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


@dataclass
class Stats:
    name: str
    latencies: list[float] = field(default_factory=list)
    window: list[float] = field(default_factory=list)
    count: int = 0
    errors: int = 0
    started: float = field(default_factory=time.perf_counter)
    finished: float | None = None  #: end of the measured load; what follows (waiting out checks) is not timed

    def record(self, seconds: float) -> None:
        self.count += 1
        self.latencies.append(seconds)
        self.window.append(seconds)

    def report(self, interval: float) -> None:
        w, self.window = self.window, []
        print(f"[{self.name}] tps={len(w) / interval:,.0f} p50_ms={percentile(w, 50) * 1000:.2f} "
              f"p99_ms={percentile(w, 99) * 1000:.2f} max_ms={max(w, default=0) * 1000:.2f} errors={self.errors}",
              flush=True)

    def figures(self) -> dict[str, tuple[float, str]]:
        """The run's throughput, count, errors and latency percentiles, as ``Results.add_all`` takes them."""
        elapsed = (self.finished or time.perf_counter()) - self.started
        return {"tps": (self.count / elapsed, "msg/s"), "count": (self.count, "msg"), "errors": (self.errors, ""),
                "p50_ms": (percentile(self.latencies, 50) * 1000, "ms"),
                "p99_ms": (percentile(self.latencies, 99) * 1000, "ms"),
                "max_ms": (max(self.latencies, default=0) * 1000, "ms")}

    def summary(self, results: Results, extra: dict[str, tuple] | None = None, **params) -> float:
        """Records the run's figures (and ``extra`` ones) under ``params``; returns its TPS."""
        figures = self.figures()
        results.add_all({**figures, **(extra or {})}, mode=self.name, **params)
        return figures["tps"][0]


async def reporter(stats: Stats, stop: asyncio.Event, every: float = 3.0) -> None:
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), every)
        except asyncio.TimeoutError:
            stats.report(every)


async def timed_loop(inflight: int, duration: float, op, stats: Stats) -> None:
    deadline = time.perf_counter() + duration

    async def worker():
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            try:
                await op()
            except Exception as exc:  # noqa: BLE001 - counted and reported
                stats.errors += 1
                if stats.errors < 5:
                    print(f"error: {exc!r}", flush=True)
                continue
            stats.record(time.perf_counter() - t0)

    stop = asyncio.Event()
    rep = asyncio.get_running_loop().create_task(reporter(stats, stop))
    try:
        await asyncio.gather(*(worker() for _ in range(inflight)))
    finally:  # also when interrupted: the reporter ends with the load
        stats.finished = time.perf_counter()
        stop.set()
        await rep


async def progress(label: str, done, total: int | None = None, every: float = 1.0) -> None:
    """Print ``done()`` every ``every`` seconds until cancelled: live progress of a long phase."""
    started = last_time = time.perf_counter()
    last = 0
    while True:
        await asyncio.sleep(every)
        now, count = time.perf_counter(), done()
        of = f"/{total:,}" if total else ""
        print(f"[{label}] {count:,}{of} messages in {now - started:.0f} s ({(count - last) / (now - last_time):,.0f}/s)",
              flush=True)
        last, last_time = count, now


class Progress:
    """``async with Progress(label, done, total):`` prints progress while the block runs."""

    def __init__(self, label: str, done, total: int | None = None):
        self.args = (label, done, total)
        self.task: asyncio.Task | None = None

    async def __aenter__(self):
        self.task = asyncio.get_running_loop().create_task(progress(*self.args))
        return self

    async def __aexit__(self, *exc):
        self.task.cancel()
        try:
            await self.task
        except asyncio.CancelledError:
            pass

"""The figures charts show over time, sampled every ``sample_interval_s`` from the brokers (their runtime info, and
the consume progress of the groups someone is looking at), kept in bounded ring buffers.

Sampling costs one GET_BROKER_RUNTIME_INFO per broker per interval, plus one GET_CONSUME_STATS per watched group and
broker: a group is watched for WATCH_S after its page or API was last read, so a thousand groups nobody looks at
cost nothing."""
from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import Callable

from halfmq.client.admin import Admin

from .settings import DashboardSettings

log = logging.getLogger(__name__)
WATCH_S = 600.0
MAX_WATCHED_GROUPS = 50  #: groups sampled at once; the least recently viewed one stops first


class History:
    def __init__(self, settings: DashboardSettings):
        self.settings = settings
        #: series name → (unix ms, value) samples, oldest first
        self.series: dict[str, deque] = {}
        self.watched: dict[str, float] = {}  # group → until (monotonic)
        self._last_totals: dict[str, tuple[float, dict[str, int]]] = {}
        self._task: asyncio.Task | None = None
        self._stop = asyncio.Event()
        self._admin: Callable[[], Admin | None] = lambda: None

    def start(self, admin: Admin, signed: Callable[[], Admin | None] | None = None) -> None:
        """Samples with ``admin``, or (ACL on) with ``signed()``: the admin client of a signed-in account."""
        self._admin = signed if signed is not None else (lambda: admin)
        self._task = asyncio.get_running_loop().create_task(self._run(), name="dashboard-history")

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)

    def watch(self, group: str) -> None:
        self.watched[group] = time.monotonic() + WATCH_S
        if len(self.watched) > MAX_WATCHED_GROUPS:
            del self.watched[min(self.watched, key=self.watched.get)]

    def add(self, name: str, value: float, at_ms: int | None = None) -> None:
        samples = self.series.get(name)
        if samples is None:
            samples = self.series[name] = deque(maxlen=self.settings.history_samples)
        samples.append((at_ms if at_ms is not None else int(time.time() * 1000), value))

    def get(self, name: str) -> list[tuple[int, float]]:
        return list(self.series.get(name, ()))

    def broker_series(self, kinds: tuple[str, ...]) -> dict[str, dict[str, list[tuple[int, float]]]]:
        """{broker: {kind: samples}} for every broker sampled so far: the shape the pages' charts draw."""
        brokers = sorted({name.split(":")[1] for name in self.series if name.startswith("broker:")})
        return {b: {kind: self.get(f"broker:{b}:{kind}") for kind in kinds} for b in brokers}

    async def _run(self) -> None:
        while not self._stop.is_set():
            admin = self._admin()
            if admin is not None:
                try:
                    await self.sample(admin)
                except Exception as exc:  # noqa: BLE001 - a broker down must not end the sampling
                    log.debug("dashboard sample failed: %s", exc)
            try:
                await asyncio.wait_for(self._stop.wait(), self.settings.sample_interval_s)
            except asyncio.TimeoutError:
                pass

    async def sample(self, admin: Admin) -> None:
        now_ms = int(time.time() * 1000)
        brokers = await admin.masters()
        tables = await asyncio.gather(*(admin.broker_status(b.addr) for b in brokers), return_exceptions=True)
        for broker, table in zip(brokers, tables):
            if isinstance(table, BaseException):
                continue
            self._rates(broker.name, now_ms, table)
            self.add(f"broker:{broker.name}:pending", float(table.get("pendingHalfMessages", 0)), now_ms)
        now = time.monotonic()
        for group in [g for g, until in self.watched.items() if until < now]:
            del self.watched[group]
        for group in list(self.watched):
            try:
                rows = await admin.consumer_progress(group)
            except Exception:  # noqa: BLE001 - a group that went away: no sample
                continue
            lag = sum(max(0, int(r["diff"])) for r in rows)
            self.add(f"group:{group}:lag", float(lag), now_ms)

    def _rates(self, broker: str, now_ms: int, table: dict) -> None:
        """Per-second rates from the broker's running totals (a restart resets them: that sample is skipped)."""
        totals = {key: int(table.get(key, 0)) for key in ("messagesPutTotal", "messagesGotTotal", "checkBacksSent")}
        last = self._last_totals.get(broker)
        self._last_totals[broker] = (now_ms, totals)
        if last is None:
            return
        seconds = (now_ms - last[0]) / 1000
        if seconds <= 0:
            return
        for key, name in (("messagesPutTotal", "sends"), ("messagesGotTotal", "pulls"), ("checkBacksSent", "checks")):
            delta = totals[key] - last[1][key]
            if delta >= 0:
                self.add(f"broker:{broker}:{name}", delta / seconds, now_ms)

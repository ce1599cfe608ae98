"""The services only a broker group's leader runs: transaction check-backs, delay-level and timer delivery,
retention. Their effects are writes, which reach a follower through the replication stream; so a follower runs
none of them, and a broker that starts leading starts them exactly as after a restart: fresh instances reading
the store as it is (pending halves from the due index, delivery progress, timers)."""
from __future__ import annotations

from .check_back import CheckBackService
from .retention import RetentionService
from .schedule import ScheduleService
from .timers import TimerService


class LeaderServices:
    """Started when the broker leads (at start, or when it takes over), stopped when it stops or follows."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.running = False

    def build(self) -> None:
        """Fresh instances in the context: services read them there at call time (a follower's stay unstarted,
        and refuse nothing themselves: the store refuses their writes)."""
        ctx = self.ctx
        ctx.schedule = ScheduleService(ctx)
        ctx.timers = TimerService(ctx)
        ctx.check_back = CheckBackService(ctx, ctx.transactions)
        ctx.retention = RetentionService(ctx)

    def start(self) -> None:
        ctx = self.ctx
        ctx.store.add_arrival_listener(ctx.schedule.on_arrival)
        ctx.schedule.start()
        ctx.timers.start()
        ctx.check_back.start()
        ctx.retention.start()
        self.running = True

    async def stop(self) -> None:
        """Stop them (reverse order) and leave fresh, unstarted instances behind."""
        if not self.running:
            return
        ctx = self.ctx
        self.running = False
        await ctx.retention.stop()
        await ctx.check_back.stop()
        await ctx.timers.stop()
        await ctx.schedule.stop()
        ctx.store.remove_arrival_listener(ctx.schedule.on_arrival)
        self.build()

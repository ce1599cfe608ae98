"""The transaction state machine of a half message: its states, the events that move it, and the one table of
transitions. The store's transaction ops (store/txops.py) ask ``transition`` before they change a half; nothing
else decides whether a transition is allowed.

What each event is:

- PREPARE: a send stored the half (TRAN_MSG=true), from either protocol.
- COMMIT, ROLLBACK: a producer's decision (END_TRANSACTION over remoting, EndTransaction over gRPC), from its
  local transaction or from a check-back. A repeated decision is acknowledged without effect; the first durable
  decision wins, so a commit after a rollback (or a discard) is refused.
- CHECK_SENT: a check-back was written to a producer that reads; the half's check count goes up.
- NO_PRODUCER: the check-back found no producer of the group that reads; the half waits for one (any sign of life
  of the group: a heartbeat, a half sent) and is tried again every transactionCheckInterval meanwhile.
- PRODUCER_SEEN: a producer of the group showed up: a waiting half is due at once.
- DISCARD: the half used up transactionCheckMax checks, or no producer answered it for fileReservedTime; it moves
  to TRANS_CHECK_MAX_TIME_TOPIC and stays resumable.
- RESUME: an operator gives a discarded (or pending) half a fresh set of checks.
- RESTART: the broker started again; every state is kept as stored (halves are durable; what was in memory, the
  check in flight, is forgotten, and a pending half is checked again when it is due).
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class HalfStatus(str, Enum):
    PREPARED = "PREPARED"
    COMMITTED = "COMMITTED"
    ROLLED_BACK = "ROLLED_BACK"
    DISCARDED = "DISCARDED"


class Event(Enum):
    PREPARE = "prepare"
    COMMIT = "commit"
    ROLLBACK = "rollback"
    CHECK_SENT = "check sent"
    NO_PRODUCER = "no producer"
    PRODUCER_SEEN = "producer seen"
    DISCARD = "discard"
    RESUME = "resume"
    RESTART = "restart"


class Decider(str, Enum):
    """Who decided a half (HalfState.decided_by, stored by value)."""

    PRODUCER = "producer"
    CHECK = "check"
    DISCARD = "discard"


class Effect(Enum):
    APPLY = "apply"        #: the transition happens (it may leave the status as it is: a check, a resume)
    REPEAT = "repeat"      #: a repeated decision: acknowledged, nothing written
    REFUSE = "refuse"      #: not allowed from this state: HalfConflictError


@dataclass(frozen=True)
class Transition:
    effect: Effect
    to: HalfStatus | None   #: the status after it (None for REFUSE)


P, C, R, D = HalfStatus.PREPARED, HalfStatus.COMMITTED, HalfStatus.ROLLED_BACK, HalfStatus.DISCARDED
_APPLY, _REPEAT = Effect.APPLY, Effect.REPEAT
_REFUSED = Transition(Effect.REFUSE, None)

#: (status before, event) → transition; None as the status before: no half yet. A pair not listed is refused.
TABLE: dict[tuple[HalfStatus | None, Event], Transition] = {
    (None, Event.PREPARE): Transition(_APPLY, P),
    (P, Event.COMMIT): Transition(_APPLY, C),
    (P, Event.ROLLBACK): Transition(_APPLY, R),
    (P, Event.CHECK_SENT): Transition(_APPLY, P),
    (P, Event.NO_PRODUCER): Transition(_APPLY, P),
    (P, Event.PRODUCER_SEEN): Transition(_APPLY, P),
    (P, Event.DISCARD): Transition(_APPLY, D),
    (P, Event.RESUME): Transition(_APPLY, P),
    (C, Event.COMMIT): Transition(_REPEAT, C),
    (R, Event.ROLLBACK): Transition(_REPEAT, R),
    (D, Event.ROLLBACK): Transition(_APPLY, R),   # an operator's or a late producer's rollback settles it
    (D, Event.RESUME): Transition(_APPLY, P),
    **{(status, Event.RESTART): Transition(_APPLY, status) for status in HalfStatus},
}


def transition(status: HalfStatus | None, event: Event) -> Transition:
    """The transition ``event`` makes from ``status`` (REFUSE for a pair the table does not list)."""
    return TABLE.get((status, event), _REFUSED)


def table_markdown() -> str:
    """The table as docs/ARCHITECTURE.md shows it (a test keeps the two equal)."""
    lines = ["| state | event | effect | next state |", "|---|---|---|---|"]
    for (status, event), move in TABLE.items():
        lines.append(f"| {status.value if status else '—'} | {event.value} | {move.effect.value} | "
                     f"{move.to.value if move.to else '—'} |")
    lines.append("| any other | any other | refuse | — |")
    return "\n".join(lines)

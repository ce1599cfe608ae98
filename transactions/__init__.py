"""The transaction state machine of half messages (machine.py), shared by the store, which applies transitions in
its write transactions, and the broker, which drives them for both protocols."""
from .machine import TABLE, Decider, Effect, Event, HalfStatus, Transition, table_markdown, transition

__all__ = ["TABLE", "Decider", "Effect", "Event", "HalfStatus", "Transition", "table_markdown", "transition"]

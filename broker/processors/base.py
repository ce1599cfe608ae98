"""What the remoting processors share: each handler says which request codes it serves (``handles``), and
``Processor.register`` hands every such handler to the dispatcher."""
from __future__ import annotations

from typing import Callable


def handles(*codes: int) -> Callable:
    """Mark a processor method as the handler of the request ``codes``."""
    def mark(handler: Callable) -> Callable:
        handler.request_codes = codes
        return handler

    return mark


class Processor:
    """A remoting processor over the broker's context: ``register`` registers each method marked with ``handles``."""

    def __init__(self, ctx):
        self.ctx = ctx

    def register(self, dispatcher) -> None:
        for name in dir(type(self)):
            for code in getattr(getattr(type(self), name), "request_codes", ()):
                dispatcher.register(code, getattr(self, name))

"""What a connection or a client repeats (request headers, call metadata), remembered as read, within bounds."""
from __future__ import annotations


def remember(table: dict, key, value, pairs, entries: int, max_bytes: int) -> None:
    """Keep ``value`` under ``key`` when ``pairs``, the (name, value) pairs the key is made of, hold at most
    ``max_bytes``; a table of ``entries`` is emptied first, so a client sending ever new ones costs no memory."""
    if sum(len(name) + len(item) for name, item in pairs) <= max_bytes:
        if len(table) >= entries:
            table.clear()
        table[key] = value

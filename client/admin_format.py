"""How ``halfmq admin`` shows results: aligned tables of plain values (never a Python repr), key/value lists, and
the commands whose answers nest (topicRoute, consumerConnection) as one table per part."""
from __future__ import annotations

import codecs
import json
import time

from .message import MessageExt


def message_row(m: MessageExt, charset: str | None = "utf-8") -> dict:
    """A message as the admin commands show it (``charset`` None: without the body)."""
    row = {"msgId": m.msg_id, "offsetMsgId": m.offset_msg_id, "topic": m.topic, "queueId": m.queue_id,
           "queueOffset": m.queue_offset, "tags": m.tags, "keys": m.keys,
           "storeTime": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(m.store_timestamp / 1000))
           + f".{m.store_timestamp % 1000:03d}", "storeTimestamp": m.store_timestamp, "bodySize": len(m.body)}
    if charset is not None:
        row["body"] = m.body.decode(codecs.lookup(charset).name, "replace")
    return row


def cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"))
    # One row a line: a body's line breaks and tabs are shown escaped.
    return str(value).replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")


def table(rows: list[dict]) -> str:
    if not rows:
        return "(none)"
    columns = list(dict.fromkeys(k for row in rows for k in row))
    cells = [[cell(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines)


def pairs(values: dict) -> str:
    width = max((len(k) for k in values), default=0)
    return "\n".join(f"{k:<{width}}  {cell(v)}" for k, v in values.items())


def sections(parts: dict[str, list[dict] | dict]) -> str:
    return "\n\n".join(f"{title}\n{table(rows) if isinstance(rows, list) else pairs(rows)}"
                       for title, rows in parts.items())


def _topic_route(route: dict) -> str:
    brokers = [{"brokerName": b["brokerName"], "cluster": b.get("cluster"), "brokerId": bid, "addr": addr}
               for b in route.get("brokerDatas", []) for bid, addr in sorted(b.get("brokerAddrs", {}).items())]
    return sections({"brokers": brokers, "queues": route.get("queueDatas", [])})


def _consumer_connection(data: dict) -> str:
    return sections({"connections": data.get("connectionSet", []),
                     "subscriptions": list(data.get("subscriptionTable", {}).values()),
                     "group": {k: v for k, v in data.items() if k not in ("connectionSet", "subscriptionTable")}})


def _messages(rows: list[dict]) -> str:
    """One key/value block per message, as mqadmin shows a queried message (the body in full)."""
    return "\n\n".join(pairs(row) for row in rows) if rows else "(none)"


def _per_broker(tables: list[dict] | dict) -> str:
    """One key/value block per broker, each led by the broker's name and address (a lone broker's: one)."""
    return pairs(tables) if isinstance(tables, dict) else "\n\n".join(pairs(t) for t in tables)


_SPECIAL = {"topicRoute": _topic_route, "consumerConnection": _consumer_connection,
            "queryMsgById": _messages, "queryMsgByUniqueKey": _messages, "queryMsgByOffset": _messages,
            "brokerStatus": _per_broker, "getBrokerConfig": _per_broker,
            "deleteExpiredCommitLog": _per_broker}


def render(command: str, result) -> str:
    special = _SPECIAL.get(command)
    if special is not None:
        return special(result)
    return pairs(result) if isinstance(result, dict) else table(result)

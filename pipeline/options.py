"""Options of the "halfmq" Spark source and sink: which each side accepts, and the checks they share."""
from __future__ import annotations


class OptionError(ValueError):
    """A data source option is missing or malformed; the message names it."""


#: The options each side understands (Spark hands them over lower-cased; these are their documented spellings).
SOURCE_OPTIONS = ("namesrv", "subscribe", "subscribePattern", "assign", "startingOffsets", "endingOffsets",
                  "startingOffsetsByTimestamp", "endingOffsetsByTimestamp", "startingTimestamp", "endingTimestamp",
                  "maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay", "minPartitions",
                  "failOnDataLoss", "kafkaConsumer.pollTimeoutMs", "tags")
SINK_OPTIONS = ("namesrv", "topic", "producerGroup", "sinkId", "checkImmunitySeconds", "rowsPerHalf")
#: Options Spark itself may pass to any data source (a load/save path, a streaming sink's checkpoint).
SPARK_OPTIONS = ("path", "checkpointLocation")


def parse_options(raw, supported: tuple[str, ...], side: str) -> dict[str, str]:
    """The options lower-cased; an option this side does not know is refused, naming it and the known ones."""
    options = {str(k).lower(): str(v) for k, v in raw.items()}
    known = {name.lower() for name in supported + SPARK_OPTIONS}
    unknown = sorted(k for k in options if k not in known)
    if unknown:
        raise OptionError(f"unknown {side} option{'s' if len(unknown) > 1 else ''} "
                          f"{', '.join(repr(k) for k in unknown)}; the halfmq {side} supports: "
                          f"{', '.join(supported)}")
    return options


def namesrv_option(options: dict[str, str]) -> str:
    if not options.get("namesrv"):
        raise OptionError("option 'namesrv' (the name server address, host:port) is required")
    return options["namesrv"]

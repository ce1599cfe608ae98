"""Store errors; each carries the response code a broker answers with."""

SYSTEM_ERROR = 1
SERVICE_NOT_AVAILABLE = 14


class StoreError(Exception):
    code = SYSTEM_ERROR


class StoreFullError(StoreError):
    """The LMDB map is full: nothing of the failed group was written."""

    code = SERVICE_NOT_AVAILABLE


class StoreClosedError(StoreError):
    code = SERVICE_NOT_AVAILABLE

"""Errors a processor raises to answer a request with a specific response code and remark."""
from halfmq.protocol.codes import ResponseCode


class BrokerError(Exception):
    def __init__(self, code: int, remark: str):
        super().__init__(remark)
        self.code = code
        self.remark = remark


def system_error(remark: str) -> BrokerError:
    return BrokerError(ResponseCode.SYSTEM_ERROR, remark)

"""halfmq's Python client: producers, transactional producers and consumers for RocketMQ 4.x brokers."""
from .blocking import BlockingProducer, BlockingPullConsumer
from .consumer import PullConsumer, PullResult, PullStatus
from .errors import (AddressError, BrokerError, ClientError, ConnectionClosedError, IllegalOperationError,
                     MessageIllegalError, MessageTooLargeError, NoPermissionError, RequestTimeoutError,
                     TopicNotExistError)
from .message import Message, MessageExt, MessageQueue, SendResult, SendStatus
from .producer import Producer
from .push import ConsumeFrom, ConsumeStatus, PushConsumer
from .remoting import Credentials
from .transaction import (LocalTransactionState, LogCheckListener, TransactionListener, TransactionLog,
                          TransactionProducer, TransactionSendResult)

__all__ = ["Credentials", "BlockingProducer", "BlockingPullConsumer", "Producer", "TransactionProducer", "TransactionListener", "LocalTransactionState",
           "TransactionSendResult", "TransactionLog", "LogCheckListener", "PullConsumer", "PullResult", "PullStatus",
           "PushConsumer", "ConsumeStatus", "ConsumeFrom", "Message", "MessageExt", "MessageQueue", "SendResult",
           "SendStatus", "ClientError", "BrokerError", "ConnectionClosedError", "RequestTimeoutError",
           "TopicNotExistError", "NoPermissionError", "MessageIllegalError", "IllegalOperationError",
           "MessageTooLargeError", "AddressError"]

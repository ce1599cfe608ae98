"""Producer: send, send_oneway and send_batch with retries over the route's queues."""
from __future__ import annotations

import itertools
import logging
import random
import ssl
import time

from halfmq.protocol import properties as P
from halfmq.protocol.codes import RequestCode, ResponseCode
from halfmq.protocol.headers import SendMessageRequestHeaderV2
from halfmq.protocol.message import BatchItem, UniqKeyGenerator, encode_batch
from halfmq.protocol.properties import encode_properties

from .errors import ClientError, MessageTooLargeError, error_for
from .instance import ClientInstance, Startable
from .message import Message, MessageQueue, SendResult, SendStatus
from .remoting import Credentials

log = logging.getLogger(__name__)
_RETRYABLE = {ResponseCode.TOPIC_NOT_EXIST, ResponseCode.SERVICE_NOT_AVAILABLE, ResponseCode.SYSTEM_ERROR,
              ResponseCode.NO_PERMISSION, ResponseCode.SYSTEM_BUSY}
_STATUS = {ResponseCode.SUCCESS: SendStatus.SEND_OK, ResponseCode.FLUSH_DISK_TIMEOUT: SendStatus.FLUSH_DISK_TIMEOUT,
           ResponseCode.FLUSH_SLAVE_TIMEOUT: SendStatus.FLUSH_SLAVE_TIMEOUT,
           ResponseCode.SLAVE_NOT_AVAILABLE: SendStatus.SLAVE_NOT_AVAILABLE}
# SEND_MESSAGE_V2's wire keys, taken from SendMessageRequestHeaderV2 (the definition the broker decodes and checks
# access by). Producer._header builds the extFields as a dict literal with these keys rather than through
# SendMessageRequestHeaderV2(...).to_ext(): python -m timeit measured 3.0 us a header through the class against
# 0.53 us for the literal, ~5% of a send at bench.py send's ~20k sends/s. tests/client checks that the literal
# is exactly what the class renders.
(_K_GROUP, _K_TOPIC, _K_DEFAULT_TOPIC, _K_QUEUE_NUMS, _K_QUEUE_ID, _K_SYS_FLAG, _K_BORN, _K_FLAG, _K_PROPERTIES,
 _K_RECONSUME, _K_UNIT_MODE, _K_BATCH) = map(SendMessageRequestHeaderV2.wire_key, (
    "producerGroup", "topic", "defaultTopic", "defaultTopicQueueNums", "queueId", "sysFlag", "bornTimestamp", "flag",
    "properties", "reconsumeTimes", "unitMode", "batch"))


BROKER_ISOLATION_S = 5.0  #: how long sends avoid a broker that failed one (it gets a new try after)
DEFAULT_MAX_MESSAGE_SIZE = 4 << 20  #: the broker's default maxMessageSize, and RocketMQ producers' maxMessageSize


class Producer(Startable):
    """An asyncio producer.

    Args:
        group: producer group.
        namesrv: name server address(es), "host:port;host:port".
        retry_times: extra attempts on another queue after a failed send.
        send_timeout: seconds per attempt.
        auto_create: fall back to the TBW102 route for topics the name server does not know (the broker then
            creates them).
        max_message_size: largest body sent, bytes (a batch: its whole body); larger ones are refused here with
            MessageTooLargeError, as RocketMQ's producers do. 4 MiB, the broker's default maxMessageSize: raise
            both together.

    Use as ``async with Producer("PG", "127.0.0.1:9876") as producer: await producer.send(Message(...))``.
    """

    def __init__(self, group: str, namesrv: str, retry_times: int = 2, send_timeout: float = 3.0,
                 auto_create: bool = True, client_ip: str = "127.0.0.1", credentials: Credentials | None = None,
                 tls: ssl.SSLContext | None = None, max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE):
        self.group = group
        self.max_message_size = max_message_size
        self.retry_times = retry_times
        self.send_timeout = send_timeout
        self.auto_create = auto_create
        self.instance = ClientInstance(namesrv, client_ip, send_timeout, credentials, tls)
        self.instance.producer_groups.add(group)
        self.uniq = UniqKeyGenerator(client_ip)
        # From a random queue, as RocketMQ's producers start: producers that each send a few messages (scripts, Spark
        # tasks) would otherwise all fill the first queue.
        self._counter = itertools.count(random.randrange(1 << 16))
        #: broker name → until when sends avoid it: it refused a connection or timed out (RocketMQ's producers do
        #: the same, sendLatencyFaultEnable): a retry then goes to another broker, not the dead one's next queue
        self._isolated: dict[str, float] = {}
        self.started = False

    async def start(self) -> None:
        self.instance.start()
        self.started = True

    async def close(self) -> None:
        if self.started:
            self.started = False
            await self.instance.unregister(producer_group=self.group)
            await self.instance.close()

    def _header(self, msg: Message, queue: MessageQueue, props: dict[str, str], sys_flag: int = 0,
                batch: bool = False) -> dict[str, str]:
        # SendMessageRequestHeaderV2 rendered by hand (see _K_GROUP): this runs for every message.
        header = {_K_GROUP: self.group, _K_TOPIC: queue.topic, _K_DEFAULT_TOPIC: "TBW102", _K_QUEUE_NUMS: "4",
                  _K_QUEUE_ID: str(queue.queue_id), _K_SYS_FLAG: str(sys_flag),
                  _K_BORN: str(int(time.time() * 1000)), _K_FLAG: str(msg.flag),
                  _K_PROPERTIES: encode_properties(props), _K_RECONSUME: "0", _K_UNIT_MODE: "false"}
        if batch:
            header[_K_BATCH] = "true"
        return header

    async def send(self, msg: Message, queue: MessageQueue | None = None) -> SendResult:
        """Send one message and wait until the broker stored it.

        Args:
            queue: a specific queue; by default the next queue of the route, round robin.

        Raises:
            MessageTooLargeError: the body is larger than ``max_message_size`` (nothing was sent).
            BrokerError: the broker refused the message (after retries for retryable codes).
            ClientError: no attempt reached a broker.
        """
        uniq = self.uniq.next()
        props = msg.wire_properties(uniq)
        return await self._send(msg, props, queue, uniq)

    async def _send(self, msg: Message, props: dict[str, str], queue: MessageQueue | None, uniq: str,
                    sys_flag: int = 0, code: int = RequestCode.SEND_MESSAGE_V2, body: bytes | None = None,
                    batch: bool = False) -> SendResult:
        self._check_size(len(msg.body) if body is None else len(body))
        last: Exception | None = None
        instance = self.instance
        for attempt in range(1 + self.retry_times):
            # The cached route, registration and connection are looked up without awaiting: this runs per send.
            route = instance.routes.cached(msg.topic) or await instance.routes.get(msg.topic, self.auto_create)
            target = self._target(msg.topic, route.write_queues, queue)
            try:
                addr = route.addr_of(target.broker_name)
                if addr not in instance.brokers:
                    await instance.heartbeat(addr)
                conn = instance.pool.open_connection(addr) or await instance.pool.get(addr)
                resp = await conn.request(code, self._header(msg, target, props, sys_flag, batch),
                                          msg.body if body is None else body, self.send_timeout)
            except ClientError as exc:
                last = exc
                self._isolate(target.broker_name)
                # The broker may be gone for good (a broker group's leader that handed over or died): the next
                # attempt asks the name servers for the route again rather than trusting the cached one.
                instance.routes.invalidate(msg.topic)
                log.debug("send attempt %d to %s failed: %s", attempt + 1, target.broker_name, exc)
                continue
            status = _STATUS.get(resp.code)
            if status is not None:
                ext = resp.ext_fields
                queue_id = int(ext.get("queueId", target.queue_id))
                return SendResult(status, uniq, ext.get("msgId", ""),
                                  target if queue_id == target.queue_id and target.topic == msg.topic
                                  else MessageQueue(msg.topic, target.broker_name, queue_id),
                                  int(ext.get("queueOffset", -1)), ext.get("transactionId") or None)
            last = error_for(resp.code, resp.remark)
            if resp.code not in _RETRYABLE or queue is not None:
                raise last
            if resp.code in (ResponseCode.TOPIC_NOT_EXIST, ResponseCode.SERVICE_NOT_AVAILABLE):
                # Not here (now): a follower, or a leader handing over its group, answers 14; ask the name servers.
                self.instance.routes.invalidate(msg.topic)
            if resp.code == ResponseCode.SERVICE_NOT_AVAILABLE:
                # So does a leader whose group is short of in-sync members, until one is back: the next attempts go
                # to the other brokers, as RocketMQ's producer retries on another broker.
                self._isolate(target.broker_name)
        raise last or ClientError("send failed")

    def _target(self, topic: str, queues: list[MessageQueue], queue: MessageQueue | None) -> MessageQueue:
        """The queue a send goes to: ``queue`` when given, else the next one ``_pick`` gives.

        Raises:
            ClientError: the topic's route has no writable queue.
        """
        if not queues:
            # Maybe for a moment (a broker group between leaders): the next send asks the name servers again.
            self.instance.routes.invalidate(topic)
            raise ClientError(f"topic {topic} has no writable queue")
        return queue or self._pick(queues)

    def _pick(self, queues: list[MessageQueue]) -> MessageQueue:
        """The next queue, round robin, skipping brokers that failed a send lately (while any other is left)."""
        start = next(self._counter)
        if self._isolated:
            now = time.monotonic()
            for offset in range(len(queues)):
                candidate = queues[(start + offset) % len(queues)]
                until = self._isolated.get(candidate.broker_name)
                if until is None:
                    return candidate
                if until <= now:  # served its time: sends stop looking it up
                    del self._isolated[candidate.broker_name]
                    return candidate
        return queues[start % len(queues)]

    def _isolate(self, broker_name: str) -> None:
        """Sends avoid ``broker_name`` for BROKER_ISOLATION_S: it failed one."""
        self._isolated[broker_name] = time.monotonic() + BROKER_ISOLATION_S

    def _check_size(self, size: int) -> None:
        if size > self.max_message_size:
            raise MessageTooLargeError(
                f"the message body is {size:,} bytes, larger than max_message_size {self.max_message_size:,} "
                f"(the broker refuses bodies above its maxMessageSize, 4 MiB by default: raise both to send it)")

    async def send_oneway(self, msg: Message, queue: MessageQueue | None = None) -> None:
        """Send without waiting for the broker (no result, no retry)."""
        self._check_size(len(msg.body))
        route = await self.instance.routes.get(msg.topic, self.auto_create)
        target = self._target(msg.topic, route.write_queues, queue)
        addr = route.addr_of(target.broker_name)
        try:
            if addr not in self.instance.brokers:
                await self.instance.heartbeat(addr)
            conn = await self.instance.pool.get(addr)
        except ClientError:
            self._isolate(target.broker_name)  # as a failed send does: the next sends avoid it
            raise
        conn.oneway(RequestCode.SEND_MESSAGE_V2, self._header(msg, target, msg.wire_properties(self.uniq.next())),
                    msg.body)

    async def send_batch(self, msgs: list[Message], queue: MessageQueue | None = None) -> SendResult:
        """Send messages of one topic atomically to one queue; they get consecutive queue offsets.

        Raises:
            ValueError: empty batch, several topics, or delayed messages.
        """
        ids, body = self._batch_body(msgs)
        return await self._send(msgs[0], {P.WAIT: "true"}, queue, ",".join(ids),
                                code=RequestCode.SEND_BATCH_MESSAGE, body=body, batch=True)

    def _batch_body(self, msgs: list[Message]) -> tuple[list[str], bytes]:
        """The message ids and the SEND_BATCH_MESSAGE body of ``msgs``."""
        if not msgs:
            raise ValueError("empty batch")
        if len({m.topic for m in msgs}) != 1 or any(m.delay_level for m in msgs):
            raise ValueError("a batch holds messages of one topic and without delay")
        ids = self.uniq.next_many(len(msgs))
        return ids, encode_batch([BatchItem(m.body, encode_properties(m.wire_properties(uid)), m.flag)
                                  for m, uid in zip(msgs, ids, strict=True)])


"""The messaging service: what a send, a half, a receive or a dead-letter copy must obey, once for every protocol.

The protocol adapters (broker/processors/ for remoting, broker/grpc/ for RocketMQ 5) decode a request, authorise
its caller (broker/acl.py), call this layer and encode its answer; a refusal here is a ``BrokerError`` carrying a
``Failure`` (broker/errors.py), which each door turns into its own code through the one error table. A rule added
here holds for every door by construction; a rule written in an adapter is a bug.

Each operation takes a plain request (what the door decoded) and the caller's identity, and returns a completion
or a result the door encodes; the door never calls back into the flow (RocketMQ 5 proxy's MessagingProcessor, with
one adapter per protocol).

- ``producer``: message sends and half prepares (``ProducerService.send``: names, sizes, message types, queues,
  delivery times, transactional rules, the group a half is filed under, the retry limit) and the one write path
  to the store; ``batch``: a batch's checks (``ProducerService.send_batch``).
- ``consumer``: what a consumer may read (a topic's readability, a queue's range), where a group starts, and a
  pull (``ConsumerService.pull``).
- ``receipts``: the consumption model of receipts (a receive's checks, pop, ack, change invisibility, dead-letter
  after the most deliveries, auto-renewal), ``ReceiptService``.
- ``transactions``: a producer's decision on a half (``TransactionService.end``: the group's name, access to the
  half's topic, the transaction id, the decision).
- ``dead_letter``: the copy of a message that goes to a group's %DLQ% topic, and what happens when none can be
  made.
"""

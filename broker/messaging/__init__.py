"""The messaging service: what a send, a half, a receive or a dead-letter copy must obey, once for every protocol.

The protocol adapters (broker/processors/ for remoting, broker/grpc/ for RocketMQ 5) decode a request, authorise
its caller (broker/acl.py), call this layer and encode its answer; a refusal here is a ``BrokerError`` carrying a
``Failure`` (broker/errors.py), which each door turns into its own code through the one error table. A rule added
here holds for every door by construction; a rule written in an adapter is a bug.

- ``producer``: message sends, batches and half prepares (names, sizes, message types, queues, delivery times,
  transactional rules, the group a half is filed under), and the one write path to the store.
- ``consumer``: what a consumer may read (a topic's readability, a queue's range) and where a group starts.
- ``dead_letter``: the copy of a message that goes to a group's %DLQ% topic, and what happens when none can be
  made.
"""

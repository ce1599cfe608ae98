"""The gRPC endpoint for RocketMQ 5 clients (apache.rocketmq.v2.MessagingService), beside the remoting listener: an
adapter of the messaging service (broker/messaging/), as the remoting processors are.

Needs the ``grpc`` extra (h2, protobuf). Layout: schema (the published .proto files, compiled), auth (client
metadata and the 5.x ACL signature), status (Status answers, from the broker's one error table), convert (gRPC
Message ⇄ stored record), sessions (clients and their telemetry streams), route (route, heartbeat, assignment,
settings), send (send, transactions), refused (what a connection owes for refused inflation), group_commit (concurrent calls' writes in one store group), receive (receive
with invisibility, ack, DLQ), server (the endpoint: methods to handlers), http2 (gRPC over HTTP/2 on the broker's
loop).
"""

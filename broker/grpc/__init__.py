"""The gRPC endpoint for RocketMQ 5 clients (apache.rocketmq.v2.MessagingService), beside the remoting listener.

Needs the ``grpc`` extra (grpcio, protobuf). Layout: schema (the published .proto files, compiled), auth (client
metadata and the 5.x ACL signature), status (the reference's Codes), convert (gRPC Message ⇄ stored record),
sessions (clients and their telemetry streams), route (route, heartbeat, assignment, settings), send (send,
transactions), receive (receive with invisibility, ack, DLQ), server (the grpc.aio server).
"""

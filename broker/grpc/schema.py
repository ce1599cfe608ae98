"""The ``apache.rocketmq.v2`` schema: message classes built from the descriptor set shipped beside this module.

``proto/apache/rocketmq/v2/{definition,service}.proto`` are RocketMQ's published files (apache/rocketmq-apis,
Apache-2.0, commit 3e60073); ``messaging_v2.binpb`` is their compiled FileDescriptorSet, made with

    python -m grpc_tools.protoc --include_imports --descriptor_set_out=broker/grpc/messaging_v2.binpb \\
        -Ibroker/grpc/proto -I<grpc_tools>/_proto apache/rocketmq/v2/service.proto

(tests/grpc/test_schema.py checks that it matches the .proto files). The classes live in a descriptor pool of
their own, so they never clash with another copy of the same files in the process (the official client ships
one under ``rocketmq.grpc_protocol``), and the broker needs only ``protobuf`` at run time, not a code generator.
"""
from __future__ import annotations

import os

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

SCHEMA_PATH = os.path.join(os.path.dirname(__file__), "messaging_v2.binpb")
PACKAGE = "apache.rocketmq.v2"
SERVICE = f"{PACKAGE}.MessagingService"


def _load_pool() -> descriptor_pool.DescriptorPool:
    files = descriptor_pb2.FileDescriptorSet()
    with open(SCHEMA_PATH, "rb") as fh:
        files.ParseFromString(fh.read())
    pool = descriptor_pool.DescriptorPool()
    for file_proto in files.file:  # --include_imports lists dependencies first
        pool.Add(file_proto)
    return pool


POOL = _load_pool()


def message_class(name: str):
    return message_factory.GetMessageClass(POOL.FindMessageTypeByName(f"{PACKAGE}.{name}"))


def _enum(name: str) -> dict[str, int]:
    return {value.name: value.number for value in POOL.FindEnumTypeByName(f"{PACKAGE}.{name}").values}


class _Namespace:
    """Message classes as attributes (``pb.SendMessageResponse``), enum values as ``pb.Code["OK"]``."""

    def __getattr__(self, name: str):
        cls = message_class(name)
        setattr(self, name, cls)
        return cls


pb = _Namespace()
Code = _enum("Code")
MessageType = _enum("MessageType")
ClientType = _enum("ClientType")
TransactionResolution = _enum("TransactionResolution")
TransactionSource = _enum("TransactionSource")
Permission = _enum("Permission")
FilterType = _enum("FilterType")
AddressScheme = _enum("AddressScheme")
DigestType = _enum("DigestType")
Encoding = _enum("Encoding")


def rpc_types(method: str) -> tuple[type, type, bool, bool]:
    """(request class, response class, client streams, server streams) of a MessagingService method."""
    desc = POOL.FindServiceByName(SERVICE).FindMethodByName(method)
    return (message_factory.GetMessageClass(desc.input_type), message_factory.GetMessageClass(desc.output_type),
            desc.client_streaming, desc.server_streaming)


def rpc_names() -> list[str]:
    return [m.name for m in POOL.FindServiceByName(SERVICE).methods]

"""The remoting processors register their handlers through ``processors/base.py`` (``handles``): each request code
still reaches the handler it did when every processor listed its own registrations."""
from __future__ import annotations

from types import SimpleNamespace

from halfmq.broker.processors.admin import AdminProcessor
from halfmq.broker.processors.client_manage import ClientManageProcessor
from halfmq.broker.processors.end_transaction import EndTransactionProcessor
from halfmq.broker.processors.inspect import InspectProcessor
from halfmq.broker.processors.lifecycle import LifecycleProcessor
from halfmq.broker.processors.offsets import OffsetProcessor
from halfmq.protocol.codes import RequestCode as C

EXPECTED = {
    AdminProcessor: {C.UPDATE_AND_CREATE_TOPIC: "create_topic", C.DELETE_TOPIC_IN_BROKER: "delete_topic",
                     C.GET_ALL_TOPIC_CONFIG: "all_topic_config", C.VIEW_MESSAGE_BY_ID: "view_message",
                     C.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: "create_group", C.DELETE_SUBSCRIPTIONGROUP: "delete_group",
                     C.GET_BROKER_CONFIG: "broker_config"},
    ClientManageProcessor: {C.HEART_BEAT: "heartbeat", C.UNREGISTER_CLIENT: "unregister",
                            C.GET_CONSUMER_LIST_BY_GROUP: "consumer_list", C.LOCK_BATCH_MQ: "lock",
                            C.UNLOCK_BATCH_MQ: "unlock", C.CHECK_CLIENT_CONFIG: "check_client_config"},
    EndTransactionProcessor: {C.END_TRANSACTION: "end_transaction", C.RESUME_CHECK_HALF_MESSAGE: "resume"},
    InspectProcessor: {C.QUERY_MESSAGE: "query_message", C.GET_BROKER_RUNTIME_INFO: "runtime_info",
                       C.GET_PRODUCER_CONNECTION_LIST: "producer_connections",
                       C.GET_CONSUMER_CONNECTION_LIST: "consumer_connections", C.GET_CONSUME_STATS: "consume_stats",
                       C.HALFMQ_GET_HALF_STATUS: "half_status", C.HALFMQ_GET_TRANSACTION_RECORDS: "transaction_records",
                       C.HALFMQ_GET_CONSUMER_GROUPS: "consumer_groups",
                       C.HALFMQ_GET_PRODUCER_GROUPS: "producer_groups", C.HALFMQ_GET_TOPIC_STATS: "topic_stats",
                       C.QUERY_TOPIC_CONSUME_BY_WHO: "topic_consumers"},
    LifecycleProcessor: {C.DELETE_EXPIRED_COMMITLOG: "delete_expired"},
    OffsetProcessor: {C.QUERY_CONSUMER_OFFSET: "query_consumer_offset",
                      C.UPDATE_CONSUMER_OFFSET: "update_consumer_offset", C.GET_MAX_OFFSET: "max_offset",
                      C.GET_MIN_OFFSET: "min_offset", C.SEARCH_OFFSET_BY_TIMESTAMP: "search_offset",
                      C.GET_EARLIEST_MSG_STORETIME: "earliest_store_time"},
}


def test_each_processor_registers_each_of_its_codes_to_its_handler():
    for cls, expected in EXPECTED.items():
        processor = cls(SimpleNamespace(), None) if cls in (EndTransactionProcessor, OffsetProcessor) else cls(
            SimpleNamespace())
        registered = {}
        processor.register(SimpleNamespace(register=lambda code, handler: registered.__setitem__(code, handler)))
        assert {code: handler.__name__ for code, handler in registered.items()} == expected, cls.__name__
        assert all(handler.__self__ is processor for handler in registered.values())

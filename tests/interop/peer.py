"""Scenarios for the real RocketMQ client (rocketmq-client-python over the C++ core), run in its own venv.

Usage: python peer.py MODE JSON_ARGS. Prints one JSON object per line on stdout and leaves with os._exit(0)
(PushConsumer.shutdown() crashes this library build, see shared/peers/README.md).
"""
import json
import os
import sys
import threading
import time

from rocketmq.client import (ConsumeStatus, Message, Producer, PushConsumer, TransactionMQProducer,
                             TransactionStatus)

STATUS = {"commit": TransactionStatus.COMMIT, "rollback": TransactionStatus.ROLLBACK,
          "unknown": TransactionStatus.UNKNOWN}


def emit(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def message(topic, i, prefix):
    msg = Message(topic)
    msg.set_keys(f"{prefix}key{i}")
    msg.set_tags(f"tag{i % 3}")
    msg.set_body(f"{prefix}body-{i}")
    msg.set_property("idx", str(i))
    msg.set_property("prefix", prefix)
    return msg


def produce(args):
    producer = Producer(args["group"])
    producer.set_name_server_address(args["namesrv"])
    producer.start()
    for i in range(args["count"]):
        if i and args.get("interval"):
            time.sleep(args["interval"])  # a paced producer: its sends span a failover
        try:
            result = producer.send_sync(message(args["topic"], i, args.get("prefix", "")))
        except Exception as exc:  # a refused send: reported with "tolerate", else the scenario fails
            if not args.get("tolerate"):
                raise
            emit({"i": i, "error": str(exc)[:300]})
            continue
        emit({"i": i, "status": int(result.status), "msg_id": result.msg_id, "offset": result.offset})
    producer.shutdown()
    emit({"done": True})


def consume(args):
    lock = threading.Lock()
    received = []
    enough = threading.Event()

    def on_message(msg):
        with lock:
            received.append({"topic": msg.topic, "tags": msg.tags.decode() if msg.tags else None,
                             "keys": msg.keys.decode() if msg.keys else None, "body": msg.body.decode(),
                             "idx": (msg.get_property("idx") or b"").decode(),
                             "prefix": (msg.get_property("prefix") or b"").decode(), "id": msg.id})
            if len(received) >= args["expect"]:
                enough.set()
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = PushConsumer(args["group"])
    consumer.set_name_server_address(args["namesrv"])
    consumer.subscribe(args["topic"], on_message, args.get("expression", "*"))
    consumer.start()
    if args.get("until_eof"):
        sys.stdin.read()  # one of several consumers of a group: the test knows when the group has read everything
    else:
        enough.wait(args["timeout"])
        # A quiet window after the expected count, to catch duplicates or messages that should never arrive.
        time.sleep(args.get("quiet", 1.0))
    with lock:
        emit({"received": received})
    if args.get("hold"):
        sys.stdin.read()  # keep consuming (and committing offsets) until the test closes our stdin
    os._exit(0)


def transactions(args):
    plan = args["plan"]  # one entry per message: {"local": ..., "check": ...}
    checks = []
    lock = threading.Lock()
    all_checked = threading.Event()
    expected_checks = sum(1 for p in plan if p["local"] == "unknown")

    def checker(msg):
        i = int(msg.get_property("idx").decode())
        with lock:
            checks.append({"i": i, "t": time.time(), "times": (msg.get_property("TRANSACTION_CHECK_TIMES") or b"").decode()})
            if len({c["i"] for c in checks}) >= expected_checks:
                all_checked.set()
        return STATUS[plan[i]["check"]]

    def local(msg, arg):
        return STATUS[plan[int(msg.get_property("idx").decode())]["local"]]

    producer = TransactionMQProducer(args["group"], checker)
    producer.set_name_server_address(args["namesrv"])
    producer.start()
    sent = []
    for i in range(len(plan)):
        result = producer.send_message_in_transaction(message(args["topic"], i, args.get("prefix", "")), local, None)
        sent.append({"i": i, "status": int(result.status), "msg_id": result.msg_id, "t": time.time()})
    if expected_checks:
        all_checked.wait(args["timeout"])
    with lock:
        emit({"sent": sent, "checks": checks})
    if args.get("hold"):
        sys.stdin.read()  # keep answering checks until the test saw every half decided and closed our stdin
    os._exit(0)


if __name__ == "__main__":
    mode, raw = sys.argv[1], json.loads(sys.argv[2])
    {"produce": produce, "consume": consume, "tx": transactions}[mode](raw)
    os._exit(0)

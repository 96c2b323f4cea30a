"""The librdkafka settings of the worker's clients: its producer, its consumer, and the
readers of a restore. Built on ``botmesh.streams.connection.confluent_options``, so TLS and
SASL come from the one set of settings every client of botmesh takes.

- The producer: acks from every in-sync replica (``acks=all``), idempotent, with the
  ``murmur2_random`` partitioner: a keyed record lands on the partition Java's and
  the Java producer puts it on (librdkafka's own default, ``consistent_random``, hashes
  with CRC32 and would split a chat's records across clients). Under ``exactly_once`` it is
  transactional, one ``transactional.id`` per worker (``transactional_id``).
- The consumer: no automatic commit or offset store (the worker commits what is durable),
  cooperative-sticky assignment, static membership (``group.instance.id``) when the worker
  has an instance id, and ``read_committed``.
"""

from __future__ import annotations

import logging
from typing import Any

from botmesh.streams.config import WorkerConfig, group_instance_id
from botmesh.streams.connection import Brokers, confluent_options

__all__ = [
    "LIBRDKAFKA_LOG",
    "LINGER_MS",
    "consumer_config",
    "producer_config",
    "reader_config",
    "transactional_id",
    "worker_consumer_config",
    "worker_producer_config",
]

#: Where librdkafka's own log lines go (served by the clients' poll and consume calls),
#: instead of the process's stderr.
LIBRDKAFKA_LOG = logging.getLogger("botmesh.streams.librdkafka")

#: How long the producer waits for more records to fill a batch (librdkafka's default is
#: 5 ms as well; a journal write waits for its ack, so this is latency, kept small).
LINGER_MS = 5


def transactional_id(group: str, instance_id: str) -> str:
    """The worker's ``transactional.id``: ``<group>.<instance id>``. Stable across restarts
    of one replica, so a restart's ``init_transactions`` aborts what the crashed incarnation
    left open and fences it, and unique per replica."""
    return f"{group}.{group_instance_id(instance_id)}"


def producer_config(
    brokers: Brokers,
    *,
    transactional_id: str | None = None,
    linger_ms: int = LINGER_MS,
    delivery_timeout: float = 30.0,
    transaction_timeout: float = 10.0,
) -> dict[str, Any]:
    """The worker's producer. ``delivery_timeout`` (seconds): how long a record may wait for
    its ack before it is reported lost (``message.timeout.ms``); with ``transactional_id``
    the producer is transactional (``exactly_once``), its transactions aborted by the
    coordinator after ``transaction_timeout`` seconds (capped by the broker's
    ``transaction.max.timeout.ms``; it bounds ``delivery_timeout``). 10 s, as Kafka Streams
    under ``exactly_once``: a worker killed or frozen mid-transaction holds the changelog
    partition's last stable offset back until then, and the peer taking the partition over
    restores up to it (``read_committed``); the worker's transactions last milliseconds."""
    conf: dict[str, Any] = {
        **confluent_options(brokers),
        "logger": LIBRDKAFKA_LOG,
        "acks": "all",
        "enable.idempotence": True,
        "partitioner": "murmur2_random",
        "linger.ms": linger_ms,
        "message.timeout.ms": int(delivery_timeout * 1000),
    }
    if transactional_id is not None:
        conf["transactional.id"] = transactional_id
        conf["transaction.timeout.ms"] = int(transaction_timeout * 1000)
        conf["message.timeout.ms"] = min(
            conf["message.timeout.ms"], int(transaction_timeout * 1000)
        )
    return conf


def consumer_config(
    brokers: Brokers,
    *,
    group: str,
    instance_id: str | None,
    session_timeout: float,
) -> dict[str, Any]:
    """The worker's consumer of its group (the inbound topics). ``session_timeout`` in
    seconds (``WorkerConfig.session_timeout``)."""
    conf: dict[str, Any] = {
        **confluent_options(brokers),
        "logger": LIBRDKAFKA_LOG,
        "group.id": group,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "partition.assignment.strategy": "cooperative-sticky",
        "isolation.level": "read_committed",
        "session.timeout.ms": int(session_timeout * 1000),
        "auto.offset.reset": "earliest",
    }
    if instance_id is not None:
        conf["group.instance.id"] = group_instance_id(instance_id)
    return conf


def reader_config(brokers: Brokers, *, group: str) -> dict[str, Any]:
    """A consumer that reads assigned partitions and never joins or commits to ``group``
    (librdkafka wants a ``group.id`` even then): a restore's reader, ``read_committed``."""
    return {
        **confluent_options(brokers),
        "logger": LIBRDKAFKA_LOG,
        "group.id": group,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "isolation.level": "read_committed",
        "auto.offset.reset": "earliest",
        "enable.partition.eof": False,
    }


def worker_producer_config(worker: WorkerConfig, instance_id: str) -> dict[str, Any]:
    """The producer of a worker run with ``worker`` as ``instance_id`` (the runtime's id:
    the configured one, else its default): transactional under ``exactly_once``."""
    tid = transactional_id(worker.catalog.group, instance_id) if worker.exactly_once else None
    return producer_config(worker.kafka, transactional_id=tid)


def worker_consumer_config(worker: WorkerConfig) -> dict[str, Any]:
    """The consumer of a worker run with ``worker``: its group, its static membership when
    it has an instance id, its session timeout."""
    return consumer_config(
        worker.kafka,
        group=worker.catalog.group,
        instance_id=worker.instance_id,
        session_timeout=worker.session_timeout,
    )

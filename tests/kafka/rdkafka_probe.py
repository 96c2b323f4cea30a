"""Small probes on the synchronous confluent-kafka clients for
``tests/kafka/test_librdkafka_facts.py``: a group member that records its rebalance
callbacks (which partitions, on which thread, inside which call), a pump that polls several
members from one thread until a condition holds (with a deadline), and readers of what a
topic holds under either isolation level."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition

TP = tuple[str, int]

#: How long a probe waits for a condition before the test fails (a deadline, never a sleep).
DEADLINE_S = 60.0


def tps(partitions: Iterable[TopicPartition]) -> list[TP]:
    return sorted((p.topic, p.partition) for p in partitions)


def wait_until(cond: Callable[[], bool], what: str, timeout: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.05)


@dataclass
class Event:
    """One rebalance callback: ``assign`` / ``revoke`` / ``lost`` with the list it was
    given, the thread it ran on, and the client call (``poll``/``consume``) it ran inside
    (``None``: outside any call of ours)."""

    kind: str
    partitions: list[TP]
    thread: int
    inside: str | None


@dataclass
class Member:
    """A synchronous ``Consumer`` in a group, subscribed with recording callbacks (which
    leave the (incremental_)assign/unassign to the binding, as it does when a callback
    does not call it)."""

    bootstrap: str
    group: str
    topics: Sequence[str]
    instance_id: str | None = None
    conf: dict[str, Any] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    records: list[tuple[int, int, bytes | None]] = field(default_factory=list)
    inside: str | None = None
    closed: bool = False

    def __post_init__(self) -> None:
        conf: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap,
            "group.id": self.group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "partition.assignment.strategy": "cooperative-sticky",
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
            "log_level": 3,
        }
        if self.instance_id is not None:
            conf["group.instance.id"] = self.instance_id
        conf.update(self.conf)
        self.consumer = Consumer(conf)
        self.consumer.subscribe(
            list(self.topics),
            on_assign=self._on("assign"),
            on_revoke=self._on("revoke"),
            on_lost=self._on("lost"),
        )

    def _on(self, kind: str) -> Callable[[Consumer, list[TopicPartition]], None]:
        def callback(_consumer: Consumer, partitions: list[TopicPartition]) -> None:
            self.events.append(Event(kind, tps(partitions), threading.get_ident(), self.inside))

        return callback

    def _keep(self, msgs: Iterable[Message | None]) -> None:
        for m in msgs:
            if m is None:
                continue
            err = m.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    continue
                raise AssertionError(f"consumer error: {err}")
            p, o = m.partition(), m.offset()
            assert p is not None and o is not None
            self.records.append((p, o, m.value()))

    def poll(self, timeout: float = 0.05) -> None:
        self.inside = "poll"
        try:
            msg = self.consumer.poll(timeout)
        finally:
            self.inside = None
        self._keep([msg])

    def consume(self, timeout: float = 0.05) -> None:
        self.inside = "consume"
        try:
            msgs = self.consumer.consume(100, timeout)
        finally:
            self.inside = None
        self._keep(msgs)

    def assigned(self) -> set[TP]:
        return set(tps(self.consumer.assignment()))

    def kinds(self) -> list[tuple[str, list[TP]]]:
        return [(e.kind, e.partitions) for e in self.events]

    def partitions_read(self) -> set[int]:
        return {p for p, _, _ in self.records}

    def close(self, *, unsubscribe: bool = False) -> None:
        if self.closed:
            return
        self.closed = True
        if unsubscribe:
            self.consumer.unsubscribe()
        self.consumer.close()


def pump(
    members: Sequence[Member], until: Callable[[], bool], what: str, timeout: float = DEADLINE_S
) -> None:
    """Poll every open member in turn (short polls, this thread) until ``until()``."""
    deadline = time.monotonic() + timeout
    while not until():
        if time.monotonic() > deadline:
            state = {
                m.instance_id or id(m): (m.kinds(), sorted(m.assigned()))
                for m in members
                if not m.closed
            }
            raise AssertionError(f"not within {timeout} s: {what}; members: {state}")
        for m in members:
            if not m.closed:
                m.poll(0.05)


def produce(
    bootstrap: str,
    topic: str,
    records: Iterable[tuple[int | None, bytes | None, bytes]],
    conf: dict[str, Any] | None = None,
) -> None:
    """Produce ``(partition, key, value)`` records (``None``: the partitioner decides) and
    wait for every delivery (an error fails the test)."""
    p = Producer({"bootstrap.servers": bootstrap, "log_level": 3, **(conf or {})})
    errors: list[KafkaError] = []

    def on_delivery(err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            errors.append(err)

    for partition, key, value in records:
        if partition is None:
            p.produce(topic, value=value, key=key, on_delivery=on_delivery)
        else:
            p.produce(topic, value=value, key=key, partition=partition, on_delivery=on_delivery)
    assert p.flush(30) == 0, "undelivered records"
    assert not errors, errors


def read_all(
    bootstrap: str, group: str, topic: str, partitions: int, *, read_committed: bool = True
) -> list[Message]:
    """Every record of ``topic`` a reader at that isolation level gets, from the start to
    the end (the partition EOF: the last stable offset under ``read_committed``)."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed" if read_committed else "read_uncommitted",
            "log_level": 3,
        }
    )
    try:
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        at_end: set[int] = set()
        out: list[Message] = []
        deadline = time.monotonic() + DEADLINE_S
        while len(at_end) < partitions:
            if time.monotonic() > deadline:
                raise AssertionError(f"{topic}: no EOF on every partition within {DEADLINE_S} s")
            for m in c.consume(500, 0.2):
                err = m.error()
                if err is None:
                    out.append(m)
                elif err.code() == KafkaError._PARTITION_EOF:
                    p = m.partition()
                    assert p is not None
                    at_end.add(p)
                else:
                    raise AssertionError(f"reader error: {err}")
        return out
    finally:
        c.close()


def settle(bootstrap: str, group: str, topic: str, partitions: int) -> None:
    """Wait until the last stable offset of every partition of ``topic`` is its high
    watermark: ``commit_transaction``/``abort_transaction`` return once the coordinator
    logged the decision, the markers on the partitions follow."""
    confs = [
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "isolation.level": level,
            "log_level": 3,
        }
        for level in ("read_committed", "read_uncommitted")
    ]
    rc, ru = (Consumer(c) for c in confs)
    try:
        for p in range(partitions):
            tp = TopicPartition(topic, p)

            def stable(tp: TopicPartition = tp) -> bool:
                lso = rc.get_watermark_offsets(tp, DEADLINE_S)[1]
                return lso == ru.get_watermark_offsets(tp, DEADLINE_S)[1]

            wait_until(stable, f"{topic} [{p}]: last stable offset = high watermark")
    finally:
        rc.close()
        ru.close()

"""The worker's journal on a real broker, for tests: ``TableKv`` over the worker's changelog
port on librdkafka (``RdChangelog``, acks=all; under ``exactly_once`` one transactional
producer), every partition restored from the compacted topic before the journal gets it.

``kafka_case(bootstrap, guarantee)`` is the journal as a ``BackendCase`` (``tests/backends.py``):
``open`` restores a new journal from the topic alone (a worker on a wiped data dir), and
``abandon`` kills one as a crash would, saying which writes it lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
import uuid
from asyncio import Future
from collections.abc import Iterator, Sequence
from pathlib import Path

from botmesh.state.keys import is_turn_key, record_group
from botmesh.state.kv import DurableKv, Entry, IndexName, Op
from botmesh.streams.table_kv import CURRENT_CHAT, TableKv, in_partition
from botmesh.streams.worker.changelog import RdChangelog
from botmesh.streams.worker.clients import producer_config, transactional_id
from botmesh.streams.worker.restore import open_database, restore
from tests.backends import BackendCase
from tests.kafka.broker import create_topics, delete_topics, free_ports

PARTITIONS = 2


class KafkaChangelog(RdChangelog):
    """The worker's ``RdChangelog`` (acks=all; each acked record written to its partition's
    RocksDB database), every partition restored from the topic at ``start``; what a test
    steers: ``stale`` (what ``unconfirmed`` answers), ``freeze_on_produce`` (the worker
    "frozen" once it hands a record over: the membership is unconfirmed from then on) and a
    broker out of reach (``unreachable`` / ``reachable``)."""

    def __init__(self, bootstrap: str, topic: str, path: Path, guarantee: str) -> None:
        # under exactly_once one transactional id across the journal's restarts, as a
        # worker's instance id gives it
        tid = transactional_id(topic, "w") if guarantee == "exactly_once" else None
        self.base = producer_config(bootstrap, transactional_id=tid)
        super().__init__(self.base, topic, unconfirmed=self._membership)
        self.bootstrap = bootstrap
        self.path = path
        #: What ``unconfirmed`` answers (a test sets it: the membership is not confirmed).
        self.stale: str | None = None
        #: Each record handed over "freezes" the worker (``frozen_at``): as of that moment
        #: on, its membership is not confirmed.
        self.freeze_on_produce = False
        self.frozen_at: float | None = None

    def _membership(self, at: float | None) -> str | None:
        at = time.monotonic() if at is None else at
        if self.frozen_at is not None and at >= self.frozen_at:
            return f"frozen {at - self.frozen_at:.3f}s before"
        return self.stale

    async def produce(self, partition: int, key: bytes, value: bytes | None) -> Future[int]:
        ack = await super().produce(partition, key, value)
        if self.freeze_on_produce and self.frozen_at is None:
            self.frozen_at = time.monotonic()
        return ack

    async def start(self) -> None:
        create_topics(
            self.bootstrap, [self.topic], PARTITIONS, config={"cleanup.policy": "compact"}
        )
        await super().start()
        self.path.mkdir(parents=True, exist_ok=True)
        dbs = {p: open_database(self.path / f"p{p}") for p in range(PARTITIONS)}
        await asyncio.to_thread(restore, self.bootstrap, self.topic, dbs, timeout=60.0)
        for p, db in dbs.items():
            self.attach(p, db)

    async def unreachable(self) -> None:
        """The producer from now on talks to an address where no broker listens: its
        records are not acked (reported lost after 2 s)."""
        await self.stop()
        [nobody] = free_ports(1)
        self.config = producer_config(f"127.0.0.1:{nobody}", delivery_timeout=2.0)
        await RdChangelog.start(self)

    async def reachable(self) -> None:
        await self.stop(timeout=1.0)
        self.config = self.base
        await RdChangelog.start(self)

    def close(self) -> None:
        """Close the databases (the journal is gone)."""
        for p in list(self.dbs):
            db = self.detach(p)
            if db is not None:
                db.db.close()


class InPartition:
    """A ``DurableKv`` view of one partition of a ``TableKv`` (as the runner's records see it)."""

    def __init__(self, kv: TableKv, port: KafkaChangelog, partition: int = 0) -> None:
        self.kv, self.port, self.partition = kv, port, partition

    async def open(self) -> None:
        await self.kv.open()

    async def close(self) -> None:
        await self.kv.close()
        await self.port.stop()
        self.port.close()

    async def get(self, key: str) -> Entry | None:
        with in_partition(self.partition, CURRENT_CHAT.get()):
            return await self.kv.get(key)

    async def get_many(self, keys: Sequence[str]) -> dict[str, Entry]:
        with in_partition(self.partition, CURRENT_CHAT.get()):
            return await self.kv.get_many(keys)

    async def commit(self, ops: Sequence[Op], *, label: str = "") -> list[int]:
        with in_partition(self.partition, CURRENT_CHAT.get()):
            return await self.kv.commit(ops, label=label)

    async def range(
        self, index: IndexName, prefix: str, until: float, limit: int = 100
    ) -> list[str]:
        with in_partition(self.partition, CURRENT_CHAT.get()):
            return await self.kv.range(index, prefix, until, limit)

    async def scan(self, prefix: str) -> list[Entry]:
        with in_partition(self.partition, CURRENT_CHAT.get()):
            return await self.kv.scan(prefix)


def topic_of(path: Path) -> str:
    """The changelog topic of the journal at ``path`` (``open_table``)."""
    return "tkv-" + hashlib.sha1(str(path).encode()).hexdigest()[:12]


def forget(bootstrap: str, path: Path) -> None:
    """Delete the changelog topic of the journal at ``path``: the broker every test shares
    slows down as its partitions add up."""
    delete_topics(bootstrap, [topic_of(path)])


async def open_table(bootstrap: str, guarantee: str, path: Path) -> InPartition:
    """A journal on the topic of ``path`` (created when missing), restored from it into a
    new data dir, owning every partition; seen through partition 0."""
    topic = topic_of(path)
    journal = path / f"journal-{uuid.uuid4().hex}"
    port = KafkaChangelog(bootstrap, topic, journal, guarantee)
    await port.start()
    kv = port.kv = TableKv(port, ack_timeout=20.0, volatile=is_turn_key, group=record_group)
    await kv.open()
    await kv.assign(range(PARTITIONS))
    return InPartition(kv, port)


async def abandon(view: DurableKv) -> set[str]:
    """Kill the journal as its process dying would, and return the keys whose latest write
    did not survive: every write it deferred and never produced, and, under
    ``exactly_once``, those of the open transaction (aborted, as the next producer with the
    transactional id does at its start). Records handed to the producer under
    ``at_least_once`` are delivered first (the outcome a kill leaves them is either; this
    one is fixed so the test knows which). Nothing more is produced after the call starts."""
    assert isinstance(view, InPartition)
    kv, port = view.kv, view.port
    await kv.write_behind.halt()  # a flush running: what it did not hand over is deferred
    kv._closed = True  # a late write (a task of the dead runtime) is refused
    await port.stop()  # delivers what is in flight; aborts an open transaction
    lost = {k for part in kv._parts.values() for k in (*part.deferred, *part.pending)}
    port.close()
    return lost


@contextlib.contextmanager
def chat_turn(chat: str) -> Iterator[None]:
    """An inbound's turn as the worker runs it: its chat named (``in_partition``)."""
    with in_partition(0, chat):
        yield


@contextlib.contextmanager
def fresh_chat_turn(chat: str) -> Iterator[None]:
    """An inbound's turn as the worker runs a fresh one (``DEFERRED_WHEN_FRESH``: its
    record is not awaited before its handlers run)."""
    with in_partition(0, chat, fresh=True):
        yield


def kafka_case(bootstrap: str, guarantee: str, *, fresh: bool = False) -> BackendCase:
    """The journal on the changelog under ``guarantee``, as a backend the crash harness and
    the contract suites run on; ``fresh``: every inbound's turn runs as a fresh one's."""

    async def open_(path: Path) -> DurableKv:
        return await open_table(bootstrap, guarantee, path)

    return BackendCase(
        f"kafka-table-{guarantee}{'-fresh' if fresh else ''}",
        open_,
        persistent=True,
        abandon=abandon,
        turn=fresh_chat_turn if fresh else chat_turn,
    )

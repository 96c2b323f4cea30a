"""Restore journal partitions from the changelog into their RocksDB databases.

A partition's database records the changelog offset it holds everything up to
(``persisted_offset``: written by ``RdChangelog`` with each batch of acked or committed
records, and here with each batch read). ``restore`` reads each partition from the offset
after it to the end of the log:

- **The end is the high watermark, read without isolation** (``read_uncommitted``,
  ``AdminClient.list_offsets``). A ``read_committed`` watermark is the last stable offset:
  behind another producer's open transaction (a crashed worker's, until its transaction
  times out or its successor's ``init_transactions`` aborts it), so a restore bounded by
  it would stop short of records committed after that transaction began.
- **The records are read ``read_committed``**: aborted records never reach the database.
- **It stops on the consumer's position**, not on a record: the position passes commit
  and abort markers and aborted records that the reader never hands out, so a log that
  ends in a marker does not hang the restore.
- **Each fetch is written in one batch per partition** through ``JournalDb.write``: the
  records, their index entries and the offset read, atomically.

The reader is a plain ``Consumer`` with partitions assigned (it never joins a group); the
call blocks (the worker runs it in a thread).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import rocksdict
from confluent_kafka import Consumer, IsolationLevel, KafkaError, Message, TopicPartition
from confluent_kafka.admin import OffsetSpec  # type: ignore[attr-defined]

from botmesh.state.errors import JournalUnavailableError
from botmesh.streams.connection import Brokers, admin
from botmesh.streams.journal_db import INTERNAL, JournalDb
from botmesh.streams.worker.clients import reader_config

__all__ = [
    "OFFSET_KEY",
    "Restored",
    "high_watermarks",
    "open_database",
    "persisted_offset",
    "restore",
]

log = logging.getLogger("botmesh.streams")

#: Where a partition's database keeps the changelog offset it holds everything up to
#: (starts with NUL: never a journal key).
OFFSET_KEY = INTERNAL + b"offset"
#: RocksDB memory of one partition's database.
WRITE_BUFFER_SIZE = 16 * 2**20
MAX_WRITE_BUFFERS = 2
#: Bits of each table's Bloom filter a key: a key the database lacks (a new inbound's
#: dedupe read, a restore's look for the version it replaces) is answered without reading
#: its blocks (10 bits: about 1 % of such reads still do).
BLOOM_BITS_PER_KEY = 10
#: Records taken from the reader in one call.
BATCH = 10_000


def open_database(path: Path | str) -> JournalDb:
    """A journal partition's database at ``path`` (created when missing)."""
    options = rocksdict.Options(raw_mode=True)
    options.create_if_missing(True)
    options.set_write_buffer_size(WRITE_BUFFER_SIZE)
    options.set_max_write_buffer_number(MAX_WRITE_BUFFERS)
    tables = rocksdict.BlockBasedOptions()
    tables.set_bloom_filter(BLOOM_BITS_PER_KEY, False)  # full filters, not block-based
    options.set_block_based_table_factory(tables)
    return JournalDb.open(rocksdict.Rdict(str(path), options=options), OFFSET_KEY)


def persisted_offset(db: JournalDb) -> int | None:
    """The changelog offset the database holds everything up to; ``None`` when empty."""
    raw = db.db.get(db.offset_key)
    return None if raw is None else int(raw)


@dataclass(frozen=True, slots=True)
class Restored:
    """One partition's restore: read from ``start`` up to ``end`` (the high watermark),
    ``records`` written."""

    partition: int
    start: int
    end: int
    records: int


def high_watermarks(
    brokers: Brokers,
    topic: str,
    partitions: Iterable[int],
    *,
    isolation: IsolationLevel = IsolationLevel.READ_UNCOMMITTED,
    timeout: float = 30.0,
) -> dict[int, int]:
    """Each partition's end offset. ``READ_UNCOMMITTED`` (the default): the high watermark,
    the end of everything written; ``READ_COMMITTED``: the last stable offset, which stops
    at the first open transaction (never a restore's bound)."""
    client = admin(brokers, timeout)
    latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]
    asked = {TopicPartition(topic, p): latest for p in partitions}
    if not asked:
        return {}
    deadline = time.monotonic() + timeout
    ends: dict[int, int] = {}
    while True:
        left = max(deadline - time.monotonic(), 0.1)
        futures = client.list_offsets(asked, isolation_level=isolation, request_timeout=left)
        failed: dict[TopicPartition, BaseException] = {}
        for tp, future in futures.items():
            try:
                ends[tp.partition] = int(future.result(left).offset)
            except Exception as refused:
                failed[tp] = refused
        # a leader moving, a broker busy: the answer a moment later is as good
        retry = all(_retriable(e) for e in failed.values())
        if not failed or not retry or time.monotonic() >= deadline:
            break
        asked = dict.fromkeys(failed, latest)
        time.sleep(0.1)
    for tp, error in failed.items():
        raise JournalUnavailableError(
            f"end offset of {topic} partition {tp.partition} not known: {error!r}"
        ) from error
    return ends


def _take(consumer: Consumer, batch: int, wait: float) -> list[Message[Any, Any]]:
    """Up to ``batch`` records that are there, at once; when none is, the first within
    ``wait`` seconds and what came with it (``consume(n, timeout)`` would wait out its
    timeout for ``n`` records, at every restore's last fetch)."""
    got = consumer.consume(batch, 0)
    if got:
        return got
    first = consumer.poll(wait)
    return [] if first is None else [first, *consumer.consume(batch - 1, 0)]


#: Answers a moment later may not give: a topic just created whose leaders are being
#: elected, a leader moving (the admin client's results do not mark them retriable).
_PASSING = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.NOT_ENOUGH_REPLICAS,
        KafkaError._TIMED_OUT,
        KafkaError._TRANSPORT,
    }
)


def _retriable(exc: BaseException) -> bool:
    err = exc.args[0] if exc.args else None
    return isinstance(err, KafkaError) and (bool(err.retriable()) or err.code() in _PASSING)


def restore(
    brokers: Brokers,
    topic: str,
    dbs: Mapping[int, JournalDb],
    *,
    timeout: float = 300.0,
    batch: int = BATCH,
    bound: IsolationLevel = IsolationLevel.READ_UNCOMMITTED,
) -> dict[int, Restored]:
    """Bring each partition's database (``dbs``: partition -> database) up to the end of its
    changelog partition, from the offset after its ``persisted_offset``. Blocking;
    ``JournalUnavailableError`` when the broker does not answer or the end is not reached
    within ``timeout`` seconds. ``bound`` is the isolation of the end offsets: leave it
    (``READ_COMMITTED`` is there to show what goes wrong with it)."""
    deadline = time.monotonic() + timeout
    ends = high_watermarks(brokers, topic, dbs, isolation=bound, timeout=timeout)
    starts: dict[int, int] = {}
    for p, db in dbs.items():
        persisted = persisted_offset(db)
        starts[p] = 0 if persisted is None else persisted + 1
        if starts[p] > ends[p]:
            raise JournalUnavailableError(
                f"journal partition {p}: its database holds changelog offset {persisted}, "
                f"past the end of {topic} ({ends[p]}): the topic was recreated; delete the "
                "partition's database to restore it from the changelog"
            )
    counts = dict.fromkeys(dbs, 0)
    todo = {p for p in dbs if starts[p] < ends[p]}
    if todo:
        _read(
            brokers,
            topic,
            dbs,
            starts=starts,
            ends=ends,
            todo=todo,
            counts=counts,
            deadline=deadline,
            batch=batch,
        )
    return {p: Restored(p, starts[p], ends[p], counts[p]) for p in dbs}


def _read(
    brokers: Brokers,
    topic: str,
    dbs: Mapping[int, JournalDb],
    *,
    starts: Mapping[int, int],
    ends: Mapping[int, int],
    todo: set[int],
    counts: dict[int, int],
    deadline: float,
    batch: int,
) -> None:
    consumer = Consumer(reader_config(brokers, group=f"{topic}.restore"))
    try:
        consumer.assign([TopicPartition(topic, p, starts[p]) for p in sorted(todo)])
        written = {p: starts[p] - 1 for p in todo}  # the offset each database holds
        while todo:
            left = deadline - time.monotonic()
            if left <= 0:
                at = {p: written[p] + 1 for p in sorted(todo)}
                end = {p: ends[p] for p in sorted(todo)}
                raise JournalUnavailableError(
                    f"restore of {topic} not done in time: read up to {at}, end {end}"
                )
            got: dict[int, list[tuple[bytes, bytes | None]]] = {}
            last: dict[int, int] = {}
            for msg in _take(consumer, batch, min(0.5, left)):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        continue
                    if err.fatal() or not err.retriable():
                        raise JournalUnavailableError(f"restore of {topic}: {err.str()}")
                    # a leader moving, a broker restarting: the consumer tries again
                    log.info("restore of %s: %s (retried)", topic, err.str())
                    continue
                p = msg.partition()
                offset = msg.offset()
                if p is None or offset is None or p not in todo or offset >= ends[p]:
                    continue
                key = msg.key()
                if key is None:  # not a journal record (nothing of ours writes one)
                    continue
                got.setdefault(p, []).append((key, msg.value()))
                last[p] = offset
            for p, records in got.items():
                dbs[p].write(records, last[p])
                written[p] = last[p]
                counts[p] += len(records)
            positions = consumer.position([TopicPartition(topic, p) for p in sorted(todo)])
            for tp in positions:
                p = tp.partition
                if tp.offset >= ends[p]:
                    todo.discard(p)
                    if written[p] < ends[p] - 1:  # markers, aborted records: read past
                        dbs[p].write([], ends[p] - 1)
    finally:
        consumer.close()

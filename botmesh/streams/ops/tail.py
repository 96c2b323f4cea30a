"""Topics followed from their start, in a background thread: what ``botmesh console`` keeps
its index from (the journal's changelog, the receipts, the dead letters, the counters).

A :class:`Follower` assigns itself every partition of its topics (no consumer group:
nothing is committed), reads each from its earliest retained record (``read_committed``:
records of aborted transactions never show) and then keeps following it, handing each
batch of records to ``on_batch`` in the thread that reads them. A topic that does not
exist yet is looked for again every ``refresh_s`` seconds, and so are new partitions. What
it has read so far, per topic, is :meth:`Follower.progress`: a partition is at its end once
the broker said so (an end-of-partition event, which also passes the transaction markers
of ``exactly_once``) and nothing newer came since.

A broker that goes away is not an error here: librdkafka reconnects by itself, and the
last error it reported is kept (:attr:`Follower.error`) for the operator to see.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from botmesh.streams.connection import Brokers, confluent_options
from botmesh.streams.groups import admin_client
from botmesh.streams.ops.operator import partition_offsets

__all__ = ["Follower", "Record", "TopicProgress"]

log = logging.getLogger("botmesh.tail")


class Record(NamedTuple):
    """One record as read from its topic (a named tuple: made 150,000 times a catch-up)."""

    topic: str
    partition: int
    offset: int
    #: the record's timestamp, epoch seconds
    timestamp: float
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes | None]] = ()


@dataclass(frozen=True, slots=True)
class TopicProgress:
    """How far a topic is read: ``read`` offsets of ``span`` (both summed over its
    partitions, from each one's earliest retained offset); ``at_end`` when every partition
    is read to its end now."""

    topic: str
    exists: bool
    partitions: int
    read: int
    span: int
    at_end: bool


@dataclass(slots=True)
class _Partition:
    start: int = 0
    end: int = 0
    position: int = 0
    at_end: bool = False


class Follower:
    """Follow ``topics`` from their start in a thread; ``on_batch(records)`` gets what is
    read, in partition order within a batch. ``start()`` it, ``stop()`` it."""

    def __init__(
        self,
        bootstrap: Brokers,
        topics: Sequence[str],
        on_batch: Callable[[list[Record]], None],
        *,
        group_id: str,
        refresh_s: float = 2.0,
        batch: int = 5000,
    ) -> None:
        self._bootstrap = bootstrap
        self._topics = list(dict.fromkeys(topics))
        self._on_batch = on_batch
        self._group_id = group_id  # librdkafka wants one; never joined (assign only)
        self._refresh_s = refresh_s
        self._batch = batch
        self._lock = threading.Lock()
        self._parts: dict[tuple[str, int], _Partition] = {}
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        #: The last error the client reported (``None`` once records flow again).
        self.error: str | None = None
        #: When the follower started (epoch seconds).
        self.started = 0.0

    @property
    def topics(self) -> list[str]:
        return list(self._topics)

    def start(self) -> None:
        self.started = time.time()
        self._thread = threading.Thread(target=self._run, name="botmesh-follower", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def progress(self) -> list[TopicProgress]:
        """Each topic's progress, in the order the topics were given."""
        with self._lock:
            parts = dict(self._parts)
        out = []
        for topic in self._topics:
            mine = [p for (t, _), p in parts.items() if t == topic]
            out.append(
                TopicProgress(
                    topic,
                    bool(mine),
                    len(mine),
                    sum(p.position - p.start for p in mine),
                    sum(max(p.end, p.position) - p.start for p in mine),
                    bool(mine) and all(p.at_end for p in mine),
                )
            )
        return out

    def at_end(self, topics: Sequence[str] | None = None) -> bool:
        """Every partition of ``topics`` (default: all) exists and is read to its end."""
        wanted = set(topics if topics is not None else self._topics)
        return all(p.at_end for p in self.progress() if p.topic in wanted) and all(
            p.exists for p in self.progress() if p.topic in wanted
        )

    # -- the thread ------------------------------------------------------------------------

    def _run(self) -> None:
        consumer = Consumer(
            {
                **confluent_options(self._bootstrap),
                "group.id": self._group_id,
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "enable.partition.eof": True,
                "auto.offset.reset": "earliest",
                "fetch.wait.max.ms": 100,
                "error_cb": self._client_error,
                "log_level": 0,
            }
        )
        admin = admin_client(self._bootstrap, 10.0)
        try:
            next_refresh = 0.0
            while not self._stopping.is_set():
                now = time.monotonic()
                if now >= next_refresh:
                    self._refresh(consumer, admin)
                    next_refresh = now + self._refresh_s
                if not self._parts:
                    self._stopping.wait(min(self._refresh_s, 0.5))
                    continue
                self._consume(consumer)
        except Exception:
            log.exception("following %s stopped", ", ".join(self._topics))
            self.error = "the follower stopped (see the log); restart the console"
        finally:
            consumer.close()

    def _client_error(self, err: KafkaError) -> None:
        self.error = f"{err.name()}: {err.str()}"

    def _refresh(self, consumer: Consumer, admin: Any) -> None:
        """Assign partitions that appeared (from their start) and read the ends again
        (with the admin client: its own connection, never queued behind a fetch)."""
        try:
            meta = admin.list_topics(timeout=5.0)
        except Exception as exc:  # the broker away: tried again at the next refresh
            self.error = f"cannot list the topics: {exc}"
            return
        new: list[TopicPartition] = []
        for topic in self._topics:
            t = meta.topics.get(topic)
            if t is None or t.error is not None:
                continue
            for p in sorted(t.partitions):
                if (topic, p) not in self._parts:
                    new.append(TopicPartition(topic, p, OFFSET_BEGINNING))
        if new:
            with self._lock:
                for tp in new:
                    self._parts[(tp.topic, tp.partition)] = _Partition()
            consumer.incremental_assign(new)
        tps = list(self._parts)
        try:
            starts = partition_offsets(admin, tps, "earliest", self._bootstrap, 5.0)
            ends = partition_offsets(admin, tps, "latest", self._bootstrap, 5.0)
        except Exception as exc:
            self.error = f"cannot read the topics' offsets: {exc}"
            return
        with self._lock:
            for where, part in self._parts.items():
                if where not in starts or where not in ends:
                    continue
                if part.position == 0 and not part.at_end:
                    part.position = starts[where]
                part.start, part.end = starts[where], ends[where]

    def _consume(self, consumer: Consumer) -> None:
        """One batch: its records handed over first, then the partitions' positions moved
        (so that a partition at its end means its records are handed over)."""
        messages = consumer.consume(num_messages=self._batch, timeout=0.2)
        if not messages:
            return
        records: list[Record] = []
        #: (topic, partition) -> (position, at its end)
        moved: dict[tuple[str, int], tuple[int, bool]] = {}
        for m in messages:
            where = (str(m.topic()), int(m.partition() or 0))
            offset = int(m.offset() or 0)
            err = m.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    moved[where] = (offset, True)
                else:
                    self.error = f"{err.name()}: {err.str()}"
                continue
            moved[where] = (offset + 1, False)
            _, ms = m.timestamp()
            key, value = m.key(), m.value()
            records.append(
                Record(
                    where[0],
                    where[1],
                    offset,
                    (ms or 0) / 1000.0,
                    key if isinstance(key, bytes) else None,
                    value if isinstance(value, bytes) else None,
                    m.headers() or (),  # type: ignore[arg-type]  # (str, bytes) pairs
                )
            )
        if records:
            self.error = None
            try:
                self._on_batch(records)
            except Exception:  # one bad batch must not stop the follower
                log.exception("a batch of %d records could not be indexed", len(records))
        with self._lock:
            for where, (position, at_end) in moved.items():
                part = self._parts.get(where)
                if part is None:
                    continue
                part.position = max(part.position, position)
                part.at_end = at_end
                if at_end:
                    part.end = max(part.end, position)

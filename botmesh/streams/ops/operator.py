"""The operator's view of a deployment on Kafka: ``botmesh replay``, ``status`` and
``metrics`` (``botmesh._cli.operator`` prints what these functions return).

- :func:`replay` resets the worker group's committed offsets (``<prefix>.worker``) on the
  inbound and/or requests topic, as ``kafka-consumer-groups.sh --reset-offsets`` does: to
  an offset, to the first record at or after a time (a consumer's ``offsets_for_times``),
  or to the earliest retained record. It is refused (:class:`Refused`) while the group
  lists members, because the broker only takes offsets for a group nobody is in and a
  live worker would commit over them; ``force`` first removes the listed members from the
  group (a LeaveGroup for each, as Java's ``Admin.removeMembersFromConsumerGroup``: the
  way to clear a static member whose worker stopped and whose session has not expired; a
  running worker removed so rejoins at its next heartbeat, goes on from its own position
  and commits over the reset).
- :func:`status`: the group's state and members, the lag of every inbound and requests
  partition, the journal's changelog (read to its end, last value of each key wins), the
  dead letters of each DLQ topic, the sends parked on each retry tier.
- :func:`read_metrics`: the last counters each worker published on ``<prefix>.metrics``
  (:func:`metrics_record` is the record the worker produces).

Everything here is synchronous (confluent-kafka's AdminClient and Consumer) except the
removal of members (``botmesh.streams.groups.remove_members``: a LeaveGroup v3 request of
its own, confluent-kafka has no call for it). A broker that does not
answer raises ``ConnectionError``; a missing topic :class:`TopicMissing`; a bad argument
``ValueError``; a precondition that does not hold :class:`Refused`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    IsolationLevel,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)
from confluent_kafka.admin import OffsetSpec  # type: ignore[attr-defined]

from botmesh.streams.connection import (
    Brokers,
    confluent_options,
    list_topics,
    servers,
)
from botmesh.streams.groups import (
    GroupInfo,
    Member,
    admin_client,
    coordinated,
    describe,
    describe_group,
    error_code,
    remove_members,
    result_of,
    unreachable,
)
from botmesh.streams.journal_db import JournalView
from botmesh.streams.table_kv import TABLE_NAME
from botmesh.topics.catalog import RETRY_TIERS, Catalog
from botmesh.topics.status_records import (
    METRICS_VERSION,
    WorkerMetrics,
    decode_metrics,
    metrics_record,
)

__all__ = [
    "METRICS_VERSION",
    "GroupInfo",
    "JournalSummary",
    "Lag",
    "Member",
    "Move",
    "Refused",
    "ReplayResult",
    "Status",
    "TierCount",
    "TopicCount",
    "TopicMissing",
    "WorkerMetrics",
    "decode_metrics",
    "describe_group",
    "is_ambiguous_send",
    "metrics_record",
    "parse_time",
    "partition_offsets",
    "read_metrics",
    "remove_members",
    "replay",
    "status",
    "sum_counters",
]

#: Seconds any one request to the broker may take (``--timeout``).
DEFAULT_TIMEOUT = 10.0
#: Replayable topics by their ``--topic`` name.
REPLAYABLE = ("inbound", "requests")
_EARLIEST: OffsetSpec = OffsetSpec.earliest()  # type: ignore[no-untyped-call]
_LATEST: OffsetSpec = OffsetSpec.latest()  # type: ignore[no-untyped-call]


class Refused(Exception):
    """A precondition does not hold (live members); the message names the fix. The CLI
    exits 1."""


class TopicMissing(LookupError):
    """A topic of the prefix does not exist (a wrong prefix, no topics created yet). The
    CLI exits 3, as ``botmesh dlq`` does."""


# -- the group ---------------------------------------------------------------------------------


def _topics(admin: Any, bootstrap: Brokers, timeout: float) -> dict[str, int]:
    """Topic -> partition count; the first call of every command: ``ConnectionError`` when
    the broker does not answer, ``KafkaAuthError`` (naming the setting) when it refuses."""
    meta = list_topics(bootstrap, timeout, client=admin)
    return {name: len(t.partitions) for name, t in meta.topics.items() if t.error is None}


def _require(topics: Mapping[str, int], name: str, cat: Catalog) -> int:
    if name not in topics:
        raise TopicMissing(
            f"topic {name!r} does not exist: is the prefix right (--prefix, "
            f"BOTMESH_TOPIC_PREFIX; here {cat.prefix!r})? `botmesh topics create` creates the "
            "topics, and so does the worker at its start"
        )
    return topics[name]


def _committed(
    admin: Any, group: str, bootstrap: Brokers, timeout: float
) -> dict[tuple[str, int], int]:
    def ask(step: float) -> Any:
        request = [ConsumerGroupTopicPartitions(group)]
        return admin.list_consumer_group_offsets(request, request_timeout=step)[group]

    try:
        res = coordinated(ask, bootstrap, timeout)
    except KafkaException as exc:
        if error_code(exc) == KafkaError.GROUP_ID_NOT_FOUND:
            return {}
        raise
    return {
        (tp.topic, tp.partition): tp.offset
        for tp in res.topic_partitions
        if tp.offset >= 0 and tp.error is None
    }


def _offsets(
    admin: Any,
    tps: Iterable[tuple[str, int]],
    spec: OffsetSpec,
    bootstrap: Brokers,
    timeout: float,
) -> dict[tuple[str, int], int]:
    """``(topic, partition) -> offset`` for ``spec`` (earliest, latest); ``latest`` under
    read_committed is the last stable offset (no open transaction's records)."""
    pending = {(t, p) for t, p in tps}
    found: dict[tuple[str, int], int] = {}
    deadline = time.monotonic() + timeout
    while pending:
        futs = admin.list_offsets(
            {TopicPartition(t, p): spec for t, p in sorted(pending)},
            isolation_level=IsolationLevel.READ_COMMITTED,
            request_timeout=timeout,
        )
        for tp, f in futs.items():
            try:
                found[(tp.topic, tp.partition)] = result_of(f, bootstrap, timeout).offset
            except KafkaException as exc:
                # A leader moving, or a topic created a moment ago whose leader the broker
                # does not know yet: asked again until the request timeout.
                if not _retriable(exc) or time.monotonic() > deadline:
                    raise
            else:
                pending.discard((tp.topic, tp.partition))
        if pending:
            time.sleep(0.1)
    return found


def partition_offsets(
    admin: Any,
    tps: Iterable[tuple[str, int]],
    which: str,
    bootstrap: Brokers,
    timeout: float,
) -> dict[tuple[str, int], int]:
    """``(topic, partition) -> offset``: the ``earliest`` retained, or the ``latest`` (under
    read_committed: the last stable offset), in one request per broker."""
    specs = {"earliest": _EARLIEST, "latest": _LATEST}
    if which not in specs:
        raise ValueError(f"which {which!r}: earliest or latest")
    return _offsets(admin, tps, specs[which], bootstrap, timeout)


_LEADERLESS = {
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError.REPLICA_NOT_AVAILABLE,
    KafkaError.UNKNOWN_LEADER_EPOCH,
    KafkaError.FENCED_LEADER_EPOCH,
    KafkaError._WAIT_COORD,
}


def _retriable(exc: KafkaException) -> bool:
    """An error the request itself names as retriable, or a partition without a known
    leader (librdkafka does not mark the per-partition errors of an admin result)."""
    err = exc.args[0] if exc.args else None
    return isinstance(err, KafkaError) and (bool(err.retriable()) or err.code() in _LEADERLESS)


# -- replay ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Move:
    """One partition of a replay: its committed offset (``None``: nothing committed) and the
    one the replay sets, with the partition's retained range ``[start, end)``."""

    topic: str
    partition: int
    current: int | None
    new: int
    start: int
    end: int

    @property
    def records(self) -> int:
        """Records the group reads again (negative: skipped) compared to the committed
        offset (or to the start when nothing is committed)."""
        return (self.current if self.current is not None else self.start) - self.new


@dataclass(slots=True)
class ReplayResult:
    group: str
    #: ``offset N``, ``time <ISO> (<ms>)`` or ``earliest``
    target: str
    members: list[Member]
    moves: list[Move]
    dry_run: bool
    applied: bool = False
    #: members removed from the group (``force``)
    removed: list[str] = field(default_factory=list)
    #: a dry run's refusal: what the real run would say (and exit 1 with)
    refused: str | None = None

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["moves"] = [{**asdict(m), "records": m.records} for m in self.moves]
        return out


def parse_time(value: str) -> int:
    """``--from-time``: ISO 8601 (``2026-12-03T12:00:00Z``; without a zone: UTC) or seconds
    since the epoch (decimals allowed); returns epoch milliseconds."""
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = datetime.fromisoformat(text)
        except ValueError:
            raise ValueError(
                f"--from-time {value!r}: give an ISO 8601 time (2026-12-03T12:00:00Z) or "
                "seconds since the epoch (1796299200)"
            ) from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = when.timestamp()
    if seconds < 0:
        raise ValueError(f"--from-time {value!r}: before the epoch")
    return round(seconds * 1000)


def _live_members_message(info: GroupInfo) -> str:
    who = ", ".join(m.describe() for m in info.members)
    return (
        f"group {info.group!r} has {len(info.members)} live member(s): {who}; the broker "
        "takes new offsets only for a group nobody is in, and a running worker would commit "
        "over them. Stop the workers first (SIGTERM; a worker with an instance id stays "
        "listed up to BOTMESH_SESSION_TIMEOUT, 30 s by default, after it stopped), then run "
        "this again; or pass --force to remove these members from the group first (only "
        "when their workers are stopped: a running one rejoins)"
    )


def replay(
    bootstrap: Brokers,
    cat: Catalog,
    *,
    from_offset: int | None = None,
    from_time_ms: int | None = None,
    to_earliest: bool = False,
    topics: Sequence[str] = ("inbound",),
    partitions: Sequence[int] | None = None,
    force: bool = False,
    dry_run: bool = False,
    timeout: float = DEFAULT_TIMEOUT,
) -> ReplayResult:
    """Reset the worker group's offsets on ``topics`` (``inbound``, ``requests``) to
    ``from_offset`` (clamped into each partition's retained range), to the first record at
    or after ``from_time_ms`` (the end where there is none), or to the earliest retained
    record. ``dry_run``: compute and return the moves only."""
    _check_replay(from_offset, from_time_ms, to_earliest, topics)
    admin = admin_client(bootstrap, timeout)
    have = _topics(admin, bootstrap, timeout)
    names = [cat.inbound if t == "inbound" else cat.requests for t in dict.fromkeys(topics)]
    tps = _replay_partitions(have, names, partitions, cat)
    info = describe(admin, cat.group, bootstrap, timeout)
    committed = _committed(admin, cat.group, bootstrap, timeout)
    starts = _offsets(admin, tps, _EARLIEST, bootstrap, timeout)
    ends = _offsets(admin, tps, _LATEST, bootstrap, timeout)
    if from_offset is not None:
        target = f"offset {from_offset}"
        news = {tp: min(max(from_offset, starts[tp]), ends[tp]) for tp in tps}
    elif from_time_ms is not None:
        iso = datetime.fromtimestamp(from_time_ms / 1000, UTC).isoformat()
        target = f"time {iso} ({from_time_ms} ms)"
        news = _for_time(
            bootstrap=bootstrap, cat=cat, tps=tps, ts_ms=from_time_ms, ends=ends, timeout=timeout
        )
    else:
        target = "earliest"
        news = dict(starts)
    moves = [
        Move(t, p, committed.get((t, p)), news[(t, p)], starts[(t, p)], ends[(t, p)])
        for t, p in tps
    ]
    result = ReplayResult(cat.group, target, info.members, moves, dry_run)
    if info.members and not force:
        if dry_run:
            result.refused = _live_members_message(info)
            return result
        raise Refused(_live_members_message(info))
    if dry_run:
        return result
    if info.members:
        result.removed = asyncio.run(remove_members(bootstrap, cat.group, info.members, timeout))
    _apply(admin, cat.group, moves, bootstrap, timeout)
    result.applied = True
    return result


def _check_replay(
    from_offset: int | None, from_time_ms: int | None, to_earliest: bool, topics: Sequence[str]
) -> None:
    """``ValueError`` unless the replay names exactly one target and only replayable topics."""
    if sum(x is not None and x is not False for x in (from_offset, from_time_ms, to_earliest)) != 1:
        raise ValueError("give exactly one of --from-offset, --from-time, --to-earliest")
    if from_offset is not None and from_offset < 0:
        raise ValueError(f"--from-offset {from_offset}: must be >= 0")
    unknown = [t for t in topics if t not in REPLAYABLE]
    if unknown or not topics:
        raise ValueError(f"--topic {unknown}: use {' or '.join(REPLAYABLE)}")


def _replay_partitions(
    have: Mapping[str, int], names: Sequence[str], partitions: Sequence[int] | None, cat: Catalog
) -> list[tuple[str, int]]:
    """The partitions of topics ``names`` a replay moves: ``partitions`` of each (every one
    when ``None``); ``ValueError`` naming a partition a topic does not have."""
    tps: list[tuple[str, int]] = []
    for name in names:
        count = _require(have, name, cat)
        chosen = sorted(set(partitions)) if partitions else list(range(count))
        bad = [p for p in chosen if not 0 <= p < count]
        if bad:
            raise ValueError(f"--partition {bad}: {name} has partitions 0-{count - 1}")
        tps += [(name, p) for p in chosen]
    return tps


def _apply(
    admin: Any, group: str, moves: Sequence[Move], bootstrap: Brokers, timeout: float
) -> None:
    """Sets the group's offsets to ``moves``, asking again while the group settles as empty
    just after its last member left (``Refused`` once a member is back)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            _alter(admin, group, moves, bootstrap, timeout)
            break
        except Refused:
            # the group settles as empty just after its last member left; a member that
            # is back is a running worker
            again = describe(admin, group, bootstrap, timeout)
            if again.members or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _for_time(
    *,
    bootstrap: Brokers,
    cat: Catalog,
    tps: Sequence[tuple[str, int]],
    ts_ms: int,
    ends: Mapping[tuple[str, int], int],
    timeout: float,
) -> dict[tuple[str, int], int]:
    """The first offset at or after ``ts_ms`` in each partition (record timestamps), the
    end offset where no record is that recent."""
    consumer = Consumer(
        {
            **confluent_options(bootstrap),
            "group.id": f"{cat.prefix}.operator",  # never joins: assign/offsets only
            "enable.auto.commit": False,
            "log_level": 0,
        }
    )
    try:
        found = consumer.offsets_for_times(
            [TopicPartition(t, p, ts_ms) for t, p in tps], timeout=timeout
        )
    except KafkaException as exc:
        raise unreachable(bootstrap, exc) from None
    finally:
        consumer.close()
    out = {}
    for tp in found:
        if tp.error is not None:
            raise RuntimeError(f"offsets_for_times {tp.topic}[{tp.partition}]: {tp.error}")
        key = (tp.topic, tp.partition)
        out[key] = tp.offset if tp.offset >= 0 else ends[key]
    return out


def _alter(
    admin: Any, group: str, moves: Sequence[Move], bootstrap: Brokers, timeout: float
) -> None:
    request = ConsumerGroupTopicPartitions(
        group, [TopicPartition(m.topic, m.partition, m.new) for m in moves]
    )

    def ask(step: float) -> Any:  # the same offsets again after an attempt timed out
        return admin.alter_consumer_group_offsets([request], request_timeout=step)[group]

    try:
        res = coordinated(ask, bootstrap, timeout)
    except KafkaException as exc:
        if error_code(exc) in {KafkaError.UNKNOWN_MEMBER_ID, KafkaError.REBALANCE_IN_PROGRESS}:
            raise Refused(
                f"the broker refused the new offsets of group {group!r}: it has members "
                f"again ({exc}); a worker of the group is running: stop it first"
            ) from None
        raise
    failed = [f"{tp.topic}[{tp.partition}]: {tp.error}" for tp in res.topic_partitions if tp.error]
    if failed:
        raise RuntimeError(f"offsets not set for {', '.join(failed)}")


# -- reading a compacted topic -----------------------------------------------------------------

Progress = Callable[[int, int], None]


def _read_compacted(
    *,
    bootstrap: Brokers,
    cat: Catalog,
    topic: str,
    partitions: int,
    on_record: Callable[[bytes, bytes | None], None],
    timeout: float,
    progress: Progress | None = None,
) -> tuple[int, int]:
    """Read every partition of ``topic`` from its start to its end (read_committed: up to
    the last stable offset), handing each record to ``on_record``; returns the offsets the
    topic spans (sum of end minus start) and the records read."""
    admin = admin_client(bootstrap, timeout)
    tps = [(topic, p) for p in range(partitions)]
    reading = _CompactedRead(
        topic,
        starts=_offsets(admin, tps, _EARLIEST, bootstrap, timeout),
        ends=_offsets(admin, tps, _LATEST, bootstrap, timeout),
    )
    span = reading.span
    if progress is not None:
        progress(0, span)
    if not reading.todo:
        return span, 0
    consumer = Consumer(
        {
            **confluent_options(bootstrap),
            "group.id": f"{cat.prefix}.operator",  # never joins: assign only, no commits
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "log_level": 0,
        }
    )
    try:
        reading.run(consumer, on_record, bootstrap=bootstrap, timeout=timeout, progress=progress)
    finally:
        consumer.close()
    if progress is not None:
        progress(span, span)
    return span, reading.read


@dataclass(slots=True)
class _CompactedRead:
    """One read of a compacted topic from each partition's start to its end: how far each
    partition got, which still have records to read, and how many records were read."""

    topic: str
    starts: dict[tuple[str, int], int]
    ends: dict[tuple[str, int], int]
    #: the offsets the topic spans: the sum of end minus start
    span: int = field(init=False)
    todo: set[tuple[str, int]] = field(init=False)
    done_offsets: dict[tuple[str, int], int] = field(init=False)
    read: int = 0

    def __post_init__(self) -> None:
        self.span = sum(self.ends[tp] - self.starts[tp] for tp in self.starts)
        self.todo = {tp for tp in self.starts if self.ends[tp] > self.starts[tp]}
        self.done_offsets = dict(self.starts)

    def run(
        self,
        consumer: Consumer,
        on_record: Callable[[bytes, bytes | None], None],
        *,
        bootstrap: Brokers,
        timeout: float,
        progress: Progress | None,
    ) -> None:
        """Reads until every partition reached its end; ``ConnectionError`` when nothing
        comes for three times ``timeout``."""
        consumer.assign([TopicPartition(t, p, self.starts[(t, p)]) for t, p in sorted(self.todo)])
        quiet_since = time.monotonic()
        while self.todo:
            batch = consumer.consume(num_messages=5000, timeout=0.5)
            if not batch:
                if time.monotonic() - quiet_since > 3 * timeout:
                    raise ConnectionError(
                        f"reading {self.topic} stalled at {self.done_offsets} (ends "
                        f"{self.ends}); is the broker at {servers(bootstrap)!r} still up?"
                    )
                continue
            quiet_since = time.monotonic()
            self._take(batch, on_record)
            if progress is not None:
                done = sum(self.done_offsets[tp] - self.starts[tp] for tp in self.starts)
                progress(done, self.span)

    def _take(self, batch: list[Message], on_record: Callable[[bytes, bytes | None], None]) -> None:
        """Hands each record of ``batch`` short of its partition's end to ``on_record``,
        and marks the partitions it shows at their end."""
        for m in batch:
            tp = (str(m.topic()), int(m.partition() or 0))
            err = m.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    if int(m.offset() or 0) >= self.ends[tp]:
                        self.todo.discard(tp)
                    continue
                raise KafkaException(err)
            offset = int(m.offset() or 0)
            if offset >= self.ends[tp]:
                self.todo.discard(tp)
                continue
            key, value = m.key(), m.value()
            on_record(
                key if isinstance(key, bytes) else b"",
                value if isinstance(value, bytes) else None,
            )
            self.read += 1
            self.done_offsets[tp] = offset + 1


# -- status ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Lag:
    topic: str
    partition: int
    #: the group's committed offset; ``None``: nothing committed (the worker starts at the
    #: earliest retained record)
    committed: int | None
    end: int
    lag: int
    #: instance id (or member id) of the member that owns the partition, if any
    owner: str | None


@dataclass(frozen=True, slots=True)
class TopicCount:
    topic: str
    #: end minus start offsets, summed over the partitions; ``None``: no such topic
    records: int | None


@dataclass(frozen=True, slots=True)
class JournalSummary:
    topic: str
    #: end minus start offsets summed (records not yet compacted away, transaction markers
    #: of ``exactly_once`` included)
    offsets: int
    #: records read (read_committed, from the start to the end), key and value bytes of them
    records: int
    bytes: int
    #: keys whose last record is not a tombstone
    keys: int
    #: outbox keys whose last value has state ``unknown`` and ``ambiguous`` true
    ambiguous: int


@dataclass(frozen=True, slots=True)
class TierCount:
    """The sends parked on one retry tier and not attempted yet: the records of
    ``<prefix>.outbox.retry.<tier>`` past the retry group's committed offsets (nothing
    committed: from the partition's start); ``None``: no such topic."""

    tier: str
    topic: str
    parked: int | None


@dataclass(slots=True)
class Status:
    group: GroupInfo
    lags: list[Lag]
    dead_letters: list[TopicCount]
    journal: JournalSummary | None
    parked: list[TierCount] = field(default_factory=list)

    @property
    def total_lag(self) -> int:
        return sum(x.lag for x in self.lags)

    def as_dict(self) -> dict[str, Any]:
        return {
            "group": self.group.group,
            "state": self.group.state,
            "members": [asdict(m) for m in self.group.members],
            "lag": [asdict(x) for x in self.lags],
            "total_lag": self.total_lag,
            "dead_letters": [asdict(d) for d in self.dead_letters],
            "journal": asdict(self.journal) if self.journal is not None else None,
            "parked": [asdict(t) for t in self.parked],
        }


def is_ambiguous_send(key: str, value: Mapping[str, Any]) -> bool:
    """An outbox record (``<scope>/out/<key>``) whose send a crash left in flight and
    ``on_ambiguous="skip"`` gave up: state ``unknown``, ``ambiguous`` true."""
    parts = key.split("/", 2)  # <scope>/out/<idempotency key>; the scope has no '/'
    return (
        len(parts) == 3
        and parts[1] == "out"
        and value.get("state") == "unknown"
        and bool(value.get("ambiguous"))
    )


def status(
    bootstrap: Brokers,
    cat: Catalog,
    *,
    journal: bool = True,
    progress: Progress | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> Status:
    """The group, the lag of its inbound and requests partitions, the dead letters, the
    sends parked on the retry tiers and (``journal``) a read of the journal's changelog to
    its end."""
    admin = admin_client(bootstrap, timeout)
    have = _topics(admin, bootstrap, timeout)
    _require(have, cat.inbound, cat)
    info = describe(admin, cat.group, bootstrap, timeout)
    lags = _lags(admin, have, cat, bootstrap, timeout, members=info.members)
    dead = _dead_letter_counts(admin, have, cat, bootstrap, timeout)
    summary = None
    changelog = cat.changelog(TABLE_NAME)
    if journal and changelog in have:
        summary = _journal_summary(
            bootstrap=bootstrap,
            cat=cat,
            changelog=changelog,
            partitions=have[changelog],
            timeout=timeout,
            progress=progress,
        )
    return Status(info, lags, dead, summary, _parked(admin, have, cat, bootstrap, timeout))


def _lags(
    admin: Any,
    have: Mapping[str, int],
    cat: Catalog,
    bootstrap: Brokers,
    timeout: float,
    *,
    members: Sequence[Member],
) -> list[Lag]:
    """The lag of the group on each inbound and requests partition, with its owner."""
    committed = _committed(admin, cat.group, bootstrap, timeout)
    tps = [(t, p) for t in (cat.inbound, cat.requests) if t in have for p in range(have[t])]
    starts = _offsets(admin, tps, _EARLIEST, bootstrap, timeout)
    ends = _offsets(admin, tps, _LATEST, bootstrap, timeout)
    owners = {
        (t, p): m.instance_id or m.member_id
        for m in members
        for t, ps in m.partitions.items()
        for p in ps
    }
    # the group assigns the inbound; its worker takes the same requests partitions with it
    owners.update({(cat.requests, p): o for (t, p), o in list(owners.items()) if t == cat.inbound})
    lags = []
    for tp in tps:
        done = committed.get(tp)
        lags.append(
            Lag(
                tp[0],
                tp[1],
                done,
                ends[tp],
                ends[tp] - (starts[tp] if done is None else done),
                owners.get(tp),
            )
        )
    return lags


def _dead_letter_counts(
    admin: Any, have: Mapping[str, int], cat: Catalog, bootstrap: Brokers, timeout: float
) -> list[TopicCount]:
    """The records held on each dead-letter topic (``None`` for one that does not exist)."""
    dlqs = [cat.inbound_dlq, cat.requests_dlq, cat.outbox_dlq]
    dlq_tps = [(t, p) for t in dlqs if t in have for p in range(have[t])]
    dstarts = _offsets(admin, dlq_tps, _EARLIEST, bootstrap, timeout)
    dends = _offsets(admin, dlq_tps, _LATEST, bootstrap, timeout)
    return [
        TopicCount(
            t, sum(dends[tp] - dstarts[tp] for tp in dlq_tps if tp[0] == t) if t in have else None
        )
        for t in dlqs
    ]


def _journal_summary(
    *,
    bootstrap: Brokers,
    cat: Catalog,
    changelog: str,
    partitions: int,
    timeout: float,
    progress: Progress | None,
) -> JournalSummary:
    """The journal's changelog read to its end: its records, bytes, live keys and the
    ambiguous sends among them."""
    view = JournalView()
    size = 0

    def keep(key: bytes, value: bytes | None) -> None:
        nonlocal size
        size += len(key) + len(value or b"")
        view.apply(key, value)

    span, read = _read_compacted(
        bootstrap=bootstrap,
        cat=cat,
        topic=changelog,
        partitions=partitions,
        on_record=keep,
        timeout=timeout,
        progress=progress,
    )
    keys = len(view.entries)
    ambiguous = sum(is_ambiguous_send(e.key, e.value) for e in view.entries.values())
    return JournalSummary(changelog, span, read, size, keys, ambiguous)


def _parked(
    admin: Any, have: Mapping[str, int], cat: Catalog, bootstrap: Brokers, timeout: float
) -> list[TierCount]:
    tiers = [(name, cat.retry(name)) for name, _ in RETRY_TIERS]
    tps = [(t, p) for _, t in tiers if t in have for p in range(have[t])]
    committed = _committed(admin, cat.retry_group, bootstrap, timeout)
    starts = _offsets(admin, tps, _EARLIEST, bootstrap, timeout)
    ends = _offsets(admin, tps, _LATEST, bootstrap, timeout)
    out = []
    for name, topic in tiers:
        mine = [tp for tp in tps if tp[0] == topic]
        left = sum(ends[tp] - max(committed.get(tp, starts[tp]), starts[tp]) for tp in mine)
        out.append(TierCount(name, topic, left if topic in have else None))
    return out


# -- metrics -----------------------------------------------------------------------------------


def sum_counters(workers: Iterable[WorkerMetrics]) -> dict[str, int]:
    total: dict[str, int] = {}
    for w in workers:
        for name, n in w.counters.items():
            total[name] = total.get(name, 0) + n
    return total


def read_metrics(
    bootstrap: Brokers, cat: Catalog, *, timeout: float = DEFAULT_TIMEOUT
) -> list[WorkerMetrics]:
    """The last counters each worker published (last value per instance id wins)."""
    admin = admin_client(bootstrap, timeout)
    have = _topics(admin, bootstrap, timeout)
    count = _require(have, cat.metrics, cat)
    latest: dict[bytes, WorkerMetrics | None] = {}

    def keep(key: bytes, value: bytes | None) -> None:
        latest[key] = decode_metrics(key, value)

    _read_compacted(
        bootstrap=bootstrap,
        cat=cat,
        topic=cat.metrics,
        partitions=count,
        on_record=keep,
        timeout=timeout,
    )
    return sorted((w for w in latest.values() if w is not None), key=lambda w: w.instance)

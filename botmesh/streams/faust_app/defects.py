"""The faust-streaming 0.15.3 defects the worker meets, and what botmesh does about each.

``REGISTER`` (at the end) lists every process-wide patch with the upstream code it
replaces and the test that shows the defect there and the workaround meeting it; the
worker installs them from one entry point, ``install(exactly_once=...)``: 14 installers,
17 patched attributes, each with a test of its own.

=====================================================  =====================================
defect                                                 workaround (where)
=====================================================  =====================================
An exception in the agent body acks the event (a       nothing escapes the batch body: a
``take_events`` batch: the whole batch) and the        batch that cannot be settled makes
error handler commits it: it is never redelivered.     the process exit without acking
                                                       (``faust_app.app``: ``os._exit``)
A cancelled ``take_events`` body acks its batch        ``CancelledError`` in the body: exit
(the stream's ``finally``).                            without acking (``faust_app.app``)
Events skipped at a startup seek: records fetched     ``guard_commit_holes`` below: after
while a partition is not yet active for the streams    Faust's seek, a source partition
are dropped, and Faust's seek back to the committed    with no committed offset (or 0) is
offsets skips a partition with no committed offset     sought to its beginning; Faust never
(or offset 0), so those records never reach the        commits past a hole at the head of
agent in this process; and the commit of a partition   the acked offsets, and seeks the
skips a hole of exactly one offset at the head of the  partition back to the hole once, so
acked offsets (``Consumer._new_offset`` checks         the skipped records are delivered
``min(acked) - committed > 1`` where ``committed`` is  again (the journal answers the rest
already the next offset; a committed 0 is not checked  as duplicates); a hole at a record
at all), so a record that never reached the agent is   the agent has and has not acked
committed past and lost.                               (``in_flight``: the worker settles
                                                       batches side by side) only holds
                                                       the commit
A seek back drops what it should redeliver: Faust's    ``ReadOffsets`` (installed with the
drain loop hands over the records it fetched before    guard): the read offset reads as the
the seek and each moves its read offset past the       hole until the records fetched again
offset sought again, so the records fetched again      reached, one by one, where the loop
are dropped as seen (the joins/leaves test: 9 of 510   was at the seek; no gap is recorded
never handled, the commit held at the hole for good).  against it meanwhile
``app.producer.flush()`` returns before a buffered     the journal never relies on it: it
write is acked; a table write is not durable until     awaits the broker's ack of each of its
the commit timer.                                      changelog records (``TableKv.commit``)
Under ``exactly_once`` the changelog offsets are       the journal bypasses Faust's table
kept per changelog partition                           writes: ``JournalTable`` persists each
(``persist_offset_on_commit``) but flushed per         record and its changelog offset into
source partition (``tables.on_commit``), so they       RocksDB itself, once the transaction
are never persisted and every restart replays the      holding it committed
whole changelog.                                       (``botmesh.streams.faust_app.app``)
Under ``exactly_once`` a restore waits at least 10   ``shorten_recovery_poll`` below: the
s whenever the changelog ends in a transaction         restore polls every quarter second, so
marker (always, with transactions): Faust's            it gives up on such an offset after
recovery counts the offsets of records it reads and    half a second (the journal also counts
waits for one at the end offset; only after two        the commit marker after its last record
empty 5 s polls does it check the consumer's           as read: ``faust_app.table``); an
position (``detect_aborted_tx``).                      aborted transaction at the end (a
                                                       worker killed) still needs it; taking
                                                       offsets for markers too early is
                                                       caught by ``verify_aborted_tails``
Faust's recovery applies a changelog a record at a    ``restore_ahead`` below: before the
time (an event, a buffer, a debug log line, a check    recovery takes the end offsets of the
of the recovery's end for each): about 8,000 records   active partitions, the journal's table
a second here, so a worker given a partition of two    reads each up to its end with a
million records answered its first message four        consumer of its own and writes each
minutes later.                                         fetch in one RocksDB batch (for at
                                                       most half the recovery's request
                                                       timeout); the recovery starts where it
                                                       stopped
Under ``exactly_once`` the restore takes a changelog   ``fresh_highwaters`` below: the
partition's end from the consumer's cached last        end offsets are asked of the broker
stable offset (``AIOKafkaConsumerThread._highwaters``  (``ListOffsets``: under
under ``in_transaction``), which is unknown until the  ``read_committed``, the last stable
consumer fetched that partition since it was           offset itself), as under
assigned: a worker given back a partition it held      ``at_least_once``
crashes (``ConsistencyError``: persisted offset >
highwater -1), and one fetched long ago ends the
restore too early.
Under ``exactly_once`` the transactional producers of  ``drop_lost_producers`` below:
partitions the worker lost are kept when they become   before Faust starts the producers of
its standbys (the revoked partitions are mapped to     a new assignment, every producer
transactional ids through the *new* assignment, which  whose partition is not among its
lists a standby's inbound partition too, so none is    active ones is stopped, so a
found to stop): the partition's new owner fences       partition that comes back gets a
them, and when the partition comes back, Faust         fresh one
reuses the fenced producer, every transaction on it
fails (``ProducerFenced``), and the partition is
stuck.
Under ``exactly_once`` a restore ends early and       ``verify_aborted_tails`` below: before
drops records: a changelog ends in a transaction       Faust takes the offsets after the
marker, so the last record read never reaches the      last record read for markers, a
end offset, and after two empty polls of the           read_committed read of them
changelog queue (one right after the restore starts:   (``committed_record_between``) must
the count of empty polls is never reset between        find no committed record there; if
restores) Faust takes every offset up to the end for   it finds one, the changelog partition
aborted records as soon as the consumer's position     is sought back to it and the restore
reached it (``detect_aborted_tx``); records fetched    goes on
but not yet handed to the restore are then dropped as
already seen: a worker given back a partition loaded
136 of its records and sent again replies its peer
had sent (1 in ~12 runs of the freeze test).
A restore overtaken by the next rebalance can be      ``faust_app.table.JournalTable``
reported complete for partitions it has not            checks each partition it loads
restored (seen under ``exactly_once``: a worker        against the changelog from its
loaded 0 of a partition's records and sent again       database's persisted offset on
replies its previous owner had sent).                  (``read_committed`` below) and
                                                       writes what it lacks first
Under ``exactly_once`` a standby replica of a          the cause is the fetch defect below
changelog partition can miss records: seen here, a     (``fetch_only_active``). Standbys were
standby started at offset 0 buffered only the records  off under ``exactly_once`` until it was
after the end offset read when it started, while its   measured again: with one standby, 30
persisted offset passed all of them; the worker that   runs in a row of the freeze test and
took the partition over loaded 15 of ~160 records      of the late-joiner test under
and sent 7-9 replies again (3 of ~20 runs of the       ``exactly_once``, 0 sent twice, 0 lost
freeze test under ``exactly_once``). Under             (it was 3 in ~20 freeze runs before);
``at_least_once`` it was seen too (46 and 37 replies   the worker keeps one standby under
again).                                                both guarantees
Faust's fetcher asks the consumer's thread for the     ``fetch_only_active`` below: the
records of its active partitions by handing it its     thread tests each partition against
live set, which the thread reads later; meanwhile the  the set as it is when aiokafka
event loop can pause them all (the end of a restore    drains its records, and is never
pauses the restored partitions before the standbys     handed an empty one (nothing is
start), and to aiokafka an empty set means every       fetched while no partition is
assigned partition: records of paused partitions are   active)
returned, Faust drops them as inactive, and the
consumer's position is past them. A standby replica
lost the backlog it had fetched (its offset then
moved past it: a worker that took the partition over
sent again replies its peer had sent, 37 in the freeze
test on CI, 19 in a test of a peer joining late); a
restore of a partition can lose every record and wait
for ever ("No event received for active tp").
A standby replica drops records it fetched: at the    ``keep_changelog_queue`` below: the
end of a rebalance Faust resumes the standby           end of the rebalance leaves the
partitions and fetches them into its changelog queue,  changelog queue as it is (its records
then resumes the flow once more, which clears every    were fetched from the positions the
queue marked ``clear_on_resume`` -- that queue too:    restore sought in that same
the records not yet applied are gone, the consumer's   rebalance); the streams' queues are
position is past them, and the records after them      cleared as before
move the standby's persisted offset over the hole
(found in Faust's code; not caught in a run, where
the fetch defect above lost standby records first).
At the end of a rebalance Faust resumes the stream     ``keep_changelog_queue`` below: the
partitions before it seeks them to their committed     stream partitions are resumed at that
offsets: records fetched from the positions before     clear, once sought (0 skipped in 32
the seek reach the streams' queues, the resume after   runs after, none lost)
the seek clears the queues, and the consumer's
position is past those records. Each rebalance
skipped some: 30 records and 6 commits held at a
hole in 10 runs of the two-worker kill test, each
caught by ``guard_commit_holes`` and read again (the
one inbound lost at a takeover, in one run of ~7,
was fetched in that window; how it got past the
guards is not known).
Under ``at_least_once`` without standby replicas, a    the fetch defect above was the cause
restore of a changelog partition the worker never      (records of a paused changelog
held could hang: the restore reads from offset 0 to a  partition fetched and dropped):
high watermark of 84 and no record of the partition    with ``fetch_only_active``, 20 of 20
ever reaches it (Faust: "No event received for active  runs of the joins/leaves test with
tp ... since recovery start"), so the partition's      standbys off passed, no "No event
inbound records wait while its peers go on (2 of ~20   received" in 120 worker runs; the
runs of the joins/leaves test).                        worker keeps one standby (under
                                                       both guarantees) all the same, so a
                                                       takeover has the partition at hand
Faust's ``Consumer.seek`` calls aiokafka's consumer    ``seek_in_consumer_thread`` below:
from the event loop while the consumer's thread may    the seek is made on the consumer's
be draining fetched records: the seek deletes the      thread (``call_thread``, as Faust's
partition's buffered records under the drain, which    own ``seek_wait`` does), between two
raises ``KeyError`` out of Faust's fetcher and         steps of the fetch
crashes the worker (once on CI, in the random-kill
test), or the drain writes its own position over the
one sought.
Outside Faust, 191 of 2,032 seeks from another
thread raised it within 10 s; none made on the
consumer's thread did.
Faust's table manager sleeps 1 s at its start before   ``start_tables_at_once`` below: the
it subscribes the changelogs and starts the restore,   manager starts them at once (the
so every start (a restart after a SIGKILL too) waits   worker declares its one table before
1 s more for its first record.                         the app starts)
Faust creates its consumer with a fetch wait of 1.5 s  ``short_fetch_wait`` below: the
(hard-coded): a request to a broker waits behind a     consumer's fetch waits 100 ms
fetch there, so on a quiet partition the restore's     (``FETCH_WAIT_MS``); a busy partition
first ``ListOffsets`` (where each changelog starts     is answered at once either way
and ends) takes 1.5 s: a restart waits for it.
Under ``exactly_once`` Faust starts a new              ``start_producers_at_once`` below:
assignment's transactional producers one after the     they start together, so a restart
other; a producer whose predecessor (the killed        waits for the slowest, not the sum
worker) left a transaction open waits for the broker
to abort it (about 0.3 s here), so a restart waited
about 1 s for four of them before its restore began.
Under ``exactly_once`` Faust's offset commit sends     ``commit_open_transactions`` below:
the offsets into each partition's transaction without  a producer found outside a
checking that one is open: a producer left outside a   transaction begins one first (the
transaction (a fenced one, one whose transaction       commit then holds only the offsets);
ended without a next) makes the commit raise, the      the partitions are committed one by
consumer crash, and the worker hang on a clean stop;   one, and a fenced one (before or
one fenced during the commit crashes the app and       during the commit) is logged and its
leaves the other partitions uncommitted.               offsets left to the new owner
aiokafka 0.14.0 (under Faust's consumer) reads a       ``lenient_header_keys`` below: a
header key as strict UTF-8: a record whose header key  batch the C reader refuses that way
is not (the broker takes any bytes) makes every fetch  is read again by aiokafka's Python
of its partition raise ``UnicodeDecodeError`` out of  reader, the bytes that are not UTF-8
the consumer, so the worker stops at every start and   kept as surrogate escapes (a dead
the partition stalls.                                  letter's copy of the header gets
                                                       U+FFFD: ``botmesh.streams.runner``)
=====================================================  =====================================
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.consumer import fetcher
from aiokafka.errors import ProducerFenced
from aiokafka.record.default_records import DefaultRecordBatch, _DefaultRecordBatchPy
from aiokafka.record.memory_records import _MemoryRecordsPy
from faust.tables import recovery
from faust.tables.manager import TableManager
from faust.transport.consumer import Consumer, ThreadDelegateConsumer, TransactionManager
from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread
from faust.transport.drivers.aiokafka import Producer as FaustProducer
from faust.types import TP

from botmesh.streams.connection import Brokers, aiokafka_options

__all__ = [
    "REGISTER",
    "ActivePartitions",
    "ReadOffsets",
    "Workaround",
    "bootstrap_of",
    "commit_open_transactions",
    "committed_record_between",
    "drop_lost_producers",
    "fetch_only_active",
    "fresh_highwaters",
    "guard_commit_holes",
    "held_commit",
    "in_flight",
    "install",
    "keep_changelog_queue",
    "lenient_header_keys",
    "read_committed",
    "read_committed_into",
    "restore_ahead",
    "seek_in_consumer_thread",
    "short_fetch_wait",
    "shorten_recovery_poll",
    "start_producers_at_once",
    "start_tables_at_once",
    "verify_aborted_tails",
]

log = logging.getLogger("botmesh.streams")

_ORIGINAL: Callable[[Any, Any], int | None] = Consumer._new_offset
_ORIGINAL_SEEK: Callable[[Any], Awaitable[None]] = Consumer.perform_seek


def held_commit(consumer: Any, tp: Any) -> bool:
    """A hole at the head of ``tp``'s acked offsets that Faust knows nothing of (no gap
    it recorded itself): the offset after the last commit never reached the agent."""
    acked = consumer._acked[tp]
    committed = consumer._committed_offset[tp]
    if not acked or committed is None or consumer._gap[tp]:
        return False
    return bool(min(acked) > committed)


_warned: set[tuple[Any, int]] = set()


def in_flight(consumer: Any, tp: Any, offset: int) -> bool:
    """The record at ``offset`` of ``tp`` reached the agent and is not acked yet (the
    worker settles batches side by side: a commit waits for it, nothing was skipped)."""
    return any(m.offset == offset and m.tp == tp for m in list(consumer._unacked_messages))


def _new_offset(self: Any, tp: Any) -> int | None:
    if tp in getattr(self, "gap_checks", ()):
        return None  # a gap being checked: the commit waits at it (see ``_add_gap``)
    if held_commit(self, tp):
        committed = self._committed_offset[tp]
        if in_flight(self, tp, committed):
            return None  # being settled: the commit waits for it
        if (tp, committed) not in _warned:
            _warned.add((tp, committed))
            log.warning(
                "%s: offset %s was never handed to the agent (acked from %s on); the commit "
                "stays at %s and the partition is read again from there",
                tp,
                committed,
                min(self._acked[tp]),
                committed,
            )
            _redeliver(self, tp, committed)
        return None
    return _ORIGINAL(self, tp)


def _redeliver(consumer: Any, tp: Any, offset: int) -> None:
    try:
        task = asyncio.get_running_loop().create_task(_rewind(consumer, tp, offset))
    except RuntimeError:  # no loop (a test calling it directly): the next start redelivers
        return
    _tasks.add(task)
    task.add_done_callback(_tasks.discard)


async def _rewind(consumer: Any, tp: Any, offset: int) -> None:
    reads = consumer._read_offset
    high = reads.get(tp)
    await consumer.seek(tp, offset)
    if isinstance(reads, ReadOffsets) and high is not None and high >= offset:
        reads.rewind(tp, offset, high)


class ReadOffsets(defaultdict[Any, int | None]):
    """Faust's read offsets (``Consumer._read_offset``: its drain loop drops a record below
    the partition's read offset as already seen), able to hold a rewind.

    The guard's seek back to a hole sets the read offset to the hole, but the drain loop is
    still handing over records fetched before the seek (the hole's successors), and each
    moves the read offset past the hole again: the records fetched again from the hole are
    then all dropped (``DROPPED MESSAGE ROFF``), the hole is never handed to the agent and
    the commit stays held at it for good (the joins/leaves test: 9 of 510 records never
    handled). While a rewind is pending the read offset reads as the hole, so every record
    from the hole on passes, whether fetched before the seek or again after it (the journal
    answers the copies as duplicates), and no gap is recorded against it. The rewind ends
    once the records fetched again have been handed over one by one from the hole up to
    the read offset of the time of the seek (records fetched before it may come in
    between), or when the partition is sought again or revoked.
    """

    def __init__(self) -> None:
        super().__init__(_none)
        #: tp -> [the offset sought back to, the read offset when it was sought, the next
        #: offset the records fetched again must bring]
        self.rewinds: dict[Any, list[int]] = {}

    def rewind(self, tp: Any, offset: int, high: int) -> None:
        self.rewinds[tp] = [offset, high, offset]

    def __getitem__(self, tp: Any) -> int | None:
        pending = self.rewinds.get(tp)
        return pending[0] if pending is not None else super().__getitem__(tp)

    def __setitem__(self, tp: Any, offset: int | None) -> None:
        pending = self.rewinds.get(tp)
        if pending is not None:
            if offset is None:
                del self.rewinds[tp]
            elif offset == pending[2]:  # the next record fetched again
                pending[2] = offset + 1
                if pending[2] > pending[1]:  # they reached where the drain loop was
                    del self.rewinds[tp]
        super().__setitem__(tp, offset)

    def update(self, *args: Any, **kwargs: Any) -> None:  # perform_seek: a fresh start
        new = dict(*args, **kwargs)
        for tp in new:
            self.rewinds.pop(tp, None)
        super().update(new)

    def pop(self, tp: Any, *default: Any) -> Any:  # revoked
        self.rewinds.pop(tp, None)
        return super().pop(tp, *default)


def _none() -> None:
    return None


_ORIGINAL_INIT: Callable[..., None] = Consumer.__init__
_ORIGINAL_ADD_GAP: Callable[[Any, Any, int, int], Awaitable[None]] = Consumer._add_gap


def _init(self: Any, *args: Any, **kwargs: Any) -> None:
    _ORIGINAL_INIT(self, *args, **kwargs)
    self._read_offset = ReadOffsets()
    #: tp -> gaps of it being checked on the broker (``_add_gap``)
    self.gap_checks = defaultdict(int)


async def _add_gap(self: Any, tp: Any, offset_from: int, offset_to: int) -> None:
    """Faust takes every offset its drain loop jumped over for one without a record (a
    transaction marker, an aborted record) and commits past it. A record the loop never
    handed over (a fetch cut short by a generation change, a record fetched while its
    partition was not active) is then committed past and lost (seen under ``exactly_once``:
    an inbound produced during a rebalance never journaled, its offset committed). So the
    jumped-over offsets are first read on the broker (``read_committed``): only when they
    hold no committed record do they become a gap; else the partition is read again from
    the first one. The commit of the partition waits meanwhile."""
    reads = self._read_offset
    if isinstance(reads, ReadOffsets) and tp in reads.rewinds:
        return  # measured against the rewound offset, not a gap in the partition
    checks = getattr(self, "gap_checks", None)
    if checks is None:
        await _ORIGINAL_ADD_GAP(self, tp, offset_from, offset_to)
        return
    checks[tp] += 1
    task = asyncio.get_running_loop().create_task(
        _check_gap(self, tp, offset_from, offset_to, checks)
    )
    _tasks.add(task)
    task.add_done_callback(_tasks.discard)


async def _check_gap(
    consumer: Any, tp: Any, offset_from: int, offset_to: int, checks: defaultdict[Any, int]
) -> None:
    try:
        try:
            found = await committed_record_between(
                bootstrap_of(consumer.app), tp, offset_from, offset_to
            )
        except Exception as exc:  # not known to be empty: read it again
            log.warning("%s: offsets %d-%d not checked (%r)", tp, offset_from, offset_to - 1, exc)
            found = offset_from
        if tp not in consumer.assignment():
            return  # revoked meanwhile: its new owner reads from the committed offset
        if found is None:
            log.info(
                "%s: offsets %d-%d hold no committed record (transaction markers, aborted "
                "records): the commit passes them",
                tp,
                offset_from,
                offset_to - 1,
            )
            await _ORIGINAL_ADD_GAP(consumer, tp, offset_from, offset_to)
            return
        log.warning(
            "%s: offset %d was skipped by the consumer but holds a record; the partition is "
            "read again from there",
            tp,
            found,
        )
        await _rewind(consumer, tp, found)
    finally:
        checks[tp] -= 1
        if checks[tp] <= 0:
            del checks[tp]


_tasks: set[asyncio.Task[None]] = set()


def _source_partitions(consumer: Any) -> list[Any]:
    changelogs = set(consumer.app.tables.changelog_topics)
    return [
        tp
        for tp in consumer.assignment()
        if tp.topic not in changelogs and "__assignor-__leader" not in tp.topic
    ]


async def _perform_seek(self: Any) -> None:
    await _ORIGINAL_SEEK(self)
    for tp in _source_partitions(self):
        if not self._committed_offset.get(tp):  # none committed (or 0): Faust left it
            await self.seek(tp, 0)  # the beginning (out of range: the earliest, by reset)


def guard_commit_holes() -> None:
    """Install the guard on Faust's consumer (idempotent; the worker does it at start)."""
    Consumer._new_offset = _new_offset  # type: ignore[method-assign]
    Consumer.perform_seek = _perform_seek  # type: ignore[method-assign]
    Consumer.__init__ = _init  # type: ignore[method-assign]
    Consumer._add_gap = _add_gap  # type: ignore[method-assign]


#: Seconds Faust's recovery waits for a changelog record before it looks again (its own: 5).
RECOVERY_POLL_S = 0.25


class _RecoveryAsyncio:
    """``asyncio`` as ``faust.tables.recovery`` sees it: its only ``wait_for``, the poll of
    the changelog queue (5 s), waits ``RECOVERY_POLL_S`` instead."""

    def __getattr__(self, name: str) -> Any:
        return getattr(asyncio, name)

    @staticmethod
    def wait_for(aw: Any, timeout: float | None) -> Any:
        return asyncio.wait_for(aw, None if timeout is None else min(timeout, RECOVERY_POLL_S))


_ORIGINAL_RECOVERY_COMPLETED: Callable[[Any, int], Awaitable[None]] = (
    recovery.Recovery.on_recovery_completed
)


async def _on_recovery_completed(self: Any, generation_id: int = 0) -> None:
    # Faust's own, whose ``flow_control.resume()`` at the end clears every queue that flow
    # control manages: for its length the changelog queue is left out of that, and the
    # stream partitions it resumes before its seek to the committed offsets are resumed
    # only at that clear, after the seek
    flow = self.app.flow_control
    queue = self.tables.changelog_queue
    consumer = self.app.consumer
    resume = consumer.resume_partitions
    deferred: set[Any] = set()

    def resume_deferred() -> None:
        if deferred:
            resume(set(deferred))
            deferred.clear()

    def clear() -> None:
        for managed in flow._queues:
            if managed is not queue:
                managed.clear()
        if queue.qsize():
            log.info("kept %d changelog records Faust's resume would drop", queue.qsize())
        if flow.is_active():  # the resume after the seek (a revoke suspends, then clears)
            resume_deferred()

    with _shadowed(flow, clear=clear), _shadowed(consumer, resume_partitions=deferred.update):
        try:
            await _ORIGINAL_RECOVERY_COMPLETED(self, generation_id)
        finally:
            resume_deferred()  # Faust never cleared (no assignment, or it gave up): as it would


@contextlib.contextmanager
def _shadowed(obj: Any, **attrs: Any) -> Iterator[None]:
    """``obj``'s attributes set to ``attrs`` for the block's length (an instance attribute
    over its class's method), then as they were."""
    saved = {name: obj.__dict__[name] for name in attrs if name in obj.__dict__}
    for name, value in attrs.items():
        setattr(obj, name, value)
    try:
        yield
    finally:
        for name in attrs:
            if name in saved:
                setattr(obj, name, saved[name])
            else:
                delattr(obj, name)


def keep_changelog_queue() -> None:
    """The end of Faust's restore no longer clears the changelog queue, so the standby
    records fetched meanwhile are applied, not skipped, and the stream partitions are
    resumed once they are sought to their committed offsets and their queues cleared, so
    no record fetched from before the seek reaches them (idempotent; the worker does it
    at start)."""
    recovery.Recovery.on_recovery_completed = _on_recovery_completed  # type: ignore[method-assign]


_ORIGINAL_BUILD_HIGHWATERS: Callable[..., Awaitable[None]] = recovery.Recovery._build_highwaters


async def _build_highwaters(
    self: Any, consumer: Any, tps: Any, destination: Any, title: str
) -> None:
    if title == "active":  # before the end offsets are taken: they then lie past what it read
        tables: dict[Any, set[int]] = {}
        for tp in tps:
            table = self.tp_to_table.get(tp)
            if table is not None and hasattr(table, "restore_ahead"):
                tables.setdefault(table, set()).add(tp.partition)
        # well inside the recovery's own limit on this step (it goes on without it after)
        within = float(self.app.conf.broker_request_timeout) / 2
        for table, partitions in tables.items():
            await table.restore_ahead(partitions, within)
            for p in partitions:  # Faust reads from there on, not from its earlier offset
                tp = TP(table.changelog_topic_name, p)
                persisted = table.persisted_offset(tp)
                if persisted is not None:
                    self.active_offsets[tp] = persisted
    await _ORIGINAL_BUILD_HIGHWATERS(self, consumer, tps, destination, title)


def restore_ahead() -> None:
    """Before Faust's recovery reads the active changelog partitions, a table with a
    ``restore_ahead(partitions, within)`` (the journal's) brings them up to their end
    itself, and the recovery starts where it stopped (idempotent; the worker does it at
    start)."""
    recovery.Recovery._build_highwaters = _build_highwaters  # type: ignore[method-assign]


def shorten_recovery_poll() -> None:
    """Faust's restore under ``exactly_once`` detects an end offset that is a transaction
    marker after two empty polls of the changelog queue: make them 1 s, not 5 s
    (idempotent; the worker does it under ``exactly_once``)."""
    recovery.__dict__["asyncio"] = _RecoveryAsyncio()


_ORIGINAL_HIGHWATERS: Callable[..., Awaitable[Any]] = AIOKafkaConsumerThread._highwaters


async def _end_offsets(self: Any, partitions: list[Any]) -> Any:
    # under ``read_committed`` (Faust's consumer under ``exactly_once``) the broker answers
    # the last stable offset: the end of what is committed, which is what a restore reads to
    return await self._ensure_consumer().end_offsets(partitions)


def fresh_highwaters() -> None:
    """Faust's restore under ``exactly_once`` asks the broker where each changelog partition
    ends, not the consumer's cache of it (idempotent; the worker does it under
    ``exactly_once``)."""
    AIOKafkaConsumerThread._highwaters = _end_offsets  # type: ignore[method-assign]


_ORIGINAL_TRANSACTIONS_REBALANCE: Callable[..., Awaitable[None]] = TransactionManager.on_rebalance


async def _on_rebalance(self: Any, assigned: Any, revoked: Any, newly_assigned: Any) -> None:
    producer = self.producer
    wanted = self._tps_to_transactional_ids(assigned)  # the new assignment's active ones
    for tid in sorted(set(producer._transaction_producers) - wanted):
        log.info("stopping transactional producer %s: its partition is no longer ours", tid)
        await producer.stop_transaction(tid)
    await _ORIGINAL_TRANSACTIONS_REBALANCE(self, assigned, revoked, newly_assigned)


def drop_lost_producers() -> None:
    """Faust's transactions stop the producers of the partitions a rebalance took away
    (idempotent; the worker does it under ``exactly_once``)."""
    TransactionManager.on_rebalance = _on_rebalance  # type: ignore[method-assign]


_ORIGINAL_START_TRANSACTIONS: Callable[[Any, Any], Awaitable[None]] = (
    TransactionManager._start_transactions
)


async def _start_transactions(self: Any, tids: Any) -> None:
    # Faust's own loop awaits each ``maybe_begin_transaction`` in turn; each touches only
    # its own transactional id's producer and lock (and logs its own failure)
    producer = self.producer
    await asyncio.gather(*(producer.maybe_begin_transaction(tid) for tid in tids))


def start_producers_at_once() -> None:
    """Faust starts the transactional producers of an assignment together, not one after
    the other (idempotent; the worker does it under ``exactly_once``)."""
    TransactionManager._start_transactions = _start_transactions  # type: ignore[method-assign]


_ORIGINAL_COMMIT_TRANSACTIONS: Callable[..., Awaitable[None]] = FaustProducer.commit_transactions


async def _commit_transactions(
    self: Any, tid_to_offset_map: Any, group_id: str, start_new_transaction: bool = True
) -> None:
    for tid, offsets in dict(tid_to_offset_map).items():
        txp = self._transaction_producers.get(tid)
        lock = self._trn_locks.get(tid)
        if txp is not None and lock is not None:
            async with lock:
                manager = txp._txn_manager
                if manager.is_fatal_error():  # fenced: the partition's new owner commits it
                    log.warning("transactional producer %s was fenced; offsets not ours", tid)
                    continue
                if not manager.is_in_transaction():
                    state = manager.state
                    log.warning("transactional producer %s outside a transaction (%s)", tid, state)
                    await txp.begin_transaction()
        try:  # one transaction at a time: a fenced one does not keep the others from theirs
            await _ORIGINAL_COMMIT_TRANSACTIONS(
                self, {tid: offsets}, group_id, start_new_transaction
            )
        except ProducerFenced:
            # left in place, failed: the journal's next commit of the partition finds it so
            # and the worker restarts to rejoin (``faust_app.app``); the rebalance stops it
            log.warning("transactional producer %s was fenced; offsets not ours", tid)


def commit_open_transactions() -> None:
    """Faust's offset commit under ``exactly_once`` finds each producer in a transaction
    (idempotent; the worker does it under ``exactly_once``)."""
    FaustProducer.commit_transactions = _commit_transactions  # type: ignore[method-assign]


_ORIGINAL_POSITION: Callable[[Any, Any], Awaitable[int | None]] = ThreadDelegateConsumer.position

#: Seconds a check of a restore's tail may take before the restore asks again.
TAIL_CHECK_S = 10.0


#: One changelog record as read back: key, value (``None``: a tombstone), offset.
Read = tuple[bytes, bytes | None, int]


async def read_committed(
    bootstrap: Brokers,
    topic: str,
    starts: dict[int, int],
    *,
    ends: dict[int, int] | None = None,
    first_only: bool = False,
    within: float = TAIL_CHECK_S,
) -> dict[int, list[Read]]:
    """The committed records of each partition of ``topic`` from its offset in ``starts`` to
    its end in ``ends`` (exclusive; by default the partition's end offset now: under
    ``read_committed`` the last stable offset), read with ``read_committed`` (transaction
    markers and aborted records are skipped); with ``first_only``, at most the first one
    of each. Raises ``TimeoutError`` when the read does not reach every end in ``within``
    seconds."""
    found: dict[int, list[Read]] = {p: [] for p in starts}

    def keep(p: int, records: list[Read], end: int | None) -> bool:
        found[p].extend(records[:1] if first_only else records)
        return first_only and bool(found[p])

    async with asyncio.timeout(within):
        await read_committed_into(bootstrap, topic, starts, keep, ends=ends)
    return found


#: ``write(partition, records, end)`` takes a partition's records as they are fetched;
#: ``end`` is the partition's end offset once they are its last (then maybe none). It
#: returns True when it wants no more of the partition.
Take = Callable[[int, list[Read], "int | None"], bool]


async def read_committed_into(
    bootstrap: Brokers,
    topic: str,
    starts: dict[int, int],
    take: Take,
    *,
    ends: dict[int, int] | None = None,
    idle: float | None = None,
) -> None:
    """``read_committed`` handing each fetch over to ``take`` as it comes (a restore writes
    them without holding them all); raises ``TimeoutError`` when a fetch brings nothing
    for ``idle`` seconds (``None``: no limit here)."""
    consumer = AIOKafkaConsumer(
        **aiokafka_options(bootstrap),
        isolation_level="read_committed",
        enable_auto_commit=False,
        auto_offset_reset="earliest",  # a start compacted away: the earliest kept
        # a bounded read: a fetch that finds only markers or aborted records (a killed
        # worker's tail) comes back at once rather than after aiokafka's 500 ms
        fetch_max_wait_ms=20,
    )
    tps = {p: TopicPartition(topic, p) for p in starts}
    try:
        async with asyncio.timeout(idle) as clock:
            await consumer.start()
            consumer.assign(list(tps.values()))
            if ends is None:
                last = await consumer.end_offsets(list(tps.values()))
                ends = {p: int(last[tp]) for p, tp in tps.items()}
            for p, tp in tps.items():
                consumer.seek(tp, starts[p])
            left = dict(tps)
            while True:
                for p, tp in list(left.items()):
                    if await consumer.position(tp) >= ends[p]:
                        del left[p]
                        take(p, [], ends[p])
                if not left:
                    return
                fetched = await consumer.getmany(*left.values(), timeout_ms=200)
                for tp, messages in fetched.items():
                    p = tp.partition
                    got = [
                        (m.key, m.value, int(m.offset))
                        for m in messages
                        if starts[p] <= m.offset < ends[p]
                    ]
                    if got and p in left:
                        if idle is not None:
                            clock.reschedule(asyncio.get_running_loop().time() + idle)
                        if take(p, got, None):
                            del left[p]
    finally:
        await consumer.stop()


async def committed_record_between(
    bootstrap: Brokers, tp: Any, start: int, end: int, *, within: float = TAIL_CHECK_S
) -> int | None:
    """The offset of the first committed record of ``tp`` in ``[start, end)``, else
    ``None`` (``read_committed``)."""
    found = await read_committed(
        bootstrap, tp.topic, {tp.partition: start}, ends={tp.partition: end}, first_only=True
    )
    records = found[tp.partition]
    return records[0][2] if records else None


def bootstrap_of(app: Any) -> Brokers:
    """How a client of our own reaches a Faust app's brokers: the worker's settings
    (``app.botmesh_kafka``, TLS and SASL included), else ``host:port,...`` of its URLs."""
    settings: Brokers | None = getattr(app, "botmesh_kafka", None)
    if settings is not None:
        return settings
    return ",".join(f"{url.host}:{url.port or 9092}" for url in app.conf.broker)


async def _position(self: Any, tp: Any) -> int | None:
    position = await _ORIGINAL_POSITION(self, tp)
    recovery_ = self.app.tables.recovery
    highwater = recovery_.active_highwaters.get(tp)
    seen = recovery_.active_offsets.get(tp)
    if position is None or highwater is None or seen is None:
        return position
    if seen >= highwater or position < highwater:
        return position  # not a restore's tail Faust would take for aborted records
    # Faust is about to take offsets seen+1..highwater for markers and aborted records
    try:
        found = await committed_record_between(bootstrap_of(self.app), tp, seen + 1, highwater + 1)
    except Exception as exc:
        log.warning("%s: the restore's tail from offset %d not checked (%r)", tp, seen + 1, exc)
        return -1  # not taken as aborted: asked again at the next empty poll
    if found is None:
        return position
    log.warning(
        "%s: the restore read up to offset %d and the consumer is at %d, but offset %d holds "
        "a committed record: the partition is read again from offset %d",
        tp,
        seen,
        position,
        found,
        seen + 1,
    )
    await self.seek(tp, seen + 1)
    return -1


def verify_aborted_tails() -> None:
    """Faust's restore under ``exactly_once`` takes the offsets after the last record it read
    for aborted ones only when the changelog holds no committed record there (idempotent;
    the worker does it under ``exactly_once``)."""
    ThreadDelegateConsumer.position = _position  # type: ignore[method-assign]


# -- Faust's fetch: an emptied set of partitions means every partition ---------------------

_ORIGINAL_GETMANY: Callable[..., Awaitable[Any]] = AIOKafkaConsumerThread.getmany


class ActivePartitions:
    """Faust's live set of active partitions as the consumer's thread reads it: each record
    aiokafka drains is checked against the set as it is then (a membership test, atomic
    under the GIL), and it is never empty to aiokafka, which takes an empty set for every
    assigned partition."""

    def __init__(self, live: Any) -> None:
        self.live = live

    def __bool__(self) -> bool:
        return True

    def __contains__(self, tp: object) -> bool:
        return tp in self.live


async def _getmany(self: Any, active_partitions: Any, timeout: float) -> Any:  # noqa: ASYNC109 (its signature)
    if active_partitions is None:  # a client-only app: every partition, as Faust meant
        return await _ORIGINAL_GETMANY(self, None, timeout)
    if not active_partitions:
        return {}
    return await _ORIGINAL_GETMANY(self, ActivePartitions(active_partitions), timeout)


def fetch_only_active() -> None:
    """Faust's fetch returns records only of partitions active when they are drained, and
    nothing when none is (idempotent; the worker does it at start)."""
    AIOKafkaConsumerThread.getmany = _getmany  # type: ignore[method-assign]


# -- Faust's seek: a call into the consumer from the wrong thread -------------------------------


_ORIGINAL_THREAD_SEEK: Callable[[Any, Any, int], Awaitable[None]] = ThreadDelegateConsumer._seek


async def _seek(self: Any, partition: Any, offset: int) -> None:
    thread = self._thread
    await thread.call_thread(thread._ensure_consumer().seek, partition, offset)


def seek_in_consumer_thread() -> None:
    """Faust's ``Consumer.seek`` moves the consumer on its own thread, between two of
    aiokafka's fetch steps, not from the event loop while the thread drains (idempotent;
    the worker does it at start)."""
    ThreadDelegateConsumer._seek = _seek  # type: ignore[method-assign]


# -- Faust's start: two waits a restart pays ---------------------------------------------------


_ORIGINAL_TABLES_START: Callable[[Any], Awaitable[None]] = TableManager.on_start


async def _start_tables(self: Any) -> None:
    # Faust's own ``TableManager.on_start`` without its ``await self.sleep(1.0)`` first: the
    # worker's table exists before the app starts (a table added later still raises
    # "Too late to add tables", from ``add``)
    if not self.should_stop:
        await self._update_channels()
        await self.recovery.start()


def start_tables_at_once() -> None:
    """Faust's table manager subscribes the changelogs and starts the restore at its start,
    not a second after it (idempotent; the worker does it at start)."""
    TableManager.on_start = _start_tables  # type: ignore[method-assign]


#: The longest Faust's consumer's fetch waits on the broker for records (Faust's own: 1.5 s).
FETCH_WAIT_MS = 100

_ORIGINAL_CREATE_CONSUMER: Callable[[Any, Any], AIOKafkaConsumer] = (
    AIOKafkaConsumerThread._create_worker_consumer
)


def _create_worker_consumer(self: Any, transport: Any) -> AIOKafkaConsumer:
    consumer = _ORIGINAL_CREATE_CONSUMER(self, transport)
    consumer._fetch_max_wait_ms = FETCH_WAIT_MS  # read by its fetcher at ``start()``
    return consumer


def short_fetch_wait() -> None:
    """Faust's consumer fetches with a wait of ``FETCH_WAIT_MS``, so a request behind a fetch
    (the restore's offsets) is answered within it (idempotent; the worker does it at start)."""
    AIOKafkaConsumerThread._create_worker_consumer = _create_worker_consumer  # type: ignore[method-assign]


# -- aiokafka: header keys that are not UTF-8 ------------------------------------------------


class _LenientBytes(bytearray):
    """A record batch's bytes for aiokafka's Python reader: its slices stay lenient, and
    decoding one (a header key) keeps the bytes that are not UTF-8 as surrogate escapes."""

    def __getitem__(self, index: Any) -> Any:
        got = super().__getitem__(index)
        return _LenientBytes(got) if isinstance(got, bytearray) else got

    def decode(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        return bytearray.decode(self, encoding, "surrogateescape")


class _LenientBatch(_DefaultRecordBatchPy):  # type: ignore[misc]
    """aiokafka's Python reader of a record batch, on lenient bytes."""

    _buffer: Any

    def __init__(self, buffer: Any) -> None:
        super().__init__(buffer)
        self._buffer = _LenientBytes(self._buffer)

    def _maybe_uncompress(self) -> None:
        super()._maybe_uncompress()
        if not isinstance(self._buffer, _LenientBytes):  # decompressed anew
            self._buffer = _LenientBytes(self._buffer)


class _Batch:
    """A record batch read by aiokafka's C reader; when that refuses a header key that is
    not UTF-8, the rest of the batch is read by the lenient Python reader."""

    __slots__ = ("_batch", "_data")

    def __init__(self, batch: Any, data: Any) -> None:
        self._batch = batch
        self._data = data

    def __getattr__(self, name: str) -> Any:
        return getattr(self._batch, name)

    def __next__(self) -> Any:  # the fetcher reads a control batch's marker this way
        return next(self._batch)

    def __iter__(self) -> Any:
        last = -1
        try:
            for record in self._batch:
                last = record.offset
                yield record
        except UnicodeDecodeError as exc:
            log.warning(
                "a record after offset %d of a batch at offset %d has a header key that is "
                "not UTF-8 (%s): reading the batch leniently",
                last,
                self._batch.base_offset,
                exc,
            )
            for record in _LenientBatch(self._data):
                if record.offset > last:
                    yield record


class _MemoryRecords(_MemoryRecordsPy):  # type: ignore[misc]
    """The fetcher's reader of a fetched partition's bytes: each record batch through
    :class:`_Batch`."""

    def next_batch(self, *args: Any, **kwargs: Any) -> Any:
        data = self._next_slice
        batch = super().next_batch(*args, **kwargs)
        if isinstance(batch, DefaultRecordBatch) and data is not None:
            return _Batch(batch, data)
        return batch


def lenient_header_keys() -> None:
    """Make aiokafka's fetcher read a record whose header key is not UTF-8 instead of
    raising at every fetch of its partition (idempotent; the worker does it at start)."""
    fetcher.__dict__["MemoryRecords"] = _MemoryRecords


# -- the register -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Workaround:
    """One workaround of the register: what it installs, the upstream defect it answers
    (faust-streaming 0.15.3 or aiokafka, where it lives there), and the test that shows the
    defect on the upstream code and the workaround meeting it (``path::function``), or
    ``None`` where no test of its own does yet."""

    name: str
    install: Callable[[], None]
    upstream: str
    test: str | None
    #: Installed only under ``exactly_once`` (the defect is in Faust's transactions).
    exactly_once: bool = False


_DEFECTS = "tests/kafka/test_faust_defects.py::"
_TRANSACTIONS = "tests/kafka/test_faust_transactions.py::"

#: Every process-wide patch the worker installs, in the order it installs them.
REGISTER: tuple[Workaround, ...] = (
    Workaround(
        "guard_commit_holes",
        guard_commit_holes,
        "faust.transport.consumer.Consumer._new_offset / perform_seek / _add_gap",
        _DEFECTS + "test_faust_commits_past_a_hole_of_one_offset_and_the_guard_holds_the_commit",
    ),
    Workaround(
        "lenient_header_keys",
        lenient_header_keys,
        "aiokafka.consumer.fetcher (its C record reader raises on a header key not UTF-8)",
        _DEFECTS + "test_aiokafka_refuses_a_header_key_that_is_not_utf8_and_the_worker_reads_it",
    ),
    Workaround(
        "start_tables_at_once",
        start_tables_at_once,
        "faust.tables.manager.TableManager._start_tables (a 1 s sleep before the restore)",
        _DEFECTS + "test_faust_sleeps_a_second_before_its_restore_and_the_worker_does_not",
    ),
    Workaround(
        "short_fetch_wait",
        short_fetch_wait,
        "faust.transport.drivers.aiokafka (its consumer's 1.5 s fetch long poll)",
        _DEFECTS + "test_faust_fetches_with_a_wait_of_1_5_s_and_the_worker_with_a_tenth",
    ),
    Workaround(
        "fetch_only_active",
        fetch_only_active,
        "faust.transport.consumer.Consumer.getmany (an empty set of active partitions)",
        _DEFECTS + "test_an_emptied_set_of_active_partitions_fetches_"
        "every_partition_unless_guarded",
    ),
    Workaround(
        "keep_changelog_queue",
        keep_changelog_queue,
        "faust.tables.recovery.Recovery.on_recovery_completed (clears the changelog queue)",
        _DEFECTS + "test_the_end_of_faust_restore_clears_the_"
        "changelog_queue_and_the_worker_keeps_it",
    ),
    Workaround(
        "restore_ahead",
        restore_ahead,
        "faust.tables.recovery.Recovery (a changelog applied a record at a time)",
        "tests/kafka/test_kill_recovery.py::test_deleted_data_dir_is_rebuilt_and_sends_nothing_again",
    ),
    Workaround(
        "seek_in_consumer_thread",
        seek_in_consumer_thread,
        "faust.transport.consumer.ThreadDelegateConsumer.seek (made from the event loop)",
        "tests/kafka/test_seek_thread.py::"
        "test_a_seek_from_the_event_loop_breaks_the_consumer_thread_unless_made_on_it",
    ),
    Workaround(
        "shorten_recovery_poll",
        shorten_recovery_poll,
        "faust.tables.recovery (two empty 5 s polls before an end at a transaction marker)",
        _DEFECTS + "test_faust_restore_polls_the_changelog_every_5_s_"
        "and_the_worker_every_quarter_second",
        exactly_once=True,
    ),
    Workaround(
        "fresh_highwaters",
        fresh_highwaters,
        "faust.transport.drivers.aiokafka.AIOKafkaConsumerThread._highwaters (a cached LSO)",
        _DEFECTS + "test_faust_takes_the_end_of_an_eos_restore_from_a_"
        "cache_the_worker_asks_the_broker",
        exactly_once=True,
    ),
    Workaround(
        "drop_lost_producers",
        drop_lost_producers,
        "faust.transport.consumer.TransactionManager.on_rebalance (keeps lost producers)",
        _TRANSACTIONS + "test_faust_keeps_the_producer_of_a_lost_partition_and_the_worker_stops_it",
        exactly_once=True,
    ),
    Workaround(
        "start_producers_at_once",
        start_producers_at_once,
        "faust.transport.consumer.TransactionManager._start_transactions (one at a time)",
        _DEFECTS + "test_faust_starts_transactional_producers_one_by_one_and_the_worker_together",
        exactly_once=True,
    ),
    Workaround(
        "commit_open_transactions",
        commit_open_transactions,
        "faust.transport.drivers.aiokafka.Producer.commit_transactions (outside a transaction)",
        _TRANSACTIONS
        + "test_faust_commit_fails_on_an_ended_or_fenced_producer_and_the_worker_commits_the_rest",
        exactly_once=True,
    ),
    Workaround(
        "verify_aborted_tails",
        verify_aborted_tails,
        "faust.transport.consumer.ThreadDelegateConsumer.position (an aborted tail taken as read)",
        _DEFECTS + "test_faust_ends_an_eos_restore_on_the_consumer_"
        "position_the_worker_checks_the_log",
        exactly_once=True,
    ),
)


def install(*, exactly_once: bool) -> list[str]:
    """Install the register's workarounds that apply (each is idempotent); their names."""
    done = []
    for workaround in REGISTER:
        if exactly_once or not workaround.exactly_once:
            workaround.install()
            done.append(workaround.name)
    return done

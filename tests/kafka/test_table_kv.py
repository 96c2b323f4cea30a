"""``botmesh.streams.table_kv.TableKv`` on a real broker: the DurableKv contract, the
partitions it owns, a revoked partition fencing its old holder, and a write the broker does
not ack.

The journal writes through the worker's changelog port on librdkafka
(``botmesh.streams.worker.changelog.RdChangelog``) on a real compacted topic (acks=all), and a
partition's database is restored from the topic (``botmesh.streams.worker.restore.restore``)
before the journal is given the partition (``tests/kafka/journal.py``). ``reopen`` is a new
journal restored from the topic alone (a worker on a wiped data dir).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any

import pytest

from botmesh import Bot, Context, Inbound, Outcome
from botmesh.state.clock import ManualClock
from botmesh.state.errors import FencedError, JournalUnavailableError, VersionConflictError
from botmesh.state.kv import Delete, Put
from botmesh.state.writes import Write
from botmesh.streams.runner import BatchAbandoned, InboundRunner
from botmesh.streams.table_kv import (
    MembershipUnconfirmed,
    PartitionRevoked,
    ProducerFencedOut,
    TableKv,
    in_partition,
)
from botmesh.streams.worker.changelog import RdChangelog
from botmesh.testing import MockProvider
from tests.backends import BackendHandle
from tests.conformance.test_kv_contract import *  # noqa: F403  # the contract, on TableKv
from tests.kafka.journal import InPartition, KafkaChangelog, forget, kafka_case
from tests.kafka.test_runner import Produced, Waits, record
from tests.kit import policy

pytestmark = pytest.mark.kafka

PARTITIONS = 2


@pytest.fixture(params=["at_least_once", "exactly_once"])
async def backend(
    kafka_bootstrap: str, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[BackendHandle]:
    """The journal on the changelog, under each processing guarantee (``exactly_once``: one
    transactional producer, a commit returns once its transaction committed)."""
    handle = BackendHandle(kafka_case(kafka_bootstrap, request.param), tmp_path)
    await handle.open()
    try:
        yield handle
    finally:
        await handle.close()
        forget(kafka_bootstrap, tmp_path)


def table_of(backend: BackendHandle) -> tuple[TableKv, KafkaChangelog]:
    view = backend.kv
    assert isinstance(view, InPartition)
    return view.kv, view.port


async def test_records_stay_in_their_partition_and_a_scan_without_one_sees_all(
    backend: BackendHandle,
) -> None:
    kv, port = table_of(backend)
    with in_partition(0):
        await kv.commit([Put("s/a", {"n": 0}, expect=0, due=2.0)])
    with in_partition(1):
        await kv.commit([Put("s/b", {"n": 1}, expect=0, due=1.0)])
        assert await kv.get("s/a") is None  # partition 1 does not see partition 0's record
    assert port.commits == (2 if port.transactional else 0)  # a transaction per commit
    assert [e.key for e in await kv.scan("s/")] == ["s/a", "s/b"]
    assert await kv.range("due", "s/", 10.0) == ["s/b", "s/a"]  # merged by score
    # a known key is written in its own partition with no partition named
    assert await kv.commit([Put("s/a", {"n": 2}, expect=1)]) == [2]
    with pytest.raises(JournalUnavailableError, match="has no partition"):
        await kv.commit([Put("s/new", {}, expect=0)])
    restored = await backend.reopen()  # a new journal from the topic alone
    assert isinstance(restored, InPartition)
    with in_partition(0):
        entry = await restored.kv.get("s/a")
    assert entry is not None and (entry.value, entry.version) == ({"n": 2}, 2)


async def test_a_commit_across_partitions_writes_each_record_in_its_own(
    backend: BackendHandle,
) -> None:
    """Receipts marked published and retention purges commit records of several chats at
    once, with no partition named: each record stays in its partition, all or nothing."""
    kv, _ = table_of(backend)
    with in_partition(0):
        await kv.commit([Put("s/a", {"n": 0}, expect=0)])
    with in_partition(1):
        await kv.commit([Put("s/b", {"n": 0}, expect=0)])
    with pytest.raises(VersionConflictError):
        await kv.commit([Put("s/a", {"n": 1}, expect=1), Put("s/b", {"n": 1}, expect=5)])
    assert [(e.key, e.version) for e in await kv.scan("s/")] == [("s/a", 1), ("s/b", 1)]
    assert await kv.commit([Put("s/a", {"n": 1}, expect=1), Delete("s/b", expect=1)]) == [2, 0]
    with in_partition(1):
        assert await kv.get("s/a") is None and await kv.get("s/b") is None
    restored = await backend.reopen()
    assert isinstance(restored, InPartition)
    with in_partition(0):
        entry = await restored.kv.get("s/a")
    assert entry is not None and entry.version == 2
    assert [e.key for e in await restored.kv.scan("s/")] == ["s/a"]


async def test_a_revoked_partition_refuses_its_old_holder(backend: BackendHandle) -> None:
    kv, _ = table_of(backend)
    with in_partition(1):
        [v] = await kv.commit([Put("s/held", {"lease": "mine"}, expect=0)])
    kv.revoke([1])
    assert kv.owned == {0}
    with pytest.raises(VersionConflictError):  # a holder's compare-and-set: fenced upstream
        await kv.commit([Put("s/held", {"done": True}, expect=v)])
    with in_partition(1), pytest.raises(PartitionRevoked, match="not owned") as refused:
        await kv.commit([Put("s/other", {}, expect=0)])
    assert isinstance(refused.value, FencedError)  # a fence, never an outage to retry
    assert not isinstance(refused.value, JournalUnavailableError)


async def test_an_inbound_of_a_revoked_partition_is_a_fence_never_run_even_fail_open(
    backend: BackendHandle,
) -> None:
    """A new inbound of a partition taken from this worker is refused as a fence: a bot
    that dispatches without its journal in an outage (``fail_open``) must not run it here
    while the partition's new owner runs it too (it did while the refusal was an outage)."""
    kv, _ = table_of(backend)
    runs: list[str] = []
    bot = Bot("fenced", durability=policy(fail_open=True))

    @bot.on_message
    async def reply(ctx: Context) -> None:
        runs.append(ctx.inbound_id)
        await ctx.reply("hi")

    provider = MockProvider()
    async with bot.bind(provider, kv, instance_id="w1") as runtime:
        with in_partition(1):
            assert await runtime.handle(Inbound(id="m0", chat_id="c0")) == Outcome.HANDLED
        kv.revoke([1])  # another worker owns the chat's partition now
        with in_partition(1), pytest.raises(PartitionRevoked, match="not owned"):
            await runtime.handle(Inbound(id="m1", chat_id="c1", text="hi"))
    assert runs == ["m0"] and len(provider.sent) == 1


async def test_a_record_of_a_partition_taken_away_gives_the_batch_up(
    backend: BackendHandle,
) -> None:
    """The runner over the real engine on the journal: a record of a partition taken from
    this worker (it was evicted) is refused as a fence (its inbound is not journaled, its
    handler does not run), and the worker is a zombie for it: the batch is given up at
    once (``BatchAbandoned``: nothing of it acked, the worker starts afresh), not retried,
    not dead-lettered."""
    kv, _ = table_of(backend)
    seen: list[str] = []
    bot = Bot("left", durability=policy())

    @bot.on_message
    async def reply(ctx: Context) -> None:
        seen.append(ctx.inbound_id)
        await ctx.reply("hi")

    produced, waits = Produced(), Waits()
    async with bot.bind(MockProvider(), kv, instance_id="w1") as runtime:
        kv.revoke([1])  # another worker owns partition 1 now
        runner = InboundRunner(runtime, produced, sleep=waits, owns=kv.owns)
        gone = dataclasses.replace(record(1, "B", "B1"), partition=1)
        with pytest.raises(BatchAbandoned, match="taken from this worker") as given_up:
            await runner.run_batch([gone])
    assert isinstance(given_up.value.__cause__, PartitionRevoked)
    assert seen == [] and runner.outcomes == {} and runner.retried == 0
    assert waits.delays == [] and produced.dead() == []


async def test_a_record_whose_partition_is_lost_while_it_runs_is_not_settled(
    backend: BackendHandle,
) -> None:
    """A worker evicted while a record's handler runs: the handler's send is refused as a
    fence, the engine answers ``fenced``, and the runner does not count the record settled
    (``BatchAbandoned``): nothing of the batch is acked, and nothing was sent."""
    kv, _ = table_of(backend)
    provider = MockProvider()
    bot = Bot("evicted", durability=policy())

    @bot.on_message
    async def reply(ctx: Context) -> None:
        kv.revoke([0])  # the group moved on while this handler ran
        await ctx.reply("hi")

    produced, waits = Produced(), Waits()
    async with bot.bind(provider, kv, instance_id="w1") as runtime:
        runner = InboundRunner(runtime, produced, sleep=waits, owns=kv.owns)
        with pytest.raises(BatchAbandoned, match="taken from this worker"):
            await runner.run_batch([record(0, "A", "A1")])
    assert provider.sent == [] and runner.outcomes == {} and produced.dead() == []


@pytest.mark.parametrize("backend", ["at_least_once"], indirect=True)
async def test_a_write_the_broker_does_not_ack_is_refused_and_undone(
    backend: BackendHandle,
) -> None:
    kv, port = table_of(backend)
    with in_partition(0):
        await kv.commit([Put("s/k", {"v": 1}, expect=0)])
    await port.unreachable()  # nothing can be acked
    with in_partition(0):
        with pytest.raises(JournalUnavailableError, match="not acked"):
            await kv.commit([Put("s/k", {"v": 2}, expect=1), Put("s/n", {}, expect=0)])
        entry = await kv.get("s/k")
        assert entry is not None and (entry.value, entry.version) == ({"v": 1}, 1)
        assert await kv.get("s/n") is None
    assert kv.failed == 1


@pytest.mark.parametrize("backend", ["exactly_once"], indirect=True)
async def test_a_write_a_newer_producer_fenced_is_a_fence_not_an_outage(
    backend: BackendHandle,
) -> None:
    """Under ``exactly_once`` another incarnation of the worker (its transactional id) fences
    this one's producer: the journal's write fails with ``ProducerFencedOut`` (the runner
    gives the batch up at once), never as an outage it would retry; nothing of it lands."""
    kv, port = table_of(backend)
    with in_partition(0):
        [v] = await kv.commit([Put("s/k", {"v": 1}, expect=0)])
    successor = RdChangelog(port.base, port.topic)
    await successor.start()  # init_transactions under the same id: the old producer is fenced
    try:
        with in_partition(0), pytest.raises(ProducerFencedOut, match="newer producer"):
            await kv.commit([Put("s/k", {"v": 2}, expect=v)])
        with in_partition(0):
            entry = await kv.get("s/k")
        assert entry is not None and (entry.value, entry.version) == ({"v": 1}, 1)
    finally:
        await successor.stop()


async def test_no_write_while_the_group_membership_is_unconfirmed(backend: BackendHandle) -> None:
    """A worker that thaws after being frozen past the session timeout may have lost its
    partitions without knowing it yet: nothing reaches the changelog until it knows."""
    kv, port = table_of(backend)
    with in_partition(0):
        [v] = await kv.commit([Put("s/k", {"v": 1}, expect=0)])
        produced = port.produced
        port.stale = "membership last confirmed 20.0s ago"
        with pytest.raises(JournalUnavailableError, match="refused: membership last confirmed"):
            await kv.commit([Put("s/k", {"v": 2}, expect=v), Put("s/n", {}, expect=0)])
        assert port.produced == produced and kv.unconfirmed == 1
        entry = await kv.get("s/k")
        assert entry is not None and (entry.value, entry.version) == ({"v": 1}, 1)
        assert await kv.get("s/n") is None
        port.stale = None  # the coordinator accepted a heartbeat again
        assert await kv.commit([Put("s/k", {"v": 2}, expect=v)]) == [2]


async def test_a_write_acked_after_a_freeze_is_not_acted_on(backend: BackendHandle) -> None:
    """A worker frozen between the membership check and its record's ack (the record still
    in its producer's buffer when ``SIGSTOP`` came) may reach the log after another owner
    restored the partition: the write is not acted on (a claimed send is not called). Under
    ``at_least_once`` it is durable all the same (the journal holds what the log holds);
    under ``exactly_once`` its transaction is aborted, not committed."""
    kv, port = table_of(backend)
    with in_partition(0):
        port.freeze_on_produce = True
        with pytest.raises(MembershipUnconfirmed, match="frozen"):
            await kv.commit([Put("s/k", {"v": 1}, expect=0)], label=Write.OUTBOX_CLAIM)
        assert kv.unconfirmed == (0 if port.transactional else 1)
        port.freeze_on_produce, port.frozen_at = False, None  # it rejoined, owning it still
        entry = await kv.get("s/k")
        if port.transactional:
            assert entry is None
        else:
            assert entry is not None and (entry.value, entry.version) == ({"v": 1}, 1)
            assert await kv.commit([Put("s/k", {"v": 2}, expect=1)]) == [2]


async def test_a_write_that_waited_over_a_freeze_for_its_partition_is_not_produced(
    backend: BackendHandle,
) -> None:
    """Two chats' writes in one partition are handed over one after the other. A write that
    passed its membership check and then waited for the other's hand-over may have waited
    over a freeze: it is asked again once its turn comes, so nothing of it reaches the
    changelog after the worker lost its partitions (a sweeper delivering several chats at a
    time made such waits common: ``outbox.sweep_at_once``)."""
    kv, port = table_of(backend)
    holding, release = asyncio.Event(), asyncio.Event()

    async def slow_rider() -> Awaitable[object]:  # the first write's hand-over takes a while
        holding.set()
        await release.wait()
        return asyncio.get_running_loop().create_future()

    with in_partition(0):
        kv.ride("s/a", slow_rider)
        first = asyncio.ensure_future(kv.commit([Put("s/a", {"v": 1}, expect=0)]))
        await holding.wait()
        produced = port.produced
        second = asyncio.ensure_future(kv.commit([Put("s/b", {"v": 1}, expect=0)]))
        await asyncio.sleep(0)  # its check passed: it waits for the partition's producing
        assert not second.done() and port.produced == produced
        port.stale = "membership last confirmed 20.0s ago"  # frozen meanwhile, thawed now
        release.set()
        with pytest.raises(MembershipUnconfirmed, match="partition 0 not produced: membership"):
            await second
        with pytest.raises(MembershipUnconfirmed, match="membership last confirmed"):
            await first  # handed over before the freeze: not acted on (exactly_once: aborted)
        assert port.produced == produced, "the waiting write reached the changelog"
        assert kv.unconfirmed >= 1
        port.stale = None
        assert await kv.get("s/b") is None
        assert await kv.commit([Put("s/b", {"v": 2}, expect=0)]) == [1]


async def test_a_rider_is_handed_over_right_after_the_record_that_holds_its_write(
    backend: BackendHandle,
) -> None:
    """``ride``: a record of another topic (a receipt under ``exactly_once``) goes to the
    producer right after the changelog record holding its key's write, in the same turn
    (so in the same transaction); a write of another key does not take it, and a rider
    taken back never goes."""
    kv, port = table_of(backend)
    when: list[int] = []

    async def rider() -> Awaitable[object]:
        when.append(port.produced)
        return asyncio.get_running_loop().create_future()

    with in_partition(0):
        kv.ride("s/k", rider)
        await kv.commit([Put("s/n", {}, expect=0)])
        assert when == []
        await kv.commit([Put("s/k", {"v": 1}, expect=0)])
        assert when == [port.produced]
        back = kv.ride("s/k", rider)
        back()
        await kv.commit([Put("s/k", {"v": 2}, expect=1)])
        assert len(when) == 1


async def test_a_turn_finished_after_its_partition_moved_is_fenced_and_counted(
    backend: BackendHandle,
) -> None:
    """The real engine on the journal: the inbound's partition is revoked while its handler
    runs; its reply and its ``done`` are refused, counted in ``staleLeases``."""
    kv, _ = table_of(backend)
    started, release = asyncio.Event(), asyncio.Event()
    bot = Bot("fence")

    @bot.on_message
    async def slow(ctx: Context) -> None:
        started.set()
        await release.wait()
        await ctx.reply("too late")

    provider = MockProvider()
    async with bot.bind(provider, kv, instance_id="w1") as runtime:
        with in_partition(1):
            turn = asyncio.ensure_future(runtime.handle(Inbound(id="m1", chat_id="c1", text="hi")))
            await started.wait()
        kv.revoke([1])  # another worker owns the chat now
        release.set()
        outcome = await turn
        assert outcome == Outcome.FENCED
        assert provider.sent == []  # the reply was never journaled here, so never sent
        assert runtime.metrics()["staleLeases"] == 1


async def test_a_turn_left_by_another_instance_is_taken_over_at_once(
    backend: BackendHandle,
) -> None:
    """A partition has one writer: an inbound another instance left pending (it lost the
    partition) is replayed by the new owner when it is redelivered, not after its lease."""
    kv, _ = table_of(backend)
    runs: list[str] = []
    first_run_blocks, started = asyncio.Event(), asyncio.Event()
    bot = Bot("takeover")

    @bot.on_message
    async def reply(ctx: Context) -> None:
        runs.append(ctx.inbound_id)
        started.set()
        if len(runs) == 1:
            await first_run_blocks.wait()  # the old owner never gets further
        await ctx.reply("hello")

    old, new = MockProvider(), MockProvider()
    message = Inbound(id="m1", chat_id="c1", text="hi")
    async with bot.bind(old, kv, instance_id="old") as a, bot.bind(new, kv, instance_id="new") as b:
        with in_partition(0):
            stuck = asyncio.ensure_future(a.handle(message))
            await started.wait()
            outcome = await b.handle(message)  # the redelivery, on the partition's new owner
        assert outcome == Outcome.HANDLED
        assert runs == ["m1", "m1"] and len(new.sent) == 1 and old.sent == []
        stuck.cancel()
        with pytest.raises(asyncio.CancelledError):
            await stuck


class HeldReceipts:
    """A ``ReceiptSink`` whose acks the test resolves (the broker's acks on ``<prefix>.sent``)."""

    def __init__(self) -> None:
        self.acks: list[asyncio.Future[None]] = []

    async def publish(self, receipt: Any) -> Awaitable[Any]:
        ack: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.acks.append(ack)
        return ack


async def test_receipts_acked_meanwhile_are_recorded_published_by_another_partitions_pass(
    backend: BackendHandle,
) -> None:
    """The recovery pass of one partition (run inside ``in_partition``, as a worker given
    partitions runs it) records as published every receipt acked so far, those of the
    other partitions' chats included: each in its own partition, none dropped."""
    kv, _ = table_of(backend)
    sink = HeldReceipts()
    bot = Bot("receipts")

    @bot.on_message
    async def reply(ctx: Context) -> None:
        await ctx.reply("hello")

    async with bot.bind(MockProvider(), kv, instance_id="w1", receipts=sink) as runtime:
        for p in range(PARTITIONS):
            with in_partition(p):
                message = Inbound(id=f"m{p}", chat_id=f"c{p}", text="hi")
                assert await runtime.handle(message) == Outcome.HANDLED
        assert len(sink.acks) == PARTITIONS  # one receipt per chat, not acked yet
        for ack in sink.acks:
            ack.set_result(None)
        ops = runtime.durability
        assert ops is not None
        with in_partition(PARTITIONS - 1):  # the last partition's recovery pass
            await ops.recover()
        await runtime.flush_receipts()
        sends = [e.value for e in await kv.scan(f"{bot.scope}/out/")]
        assert [(s["key"], s["state"], s["published"]) for s in sends] == [
            (f"m{p}:1", "sent", True) for p in range(PARTITIONS)
        ]


async def test_memory_holds_what_is_in_flight_and_the_disk_what_is_retained(
    backend: BackendHandle,
) -> None:
    """Acked records live in the partition's RocksDB database: memory keeps the writes in
    flight and a bounded cache, and the indexes answer from disk."""
    kv, _ = table_of(backend)
    kv.cache_size = 10
    with in_partition(0):
        for i in range(0, 300, 50):
            await asyncio.gather(
                *(
                    kv.commit([Put(f"s/{n:03}", {"n": n}, expect=0, due=float(n), purge=1e12)])
                    for n in range(i, i + 50)
                )
            )
        await asyncio.sleep(0)  # the last acks' writes to the database
        assert kv.in_memory <= 10
        assert len(await kv.range("due", "s/", 299.0, limit=1000)) == 300
        assert await kv.range("due", "s/", 4.5) == ["s/000", "s/001", "s/002", "s/003", "s/004"]
        # a record read from disk, changed: the index follows it
        assert await kv.commit([Put("s/000", {"n": 0}, expect=1, due=None, purge=5.0)]) == [2]
        assert (await kv.range("due", "s/", 2.0)) == ["s/001", "s/002"]
        assert (await kv.range("purge", "s/", 10.0)) == ["s/000"]
        entry = await kv.get("s/150")
        assert entry is not None and (entry.value, entry.version) == ({"n": 150}, 1)
    assert [e.key for e in await kv.scan("s/")][:2] == ["s/000", "s/001"]
    assert len(await kv.scan("s/")) == 300


async def test_writes_no_side_effect_waits_for_go_out_later_and_once_per_key(
    backend: BackendHandle,
) -> None:
    """``DEFERRED`` writes (a send sent, then published; an inbound done) are read at once
    but produced later: each key's latest version once, with the chat's next awaited write
    (before it; another chat's stay) or with ``flush``. The changelog then holds them."""
    kv, port = table_of(backend)
    with in_partition(0, "a"):
        await kv.commit([Put("s/a1", {"n": 0}, expect=0)])
    with in_partition(0, "b"):
        await kv.commit([Put("s/b1", {"n": 0}, expect=0)])
    produced = port.produced
    with in_partition(0, "a"):
        await kv.commit([Put("s/a1", {"n": 1}, expect=1)], label=Write.OUTBOX_MARK_SENT)
        await kv.commit([Put("s/a1", {"n": 2}, expect=2)], label=Write.OUTBOX_MARK_SENT)
        entry = await kv.get("s/a1")
        assert entry is not None and (entry.value, entry.version) == ({"n": 2}, 3)
    with in_partition(0, "b"):
        await kv.commit([Put("s/b1", {"n": 1}, expect=1)], label=Write.INBOX_MARK_DONE)
    assert port.produced == produced and kv.deferred == 2  # nothing produced yet
    with in_partition(0, "a"):  # chat a's next awaited write: a1 (once) goes first
        await kv.commit([Put("s/a2", {"n": 0}, expect=0)], label=Write.OUTBOX_JOURNAL)
    assert port.produced == produced + 2 and kv.deferred == 1  # b1 still waits
    await kv.flush()
    assert port.produced == produced + 3 and kv.deferred == 0
    restored = await backend.reopen()  # from the changelog alone
    assert isinstance(restored, InPartition)
    with in_partition(0):
        got = {k: await restored.kv.get(k) for k in ("s/a1", "s/a2", "s/b1")}
    assert {k: (e.value, e.version) for k, e in got.items() if e is not None} == {
        "s/a1": ({"n": 2}, 3),
        "s/a2": ({"n": 0}, 1),
        "s/b1": ({"n": 1}, 2),
    }


async def states_restored(backend: BackendHandle, *keys: str) -> dict[str, Any]:
    """The ``state`` of each of ``keys`` in the journal restored from the changelog alone
    (``None``: no record)."""
    restored = await backend.reopen()
    assert isinstance(restored, InPartition)
    with in_partition(0):
        got = {k: await restored.kv.get(k) for k in keys}
    return {k: None if e is None else e.value["state"] for k, e in got.items()}


async def test_a_turn_writes_a_record_of_its_group_a_wait_and_its_chat_turn_none(
    backend: BackendHandle,
) -> None:
    """A turn as the engine writes it on the worker: the inbound journaled (its group's
    record, awaited), the chat's turn taken (memory only: nothing produced), the send's
    claim (the group's record again, holding the inbound and the send); the marks after the
    provider call go out with the flush, in one record. A restore finds the inbound and the
    send, and no turn."""
    kv, port = table_of(backend)
    produced = port.produced
    with in_partition(0, "c"):
        await kv.commit([Put("s/in/m1", {"state": "pending"}, expect=0)], label=Write.INBOX_JOURNAL)
        await kv.commit([Put("s/turn/c", {"state": "held"}, expect=0)], label=Write.TURN_TAKE)
        assert port.produced == produced + 1  # the inbound's, not the turn's
        await kv.commit(
            [Put("s/out/m1:0", {"state": "sending"}, expect=0)], label=Write.OUTBOX_JOURNAL
        )
        assert port.produced == produced + 2 and kv.deferred == 0
        await kv.commit(
            [Put("s/out/m1:0", {"state": "sent"}, expect=1)], label=Write.OUTBOX_MARK_SENT
        )
        await kv.commit(
            [
                Put("s/in/m1", {"state": "done"}, expect=1),
                Put("s/turn/c", {"state": "done"}, expect=1),
            ],
            label=Write.INBOX_MARK_DONE,
        )
        turn = await kv.get("s/turn/c")
        assert turn is not None and (turn.value, turn.version) == ({"state": "done"}, 2)
    assert kv.deferred == 2
    await kv.flush()
    assert port.produced == produced + 3 and kv.deferred == 0  # one record, no turn's
    assert await states_restored(backend, "s/in/m1", "s/out/m1:0", "s/turn/c") == {
        "s/in/m1": "done",
        "s/out/m1:0": "sent",
        "s/turn/c": None,
    }


async def test_a_fresh_inbounds_turn_writes_one_record_before_its_send_and_one_after(
    backend: BackendHandle,
) -> None:
    """A fresh inbound record (``DEFERRED_WHEN_FRESH``: it came in after the worker was
    given its partition) is journaled in memory, nothing produced before its handlers run;
    its send's claim is the turn's first record (its group's: the inbound and the send,
    awaited before the provider call), its marks after the call the second (the flush).
    The same inbound not fresh is produced before its handlers run, as it always was."""
    kv, port = table_of(backend)
    produced = port.produced
    with in_partition(0, "c", fresh=True):
        await kv.commit([Put("s/in/m1", {"state": "pending"}, expect=0)], label=Write.INBOX_JOURNAL)
        assert port.produced == produced and kv.deferred == 1  # nothing awaited yet
        entry = await kv.get("s/in/m1")  # read back at once
        assert entry is not None and entry.value == {"state": "pending"}
        await kv.commit(
            [Put("s/out/m1:0", {"state": "sending"}, expect=0)], label=Write.OUTBOX_JOURNAL
        )
        assert port.produced == produced + 1 and kv.deferred == 0  # one record, both in it
        await kv.commit(
            [Put("s/out/m1:0", {"state": "sent"}, expect=1)], label=Write.OUTBOX_MARK_SENT
        )
        await kv.commit([Put("s/in/m1", {"state": "done"}, expect=1)], label=Write.INBOX_MARK_DONE)
    await kv.flush()
    assert port.produced == produced + 2 and kv.deferred == 0
    with in_partition(0, "c"):  # not fresh: durable before its handlers run
        await kv.commit([Put("s/in/m2", {"state": "pending"}, expect=0)], label=Write.INBOX_JOURNAL)
    assert port.produced == produced + 3 and kv.deferred == 0
    assert await states_restored(backend, "s/in/m1", "s/out/m1:0", "s/in/m2") == {
        "s/in/m1": "done",
        "s/out/m1:0": "sent",
        "s/in/m2": "pending",
    }


@pytest.mark.parametrize("backend", ["at_least_once"], indirect=True)
async def test_deferred_writes_the_broker_does_not_ack_wait_for_the_next_flush(
    backend: BackendHandle,
) -> None:
    kv, port = table_of(backend)
    with in_partition(0):
        await kv.commit([Put("s/k", {"v": 1}, expect=0)])
        await kv.commit([Put("s/k", {"v": 2}, expect=1)], label=Write.INBOX_MARK_DONE)
    await port.unreachable()  # the broker is gone: the flush fails
    with pytest.raises(JournalUnavailableError, match="not acked"):
        await kv.flush()
    assert kv.deferred == 1
    port.produced = 0
    await port.reachable()
    await kv.flush()
    assert port.produced == 1 and kv.deferred == 0
    restored = await backend.reopen()
    assert isinstance(restored, InPartition)
    with in_partition(0):
        entry = await restored.kv.get("s/k")
    assert entry is not None and (entry.value, entry.version) == ({"v": 2}, 2)


async def test_a_clean_stop_flushes_the_deferred_writes(backend: BackendHandle) -> None:
    """The worker closes its journal after the runtime stopped (whose last act marks
    receipts published, a deferred write): the close produces them."""
    kv, port = table_of(backend)
    with in_partition(1):
        await kv.commit([Put("s/k", {"v": 1}, expect=0)])
        await kv.commit([Put("s/k", {"v": 2}, expect=1)], label=Write.INBOX_MARK_DONE)
    produced = port.produced
    await kv.close()
    assert port.produced == produced + 1
    restored = await backend.reopen()
    assert isinstance(restored, InPartition)
    with in_partition(1):
        entry = await restored.kv.get("s/k")
    assert entry is not None and (entry.value, entry.version) == ({"v": 2}, 2)


async def test_a_later_write_of_a_key_is_its_last_record_even_when_a_flush_is_held_up(
    backend: BackendHandle,
) -> None:
    """A flush takes a deferred ``sent`` record, and the producer holds it up (a full buffer,
    a transaction lock): the receipt's ``published`` mark of the same key, written meanwhile,
    must still be the key's last record in the changelog, so that a restart restores it.
    Before the fix the flush had read the value before it waited and produced it after the
    mark: the restored record was unpublished again and its receipt went out a second time
    after a clean restart (5 of 600 in a CI run of the worker's restart test)."""
    kv, port = table_of(backend)
    with in_partition(0):
        await kv.commit([Put("o/k", {"published": None}, expect=0)])
        await kv.commit([Put("o/k", {"published": False}, expect=1)], label=Write.OUTBOX_MARK_SENT)
    assert kv.deferred == 1
    gate, held = asyncio.Event(), asyncio.Event()
    produce = port.produce

    async def held_up(partition: int, key: bytes, value: bytes | None) -> asyncio.Future[int]:
        if not held.is_set():  # the first record handed over (the flush's) waits
            held.set()
            await gate.wait()
        return await produce(partition, key, value)

    port.produce = held_up  # type: ignore[method-assign]
    flush = asyncio.ensure_future(kv.flush())
    await held.wait()
    with in_partition(0):
        mark = asyncio.ensure_future(
            kv.commit([Put("o/k", {"published": True}, expect=2)], label=Write.OUTBOX_PUBLISHED)
        )
        for _ in range(100):  # the loop turns over while the flush waits: the mark is written
            await asyncio.sleep(0)
        gate.set()
        await asyncio.gather(flush, mark)
        entry = await kv.get("o/k")
    assert entry is not None and (entry.value, entry.version) == ({"published": True}, 3)
    restored = await backend.reopen()  # from the changelog alone
    assert isinstance(restored, InPartition)
    with in_partition(0):
        entry = await restored.kv.get("o/k")
    assert entry is not None and (entry.value, entry.version) == ({"published": True}, 3)


async def test_a_published_mark_the_journal_refuses_is_recorded_by_the_next_flush(
    backend: BackendHandle,
) -> None:
    """The real engine on the journal: a receipt acked while the worker's group membership
    is unconfirmed cannot be recorded published (the journal refuses every write); it stays
    with the publisher, so a sweeper pass after its record fell due does not publish it
    again, and the first flush after the coordinator answered records it."""
    kv, port = table_of(backend)
    sink = HeldReceipts()
    clock = ManualClock()
    bot = Bot("refused")

    @bot.on_message
    async def reply(ctx: Context) -> None:
        await ctx.reply("hello")

    async with bot.bind(MockProvider(), kv, instance_id="w1", receipts=sink, clock=clock) as rt:
        ops = rt.durability
        assert ops is not None
        with in_partition(0):
            assert await rt.handle(Inbound(id="m", chat_id="c", text="hi")) == Outcome.HANDLED
            [ack] = sink.acks
            ack.set_result(None)
            port.stale = "membership last confirmed 20.0s ago"
            with pytest.raises(JournalUnavailableError, match="membership last confirmed"):
                await rt.flush_receipts()
            clock.advance(61.0)  # past the record's due time (the 60 s lease)
            refused: JournalUnavailableError | None = None
            try:  # the pass tries the mark again, refused again
                await ops.sweep_once()
            except JournalUnavailableError as exc:
                refused = exc
            for copy in sink.acks[1:]:  # acked, so that a failing test still stops
                copy.set_result(None)
            assert len(sink.acks) == 1, "the receipt was published again"
            assert refused is not None and "membership last confirmed" in str(refused)
            port.stale = None  # the coordinator accepted a heartbeat again
            assert await rt.flush_receipts() == 1
    restored = await backend.reopen()  # from the changelog alone
    assert isinstance(restored, InPartition)
    with in_partition(0):
        [sent] = [e.value for e in await restored.kv.scan(f"{bot.scope}/out/")]
    assert (sent["key"], sent["state"], sent["published"]) == ("m:1", "sent", True)

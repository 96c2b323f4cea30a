"""The two ``exactly_once`` defects of ``botmesh.streams.faust_app.defects`` in Faust's
transactions, each shown on Faust's own code and met by botmesh's workaround:
``drop_lost_producers`` and ``commit_open_transactions``.

Real parts: a real Faust app (never started: its assignor's assignment is set as Faust's
``on_assignment`` sets it), its real producer started against the broker, so every
transactional producer is a real ``AIOKafkaProducer`` (``transactional_id``,
``enable_idempotence``) Faust creates itself, and Faust's real ``TransactionManager``; a
partition's new owner is a real transactional producer of the same id, which the broker
fences the old one for."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import AsyncIterator, Iterable, Iterator
from types import SimpleNamespace
from typing import Any, cast

import faust
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import IllegalOperation, ProducerFenced
from faust.assignor.client_assignment import ClientAssignment, CopartitionedAssignment
from faust.transport.consumer import TransactionManager
from faust.transport.drivers.aiokafka import Producer as FaustProducer

from botmesh.streams.faust_app.defects import (
    _ORIGINAL_COMMIT_TRANSACTIONS,
    _ORIGINAL_TRANSACTIONS_REBALANCE,
    commit_open_transactions,
    drop_lost_producers,
)
from botmesh.streams.table_kv import TABLE_NAME
from botmesh.topics import Catalog
from tests.kafka.broker import committed_offsets, create_topics

pytestmark = pytest.mark.kafka

#: Seconds a condition on the broker may take to hold (a wait for it, not a measure).
WITHIN_S = 30.0


@pytest.fixture(autouse=True)
def _collect_fenced_waiters() -> Iterator[None]:
    """aiokafka fails a fenced producer's transaction waiter (``fatal_error``) and nothing
    awaits it: "Future exception was never retrieved" is logged whenever the garbage
    collector finds it. Collected here, at the end of the test that made it, not in the
    middle of a later test (on CPython 3.11.7 that log from inside ``ast``'s ``compile``
    made ``inspect.getsource`` raise ``SystemError`` in ``test_faust_defects``)."""
    yield
    gc.collect()


@contextlib.asynccontextmanager
async def _faust(bootstrap: str, cat: Catalog) -> AsyncIterator[tuple[Any, Any, Any]]:
    """A Faust app under ``exactly_once`` as the worker builds it (its id the group, one
    standby replica) and runs it (in a worker: its transactions on), its producer started,
    and Faust's transaction manager over it."""
    app = faust.App(
        cat.app_id,
        broker=f"kafka://{bootstrap}",
        processing_guarantee="exactly_once",
        table_standby_replicas=1,
    )
    app.in_worker = True  # as ``faust.Worker`` sets it: then ``app.in_transaction``
    producer: Any = app.producer
    # Faust keeps its transactional producers in dicts of the class (one app per process):
    # this test's own, so that none of them outlives it
    producer._transaction_producers = {}
    producer._trn_locks = {}
    await producer.start()
    try:
        manager = TransactionManager(app.transport, consumer=cast(Any, None), producer=producer)
        yield app, producer, manager
    finally:
        await producer.stop()  # stops every transactional producer it still holds


def _assign(app: Any, cat: Catalog, actives: Iterable[int], standbys: Iterable[int]) -> set[Any]:
    """Give the app's assignor the assignment Faust's leader hands out (the inbound topic and
    the journal's changelog copartitioned: one group, its standbys of both topics), as its
    ``on_assignment`` would; the Kafka assignment, as the rebalance reports it to Faust."""
    changelog = cat.changelog(TABLE_NAME)
    assignment = ClientAssignment(actives={}, standbys={})
    assignment.add_copartitioned_assignment(
        CopartitionedAssignment(
            actives=set(actives), standbys=set(standbys), topics={cat.inbound, changelog}
        )
    )
    assignor = app.assignor
    assignor._assignment = assignment
    assignor._topic_groups = {cat.inbound: 0, changelog: 0}
    assignor._active_tps = assignment.active_tps
    assignor._standby_tps = assignment.standby_tps
    tables = SimpleNamespace(changelog_topics={changelog})
    return {
        TopicPartition(topic, p)
        for topic, partitions in assignment.kafka_protocol_assignment(tables)  # type: ignore[arg-type]
        for p in partitions
    }


async def _fence(bootstrap: str, tid: str) -> AIOKafkaProducer:
    """The partition's new owner: a transactional producer of the same id, started (its
    start takes the id's next epoch from the broker, which fences every earlier one)."""
    owner = AIOKafkaProducer(
        bootstrap_servers=bootstrap, transactional_id=tid, enable_idempotence=True, acks="all"
    )
    await owner.start()
    return owner


async def _committed(bootstrap: str, group: str) -> dict[tuple[str, int], int]:
    return await asyncio.to_thread(committed_offsets, bootstrap, group)


async def _wait_committed(bootstrap: str, group: str, want: dict[tuple[str, int], int]) -> None:
    """Wait until the group's committed offsets are ``want``: the broker materializes the
    offsets of a transaction once it wrote the commit's markers, after the commit returned."""
    async with asyncio.timeout(WITHIN_S):  # polls the broker: there is no event to wait on
        while await _committed(bootstrap, group) != want:  # noqa: ASYNC110
            await asyncio.sleep(0.05)


async def test_faust_keeps_the_producer_of_a_lost_partition_and_the_worker_stops_it(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    """Under ``exactly_once`` Faust maps the partitions a rebalance took away to their
    transactional producers through the *new* assignment, where a lost partition is now a
    standby replica (one standby: the worker keeps a copy of what its peer took), so no
    producer is found to stop. The new owner's producer fences the one kept; when the
    partition comes back, Faust reuses the fenced producer and every transaction on it
    fails (``ProducerFenced``): the partition is stuck. ``drop_lost_producers`` stops every
    producer whose partition is not among the new assignment's active ones before Faust
    starts the new ones, so the partition that comes back gets a fresh producer, whose
    transactions commit."""
    assert _ORIGINAL_TRANSACTIONS_REBALANCE.__module__ == "faust.transport.consumer"
    cat = Catalog(topic_prefix)
    create_topics(kafka_bootstrap, [cat.inbound], partitions=2)
    tid = f"{cat.app_id}-0-1"  # Faust's transactional id of partition 1 (topic group 0)
    lost_tp = TopicPartition(cat.inbound, 1)

    # -- the defect, on Faust's own on_rebalance
    async with _faust(kafka_bootstrap, cat) as (app, producer, manager):
        both = _assign(app, cat, actives=[0, 1], standbys=[])
        await _ORIGINAL_TRANSACTIONS_REBALANCE(manager, both, set(), both)
        assert sorted(producer._transaction_producers) == [f"{cat.app_id}-0-0", tid]
        held = producer._transaction_producers[tid]
        assert isinstance(held, AIOKafkaProducer)
        assert held._txn_manager.transactional_id == tid
        assert producer._settings_extra() == {"acks": "all", "enable_idempotence": True}

        one = _assign(app, cat, actives=[0], standbys=[1])  # the peer took partition 1
        assert both - one == {lost_tp}  # its changelog partition stays, as a standby
        # the cause: a standby in the new assignment (the copartitioned assignment lists the
        # inbound partition among the standbys too), so it maps to no transactional id
        assert manager._tps_to_transactional_ids({lost_tp}) == set()
        await _ORIGINAL_TRANSACTIONS_REBALANCE(manager, one, both - one, one - both)
        assert producer._transaction_producers[tid] is held  # kept, still running
        assert not held._closed

        owner = await _fence(kafka_bootstrap, tid)
        await owner.stop()  # the peer left: the partition comes back
        back = _assign(app, cat, actives=[0, 1], standbys=[])
        await _ORIGINAL_TRANSACTIONS_REBALANCE(manager, back, one - back, back - one)
        assert producer._transaction_producers[tid] is held  # reused, fenced
        with pytest.raises(ProducerFenced):
            await producer.send_and_wait(
                cat.inbound, b"k", b"kept", 1, None, None, transactional_id=tid
            )
        assert producer._transaction_producers[tid] is held  # stuck with it

    # -- the workaround, the same rebalances
    drop_lost_producers()
    async with _faust(kafka_bootstrap, cat) as (app, producer, manager):
        both = _assign(app, cat, actives=[0, 1], standbys=[])
        await manager.on_rebalance(both, set(), both)
        held = producer._transaction_producers[tid]
        kept = producer._transaction_producers[f"{cat.app_id}-0-0"]

        one = _assign(app, cat, actives=[0], standbys=[1])
        await manager.on_rebalance(one, both - one, one - both)
        assert tid not in producer._transaction_producers  # stopped: no longer ours
        assert held._closed
        assert producer._transaction_producers[f"{cat.app_id}-0-0"] is kept  # still ours
        assert kept._txn_manager.is_in_transaction()

        owner = await _fence(kafka_bootstrap, tid)
        await owner.stop()
        back = _assign(app, cat, actives=[0, 1], standbys=[])
        await manager.on_rebalance(back, one - back, back - one)
        fresh = producer._transaction_producers[tid]
        assert fresh is not held
        await producer.send_and_wait(
            cat.inbound, b"k", b"fresh", 1, None, None, transactional_id=tid
        )
        await _ORIGINAL_COMMIT_TRANSACTIONS(producer, {tid: {lost_tp: 1}}, cat.group)

    reader = AIOKafkaConsumer(
        bootstrap_servers=kafka_bootstrap,
        isolation_level="read_committed",
        enable_auto_commit=False,
    )
    await reader.start()
    try:
        reader.assign([lost_tp])
        await reader.seek_to_beginning(lost_tp)
        async with asyncio.timeout(WITHIN_S):  # the committed record, once its marker is written
            record = await reader.getone()
        assert (record.key, record.value) == (b"k", b"fresh")  # the fenced one's never written
    finally:
        await reader.stop()
    await _wait_committed(kafka_bootstrap, cat.group, {(cat.inbound, 1): 1})


async def test_faust_commit_fails_on_an_ended_or_fenced_producer_and_the_worker_commits_the_rest(
    kafka_bootstrap: str,
    topic_prefix: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Under ``exactly_once`` Faust commits the consumer's offsets by sending them into each
    partition's transaction without checking that one is open. A producer whose transaction
    ended without a next one (Faust's own ``commit_and_end_transactions``) makes the commit
    raise (``Not in the middle of a transaction``: the consumer crashes, a clean stop
    hangs); a producer fenced by the partition's new owner makes it raise ``ProducerFenced``,
    which crashes the app, and the partitions after it in the same commit are never
    committed. ``commit_open_transactions`` begins a transaction on a producer found
    outside one, commits the partitions one by one, and logs a fenced one (fenced before
    the commit or found so during it) and leaves its offsets to the new owner: the other
    partitions' offsets are committed."""
    assert _ORIGINAL_COMMIT_TRANSACTIONS.__module__ == "faust.transport.drivers.aiokafka"
    caplog.set_level(logging.WARNING)
    cat = Catalog(topic_prefix)
    create_topics(kafka_bootstrap, [cat.inbound], partitions=4)
    tids = [f"{cat.app_id}-0-{p}" for p in range(4)]
    tps = [TopicPartition(cat.inbound, p) for p in range(4)]
    # Faust's own commit for the defect (another test may have installed the workaround)
    monkeypatch.setattr(FaustProducer, "commit_transactions", _ORIGINAL_COMMIT_TRANSACTIONS)
    owners: list[AIOKafkaProducer] = []
    async with _faust(kafka_bootstrap, cat) as (app, producer, manager):
        app.assignor._topic_groups = {cat.inbound: 0}
        try:
            for tid in tids:
                await producer.begin_transaction(tid)
            # partition 1's transaction ended without a next one (a stop, a revocation)
            await manager.commit({tps[1]: 3}, start_new_transaction=False)
            assert not producer._transaction_producers[tids[1]]._txn_manager.is_in_transaction()
            await _wait_committed(kafka_bootstrap, cat.group, {(cat.inbound, 1): 3})

            # -- the defects, on Faust's own commit_transactions
            with pytest.raises(IllegalOperation, match="Not in the middle of a transaction"):
                await manager.commit({tps[1]: 7})
            owners.append(await _fence(kafka_bootstrap, tids[0]))  # partition 0's new owner
            offsets = {tps[0]: 5, tps[1]: 7, tps[2]: 9, tps[3]: 11}
            assert app.crash_reason is None
            await manager.commit(offsets)
            assert isinstance(app.crash_reason, ProducerFenced)  # the app crashed
            assert any("Crashed reason" in r.getMessage() for r in caplog.records)
            # partition 0 fenced first: none after it committed (nothing was sent for them)
            assert await _committed(kafka_bootstrap, cat.group) == {(cat.inbound, 1): 3}

            # -- the workaround: partition 0's producer knows it is fenced now; partition
            # 2's is fenced too and finds it out during the commit
            commit_open_transactions()
            owners.append(await _fence(kafka_bootstrap, tids[2]))
            assert producer._transaction_producers[tids[0]]._txn_manager.is_fatal_error()
            assert not producer._transaction_producers[tids[2]]._txn_manager.is_fatal_error()
            caplog.clear()
            await manager.commit(offsets)
            assert not any("Crashed reason" in r.getMessage() for r in caplog.records)
            await _wait_committed(
                kafka_bootstrap, cat.group, {(cat.inbound, 1): 7, (cat.inbound, 3): 11}
            )
            warned = [r.getMessage() for r in caplog.records if r.name == "botmesh.streams"]
            assert f"transactional producer {tids[0]} was fenced; offsets not ours" in warned
            assert f"transactional producer {tids[2]} was fenced; offsets not ours" in warned
            assert any(f"{tids[1]} outside a transaction" in m for m in warned)
            for p in (1, 3):  # committed, and in the next transaction
                assert producer._transaction_producers[tids[p]]._txn_manager.is_in_transaction()
        finally:
            for owner in owners:
                await owner.stop()

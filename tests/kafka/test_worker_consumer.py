"""``botmesh.streams.worker.consumer.ConsumerThread`` on a real broker: the inbound topic's
partitions come with the same partitions of the side topics, paused until the worker
resumes them; a second worker joining moves some of each topic together, the first worker
finishing with them (``revoking``) before they go; commits land; a leave hands the
partitions over at once."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from botmesh.streams.config import WorkerConfig, group_instance_id
from botmesh.streams.groups import describe as real_describe
from botmesh.streams.worker import loop as loop_module
from botmesh.streams.worker.clients import consumer_config, worker_consumer_config
from botmesh.streams.worker.consumer import ConsumerThread
from botmesh.streams.worker.loop import CHECKS_A_SESSION, Membership
from tests.kafka.broker import create_topics
from tests.kafka.rdkafka_probe import produce

pytestmark = pytest.mark.kafka

PARTITIONS = 4


class Hooks:
    """Records the rebalances a worker saw; resumes what it is given, as the worker does
    once the journal partitions are restored."""

    def __init__(self, *, resume: bool = False) -> None:
        self.events: list[tuple[str, list[int]]] = []
        self.thread: ConsumerThread | None = None
        self.held: set[int] = set()
        #: resume the partitions inside the hook, as the worker does once restored (the
        #: consumer's thread serves the call while it waits for the hook)
        self.resume = resume

    async def assigned(self, partitions: set[int]) -> None:
        self.events.append(("assigned", sorted(partitions)))
        assert self.thread is not None
        if self.resume:
            await self.thread.resume(partitions)
        self.held |= partitions

    async def revoking(self, partitions: set[int]) -> None:
        self.events.append(("revoking", sorted(partitions)))
        self.held -= partitions

    async def lost(self, partitions: set[int]) -> None:
        self.events.append(("lost", sorted(partitions)))
        self.held -= partitions


async def until(cond: Callable[[], bool], what: str, within: float = 60.0) -> None:
    deadline = time.monotonic() + within
    while not cond():
        assert time.monotonic() < deadline, f"never: {what}"
        await asyncio.sleep(0.05)


async def drain(thread: ConsumerThread, into: list[tuple[str, int, bytes]]) -> None:
    while not thread.batches.empty():
        batch = thread.batches.get_nowait()
        into.extend(
            (str(m.topic()), int(m.partition() or 0), m.value() or b"") for m in batch.messages
        )


@pytest.fixture
async def topics(kafka_bootstrap: str, topic_prefix: str) -> AsyncIterator[tuple[str, str]]:
    inbound, requests = f"{topic_prefix}.inbound", f"{topic_prefix}.requests"
    create_topics(kafka_bootstrap, [inbound, requests], PARTITIONS)
    yield inbound, requests


def worker(
    bootstrap: str, group: str, name: str, inbound: str, requests: str, *, resume: bool = False
) -> tuple[ConsumerThread, Hooks]:
    hooks = Hooks(resume=resume)
    config = consumer_config(bootstrap, group=group, instance_id=name, session_timeout=10.0)
    thread = ConsumerThread(config, inbound, [requests], hooks, batch_size=100)
    hooks.thread = thread
    return thread, hooks


async def test_partitions_come_paused_with_their_side_topics_and_move_together(
    kafka_bootstrap: str, topic_prefix: str, topics: tuple[str, str]
) -> None:
    inbound, requests = topics
    group = f"{topic_prefix}-workers"
    produce(kafka_bootstrap, inbound, [(p, None, b"m") for p in range(PARTITIONS)])
    produce(kafka_bootstrap, requests, [(p, None, b"r") for p in range(PARTITIONS)])
    a, hooks_a = worker(kafka_bootstrap, group, "a", inbound, requests)
    await a.start()
    got: list[tuple[str, int, bytes]] = []
    b: ConsumerThread | None = None
    try:
        await until(lambda: hooks_a.held == set(range(PARTITIONS)), "a is given every partition")
        assert hooks_a.events == [("assigned", [0, 1, 2, 3])]
        # the group's generation, read from the group metadata librdkafka serialises
        first = a.generation
        assert first >= 1 and not a.rebalancing
        await until(lambda: a.member_id != "", "a's member id")
        await drain(a, got)
        # paused: nothing is read before the worker resumes (its journal restored)
        assert got == []
        await a.resume({0, 1})

        async def four() -> bool:
            await drain(a, got)
            return len(got) == 4

        deadline = time.monotonic() + 60
        while not await four():
            assert time.monotonic() < deadline, got
            await asyncio.sleep(0.05)
        assert sorted((t, p) for t, p, _ in got) == sorted(
            [(inbound, 0), (inbound, 1), (requests, 0), (requests, 1)]
        )
        await a.resume({2, 3})
        await a.commit({(inbound, 0): 1, (requests, 0): 1, ("not-ours", 0): 5})
        committed = await a.call(
            lambda c: c.committed(
                [TopicPartition(inbound, 0), TopicPartition(requests, 0)], timeout=30
            )
        )
        assert [tp.offset for tp in committed] == [1, 1]

        b, hooks_b = worker(kafka_bootstrap, group, "b", inbound, requests, resume=True)
        await b.start()
        await until(
            lambda: len(hooks_a.held) == 2 and len(hooks_b.held) == 2, "two partitions each"
        )
        # b resumed inside its hook: it reads what a left of the moved partitions
        read_b: list[tuple[str, int, bytes]] = []

        async def b_reads() -> bool:
            await drain(b, read_b)
            return {(t, p) for t, p, _ in read_b} >= {
                (t, p) for t in (inbound, requests) for p in hooks_b.held if p != 0
            }

        deadline = time.monotonic() + 60
        while not await b_reads():
            assert time.monotonic() < deadline, read_b
            await asyncio.sleep(0.05)
        moved = hooks_b.held
        # b's join made a new generation, the same for both members at its end
        await until(
            lambda: a.generation == b.generation > first,
            f"a new generation for both (a {a.generation}, b {b.generation}, first {first})",
        )
        assert hooks_a.events == [("assigned", [0, 1, 2, 3]), ("revoking", sorted(moved))]
        assert hooks_b.events == [("assigned", sorted(moved))]
        assert a.partitions == hooks_a.held and b.partitions == moved
        mine = await a.call(lambda c: {(tp.topic, tp.partition) for tp in c.assignment()})
        assert mine == {(t, p) for t in (inbound, requests) for p in hooks_a.held}
    finally:
        if b is not None:
            await b.close(leave=True)
        await a.close(leave=True)


async def test_a_leave_hands_the_partitions_over_at_once_and_a_restart_keeps_them(
    kafka_bootstrap: str, topic_prefix: str, topics: tuple[str, str]
) -> None:
    """``close()`` alone (a restart): the static member's partitions wait for it, and the
    other worker sees no rebalance; ``close(leave=True)``: they move at once."""
    inbound, requests = topics
    group = f"{topic_prefix}-workers"
    a, hooks_a = worker(kafka_bootstrap, group, "a", inbound, requests)
    b, hooks_b = worker(kafka_bootstrap, group, "b", inbound, requests)
    await a.start()
    await until(lambda: len(hooks_a.held) == PARTITIONS, "a has every partition")
    await b.start()
    await until(lambda: len(hooks_a.held) == 2 and len(hooks_b.held) == 2, "two each")
    seen_by_b = list(hooks_b.events)
    await a.close()  # a restart: no LeaveGroup
    again, hooks_again = worker(kafka_bootstrap, group, "a", inbound, requests)
    await again.start()
    try:
        await until(lambda: len(hooks_again.held) == 2, "a's successor gets its two back")
        assert hooks_b.events == seen_by_b  # b saw no rebalance
        await again.close(leave=True)
        # left, not expired: the coordinator lists b alone at once (a member that only
        # closed stays listed for its session timeout, 10 s here)
        admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
        described = admin.describe_consumer_groups([group])[group].result(30)
        assert [m.group_instance_id for m in described.members] == [group_instance_id("b")]
        await until(lambda: len(hooks_b.held) == PARTITIONS, "b takes every partition")
    finally:
        await b.close(leave=True)


def a_member(
    bootstrap: str, prefix: str, topics: tuple[str, str], session_timeout: float
) -> tuple[WorkerConfig, ConsumerThread, Hooks, Membership]:
    """A worker's consumer (not started) with hooks that record what it is given, and its
    membership."""
    inbound, requests = topics
    config = WorkerConfig(bootstrap=bootstrap, prefix=prefix, session_timeout=session_timeout)
    hooks = Hooks()
    thread = ConsumerThread(
        worker_consumer_config(config), inbound, [requests], hooks, batch_size=100
    )
    hooks.thread = thread
    return config, thread, hooks, Membership(thread, config)


async def test_the_membership_is_confirmed_only_while_the_coordinator_lists_the_member(
    kafka_bootstrap: str, topic_prefix: str, topics: tuple[str, str]
) -> None:
    """The new runtime's fence: confirmed by a describe of the group that lists this
    consumer's member id; too old a confirmation refuses writes (``unconfirmed`` says why)
    until a describe lists the member again."""
    config, thread, hooks, membership = a_member(kafka_bootstrap, topic_prefix, topics, 10.0)
    await thread.start()
    try:
        await until(lambda: len(hooks.held) == PARTITIONS, "the member has every partition")
        membership.confirmed -= 60  # as after a freeze
        assert "last confirmed 6" in (membership.unconfirmed() or "")
        assert await membership.check()
        assert membership.unconfirmed() is None
        gone = await thread.call(lambda c: c.memberid())
    finally:
        await thread.close(leave=True)
    # left: the coordinator does not list the member any more (what ``check`` looks for)
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    described = admin.describe_consumer_groups([config.catalog.group])[config.catalog.group]
    assert gone not in {m.member_id for m in described.result(30).members}


async def test_a_question_answered_late_and_failed_never_leaves_a_healthy_member_unconfirmed(
    kafka_bootstrap: str,
    topic_prefix: str,
    topics: tuple[str, str],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One membership question that hangs and then fails (a coordinator lookup librdkafka
    left behind, a timeout, a connection dropped for good) must not get a healthy worker's
    writes refused: the next questions go on at their pace, and the last confirmation never
    gets older than the limit. (Asked one after the other every quarter of the session
    timeout, a failed question let it pass half the session timeout: the bench's workers
    had their writes of that moment refused, and their claimed sends ended ``unknown`` a
    minute later.)"""
    _, thread, hooks, membership = a_member(kafka_bootstrap, topic_prefix, topics, 6.0)
    asked: list[float] = []

    def answered_late_once(*args: object) -> object:
        asked.append(time.monotonic())
        if len(asked) == 2:  # the coordinator answers 2.5 s late, with an error
            time.sleep(membership.limit - 0.5)
            raise ConnectionError("the group coordinator did not answer in time")
        return real_describe(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(loop_module, "describe", answered_late_once)
    await thread.start()
    running: asyncio.Task[None] | None = None
    try:
        await until(lambda: len(hooks.held) == PARTITIONS, "the member has every partition")
        caplog.set_level(logging.INFO, logger="botmesh.streams")
        membership.confirm()
        running = asyncio.ensure_future(membership.run())
        refused: list[str] = []
        # until the questions asked after the failed one cover twice the limit
        while len(asked) < 2 or time.monotonic() - asked[1] < 2 * membership.limit:
            why = membership.unconfirmed()
            if why is not None:
                refused.append(why)
            await asyncio.sleep(0.05)
        assert refused == []
        assert membership.failed == 1
        said = [r.getMessage() for r in caplog.records if "not confirmed" in r.getMessage()]
        assert len(said) == 1 and "did not answer in time" in said[0]
    finally:
        if running is not None:
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)
        await membership.calls.settle(10.0)
        await thread.close(leave=True)


async def test_questions_failing_for_a_session_timeout_ask_with_a_new_client(
    kafka_bootstrap: str,
    topic_prefix: str,
    topics: tuple[str, str],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An admin client whose questions keep failing while the coordinator holds the member
    (CI saw it for minutes after a broker restart under load, every journal write refused
    meanwhile) is replaced once they have failed for a session timeout: the next question,
    on a new client, confirms the member. The client replaced is kept, not destroyed (a
    client destroyed with a request pending can abort the process)."""
    _, thread, hooks, membership = a_member(kafka_bootstrap, topic_prefix, topics, 6.0)
    clients: list[object] = []

    def wedged_first_client(admin: object, *args: object) -> object:
        if admin not in clients:
            clients.append(admin)
        if admin is clients[0]:
            raise ConnectionError("this client's questions time out")
        return real_describe(admin, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(loop_module, "describe", wedged_first_client)
    await thread.start()
    running: asyncio.Task[None] | None = None
    try:
        await until(lambda: len(hooks.held) == PARTITIONS, "the member has every partition")
        caplog.set_level(logging.INFO, logger="botmesh.streams")
        running = asyncio.ensure_future(membership.run())

        def said(words: str) -> list[str]:
            return [r.getMessage() for r in caplog.records if words in r.getMessage()]

        await until(lambda: bool(said("confirmed again, after")), "confirmed on a new client")
        assert len(clients) == 2 and list(membership.retired) == [clients[0]]
        assert len(said("asking with a new admin client")) == 1
        [again] = said("confirmed again, after")
        failed_in_a_row = int(again.split("after ")[1].split()[0])
        assert failed_in_a_row >= CHECKS_A_SESSION, again  # a session timeout of failures
        assert membership.unconfirmed() is None
    finally:
        if running is not None:
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)
        await membership.calls.settle(10.0)
        await thread.close(leave=True)

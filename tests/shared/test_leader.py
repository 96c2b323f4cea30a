"""Leader-only provider sessions (``provider_session="leader"``): two runtimes in one
process on one journal (the memory journal, and two connections to a shared SQLite,
PostgreSQL and Redis journal), on one manual clock. Only the leader's provider is called;
a standby's sends are journaled, left to the leader, never charged; the lease passes at a
clean stop and after it lapsed."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from botmesh import Bot, Context, Inbound
from botmesh.errors import ConfigError, ProviderNotLeaderError
from botmesh.journal import DurableKv, MemoryKv
from botmesh.state.config import DurabilityConfig
from botmesh.testing import ManualClock, MockProvider
from tests.backends import BACKENDS
from tests.kit import App, make_app, texts

LEASE = 10.0


def _bot(provider_session: str = "leader") -> Bot:
    bot = Bot(
        "lead",
        durability={
            "poll": 0,
            "provider_session": provider_session,
            "leader": {"lease": f"{LEASE:g}s"},
            "inbox": {"backoff": {"jitter": 0}},
            "outbox": {"retries": 1, "backoff": {"jitter": 0}},
        },
    )

    @bot.on_message
    async def answer(ctx: Context) -> None:
        await ctx.reply(f"re:{ctx.text}")

    return bot


@asynccontextmanager
async def pair(backend: str, tmp_path: Path) -> AsyncIterator[tuple[App, App, ManualClock]]:
    """Leader ``a`` (started first) and standby ``b`` on one journal and one clock."""
    clock = ManualClock()
    case = BACKENDS[backend]
    kv_a: DurableKv = await case.open(tmp_path / "journal")
    kv_b: DurableKv = kv_a if backend == "memory" else await case.open(tmp_path / "journal")
    a = await make_app(kv=kv_a, clock=clock, bot=_bot(), instance_id="a")
    b = await make_app(kv=kv_b, clock=clock, bot=_bot(), instance_id="b")
    try:
        yield a, b, clock
    finally:
        for app in (b, a):
            await app.stop()
        for kv in {id(kv_a): kv_a, id(kv_b): kv_b}.values():
            await kv.close()


@pytest.mark.parametrize("backend_name", ["memory", "sqlite", "postgres", "redis"])
async def test_only_the_leader_calls_the_provider(backend_name: str, tmp_path: Path) -> None:
    async with pair(backend_name, tmp_path) as (a, b, clock):
        assert a.engine.leader is not None and a.engine.leader.is_leader
        assert b.engine.leader is not None and not b.engine.leader.is_leader
        # a standby's inline reply and enqueued send: journaled, pending, left to the leader
        assert await b.runtime.handle(Inbound(id="m1", chat_id="c", text="x")) == "handled"
        receipt = await b.runtime.send("c", "from-b", idempotency_key="k1")
        assert receipt.state == "pending"
        await b.runtime.enqueue("c", "queued-b", idempotency_key="k2")
        for _ in range(3):  # the standby's sweeper leaves them alone, whatever the time
            clock.advance(1.0)
            await b.ops.drain()
        assert b.provider.sent == []
        for key in ("m1:1", "k1", "k2"):
            rec = await b.ops.outbox.get(key)
            assert rec is not None and (rec.state, rec.attempts) == ("pending", 0)
        for _ in range(3):  # the leader delivers them, in the order they were made
            clock.advance(0.01)
            await a.ops.drain()
        assert texts(a.provider) == ["re:x", "from-b", "queued-b"]
        for key in ("m1:1", "k1", "k2"):
            rec = await a.ops.outbox.get(key)
            assert rec is not None and (rec.state, rec.attempts) == ("sent", 1)
        assert b.ops.metrics()["providerNotLeader"] == 2  # the two inline sends
        assert b.ops.metrics()["outboxDead"] == a.ops.metrics()["outboxDead"] == 0
        # the leader's own sends go out inline
        assert (await a.runtime.send("c", "from-a")).state == "sent"
        assert b.provider.sent == []


async def test_a_standby_is_never_charged_nor_dead_lettered(tmp_path: Path) -> None:
    async with pair("memory", tmp_path) as (a, b, clock):
        await b.runtime.enqueue("c", "waits", idempotency_key="w")
        for _ in range(20):  # far more passes than outbox.retries allows attempts
            clock.advance(0.5)
            await b.ops.sweep_once()
            assert a.engine.leader is not None
            await a.engine.leader.tick()  # the leader renews (its timer would)
        rec = await b.ops.outbox.get("w")
        assert rec is not None and (rec.state, rec.attempts) == ("pending", 0)
        assert b.provider.sent == [] and b.ops.metrics()["outboxDead"] == 0
        await a.ops.drain()
        assert texts(a.provider) == ["waits"]


@pytest.mark.parametrize("backend_name", ["memory", "sqlite", "postgres", "redis"])
async def test_the_session_passes_at_a_clean_stop(backend_name: str, tmp_path: Path) -> None:
    async with pair(backend_name, tmp_path) as (a, b, _clock):
        await b.runtime.send("c", "before", idempotency_key="k1")
        await a.stop()  # its pass delivers nothing more; the lease is released
        await b.ops.sweep_once()  # takes the session at once (no lease to wait for)
        assert b.engine.leader is not None and b.engine.leader.is_leader
        await b.ops.drain()
        assert texts(b.provider) == ["before"]
        assert (await b.runtime.send("c", "after")).state == "sent"
        assert texts(a.provider) == []


@pytest.mark.parametrize("backend_name", ["memory", "sqlite"])
async def test_a_lapsed_lease_is_taken_over_and_the_old_leader_refuses(
    backend_name: str, tmp_path: Path
) -> None:
    async with pair(backend_name, tmp_path) as (a, b, clock):
        await b.runtime.enqueue("c", "queued", idempotency_key="q")
        # the leader freezes (no renewal): its lease lapses
        clock.advance(LEASE * 0.8)
        assert a.engine.leader is not None and not a.engine.leader.may_send(clock.now())
        # past its safety margin the old leader sends nothing, even inline
        receipt = await a.runtime.send("c", "late", idempotency_key="late")
        assert receipt.state == "pending" and a.provider.sent == []
        await b.ops.sweep_once()
        assert b.engine.leader is not None and not b.engine.leader.is_leader  # not yet
        clock.advance(LEASE * 0.2 + 0.001)
        await b.ops.drain()  # the standby takes the session, and delivers
        assert b.engine.leader.is_leader
        assert sorted(texts(b.provider)) == ["late", "queued"]
        await a.ops.sweep_once()  # the old leader sees it lost the lease
        assert not a.engine.leader.is_leader and a.provider.sent == []
        with pytest.raises(ProviderNotLeaderError) as refused:
            a.engine.leader.check(clock.now())
        assert refused.value.leader == "b" and refused.value.until is not None
        assert "'b'" in str(refused.value)


async def test_a_refusal_right_before_the_call_hands_the_send_back(tmp_path: Path) -> None:
    """The lease lost between the claim and the provider call (a long pause): refused,
    handed back uncharged, and delivered by the next leader."""
    async with pair("memory", tmp_path) as (a, b, clock):
        await a.runtime.enqueue("c", "x", idempotency_key="k")
        leader = a.engine.leader
        assert leader is not None
        checks = 0
        real = leader.check

        def pause_then_check(now: float) -> None:
            nonlocal checks
            checks += 1
            clock.advance(LEASE)  # the pause: the lease is gone by the time of the call
            real(clock.now())

        leader.check = pause_then_check  # type: ignore[method-assign]
        await a.ops.sweep_once()
        assert checks == 1 and a.provider.sent == []
        rec = await a.ops.outbox.get("k")
        assert rec is not None and (rec.state, rec.attempts) == ("pending", 0)
        assert a.ops.metrics()["providerNotLeader"] == 1
        await b.ops.drain()
        assert texts(b.provider) == ["x"]


class SessionProvider(MockProvider):
    def __init__(self) -> None:
        super().__init__()
        self.sessions: list[str] = []

    async def open_session(self) -> None:
        self.sessions.append("open")

    async def close_session(self) -> None:
        self.sessions.append("close")


async def test_session_hooks_follow_the_lease() -> None:
    kv, clock = MemoryKv(), ManualClock()
    pa, pb = SessionProvider(), SessionProvider()
    a = await make_app(pa, kv=kv, clock=clock, bot=_bot(), instance_id="a")
    b = await make_app(pb, kv=kv, clock=clock, bot=_bot(), instance_id="b")
    assert (pa.sessions, pb.sessions) == (["open"], [])
    await a.stop()
    await b.ops.sweep_once()
    assert (pa.sessions, pb.sessions) == (["open", "close"], ["open"])
    await b.stop()
    assert pb.sessions == ["open", "close"]


class _PartitionedKv(MemoryKv):
    """A journal that says it is split by partition (as the Kafka worker's is)."""

    def near(self, key: str) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def across_partitions(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()


async def test_options_are_checked() -> None:
    cfg = DurabilityConfig.of({"provider_session": "leader", "leader": {"lease": "3s"}})
    assert (cfg.provider_session, cfg.leader.lease) == ("leader", 3.0)
    assert DurabilityConfig.of({}).provider_session == "any"
    with pytest.raises(ConfigError, match="provider_session: must be 'any' or 'leader'"):
        DurabilityConfig.of({"provider_session": "one"})
    with pytest.raises(ConfigError, match=r"leader\.lease"):
        DurabilityConfig.of({"leader": {"lease": "10ms"}})
    with pytest.raises(ConfigError, match=r"leader\.ttl: unknown option"):
        DurabilityConfig.of({"leader": {"ttl": "1s"}})
    with pytest.raises(ConfigError, match="shared by every replica"):
        await make_app(kv=_PartitionedKv(), bot=_bot())

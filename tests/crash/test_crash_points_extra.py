"""Crash points the main scenario does not reach: heartbeats, release of later parts,
failures before the handlers, operator actions and retention. Each write × before/after ×
both policies × every backend; after the crash a new incarnation recovers and settles."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from botmesh import Bot, Context, Inbound
from botmesh.errors import SendError, UnsupportedContentError
from botmesh.journal import DurableKv, Put
from botmesh.state.messages import Outbound, SendResult
from botmesh.testing import FaultyKv, ManualClock, MockProvider, SimulatedCrash, crashable
from tests.backends import BACKENDS, BackendHandle
from tests.kit import App, make_app, policy

pytestmark = pytest.mark.crash


class Channel(MockProvider):
    """Counts accepted texts across incarnations; refuses to work for a dead process;
    can hold a call open (``gate``) and fail on demand."""

    def __init__(self, accepted: dict[str, int], kv: FaultyKv | None, limit: int | None) -> None:
        super().__init__(text_limit=limit)
        self.accepted = accepted
        self.kv = kv
        self.gate: asyncio.Event | None = None
        self.entered = asyncio.Event()

    async def send(self, message: Outbound) -> SendResult:
        self.entered.set()
        if self.gate is not None:
            await self.gate.wait()
        if self.kv is not None and self.kv.crashed is not None:
            raise SimulatedCrash("dead", "provider", 0)
        result = await super().send(message)
        self.accepted[message.text or ""] = self.accepted.get(message.text or "", 0) + 1
        return result


@dataclass
class World:
    app: App
    channel: Channel
    clock: ManualClock
    hold: asyncio.Event | None = None
    entered: asyncio.Event | None = None

    @property
    def d(self) -> Any:
        return self.app.ops


async def _world(
    kv: DurableKv, accepted: dict[str, int], clock: ManualClock, policy_name: str, **opts: Any
) -> World:
    ckv = kv if isinstance(kv, FaultyKv) else None
    channel = Channel(accepted, ckv, opts.pop("limit", None))
    outbox = {"on_ambiguous": policy_name, **opts.pop("outbox", {})}
    bot = Bot("x", durability=policy(outbox=outbox, **opts))
    world = World(None, channel, clock)  # type: ignore[arg-type]

    @bot.on_message
    async def handler(ctx: Context) -> None:
        if world.hold is not None and world.entered is not None:
            world.entered.set()
            await world.hold.wait()
        await ctx.reply(f"re {ctx.inbound_id}")

    world.app = await make_app(channel, kv=kv, clock=clock, bot=bot, instance_id="x1")
    return world


Setup = Callable[[World], Awaitable[None]]


async def _slow_send(w: World) -> None:
    w.channel.gate = asyncio.Event()
    task = asyncio.create_task(w.app.runtime.send("c", "slow", idempotency_key="k"))
    await w.channel.entered.wait()
    w.clock.advance(45)
    try:
        await w.app.engine.leases.heartbeat_once(w.clock.now())
    finally:
        w.channel.gate.set()
        with contextlib.suppress(SimulatedCrash):
            await task


async def _slow_handler(w: World) -> None:
    w.hold, w.entered = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(w.app.runtime.handle(Inbound(id="m", chat_id="c")))
    await w.entered.wait()
    w.clock.advance(45)
    try:
        await w.app.engine.leases.heartbeat_once(w.clock.now())
    finally:
        w.hold.set()
        with contextlib.suppress(SimulatedCrash):
            await task


async def _deferred_parts(w: World) -> None:
    w.channel.fail_next(SendError("blip"))
    with contextlib.suppress(Exception):
        await w.app.runtime.send("c", "aaaa bbbb", idempotency_key="k")


async def _bad_record(w: World) -> None:
    bad = {"t": "in", "id": "bad", "state": "pending", "attempts": 0, "token": 0,
           "lease": None, "message": {"kind": "carrier-pigeon"}, "error": None}  # fmt: skip
    e = w.app.engine
    await e.kv.commit([Put(e.in_prefix + "bad", bad, expect=0, due=w.clock.now())])
    await w.d.sweep_once()


async def _replay(w: World) -> None:
    await w.app.runtime.handle(Inbound(id="m", chat_id="c"))
    await w.d.replay_inbound("m")


async def _retry(w: World) -> None:
    w.channel.fail_next(UnsupportedContentError("no"))
    with contextlib.suppress(UnsupportedContentError):
        await w.app.runtime.send("c", "again", idempotency_key="k")
    await w.d.retry_send("k")


async def _discard(w: World) -> None:
    await w.app.runtime.send("c", "gone", idempotency_key="k")
    await w.d.outbox.discard("k")


async def _purge(w: World) -> None:
    await w.app.runtime.handle(Inbound(id="m", chat_id="c"))
    w.clock.advance(120)
    await w.d.sweep_once()


Check = Callable[[World, dict[str, int], str, str], Awaitable[None]]


async def _check_slow_send(w: World, acc: dict[str, int], when: str, policy: str) -> None:
    rec = await w.d.outbox.get("k")
    assert rec is not None and rec.ambiguous  # a heartbeat crash is inside the window
    assert rec.state == ("unknown" if policy == "skip" else "sent")
    assert acc.get("slow", 0) == (0 if policy == "skip" else 1)


async def _check_slow_handler(w: World, acc: dict[str, int], when: str, policy: str) -> None:
    rec = await w.d.inbox.get("m")
    assert rec is not None and rec.state == "done"
    assert acc == {"re m": 1}


async def _check_parts(w: World, acc: dict[str, int], when: str, policy: str) -> None:
    states = {r.key: r.state for r in await w.d.outbox.list()}
    assert states == {"k": "sent", "k#2": "sent"}
    assert acc == {"aaaa ": 1, "bbbb": 1}


async def _check_bad(w: World, acc: dict[str, int], when: str, policy: str) -> None:
    rec = await w.d.inbox.get("bad")
    assert rec is not None and rec.state == "dead"  # never lost silently


async def _check_replay(w: World, acc: dict[str, int], when: str, policy: str) -> None:
    rec = await w.d.inbox.get("m")
    assert rec is not None and rec.state == "done"
    assert acc == {"re m": 1}


async def _check_retry(w: World, acc: dict[str, int], when: str, policy: str) -> None:
    rec = await w.d.outbox.get("k")
    assert rec is not None
    if when == "before":
        assert rec.state == "dead" and acc == {}
    else:
        assert rec.state == "sent" and acc == {"again": 1}


async def _check_discard(w: World, acc: dict[str, int], when: str, policy: str) -> None:
    rec = await w.d.outbox.get("k")
    assert (rec is None) == (when == "after")
    assert acc == {"gone": 1}


async def _check_purge(w: World, acc: dict[str, int], when: str, policy: str) -> None:
    assert await w.d.inbox.list() == [] and await w.d.outbox.list() == []
    assert acc == {"re m": 1}


CASES: dict[str, tuple[Setup, Check, dict[str, object]]] = {
    "outbox.heartbeat": (_slow_send, _check_slow_send, {}),
    "inbox.heartbeat": (_slow_handler, _check_slow_handler, {}),
    "outbox.release": (_deferred_parts, _check_parts, {"limit": 5, "outbox": {"inline_max": 0}}),
    "inbox.mark_retry": (
        _bad_record,
        _check_bad,
        {"inbox": {"max_attempts": 3, "backoff": {"jitter": 0}}},
    ),
    "inbox.mark_dead": (_bad_record, _check_bad, {"inbox": {"max_attempts": 1}}),
    "inbox.replay": (_replay, _check_replay, {}),
    "outbox.retry": (_retry, _check_retry, {}),
    "outbox.discard": (_discard, _check_discard, {}),
    "retention.purge": (_purge, _check_purge, {"retention": "1m"}),
}


@pytest.mark.parametrize("policy_name", ["skip", "resend"])
@pytest.mark.parametrize("backend_name", sorted(BACKENDS))
async def test_extra_crash_points(backend_name: str, policy_name: str, tmp_path: Path) -> None:
    for i, (label, (setup, check, opts)) in enumerate(CASES.items()):
        for when in ("before", "after"):
            handle = BackendHandle(BACKENDS[backend_name], tmp_path / f"{i}-{when}")
            kv = await handle.open()
            clock = ManualClock()
            accepted: dict[str, int] = {}
            ckv = crashable(kv)
            (ckv.crash_before if when == "before" else ckv.crash_after)(label)
            a = await _world(ckv, accepted, clock, policy_name, **dict(opts))
            with contextlib.suppress(SimulatedCrash):
                await setup(a)
            assert ckv.crashed is not None, (label, when)
            kv = await handle.reopen()
            b = await _world(kv, accepted, clock, policy_name, **dict(opts))
            for _ in range(8):
                clock.advance(61)
                await b.d.drain()
            try:
                await check(b, accepted, when, policy_name)
            except AssertionError as exc:
                raise AssertionError(f"{label} {when}: {exc}") from exc
            await b.app.stop()
            await handle.close()

"""Chat turns across replicas (``botmesh.state.turns``): two replicas receiving messages of one
chat never run its handlers at the same time; a turn held elsewhere is waited for, then
left to the sweeper (never lost, never charged); a dead holder's turn is taken after its
lease and the stale holder cannot finish.

Two runtimes in one process on one journal (memory, turns asked for) for the unit cases;
two replica processes on a shared SQLite, PostgreSQL and Redis journal (turns on by
default there) for the real ones: the handler proves no overlap with an ``O_EXCL`` file.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from botmesh import Bot, Context, Inbound, Outcome
from botmesh.journal import MemoryKv, Write
from botmesh.state.kv import Put
from botmesh.testing import ManualClock, SimulatedCrash, crashable
from tests.backends import BACKENDS, BackendHandle
from tests.kill import Child, python
from tests.kit import App, make_app, policy


class Overlaps:
    """A handler that records whether two runs of one chat ever overlap."""

    def __init__(self, hold: float = 0.005) -> None:
        self.busy: set[str] = set()
        self.overlaps: list[str] = []
        self.handled: list[str] = []
        self.hold = hold
        self.gate: asyncio.Event | None = None
        self.entered = asyncio.Event()

    def bot(self, **options: Any) -> Bot:
        bot = Bot("turns", durability=policy(**options))

        @bot.on_message
        async def handler(ctx: Context) -> None:
            if ctx.chat_id in self.busy:
                self.overlaps.append(ctx.inbound_id)
            self.busy.add(ctx.chat_id)
            try:
                self.entered.set()
                if self.gate is not None and ctx.text == "gated":
                    await self.gate.wait()
                await asyncio.sleep(self.hold)
                self.handled.append(ctx.inbound_id)
            finally:
                self.busy.discard(ctx.chat_id)

        return bot


class _PartitionedKv(MemoryKv):
    """A journal that says it is split by partition (as the Kafka worker's is)."""

    def near(self, key: str) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def across_partitions(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()


def _turn_key(app: App, chat: str = "c") -> str:
    assert app.engine.turns is not None
    return app.engine.turns.prefix + chat


async def _pair(
    seen: Overlaps, kv: Any = None, clock: ManualClock | None = None, **inbox: Any
) -> tuple[App, App]:
    kv = kv if kv is not None else MemoryKv()
    clock = clock or ManualClock()
    a = await make_app(kv=kv, clock=clock, bot=seen.bot(inbox=inbox), instance_id="a")
    b = await make_app(kv=kv, clock=clock, bot=seen.bot(inbox=inbox), instance_id="b")
    return a, b


@pytest.mark.parametrize("turns", [True, False])
async def test_two_replicas_take_turns_on_a_chat(turns: bool) -> None:
    seen = Overlaps()
    a, b = await _pair(seen, chat_turns=turns)
    ids = [f"m{i}" for i in range(12)]
    outcomes = await asyncio.gather(
        *(
            (a if i % 2 == 0 else b).runtime.handle(Inbound(id=mid, chat_id="c", text="x"))
            for i, mid in enumerate(ids)
        )
    )
    if not turns:  # the control: without turns the same feed does overlap
        assert seen.overlaps
        return
    assert seen.overlaps == []
    assert set(outcomes) == {Outcome.HANDLED}  # each waited for its turn (turn_wait 10 s)
    assert Counter(seen.handled) == Counter(ids)
    entry = await a.kv.get(_turn_key(a))
    assert entry is not None and entry.value["token"] == len(ids) and "lease" not in entry.value


async def test_a_turn_held_past_turn_wait_leaves_the_inbound_to_the_sweeper() -> None:
    seen = Overlaps()
    seen.gate = asyncio.Event()
    a, b = await _pair(seen, chat_turns=True, turn_wait=0)
    first = asyncio.create_task(a.runtime.handle(Inbound(id="m1", chat_id="c", text="gated")))
    await seen.entered.wait()
    assert await b.runtime.handle(Inbound(id="m2", chat_id="c", text="x")) == Outcome.DEFERRED
    rec = await b.ops.inbox.get("m2")
    assert rec is not None and (rec.state, rec.attempts) == ("pending", 0)  # not charged
    b.clock.advance(1.0)
    await b.ops.drain()  # the turn is still held: nothing runs, nothing is charged
    rec = await b.ops.inbox.get("m2")
    assert rec is not None and (rec.state, rec.attempts) == ("pending", 0)
    seen.gate.set()
    assert await first == Outcome.HANDLED
    b.clock.advance(1.0)
    await b.ops.drain()
    rec = await b.ops.inbox.get("m2")
    assert rec is not None and (rec.state, rec.attempts) == ("done", 1)
    assert seen.handled == ["m1", "m2"] and seen.overlaps == []


async def test_a_dead_holders_turn_is_taken_after_its_lease() -> None:
    seen, shared, clock = Overlaps(), MemoryKv(), ManualClock()
    dying = crashable(shared)
    dying.crash_before(Write.INBOX_MARK_DONE)
    a = await make_app(
        kv=dying, clock=clock, bot=seen.bot(inbox={"chat_turns": True}), instance_id="a"
    )
    b = await make_app(
        kv=shared,
        clock=clock,
        bot=seen.bot(inbox={"chat_turns": True, "turn_wait": 0}),
        instance_id="b",
    )
    with pytest.raises(SimulatedCrash):
        await a.runtime.handle(Inbound(id="m1", chat_id="c", text="x"))
    seen.busy.clear()  # the dead process's handler is gone with it
    assert await b.runtime.handle(Inbound(id="m2", chat_id="c", text="x")) == Outcome.DEFERRED
    clock.advance(61.0)  # past the inbox lease: the turn and m1 are b's to take
    await b.ops.drain()
    for mid in ("m1", "m2"):
        rec = await b.ops.inbox.get(mid)
        assert rec is not None and rec.state == "done", mid
    assert seen.overlaps == [] and Counter(seen.handled) == Counter(["m1", "m1", "m2"])


async def test_a_stale_holder_cannot_finish() -> None:
    seen = Overlaps()
    seen.gate = asyncio.Event()
    a, b = await _pair(seen, chat_turns=True)
    stale = asyncio.create_task(a.runtime.handle(Inbound(id="m1", chat_id="c", text="gated")))
    await seen.entered.wait()
    a.clock.advance(61.0)  # a froze: no heartbeat, its leases lapsed
    seen.busy.clear()
    assert await b.runtime.handle(Inbound(id="m2", chat_id="c", text="x")) == Outcome.HANDLED
    seen.gate.set()
    assert await stale == Outcome.FENCED  # its release, joined to mark-done, is refused
    assert a.ops.metrics()["staleLeases"] == 1
    rec = await a.ops.inbox.get("m1")
    assert rec is not None and rec.state == "pending"  # replayed by whoever takes it
    b.clock.advance(61.0)
    await b.ops.drain()
    rec = await b.ops.inbox.get("m1")
    assert rec is not None and rec.state == "done"


async def test_turns_are_on_by_default_only_on_a_shared_journal(tmp_path: Path) -> None:
    memory = await make_app()
    assert memory.engine.turns is None
    kv = await BACKENDS["sqlite"].open(tmp_path / "j")
    try:
        shared = await make_app(kv=kv)
        assert shared.engine.turns is not None
        await shared.stop()
        off = await make_app(kv=kv, inbox={"chat_turns": False})
        assert off.engine.turns is None
        await off.stop()
    finally:
        await kv.close()
    forced = await make_app(inbox={"chat_turns": True})
    assert forced.engine.turns is not None
    partitioned = await make_app(kv=_PartitionedKv(), inbox={"chat_turns": True})
    assert partitioned.engine.turns is None  # the partition serializes a chat already


async def test_a_heartbeat_landing_first_does_not_fail_the_release() -> None:
    seen = Overlaps()
    seen.gate = asyncio.Event()
    a, _ = await _pair(seen, chat_turns=True)
    run = asyncio.create_task(a.runtime.handle(Inbound(id="m1", chat_id="c", text="gated")))
    await seen.entered.wait()
    entry = await a.kv.get(_turn_key(a))
    assert entry is not None
    await a.kv.commit([Put(entry.key, {**entry.value, "beat": 1}, expect=entry.version)])
    seen.gate.set()
    assert await run == Outcome.HANDLED  # same token: the release is retried, not fenced
    after = await a.kv.get(_turn_key(a))
    assert after is not None and "lease" not in after.value


# -- real processes --------------------------------------------------------------------

SHARED = ["sqlite", "postgres", "redis"]


def _tell(child: Child, line: str) -> None:
    assert child.proc is not None and child.proc.stdin is not None
    child.proc.stdin.write(line + "\n")
    child.proc.stdin.flush()


def _lines(folder: Path, name: str) -> list[str]:
    file = folder / name
    return file.read_text().splitlines() if file.exists() else []


async def _create(name: str, path: Path) -> None:
    handle = BackendHandle(BACKENDS[name], path)
    await handle.open()
    await handle.close()


def _start(stack: ExitStack, backend: str, tmp_path: Path) -> list[Child]:
    path = tmp_path / "journal"
    asyncio.run(_create(backend, path))
    group = []
    for name in ("r1", "r2"):
        argv = python("-m", "tests.shared._turn_replica", backend, str(path), name, str(tmp_path))
        group.append(stack.enter_context(Child(argv, stdin=True)))
    for child in group:
        child.wait_for("ready")
    return group


def _summaries(group: list[Child]) -> list[dict[str, Any]]:
    for child in group:
        _tell(child, "end")
    out = [json.loads(c.wait_for("SUMMARY ", timeout=90).split(" ", 1)[1]) for c in group]
    for child in group:
        child.finish()
    return out


@pytest.mark.crash
@pytest.mark.parametrize("backend_name", SHARED)
def test_replica_processes_take_turns(backend_name: str, tmp_path: Path) -> None:
    ids = [f"m{i}" for i in range(16)]
    with ExitStack() as stack:
        group = _start(stack, backend_name, tmp_path)
        for i, mid in enumerate(ids):  # one chat (and a second), fed alternately to both
            _tell(group[i % 2], f"in {mid} {'c1' if i % 4 else 'c2'}")
        summaries = _summaries(group)
    assert _lines(tmp_path, "overlap.log") == []
    handled = Counter(line.split()[1] for line in _lines(tmp_path, "handled.log"))
    assert handled == Counter(ids)  # every inbound handled once
    for s in summaries:
        assert set(s["inbox"].values()) == {"done"} and len(s["inbox"]) == len(ids)
    per = Counter(line.split()[0] for line in _lines(tmp_path, "handled.log"))
    print(json.dumps({f"turns/{backend_name}": {"inbounds": len(ids), "per replica": dict(per)}}))


@pytest.mark.crash
@pytest.mark.parametrize("backend_name", SHARED)
def test_a_holder_killed_mid_turn_is_taken_over(backend_name: str, tmp_path: Path) -> None:
    with ExitStack() as stack:
        r1, r2 = _start(stack, backend_name, tmp_path)
        _tell(r1, "in k1 c hold:r1")
        r1.wait_for("HOLDING k1")
        _tell(r2, "in k2 c")  # waits for the turn r1 holds
        r1.kill()
        (tmp_path / "c.busy").unlink()  # the dead handler's proof file, left by the kill
        summary = _summaries([r2])[0]
        outcome = r2.lines
    assert _lines(tmp_path, "overlap.log") == []
    assert Counter(_lines(tmp_path, "handled.log")) == Counter(["r2 k1", "r2 k2"])
    assert summary["inbox"] == {"k1": "done", "k2": "done"}
    assert any(line.startswith("OUT k2 ") for line in outcome)
    figures = {"inbounds": 2, "kills": 1, "overlaps": 0, "lost": 0, "replayed": ["k1"]}
    print(json.dumps({f"turn-kill/{backend_name}": figures}))


async def test_a_free_turn_is_purged_with_retention_a_held_one_is_not() -> None:
    seen = Overlaps()
    seen.gate = asyncio.Event()
    a, _ = await _pair(seen, chat_turns=True)
    await a.runtime.handle(Inbound(id="m1", chat_id="c", text="x"))
    seen.entered.clear()
    held = asyncio.create_task(a.runtime.handle(Inbound(id="m2", chat_id="d", text="gated")))
    await seen.entered.wait()
    a.clock.advance(8 * 86400.0)  # past the default retention of 7 days
    await a.ops.sweep_once()
    assert await a.kv.get(_turn_key(a, "c")) is None  # free: purged
    assert await a.kv.get(_turn_key(a, "d")) is not None  # held: kept
    seen.gate.set()
    assert await held == Outcome.HANDLED  # lapsed, but nobody took it: it completes

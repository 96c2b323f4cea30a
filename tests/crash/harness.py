"""The crash-matrix scenario: three inbounds, each making an inline reply, a reply split in
two parts and an enqueued send; one send fails once (retryable), one fails for good.

``run_case`` drives runtime A on a crashable journal until it dies at the chosen point,
then optionally runtime B (crashing again at a second point), then runtime C on the same
journal with the same instance id; the channel redelivers every inbound to each new
incarnation. Each incarnation's journal dies with it (``BackendHandle.crash``): one that
holds writes back (the Kafka worker's, ``tests/kafka/journal.py``) says which it lost, and
a send whose outcome was among them joins the ambiguous window. Every incarnation publishes
receipts to one shared sink (as the Kafka worker does), so the checks also see that every
settled send has its receipt. ``run_case`` returns what the checks need.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import botmesh
from botmesh import Bot, Context, Inbound, Receipt
from botmesh.errors import SendError, UnsupportedContentError
from botmesh.state.kv import DurableKv
from botmesh.state.message_log import LoggedMessage
from botmesh.state.messages import Outbound, SendResult
from botmesh.state.splitter import split_text
from botmesh.testing import FaultyKv, ManualClock, SimulatedCrash, crashable
from tests.backends import BackendCase, BackendHandle

LIMIT = 40
INBOUNDS = [
    Inbound(id="m0", chat_id="c0", text="hi"),
    Inbound(id="m1", chat_id="c1", text="hey"),
    Inbound(id="m2", chat_id="c0", text="yo"),
]
#: Sends that fail once with a retryable error (inline retry, sweeper retry).
FAIL_ONCE = {"m1/a", "m2/e"}
#: A send the channel refuses for good: it must end dead (or unknown), never lost silently.
FINAL = {"m0/a"}

#: (when, label) crash points that fall in the ambiguous window: the send was recorded in
#: flight and its outcome was not recorded yet.
WINDOW = {
    ("after", "outbox.journal"),
    ("after", "outbox.claim"),
    ("before", "outbox.mark_sent"),
    ("before", "outbox.mark_failed"),
    ("before", "outbox.mark_dead"),
    ("before", "outbox.heartbeat"),
    ("after", "outbox.heartbeat"),
}


def long_text(mid: str) -> str:
    return f"{mid}/b " + "z" * 30 + f" {mid}/b2"


def expected_texts() -> dict[str, str]:
    """Record key -> text, for every send of the scenario."""
    out: dict[str, str] = {}
    for m in INBOUNDS:
        out[f"{m.id}:1"] = f"{m.id}/a"
        parts = split_text(long_text(m.id), LIMIT)
        assert len(parts) == 2
        out[f"{m.id}:2"] = parts[0]
        out[f"{m.id}:2#2"] = parts[1]
        out[f"{m.id}:3"] = f"{m.id}/e"
    return out


class ChannelLog:
    """The channel's side, shared by every incarnation: accepted texts, all calls, and the
    receipts published (key -> states seen)."""

    def __init__(self) -> None:
        self.accepted: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()
        self.failed_once: set[str] = set()
        self.receipts: dict[str, set[str]] = {}


class ReceiptLog:
    """A receipts sink that acknowledges at once, unless its process is dead."""

    def __init__(self, log: ChannelLog, kv: FaultyKv | None) -> None:
        self.log = log
        self.kv = kv

    async def publish(self, receipt: Receipt) -> Awaitable[Any]:
        if self.kv is not None and self.kv.crashed is not None:
            raise SimulatedCrash("dead", self.kv.crashed.label, self.kv.commits)
        self.log.receipts.setdefault(receipt.key, set()).add(receipt.state)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


class ScenarioProvider:
    name = "scenario"
    text_limit: int | None = LIMIT

    def __init__(self, log: ChannelLog, kv: FaultyKv | None = None) -> None:
        self.log = log
        self.kv = kv

    async def send(self, message: Outbound) -> SendResult:
        if self.kv is not None and self.kv.crashed is not None:
            raise SimulatedCrash("dead", self.kv.crashed.label, self.kv.commits)
        text = message.text or ""
        assert "idempotency_key" not in message.options
        self.log.calls[text] += 1
        if text in FINAL:
            raise UnsupportedContentError("this channel cannot carry that")
        if text in FAIL_ONCE and text not in self.log.failed_once:
            self.log.failed_once.add(text)
            raise SendError("temporary failure")
        self.log.accepted[text] += 1
        return SendResult(f"id-{text}-{self.log.accepted[text]}")


def make_bot(policy: str) -> Bot:
    bot = Bot(
        "crash",
        durability={
            "poll": 0,
            # one due send after another: the crash points of a run are the same on
            # every backend (concurrent sends interleave by each backend's own timing)
            "outbox": {
                "on_ambiguous": policy,
                "inline_max": "15s",
                "retries": 3,
                "sweep_at_once": 1,
            },
            "inbox": {"backoff": {"jitter": 0}},
        },
    )

    @bot.on_message
    async def handler(ctx: Context) -> None:
        mid = ctx.inbound_id
        with contextlib.suppress(UnsupportedContentError):  # it ends dead, by design
            await ctx.reply(f"{mid}/a")
        await ctx.reply(long_text(mid))
        await ctx.enqueue(ctx.chat_id, f"{mid}/e")

    return bot


def make_runtime(
    kv: DurableKv, log: ChannelLog, policy: str, clock: ManualClock
) -> botmesh.Runtime:
    crash_kv = kv if isinstance(kv, FaultyKv) else None
    return make_bot(policy).bind(
        ScenarioProvider(log, crash_kv),
        kv,
        instance_id="i1",
        receipts=ReceiptLog(log, crash_kv),
        clock=clock,
    )


Point = tuple[Literal["label", "commit"], object, Literal["before", "after"]]


@dataclass
class Outcome:
    crashes: list[SimulatedCrash] = field(default_factory=list)
    states: dict[str, str] = field(default_factory=dict)
    inbox: dict[str, str] = field(default_factory=dict)
    ambiguous_keys: set[str] = field(default_factory=set)
    log: ChannelLog = field(default_factory=ChannelLog)
    labels_a: list[str] = field(default_factory=list)
    final_metrics: dict[str, int] = field(default_factory=dict)
    unpublished: set[str] = field(default_factory=set)
    #: The message ids the journal recorded, by send key (``None``: not sent).
    message_ids: dict[str, str | None] = field(default_factory=dict)
    #: The message log of every chat of the scenario, after recovery.
    logged: list[LoggedMessage] = field(default_factory=list)
    #: Per incarnation that died: the journal keys whose latest write its death lost.
    lost: list[set[str]] = field(default_factory=list)


def _arm(kv: FaultyKv, point: Point | None) -> None:
    if point is None:
        return
    kind, what, when = point
    if kind == "label":
        assert isinstance(what, tuple)
        label, occurrence = what
        if when == "before":
            kv.crash_before(label, occurrence)
        else:
            kv.crash_after(label, occurrence)
    else:
        assert isinstance(what, int)
        kv.crash_at(what, when)


async def _incarnation(
    kv: DurableKv, log: ChannelLog, policy: str, clock: ManualClock, handle: BackendHandle
) -> botmesh.Runtime:
    app = make_runtime(kv, log, policy, clock)
    await app.start()
    for m in INBOUNDS:
        with handle.turn(m.chat_id):
            await app.handle(m)
    d = app.durability
    assert d is not None
    for _ in range(6):
        clock.advance(120.0)
        await d.drain()
    return app


async def run_case(
    case: BackendCase, path: Path, policy: str, points: list[Point | None]
) -> Outcome:
    """Crash at ``points[0]`` in bot A, ``points[1]`` in bot B…, then recover and settle."""
    out = Outcome()
    clock = ManualClock()
    handle = BackendHandle(case, path)
    kv = await handle.open()
    try:
        for i, point in enumerate(points):
            if i > 0:
                kv, lost = await handle.crash()
                out.lost.append(lost)
            ckv = crashable(kv)
            _arm(ckv, point)
            try:
                await _incarnation(ckv, out.log, policy, clock, handle)
            except SimulatedCrash as crash:
                out.crashes.append(crash)
            if i == 0:
                out.labels_a = list(ckv.labels)
            # an incarnation that did not crash is simply abandoned too (never stopped)
        kv, lost = await handle.crash()
        out.lost.append(lost)
        final = await _incarnation(kv, out.log, policy, clock, handle)
        d = final.durability
        assert d is not None
        out.final_metrics = d.metrics()
        for r in await d.outbox.list():
            out.states[r.key] = r.state
            out.message_ids[r.key] = r.message_id
            if r.ambiguous:
                out.ambiguous_keys.add(r.key)
        out.inbox = {r.id: r.state for r in await d.inbox.list()}
        out.unpublished = {r.key for r in await d.outbox.list() if not r.published}
        for chat in sorted({m.chat_id for m in INBOUNDS}):
            out.logged += await final.messages(chat, limit=1000)
        await final.stop()
    finally:
        await handle.close()
    return out


def scope_key(full: str) -> str:
    """``<scope>/out/<key>`` -> ``<key>``."""
    return full.split("/out/", 1)[1] if "/out/" in full else full


def check(out: Outcome, policy: str) -> None:
    """The invariants every crash case must keep."""
    expected = expected_texts()
    # 1. no inbound lost: every inbound ends done
    assert out.inbox == {m.id: "done" for m in INBOUNDS}, out.inbox
    # the ambiguous window: which keys were in flight at a crash
    window_crashes = Counter(
        scope_key(c.keys[0])
        for c in out.crashes
        if (c.when, c.label) in WINDOW and c.keys and "/out/" in c.keys[0]
    )
    # and a send whose outcome the journal held back and lost with its process (a deferred
    # sent mark): recovery finds it in flight
    window_crashes.update(scope_key(k) for lost in out.lost for k in lost if "/out/" in k)
    window = set(window_crashes)
    # 4. ambiguous count equals the crashes placed in the window (distinct sends)
    assert out.ambiguous_keys == window, (out.ambiguous_keys, window, out.crashes)
    # 2./5. every send ends sent, dead (the final one) or unknown (ambiguous under skip)
    for key, text in expected.items():
        state = out.states.get(key)
        # a later part shares the fate of an earlier part that became unknown: never a hole
        after_unknown = key.endswith("#2") and out.states.get(key[:-2]) == "unknown"
        if text in FINAL:
            allowed = {"dead"} | ({"unknown"} if key in window and policy == "skip" else set())
        elif (key in window or after_unknown) and policy == "skip":
            allowed = {"unknown"}
        else:
            allowed = {"sent"}
        assert state in allowed, (key, state, allowed, out.crashes)
        # 9. evidence matches the journal: every settled send has its receipt, in its state
        assert state in out.log.receipts.get(key, set()), (key, state, out.log.receipts)
        # 3. no provider call repeated for a key outside the ambiguous window
        accepted = out.log.accepted[text]
        if state == "sent":
            # each crash in the window may have let one accepted call go unrecorded
            limit = 1 + (window_crashes[key] if policy == "resend" else 0)
            assert 1 <= accepted <= limit, (key, accepted, out.crashes)
        elif state == "unknown":
            assert accepted <= (0 if after_unknown and key not in window else 1), (key, accepted)
        else:
            assert accepted == 0
    assert set(out.states) == set(expected), sorted(set(out.states) ^ set(expected))
    assert out.unpublished == set(), out.unpublished
    if policy == "skip":
        assert all(n <= 1 for n in out.log.accepted.values()), out.log.accepted
    check_log(out)


def check_log(out: Outcome) -> None:
    """The message log: every send the journal recorded ``sent`` is logged exactly once,
    with the message id the journal recorded (one the channel gave); nothing else is."""
    logged = Counter(m.key for m in out.logged)
    sent = {k for k, state in out.states.items() if state == "sent"}
    assert set(logged) == sent, (sorted(set(logged) ^ sent), out.crashes)
    assert all(n == 1 for n in logged.values()), (logged, out.crashes)
    given = {
        f"id-{text}-{n}" for text, count in out.log.accepted.items() for n in range(1, count + 1)
    }
    for m in out.logged:
        assert m.message_id == out.message_ids[m.key] and m.message_id in given, (m, given)
        assert m.text == expected_texts()[m.key] and m.channel == "scenario", m

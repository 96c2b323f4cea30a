"""The crash matrix for conversation flows: a persistent five-question flow (the third
question times out once and is asked again), killed before and after each of its writes:
the answers' ``inbox.journal``, the checkpoint riding on ``inbox.mark_done``, the
timeout's ``flow.checkpoint``, the questions' ``outbox.journal`` and ``outbox.mark_sent``;
every occurrence × before/after × both ambiguity policies × every backend. A new runtime on
the same journal then recovers and the channel delivers every message again; the flow must
end with the right result, every question sent once (under ``resend``, twice at most for a
crash in its ambiguous window; under ``skip`` never twice, possibly ``unknown``) and no
answer lost.

``-s`` prints the number of crash cases per backend and policy (``flow crash cases``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import botmesh
from botmesh import Bot, Context, Conversation, FlowEndedEvent, FlowTimeout, Inbound
from botmesh.journal import DurableKv
from botmesh.state.messages import Outbound, SendResult
from botmesh.testing import FaultyKv, ManualClock, SimulatedCrash, crashable
from tests.backends import BACKENDS, BackendCase, BackendHandle
from tests.crash.harness import WINDOW, Point, _arm, scope_key

pytestmark = pytest.mark.crash

POLICIES = ["skip", "resend"]
#: The writes a flow turn makes (the others are the matrix's business).
FLOW_LABELS = {
    "inbox.journal",
    "inbox.mark_done",
    "flow.checkpoint",
    "outbox.journal",
    "outbox.mark_sent",
}
BEFORE_TIMEOUT = [
    Inbound(id="m0", chat_id="c", text="/start"),
    Inbound(id="m1", chat_id="c", text="a1"),
    Inbound(id="m2", chat_id="c", text="a2"),
]
AFTER_TIMEOUT = [
    Inbound(id="m3", chat_id="c", text="a3"),
    Inbound(id="m4", chat_id="c", text="a4"),
    Inbound(id="m5", chat_id="c", text="a5"),
]
RESULT = ["a1", "a2", "a3", "a4", "a5"]
TEXTS = ["q1", "q2", "q3", "q3 late", "q3 again", "q4", "q5", "thanks a1,a2,a3,a4,a5"]


class Channel:
    """Counts accepted texts across incarnations; dead with its crashed journal."""

    name = "flows"
    text_limit: int | None = None

    def __init__(self, accepted: Counter[str], kv: FaultyKv | None) -> None:
        self.accepted = accepted
        self.kv = kv

    async def send(self, message: Outbound) -> SendResult:
        if self.kv is not None and self.kv.crashed is not None:
            raise SimulatedCrash("dead", self.kv.crashed.label, self.kv.commits)
        text = message.text or ""
        self.accepted[text] += 1
        return SendResult(f"id-{text}-{self.accepted[text]}")


def make_bot(policy: str, ended: list[FlowEndedEvent]) -> Bot:
    bot = Bot(
        "flowcrash",
        durability={
            "poll": 0,
            "outbox": {"on_ambiguous": policy, "backoff": {"jitter": 0}},
            "inbox": {"backoff": {"jitter": 0}, "max_attempts": 20},
        },
    )
    bot.on(FlowEndedEvent, ended.append)

    @bot.flow("five", persistent=True)
    async def five(conv: Conversation) -> list[str]:
        answers = [await conv.ask("q1"), await conv.ask("q2")]
        try:
            answers.append(await conv.ask("q3", timeout="1m"))
        except FlowTimeout:
            await conv.say("q3 late")
            answers.append(await conv.ask("q3 again"))
        answers += [await conv.ask("q4"), await conv.ask("q5")]
        await conv.say("thanks " + ",".join(answers))
        return answers

    @bot.on_message
    async def start(ctx: Context) -> None:
        if ctx.text == "/start":
            await ctx.start_flow(five)
        else:
            await ctx.reply(f"unexpected {ctx.text}")

    return bot


@dataclass
class Run:
    crashes: list[SimulatedCrash] = field(default_factory=list)
    accepted: Counter[str] = field(default_factory=Counter)
    ended: list[FlowEndedEvent] = field(default_factory=list)
    labels_a: list[str] = field(default_factory=list)
    states: dict[str, str] = field(default_factory=dict)
    texts: dict[str, str] = field(default_factory=dict)
    inbox: dict[str, str] = field(default_factory=dict)
    flow: tuple[str, int] = ("", 0)


async def _incarnation(kv: DurableKv, run: Run, policy: str, clock: ManualClock) -> botmesh.Runtime:
    app = make_bot(policy, run.ended).bind(
        Channel(run.accepted, kv if isinstance(kv, FaultyKv) else None),
        kv,
        instance_id="f1",
        clock=clock,
    )
    await app.start()
    d = app.durability
    assert d is not None
    for m in BEFORE_TIMEOUT:
        await app.handle(m)
    clock.advance(61.0)  # past q3's timeout: the sweeper fires it
    await d.drain()
    for m in AFTER_TIMEOUT:
        await app.handle(m)
    for _ in range(3):
        clock.advance(120.0)
        await d.drain()
    return app


async def run_case(case: BackendCase, path: Path, policy: str, point: Point | None) -> Run:
    run = Run()
    clock = ManualClock()
    handle = BackendHandle(case, path)
    kv = await handle.open()
    try:
        ckv = crashable(kv)
        _arm(ckv, point)
        try:
            await _incarnation(ckv, run, policy, clock)
        except SimulatedCrash as crash:
            run.crashes.append(crash)
        run.labels_a = list(ckv.labels)
        kv = await handle.reopen()
        final = await _incarnation(kv, run, policy, clock)
        d = final.durability
        assert d is not None
        for r in await d.outbox.list():
            run.states[r.key] = r.state
            run.texts[r.key] = r.payload.get("text") or ""
        run.inbox = {r.id: r.state for r in await d.inbox.list()}
        [flow] = await d.flows("c")
        run.flow = (flow.status, flow.steps)
        await final.stop()
    finally:
        await handle.close()
    return run


def check(run: Run, policy: str) -> None:
    # no answer lost: every inbound done, the flow done with every answer
    assert run.inbox == {m.id: "done" for m in BEFORE_TIMEOUT + AFTER_TIMEOUT}, run.inbox
    assert run.flow == ("done", 6), run.flow  # five answers and one timeout
    results = [e.result for e in run.ended if e.status == "done"]
    assert results and all(r == RESULT for r in results), run.ended
    assert all(e.status == "done" for e in run.ended), run.ended
    window = Counter(
        scope_key(c.keys[0])
        for c in run.crashes
        if (c.when, c.label) in WINDOW and c.keys and "/out/" in c.keys[0]
    )
    # every question and message of the flow journaled once, under one key
    assert sorted(run.texts.values()) == sorted(TEXTS), run.texts
    for key, text in run.texts.items():
        state = run.states[key]
        accepted = run.accepted[text]
        if key in window and policy == "skip":
            assert state == "unknown", (key, state, run.crashes)
            assert accepted <= 1, (key, accepted)
        else:
            assert state == "sent", (key, state, run.crashes)
            limit = 1 + (window[key] if policy == "resend" else 0)
            assert 1 <= accepted <= limit, (key, text, accepted, run.crashes)
    assert not any(t.startswith("unexpected") for t in run.accepted), run.accepted


async def _points(tmp_path: Path) -> list[Point]:
    dry = await run_case(BACKENDS["memory"], tmp_path / "dry", "skip", None)
    check(dry, "skip")
    points: list[Point] = []
    seen: Counter[str] = Counter()
    for label in dry.labels_a:
        seen[label] += 1
        if label in FLOW_LABELS:
            for when in ("before", "after"):
                points.append(("label", (label, seen[label]), when))
    return points


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("backend_name", sorted(BACKENDS))
async def test_flow_crash_points(backend_name: str, policy: str, tmp_path: Path) -> None:
    points = await _points(tmp_path)
    labels = {p[1][0] for p in points if isinstance(p[1], tuple)}
    assert labels == FLOW_LABELS, labels  # the scenario reaches every flow write
    for i, point in enumerate(points):
        run = await run_case(BACKENDS[backend_name], tmp_path / f"p{i}", policy, point)
        assert len(run.crashes) == 1, point
        try:
            check(run, policy)
        except AssertionError as exc:
            raise AssertionError(f"crash point {point}: {exc}") from exc
    print(f"flow crash cases: {backend_name}/{policy}: {len(points)}")

"""The message log across a crash between the provider call and the ``sent`` record: each
message the channel accepted and the journal recorded ``sent`` is logged exactly once, none
twice, none for a send not recorded ``sent`` (``botmesh.state.message_log``).

Three kinds of evidence: the crash scenario of ``tests/crash/harness.py`` crashed at every
occurrence of the writes around the provider call (``check`` holds the log to the journal:
``check_log``), on every backend and both ambiguity policies; a real child process killed
with SIGKILL while the provider call is in flight, then restarted on the same journal; and
a channel that can tell an ambiguous send went out (the resolver's "found" path).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from botmesh import Bot, Context, Inbound
from botmesh.journal import MemoryKv, Write
from botmesh.state.kv import Op
from botmesh.state.messages import Outbound, SendResult
from botmesh.testing import ManualClock, MockProvider, SimulatedCrash, crashable
from tests.backends import BACKENDS
from tests.crash.harness import Point, check, run_case
from tests.kill import Child, python

pytestmark = pytest.mark.crash

BACKEND_NAMES = sorted(BACKENDS)
PERSISTENT = sorted(n for n, c in BACKENDS.items() if c.persistent)

#: The writes around the provider call: the send journaled or claimed in flight, and its
#: outcome recorded (the log entry rides on ``outbox.mark_sent``).
AROUND_THE_CALL = ("outbox.journal", "outbox.claim", "outbox.mark_sent")


async def _points(tmp_path: Path) -> list[Point]:
    clean = await run_case(BACKENDS["memory"], tmp_path / "dry", "skip", [None])
    check(clean, "skip")
    assert len(clean.logged) == 11  # 12 sends, one refused for good (dead: not logged)
    points: list[Point] = []
    for label in AROUND_THE_CALL:
        for n in range(1, clean.labels_a.count(label) + 1):
            points += [("label", (label, n), "before"), ("label", (label, n), "after")]
    return points


@pytest.mark.parametrize("policy", ["skip", "resend"])
@pytest.mark.parametrize("backend_name", BACKEND_NAMES)
async def test_a_crash_around_the_provider_call_logs_each_sent_message_once(
    backend_name: str, policy: str, tmp_path: Path
) -> None:
    points = await _points(tmp_path)
    assert len(points) >= 24
    logged_after_a_window_crash = 0
    for i, point in enumerate(points):
        out = await run_case(BACKENDS[backend_name], tmp_path / f"p{i}", policy, [point])
        assert len(out.crashes) == 1, point
        check(out, policy)  # check_log: the log is the journal's sent sends, once each
        crash = out.crashes[0]
        if (crash.when, crash.label) == ("before", "outbox.mark_sent"):
            key = crash.keys[0].split("/out/", 1)[1]
            # the channel had it, the journal did not: logged only if sent again (resend)
            logged = [m for m in out.logged if m.key == key]
            if policy == "skip":
                assert logged == [] and out.states[key] == "unknown", (key, out.states[key])
            else:
                assert len(logged) == 1 and logged[0].ambiguous, logged
                logged_after_a_window_crash += 1
        elif (crash.when, crash.label) == ("after", "outbox.mark_sent"):
            key = crash.keys[0].split("/out/", 1)[1]
            # recorded with its entry: the restart answers it from the outbox, logs nothing
            assert Counter(m.key for m in out.logged)[key] == 1
    assert policy == "skip" or logged_after_a_window_crash > 0


# -- a channel that can tell whether an ambiguous send went out ---------------------------


class Resolving(MockProvider):
    """A mock channel that answers ``resolve_ambiguous`` from what it accepted."""

    async def resolve_ambiguous(
        self, message: Outbound, key: str, since: float
    ) -> SendResult | None:
        for call in self.calls:
            if call.error is None and call.message == message:
                assert call.message_id is not None
                return SendResult(call.message_id)
        return None


def _bot() -> Bot:
    bot = Bot("resolve", durability={"poll": 0, "outbox": {"on_ambiguous": "skip"}})

    @bot.on_message
    async def handler(ctx: Context) -> None:
        await ctx.reply("only once")

    return bot


async def test_an_ambiguous_send_the_channel_found_is_logged_once_with_its_id() -> None:
    kv, clock, provider = MemoryKv(), ManualClock(), Resolving()
    a = crashable(kv)
    a.crash_before(Write.OUTBOX_MARK_SENT)
    first = _bot().bind(provider, a, instance_id="r1", clock=clock)
    await first.start()
    with pytest.raises(SimulatedCrash):
        await first.handle(Inbound(id="m1", chat_id="c", text="hi"))
    [accepted] = provider.calls
    bot = _bot()
    async with bot.bind(provider, kv, instance_id="r1", clock=clock) as again:
        ops = again.durability
        assert ops is not None
        await ops.drain()
        logged = await bot.messages("c")
        record = await ops.outbox.get("m1:1")
        assert record is not None and record.state == "sent"
        assert ops.metrics()["outboxResolvedSent"] == 1
    assert len(provider.calls) == 1  # not sent again
    assert [(m.key, m.message_id, m.text) for m in logged] == [
        ("m1:1", accepted.message_id, "only once")
    ]
    assert record.message_id == accepted.message_id


class Torn(MemoryKv):
    """A journal whose first ``sent`` commit is cut after its first operation, as a kill
    between two changelog records cuts it on Kafka (the commit's records go one by one)."""

    tear = True

    async def commit(self, ops: Sequence[Op], *, label: str = "") -> list[int]:
        if self.tear and label == Write.OUTBOX_MARK_SENT:
            self.tear = False
            await super().commit(list(ops[:1]), label=label)
            raise SimulatedCrash("cut", label, 1, tuple(op.key for op in ops))
        return await super().commit(ops, label=label)


@pytest.mark.parametrize("policy", ["skip", "resend"])
async def test_a_sent_commit_cut_after_its_log_entry_is_recorded_sent_from_the_entry(
    policy: str,
) -> None:
    """The log entry goes first in the commit that records a send ``sent``; when only it
    landed, the restart finds the send in flight and its entry, which holds the channel's
    answer: the send is recorded ``sent`` with that message id, under either policy,
    without calling the channel or logging it again."""
    kv, clock, provider = Torn(), ManualClock(), MockProvider()

    def bot() -> Bot:
        b = Bot("torn", durability={"poll": 0, "outbox": {"on_ambiguous": policy}})

        @b.on_message
        async def handler(ctx: Context) -> None:
            await ctx.reply("only once")

        return b

    first = bot().bind(provider, kv, instance_id="t1", clock=clock)
    await first.start()
    with pytest.raises(SimulatedCrash) as cut:
        await first.handle(Inbound(id="m1", chat_id="c", text="hi"))
    assert "/log/" in cut.value.keys[0]  # the entry went first, the record did not land
    [accepted] = provider.calls
    again_bot = bot()
    async with again_bot.bind(provider, kv, instance_id="t1", clock=clock) as again:
        ops = again.durability
        assert ops is not None
        await ops.drain()
        record = await ops.outbox.get("m1:1")
        logged = await again_bot.messages("c")
    assert len(provider.calls) == 1  # not sent again
    assert record is not None and record.state == "sent"
    assert record.message_id == accepted.message_id
    assert [(m.key, m.message_id) for m in logged] == [("m1:1", accepted.message_id)]


# -- SIGKILL of a real process ----------------------------------------------------------------


def _run(marker: str | None, *args: str) -> dict[str, Any] | None:
    with Child(python("-m", "tests.crash.child", *args)) as child:
        if marker is not None:
            child.wait_for(marker)
            child.kill()
            return None
        lines = child.finish()
    summary: dict[str, Any] = json.loads(lines[-1])
    return summary


def _check_log(summary: dict[str, Any]) -> list[str]:
    """The log is the journal's sent sends, once each, with their recorded ids; returns the
    logged keys, oldest first."""
    log = summary["log"]
    sent = {k for k, state in summary["outbox"].items() if state == "sent"}
    keys = [k for k, _ in log]
    assert sorted(keys) == sorted(sent), (log, summary["outbox"])
    assert all(mid == summary["message_ids"][k] and mid for k, mid in log), summary
    return keys[::-1]


@pytest.mark.parametrize("policy", ["skip", "resend"])
@pytest.mark.parametrize("backend_name", PERSISTENT)
def test_sigkill_between_the_provider_call_and_the_sent_record(
    backend_name: str, policy: str, tmp_path: Path
) -> None:
    args = (backend_name, str(tmp_path / "journal"), str(tmp_path / "sent.log"))
    _run("SENT", *args, "hang-after-send", policy)  # the channel has "a"; killed before record
    summary = _run(None, *args, "recover", policy)
    assert summary is not None
    received = (tmp_path / "sent.log").read_text().splitlines()
    keys = _check_log(summary)
    if policy == "skip":
        assert received == ["a", "b"]
        assert keys == ["m1:2"]  # "a" went out but its outcome was lost: unknown, not logged
    else:
        assert received == ["a", "a", "b"]
        assert keys == ["m1:1", "m1:2"]  # "a" logged once: for the attempt recorded sent
        [(_, mid)] = [e for e in summary["log"] if e[0] == "m1:1"]
        assert mid.endswith("-a") and mid == summary["message_ids"]["m1:1"]


@pytest.mark.parametrize("backend_name", PERSISTENT)
def test_sigkill_in_a_handler_after_a_send_logs_it_once(backend_name: str, tmp_path: Path) -> None:
    args = (backend_name, str(tmp_path / "journal"), str(tmp_path / "sent.log"))
    _run("IN_HANDLER", *args, "hang-in-handler", "skip")  # "a" recorded sent and logged
    summary = _run(None, *args, "recover", "skip")  # the replay answers "a" from the outbox
    assert summary is not None
    assert (tmp_path / "sent.log").read_text().splitlines() == ["a", "b"]
    assert _check_log(summary) == ["m1:1", "m1:2"]

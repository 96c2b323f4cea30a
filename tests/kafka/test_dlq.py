"""Failed sends, dead letters and the operator's ``botmesh dlq`` on a real broker, with a
real ``botmesh worker`` whose provider talks to a local fake of a channel's API (the
``Recorder``: 429 with Retry-After, 500, a final 400, or 200 with a message id).

Every send ends ``sent`` (at the recorder) or on ``<prefix>.outbox.dlq`` with its reason;
no attempt comes before the Retry-After the fake asked for (the fake's own clock); a chat's
replies reach the fake in the chat's order; a dead letter redriven with ``botmesh dlq
retry`` is sent once, and a second ``dlq retry`` of the send now sent sends nothing.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from botmesh import Inbound
from botmesh.streams.ops.dlq import read_dead_letters, reproduce
from botmesh.streams.ops.tools import produce_inbound
from botmesh.streams.provision import ensure_topics
from botmesh.topics import Catalog
from tests.kafka.bot import reply_text
from tests.kafka.recorder import Recorder
from tests.kafka.worker import PARTITIONS, WAIT_S, Worker, read_all, read_journal
from tests.kill import Child

pytestmark = pytest.mark.kafka

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    with Recorder() as rec:
        yield rec


@pytest.fixture
def worker(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path, recorder: Recorder
) -> Iterator[Worker]:
    ensure_topics(kafka_bootstrap, Catalog(topic_prefix).specs(partitions=PARTITIONS))
    env = {"BOTMESH_TEST_OUTBOX_INLINE": "0.5ms", "BOTMESH_TEST_OUTBOX_RETRIES": "4"}
    w = Worker(kafka_bootstrap, topic_prefix, tmp_path, env=env, recorder=recorder.url)
    yield w
    w.close()


def botmesh(worker: Worker, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI, as an operator runs it, against the test's broker and prefix."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "botmesh",
            *args,
            "--bootstrap",
            worker.bootstrap,
            "--prefix",
            worker.prefix,
        ],
        cwd=REPO,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


async def wait_for(what: str, check: Any, worker: Worker) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        worker.check_alive()
        if time.monotonic() > deadline:
            pytest.fail(f"still waiting for {what}")
        await asyncio.sleep(0.2)


async def died(child: Child, what: str) -> None:
    """Until the worker process is gone (killed by its own hook); ``what`` if it is not."""
    deadline = time.monotonic() + WAIT_S
    while child.alive():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.1)


def dlq_list(worker: Worker, *args: str) -> list[dict[str, Any]]:
    out = botmesh(worker, "dlq", "list", "--json", *args)
    assert out.returncode == 0, out.stderr
    got: list[dict[str, Any]] = json.loads(out.stdout)
    return got


async def test_failed_sends_retry_as_asked_end_sent_or_dead_and_redrive_once(
    worker: Worker, recorder: Recorder
) -> None:
    cat = Catalog(worker.prefix)
    chats = [f"c{i}" for i in range(4)]
    messages = [Inbound(id=f"m-{c}-{k}", chat_id=c, text=f"t{k}") for k in range(4) for c in chats]
    text = {m.id: reply_text(m.id, m.text) for m in messages}
    recorder.script(text["m-c0-0"], [(429, 2.0)])
    recorder.script(text["m-c1-1"], [(500, None), (500, None)])
    recorder.script(text["m-c3-0"], [(429, 1.0), (500, None), (429, 1.5)])
    refused = {"m-c2-2", "m-c1-3"}
    for mid in refused:
        recorder.refuse(text[mid])
    await produce_inbound(worker.bootstrap, cat.inbound, messages)
    worker.start()

    sent_ids = {m.id for m in messages} - refused
    await wait_for(
        "every send accepted or dead",
        lambda: (
            {c.inbound_id for c in recorder.calls()} >= sent_ids
            and len({d["headers"]["idempotency.key"] for d in dlq_list(worker)}) == len(refused)
        ),
        worker,
    )

    # every send: sent once, or dead with the provider's refusal as its reason
    calls = recorder.calls()
    assert collections.Counter(c.inbound_id for c in calls) == dict.fromkeys(sent_ids, 1)
    dead = {d["headers"]["inbound.id"]: d for d in dlq_list(worker, "--kind", "outbox")}
    assert set(dead) == refused
    for mid, d in dead.items():
        h = d["headers"]
        assert (h["reason"], h["error.class"]) == ("send-refused", "RecipientUnreachableError")
        assert h["chat.id"] == d["key"] == mid.split("-")[1]
        assert h["source.topic"] == cat.inbound and int(h["source.offset"]) >= 0
        assert float(h["failed.first"]) <= float(h["failed.last"]) <= float(h["dead.ts"])
        assert d["value"]["text"] == text[mid]

    # Retry-After: no attempt of a send before the time the fake asked for
    attempts: dict[str, list[float]] = collections.defaultdict(list)
    for r in recorder.refusals():
        attempts[r.text].append(r.at)
    for c in calls:
        attempts[c.text].append(c.at)
    checked = 0
    for r in recorder.refusals():
        if r.retry_after is None:
            continue
        later = [t for t in attempts[r.text] if t > r.at]
        assert later, f"no attempt after the 429 of {r.text!r}"
        assert min(later) - r.at >= r.retry_after, (r.text, min(later) - r.at, r.retry_after)
        checked += 1
    assert checked == 3

    # the waits went through the retry tiers, visible on their topics (the sweeper's backstop
    # would take 30 s more): the 429 asking 2 s parked the send on the 5 s tier
    parked = {
        tier: [json.loads(r.value) for r in await read_all(worker.bootstrap, cat.retry(tier))]
        for tier in ("1s", "5s")
    }
    assert {p["key"] for p in parked["5s"]} >= {"m-c0-0:1", "m-c3-0:1"}
    assert {p["key"] for p in parked["1s"]} >= {"m-c3-0:1"}
    assert all(p["retry_at"] > 0 and p["attempts"] >= 1 for p in parked["5s"] + parked["1s"])

    # each chat's replies reached the fake in the chat's order
    for chat in chats:
        got = [c.inbound_id for c in calls if c.chat_id == chat]
        want = [m.id for m in messages if m.chat_id == chat and m.id not in refused]
        assert got == want

    # the operator: a dry run does nothing; a redrive sends once; again, nothing
    key = dead["m-c2-2"]["headers"]["idempotency.key"]
    dry = botmesh(worker, "dlq", "retry", "--key", key, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "dry run: 1 to retry, nothing done" in dry.stdout
    recorder.allow(text["m-c2-2"])
    before = len(recorder.calls())
    retry = botmesh(worker, "dlq", "retry", "--key", key, "--json")
    assert retry.returncode == 0, retry.stderr
    [result] = json.loads(retry.stdout)["results"]
    assert (result["outcome"], result["target"], result["chat_id"]) == ("done", key, "c2")
    await wait_for("the redriven send", lambda: len(recorder.calls()) > before, worker)
    again = botmesh(worker, "dlq", "retry", "--key", key, "--json")
    assert again.returncode == 1, again.stderr
    [result] = json.loads(again.stdout)["results"]
    assert (result["outcome"], result["state"]) == ("refused", "sent")
    shown = botmesh(worker, "dlq", "show", key)
    assert shown.returncode == 0 and "reason: send-refused" in shown.stdout

    # discard: the owner forgets the other dead send
    other = dead["m-c1-3"]["headers"]["idempotency.key"]
    gone = botmesh(worker, "dlq", "discard", "--chat-id", "c1", "--json")
    assert gone.returncode == 0, gone.stderr
    assert [(r["target"], r["outcome"]) for r in json.loads(gone.stdout)["results"]] == [
        (other, "done")
    ]
    assert worker.stop() == 0
    sends = collections.Counter(c.inbound_id for c in recorder.calls())
    assert sends == dict.fromkeys(sent_ids | {"m-c2-2"}, 1)


def test_dlq_commands_name_the_bad_input_and_an_unreachable_broker(worker: Worker) -> None:
    nothing = botmesh(worker, "dlq", "retry", "--chat-id", "nobody")
    assert nothing.returncode == 1
    assert "no outbox dead letters match" in nothing.stdout
    bad = botmesh(worker, "dlq", "list", "--since", "yesterday")
    assert bad.returncode == 2
    assert "'yesterday' is not a time" in bad.stderr
    down = subprocess.run(
        [sys.executable, "-m", "botmesh", "dlq", "list", "--bootstrap", "127.0.0.1:1"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert down.returncode == 3
    assert "cannot reach Kafka at '127.0.0.1:1'" in down.stderr


async def test_a_sigkill_between_dead_and_its_dead_letter_leaves_both_or_neither(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    """The worker is SIGKILLed right after the journal recorded a send dead and before its
    dead letter was produced. Restarted, it copies the record: every dead send in the
    journal has its dead letter on ``outbox.dlq``, and every dead letter a dead send."""
    cat = Catalog(topic_prefix)
    ensure_topics(kafka_bootstrap, cat.specs(partitions=PARTITIONS))
    marker = tmp_path / "killed"
    env = {"BOTMESH_TEST_KILL_AT_DEAD_LETTER": str(marker)}
    worker = Worker(kafka_bootstrap, topic_prefix, tmp_path, env=env)
    try:
        texts = ["refuse" if i % 3 == 0 else f"t{i}" for i in range(9)]
        messages = [Inbound(id=f"k{i}", chat_id=f"c{i % 3}", text=t) for i, t in enumerate(texts)]
        await produce_inbound(kafka_bootstrap, cat.inbound, messages)
        child = worker.start()
        await died(child, "the worker did not die at its dead letter")
        assert child.proc is not None and child.proc.returncode == -9
        assert marker.exists()
        worker.start()
        refused = {f"k{i}" for i, t in enumerate(texts) if t == "refuse"}
        want = {f"{mid}:1" for mid in refused}
        await wait_for(
            "a dead letter for each refused send",
            lambda: {d["headers"]["idempotency.key"] for d in dlq_list(worker)} >= want,
            worker,
        )
        assert worker.stop() == 0
        journal = await read_journal(worker)
        dead = {v["key"] for k, v in journal.items() if "/out/" in k and v.get("state") == "dead"}
        letters = {d["headers"]["idempotency.key"] for d in dlq_list(worker, "--kind", "outbox")}
        assert dead == letters == want
        published = {v["key"]: v.get("published") for v in journal.values() if v.get("key") in dead}
        assert set(published.values()) == {True}
    finally:
        worker.close()


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
async def test_an_inbound_dead_after_a_crash_is_in_the_dlq_and_replayed_once_from_the_cli(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path, guarantee: str
) -> None:
    """With ``inbox.max_attempts=1`` a message whose handler killed the worker is dead at the
    next start: the journal copies it to ``inbound.dlq`` (with its id, reason and source
    offset; under ``exactly_once`` with the dead record, in its transaction); ``botmesh dlq
    replay`` has its owner run it again: its reply goes out once."""
    cat = Catalog(topic_prefix)
    ensure_topics(kafka_bootstrap, cat.specs(partitions=PARTITIONS))
    marker = tmp_path / "crashed"
    env = {
        "BOTMESH_TEST_CRASH_MARKER": str(marker),
        "BOTMESH_TEST_INBOX_ATTEMPTS": "1",
        "BOTMESH_PROCESSING_GUARANTEE": guarantee,
    }
    worker = Worker(kafka_bootstrap, topic_prefix, tmp_path, env=env)
    try:
        messages = [Inbound(id="x1", chat_id="c1", text="crash")]
        messages += [Inbound(id=f"x{i}", chat_id="c1", text=f"t{i}") for i in range(2, 5)]
        await produce_inbound(kafka_bootstrap, cat.inbound, messages)
        child = worker.start()
        await died(child, "the handler did not kill the worker")
        worker.start()
        await wait_for(
            "the dead inbound's dead letter",
            lambda: (
                [d["headers"].get("inbound.id") for d in dlq_list(worker, "--kind", "inbound")]
                == ["x1"]
            ),
            worker,
        )
        [d] = dlq_list(worker, "--kind", "inbound")
        h = d["headers"]
        assert (h["reason"], h["chat.id"], h["source.topic"]) == (
            "attempts-exhausted",
            "c1",
            cat.inbound,
        )
        assert d["value"]["id"] == "x1" and d["value"]["text"] == "crash"
        later = {reply_text(f"x{i}", f"t{i}") for i in range(2, 5)}
        await wait_for(
            "the chat's other replies", lambda: later <= {s["text"] for s in worker.sends()}, worker
        )
        assert reply_text("x1", "crash") not in {s["text"] for s in worker.sends()}

        replay = botmesh(worker, "dlq", "replay", "--key", "x1", "--json")
        assert replay.returncode == 0, replay.stderr
        [result] = json.loads(replay.stdout)["results"]
        assert (result["outcome"], result["target"]) == ("done", "x1")
        await wait_for(
            "the replayed reply",
            lambda: reply_text("x1", "crash") in {s["text"] for s in worker.sends()},
            worker,
        )
        # the dead letter produced again to the inbound (as with kcat): known by its id, done
        # now, so nothing runs again; a message after it in the chat shows it was read
        [letter] = await read_dead_letters(kafka_bootstrap, [cat.inbound_dlq])
        await reproduce(kafka_bootstrap, cat.inbound, [letter])
        await produce_inbound(
            kafka_bootstrap, cat.inbound, [Inbound(id="x5", chat_id="c1", text="t5")]
        )
        await wait_for(
            "the reply after the redriven copy",
            lambda: reply_text("x5", "t5") in {s["text"] for s in worker.sends()},
            worker,
        )
        assert worker.stop() == 0
        texts = collections.Counter(s["text"] for s in worker.sends())
        want = later | {reply_text("x1", "crash"), reply_text("x5", "t5")}
        assert texts == dict.fromkeys(want, 1)
        assert worker.handled()["x1"] == 2  # the crashed run and the replay; not the copy
    finally:
        worker.close()


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
async def test_a_message_that_always_kills_the_worker_ends_dead_when_it_came_in_fresh(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path, guarantee: str
) -> None:
    """A message whose handler kills the worker every time, produced while the worker runs:
    it is fresh, so its journal record is not awaited before its handler and its first run
    dies uncounted; at the next start it is on the log the partition was given back with,
    so it is journaled before its handler runs and that run counts. With
    ``inbox.max_attempts=1`` it is dead at the third start (in ``inbound.dlq``), not in a
    crash loop, and the chat's other messages are answered once each."""
    cat = Catalog(topic_prefix)
    ensure_topics(kafka_bootstrap, cat.specs(partitions=PARTITIONS))
    env = {
        "BOTMESH_TEST_POISON": "1",
        "BOTMESH_TEST_INBOX_ATTEMPTS": "1",
        "BOTMESH_PROCESSING_GUARANTEE": guarantee,
    }
    worker = Worker(kafka_bootstrap, topic_prefix, tmp_path, env=env)
    try:
        child = worker.start()
        await produce_inbound(
            kafka_bootstrap, cat.inbound, [Inbound(id="y0", chat_id="c1", text="t0")]
        )
        await wait_for(
            "the first reply", lambda: worker.handled()["y0"] == 1 and worker.sends(), worker
        )
        messages = [Inbound(id="y1", chat_id="c1", text="poison")]
        messages += [Inbound(id=f"y{i}", chat_id="c1", text=f"t{i}") for i in range(2, 5)]
        await produce_inbound(kafka_bootstrap, cat.inbound, messages)
        await died(child, "the poison did not kill the worker")
        child = worker.start()
        await died(child, "the poison did not kill the restarted worker")
        assert worker.handled()["y1"] == 2
        worker.start()
        await wait_for(
            "the poison's dead letter",
            lambda: (
                [d["headers"].get("inbound.id") for d in dlq_list(worker, "--kind", "inbound")]
                == ["y1"]
            ),
            worker,
        )
        later = {reply_text(f"y{i}", f"t{i}") for i in range(2, 5)}
        await wait_for(
            "the chat's other replies", lambda: later <= {s["text"] for s in worker.sends()}, worker
        )
        assert worker.stop() == 0
        texts = collections.Counter(s["text"] for s in worker.sends())
        assert texts == dict.fromkeys(later | {reply_text("y0", "t0")}, 1)
        assert worker.handled()["y1"] == 2  # the fresh run (uncounted) and the counted one
    finally:
        worker.close()


async def test_botmesh_flows_drop_and_restart_a_chats_flow_through_its_owner(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path, recorder: Recorder
) -> None:
    """``botmesh flows drop|restart --chat-id`` on a real worker running a persistent flow:
    the chat's owner ends it (the chat's next message goes to the handlers) or starts it
    again from its first question; an unknown chat is refused, naming why."""
    ensure_topics(kafka_bootstrap, Catalog(topic_prefix).specs(partitions=PARTITIONS))
    w = Worker(
        kafka_bootstrap,
        topic_prefix,
        tmp_path,
        recorder=recorder.url,
        provider="tests.kafka.flow_bot:provider",
        app="tests.kafka.flow_bot:bot",
    )
    w.start()
    inbound = Catalog(topic_prefix).inbound

    def texts() -> list[str]:
        return [c.text for c in recorder.calls() if c.chat_id == "f1"]

    try:
        await produce_inbound(
            kafka_bootstrap, inbound, [Inbound(id="s", chat_id="f1", text="/start")]
        )
        await wait_for("the first question", lambda: texts() == ["q1?"], w)
        dropped = botmesh(w, "flows", "drop", "--chat-id", "f1", "--json")
        assert dropped.returncode == 0, dropped.stdout + dropped.stderr
        [result] = json.loads(dropped.stdout)["results"]
        assert (result["outcome"], result["state"]) == ("done", "dropped")
        await produce_inbound(
            kafka_bootstrap, inbound, [Inbound(id="x", chat_id="f1", text="a1-f1")]
        )
        await wait_for("the handlers' reply", lambda: len(texts()) == 2, w)
        assert texts()[1] == "unexpected a1-f1"  # not an answer: the flow is gone

        restarted = botmesh(w, "flows", "restart", "--chat-id", "f1", "--json")
        assert restarted.returncode == 0, restarted.stdout + restarted.stderr
        await wait_for("the first question again", lambda: texts()[2:] == ["q1?"], w)

        unknown = botmesh(w, "flows", "drop", "--chat-id", "nobody")
        assert unknown.returncode == 1, unknown.stdout + unknown.stderr
        assert "no flow checkpoint for this chat" in unknown.stdout
    finally:
        w.close()

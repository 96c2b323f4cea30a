"""``botmesh console`` against a real broker and a real ``botmesh worker`` (the test bot,
its sends recorded by the ``Recorder``, the one fake: a channel's API): the overview lists
the worker with its partitions, a chat's timeline shows its inbound and its reply ``sent``
with the receipt, a dead-lettered send is listed and retried through the page (a token, a
dry run, a confirmation, the session's CSRF token) and sent once, with the owner's answer
shown; without the token or with a wrong CSRF token the action is refused and nothing
moves; read-only has no action buttons and refuses posts; texts are hidden unless asked
for; a replay's plan shows the offsets and the refusal a live group earns.

Every wait ends as soon as its condition holds; the time limits are hang guards only."""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from botmesh import Inbound
from botmesh.streams.ops.tools import end_offsets, produce_inbound
from botmesh.streams.provision import ensure_topics
from botmesh.topics import Catalog
from tests.kafka.bot import reply_text
from tests.kafka.console import WHO, start_console
from tests.kafka.recorder import Recorder
from tests.kafka.worker import PARTITIONS, WAIT_S, Worker

pytestmark = pytest.mark.kafka


@pytest.fixture
def worker(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path, recorder: Recorder
) -> Iterator[Worker]:
    ensure_topics(kafka_bootstrap, Catalog(topic_prefix).specs(partitions=PARTITIONS))
    env = {
        "BOTMESH_TEST_OUTBOX_INLINE": "0.5ms",
        "BOTMESH_TEST_OUTBOX_RETRIES": "2",
        "BOTMESH_METRICS_INTERVAL": "1",
    }
    (tmp_path / "worker").mkdir()
    w = Worker(kafka_bootstrap, topic_prefix, tmp_path / "worker", env=env, recorder=recorder.url)
    yield w
    w.close()


async def wait_for(what: str, check: object, worker: Worker) -> None:
    assert callable(check)
    deadline = time.monotonic() + WAIT_S
    while not check():
        worker.check_alive()
        assert time.monotonic() < deadline, f"still waiting for {what}"
        await asyncio.sleep(0.2)


async def test_the_console_shows_the_worker_a_timeline_and_retries_a_dead_send_once(
    worker: Worker, recorder: Recorder, tmp_path: Path
) -> None:
    cat = Catalog(worker.prefix)
    ok, bad = reply_text("m-ok", "hello there"), reply_text("m-bad", "t")
    recorder.refuse(bad)
    await produce_inbound(
        worker.bootstrap,
        cat.inbound,
        [
            Inbound(id="m-ok", chat_id="c1", text="hello there"),
            Inbound(id="m-bad", chat_id="c2", text="t"),
        ],
    )
    worker.start()
    await wait_for("the reply", lambda: ok in {c.text for c in recorder.calls()}, worker)
    [call] = [c for c in recorder.calls() if c.text == ok]

    with start_console(worker.bootstrap, worker.prefix, tmp_path / "console") as console:
        # the overview: the worker, its four partitions, ready; the lag of each partition
        page = await asyncio.to_thread(
            console.wait_for,
            "/",
            f'data-testid="worker-row" data-instance="{worker.instance_id}"',
            '<td data-testid="worker-partitions" title=',
            'data-status="ready"',
        )
        assert ">0, 1, 2, 3</td>" in page
        for p in range(PARTITIONS):
            assert f'data-testid="lag-cell" data-topic="inbound" data-partition="{p}"' in page
        assert 'data-testid="ambiguous-count">0<' in page
        assert 'data-testid="parked-count" data-tier="1s"' in page
        assert 'data-testid="counters-chart"' in page

        # a chat's timeline: the inbound, its reply sent, the provider's id, the receipt;
        # the texts hidden
        timeline = await asyncio.to_thread(
            console.wait_for,
            "/timeline?chat_id=c1",
            'data-kind="inbound" data-id="m-ok" data-state="done"',
            'data-kind="send" data-key="m-ok:1" data-state="sent"',
            'data-testid="send-receipt" data-state="sent"',
        )
        assert f'data-testid="send-message-id">{call.message_id}<' in timeline
        assert "hello there" not in timeline
        assert "hidden (11 chars)" in timeline  # the inbound's text
        assert f"hidden ({len(ok)} chars)" in timeline  # the reply's

        # the dead send is listed; signed out, no action button
        row = 'data-testid="dlq-row" data-kind="outbox" data-key="m-bad:1"'
        listed = await asyncio.to_thread(console.wait_for, "/dead-letters", row)
        assert 'data-reason="send-refused"' in listed
        assert "dlq-action-" not in listed

        # refused: no token, a wrong CSRF token; nothing reaches the control topic
        before = await end_offsets(worker.bootstrap, cat.control)
        calls = len(recorder.calls())
        action = {"command": "retry", "key": "m-bad:1", "confirm": "yes"}
        status, html = await asyncio.to_thread(console.post, "/dead-letters/action", action)
        assert status == 401 and 'data-testid="action-refused"' in html
        browser = await asyncio.to_thread(console.signed_in)
        status, html = await asyncio.to_thread(
            browser.post, "/dead-letters/action", {**action, "csrf": "not-the-sessions"}
        )
        assert status == 403 and "CSRF token" in html
        assert await end_offsets(worker.bootstrap, cat.control) == before
        assert len(recorder.calls()) == calls

        # the retry through the page: a dry run, then the confirmation; the owner's answer
        recorder.allow(bad)
        _, listed = await asyncio.to_thread(browser.get, "/dead-letters?kind=outbox")
        assert 'data-testid="dlq-action-retry"' in listed
        form = {"command": "retry", "key": "m-bad:1"}
        status, dry = await asyncio.to_thread(browser.post, "/dead-letters/action", form)
        assert status == 200, dry
        assert 'data-testid="action-dry-run"' in dry and 'data-outcome="would retry"' in dry
        assert 'data-testid="action-confirm"' in dry
        assert await end_offsets(worker.bootstrap, cat.control) == before
        status, done = await asyncio.to_thread(
            browser.post, "/dead-letters/action", {**form, "confirm": "yes"}
        )
        assert status == 200, done
        assert 'data-testid="action-result"' in done
        assert 'data-target="m-bad:1" data-outcome="done"' in done
        await wait_for(
            "the retried send", lambda: bad in {c.text for c in recorder.calls()}, worker
        )
        await asyncio.to_thread(
            console.wait_for,
            "/timeline?chat_id=c2",
            'data-kind="send" data-key="m-bad:1" data-state="sent"',
        )

        # a replay's plan while the worker runs: the offsets, and the refusal
        plan = await asyncio.to_thread(
            console.wait_for, "/replay?mode=to-earliest&topic=inbound", 'data-testid="replay-move"'
        )
        assert 'data-testid="replay-refusal"' in plan and worker.instance_id in plan
        assert plan.count('data-testid="replay-move"') == PARTITIONS
    assert worker.stop() == 0
    sends = collections.Counter(c.text for c in recorder.calls())
    assert sends == {ok: 1, bad: 1}

    # who did what, in the log; the token never
    log = "\n".join(console.lines)
    assert f"console: {WHO} asks to retry the outbox dead letters matching key=m-bad:1" in log
    assert f"console: {WHO} retry: retry: 1 of 1 done [m-bad:1: done]" in log
    assert console.token is not None and console.token not in log


async def test_read_only_shows_no_action_and_texts_only_when_asked(
    worker: Worker, recorder: Recorder, tmp_path: Path
) -> None:
    cat = Catalog(worker.prefix)
    recorder.refuse(reply_text("r2", "refuse me <b>"))
    await produce_inbound(
        worker.bootstrap,
        cat.inbound,
        [
            Inbound(id="r1", chat_id="<c&1>", text="say <b>hi</b>"),
            Inbound(id="r2", chat_id="c2", text="refuse me <b>"),
        ],
    )
    worker.start()
    with start_console(
        worker.bootstrap, worker.prefix, tmp_path / "console", token=None, show_texts=True
    ) as console:
        assert any("read-only: no token was given" in line for line in console.child.lines)
        timeline = await asyncio.to_thread(
            console.wait_for,
            "/timeline?chat_id=%3Cc%261%3E",
            'data-key="r1:1" data-state="sent"',
        )
        assert 'data-chat="&lt;c&amp;1&gt;"' in timeline
        assert "say &lt;b&gt;hi&lt;/b&gt;" in timeline and "<b>hi" not in timeline
        listed = await asyncio.to_thread(
            console.wait_for, "/dead-letters", 'data-key="r2:1"', 'data-testid="readonly-banner"'
        )
        assert "dlq-action-" not in listed and "dlq-bulk-" not in listed
        assert "refuse me &lt;b&gt;" in listed  # the value, shown with --show-texts
        status, html = await asyncio.to_thread(
            console.post,
            "/dead-letters/action",
            {"command": "retry", "key": "r2:1", "confirm": "yes"},
            {"Authorization": "Bearer whatever-it-is-0123456789"},
        )
        assert status == 403 and "read-only" in html
        status, _ = await asyncio.to_thread(console.get, "/login")
        assert status == 403
    assert worker.stop() == 0
    assert [c.text for c in recorder.calls()] == [reply_text("r1", "say <b>hi</b>")]

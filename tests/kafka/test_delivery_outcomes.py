"""After the send, on a real broker with ``botmesh gateway`` and ``botmesh worker``
processes: the Graph fake (served from this test process) accepts the worker's WhatsApp
replies and then posts their status webhooks, signed with the app secret, to the gateway,
which produces them to ``<prefix>.statuses``; the worker that owns the chat joins each to
its send.

- receipts on ``<prefix>.sent`` show sent → delivered → read, in order, for a chat, and a
  status the channel posts twice changes nothing the second time;
- a reply accepted and then failed with 131047 switches to its template fallback exactly
  once, with the worker SIGKILLed right before, or right after, the journal write of the
  switch (the status is read again after the restart);
- on Telegram, an edit made by a handler whose message is replayed after a SIGKILL calls
  the channel once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from botmesh import Inbound, Receipt
from botmesh.streams.ops.tools import produce_inbound
from botmesh.streams.provision import ensure_topics
from botmesh.topics import Catalog, decode_receipt
from tests.kafka.gateway import Gateway, start_gateway
from tests.kafka.worker import PARTITIONS, WAIT_S, Worker, read_all
from tests.providers.fakes.graph import VERSION, GraphFake
from tests.providers.fakes.telegram import FakeTelegram
from tests.providers.serve import Background

pytestmark = [pytest.mark.kafka, pytest.mark.crash]

OK, FAILING = "15551230001", "15551230002"
TG_TOKEN = "123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw"


@pytest.fixture
def graph() -> Iterator[tuple[GraphFake, str]]:
    fake = GraphFake()
    fake.numbers.update({OK, FAILING})
    fake.fail_after_accept[FAILING] = 131047
    with Background(fake.app()) as url:
        yield fake, url


@pytest.fixture
def gateway(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path, graph: tuple[GraphFake, str]
) -> Iterator[Gateway]:
    fake, _ = graph
    ensure_topics(kafka_bootstrap, Catalog(topic_prefix).specs(partitions=PARTITIONS))
    env = {"META_APP_SECRET": fake.app_secret, "META_VERIFY_TOKEN": "v"}
    gw = start_gateway(
        "whatsapp", env, bootstrap=kafka_bootstrap, prefix=topic_prefix, log=tmp_path / "gw.log"
    )
    fake.webhook_url = f"{gw.url}/whatsapp"
    yield gw
    gw.child.stop()


def _worker(
    bootstrap: str, prefix: str, tmp_path: Path, graph: tuple[GraphFake, str], **env: str
) -> Worker:
    fake, url = graph
    return Worker(
        bootstrap,
        prefix,
        tmp_path,
        app="tests.kafka.outcomes_bot:bot",
        provider="whatsapp",
        env={
            "WHATSAPP_ACCESS_TOKEN": fake.whatsapp_token,
            "WHATSAPP_PHONE_NUMBER_ID": fake.phone_number_id,
            "WHATSAPP_API_URL": f"{url}/{VERSION}",
            **env,
        },
    )


async def _receipts_until(
    worker: Worker, cat: Catalog, done: Callable[[list[Receipt]], bool], what: str
) -> list[Receipt]:
    """Every receipt on ``<prefix>.sent``, once ``done`` holds for them."""
    deadline = time.monotonic() + WAIT_S
    while True:
        receipts = [decode_receipt(r.value) for r in await read_all(worker.bootstrap, cat.sent)]
        if done(receipts):
            return receipts
        worker.check_alive()
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not seen in {WAIT_S}s; receipts: {receipts}")
        await asyncio.sleep(0.2)


def _story(receipts: list[Receipt], key: str) -> list[tuple[str, str | None]]:
    """The (state, delivery) of ``key``'s receipts, copies dropped, in order."""
    out: list[tuple[str, str | None]] = []
    for r in receipts:
        step = (str(r.state), None if r.delivery is None else str(r.delivery))
        if r.key == key and step not in out:
            out.append(step)
    return out


def _templates(fake: GraphFake, chat: str) -> list[str]:
    return [
        a.body["template"]["name"]
        for a in list(fake.accepted["whatsapp"])
        if a.chat_id == chat and a.body["type"] == "template"
    ]


@pytest.mark.usefixtures("gateway")
async def test_receipts_go_sent_delivered_read_and_a_failure_falls_back_once(
    kafka_bootstrap: str,
    topic_prefix: str,
    tmp_path: Path,
    graph: tuple[GraphFake, str],
) -> None:
    fake, _ = graph
    fake.status_copies = 2  # every status webhook posted twice: the channel retrying
    cat = Catalog(topic_prefix)
    worker = _worker(kafka_bootstrap, topic_prefix, tmp_path, graph)
    await produce_inbound(
        kafka_bootstrap,
        cat.inbound,
        [
            Inbound(id="in-ok", chat_id=OK, text="hello"),
            Inbound(id="in-failing", chat_id=FAILING, text="where is my order"),
        ],
    )
    worker.start()
    try:
        receipts = await _receipts_until(
            worker,
            cat,
            lambda rs: (
                ("sent", "read") in _story(rs, "in-ok:1")
                and ("sent", "read") in _story(rs, "in-failing:1~fallback")
            ),
            "the reply read, and the fallback read",
        )
    finally:
        assert worker.stop() == 0
    # each status went out twice: the second copy changed nothing (one receipt a change)
    assert [(r.state, r.delivery) for r in receipts if r.key == "in-ok:1"] == [
        ("sent", None),
        ("sent", "delivered"),
        ("sent", "read"),
    ]
    failed = [r for r in receipts if r.key == "in-failing:1" and r.delivery == "failed"]
    assert len(failed) == 1
    assert failed[0].fallback_key == "in-failing:1~fallback"
    assert failed[0].delivery_code == "131047"
    assert _templates(fake, FAILING) == ["hello_world"]
    assert [p for p in fake.posted if p[2] != 200] == []  # the gateway took every webhook


@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.usefixtures("gateway")
async def test_a_failure_after_the_200_switches_once_across_a_sigkill_at_the_switch(
    when: str,
    kafka_bootstrap: str,
    topic_prefix: str,
    tmp_path: Path,
    graph: tuple[GraphFake, str],
) -> None:
    fake, _ = graph
    cat = Catalog(topic_prefix)
    marker = tmp_path / "killed"
    worker = _worker(
        kafka_bootstrap,
        topic_prefix,
        tmp_path,
        graph,
        BOTMESH_TEST_KILL_AT_SWITCH=f"{marker}:{when}",
    )
    await produce_inbound(
        kafka_bootstrap, cat.inbound, [Inbound(id="in-1", chat_id=FAILING, text="hi")]
    )
    worker.start()
    deadline = time.monotonic() + WAIT_S
    while not marker.exists() or worker.child is None or worker.child.alive():
        if time.monotonic() > deadline:
            pytest.fail(f"the worker was not killed at the switch:\n{worker.child}")
        await asyncio.sleep(0.1)
    worker.start()  # the status was not acked: the new run reads it again
    try:
        # the template's own statuses applied: every status of the chat before them was
        # (one partition, in order), the copies of the failure among them
        receipts = await _receipts_until(
            worker,
            cat,
            lambda rs: ("sent", "read") in _story(rs, "in-1:1~fallback"),
            "the fallback sent and read",
        )
        await fake.settle()
    finally:
        assert worker.stop() == 0
    assert marker.read_text().strip() == f"{when} the switch"
    assert _templates(fake, FAILING) == ["hello_world"]
    assert [r.fallback_key for r in receipts if r.key == "in-1:1" and r.delivery == "failed"][
        :1
    ] == ["in-1:1~fallback"]


async def test_an_edit_replayed_after_a_sigkill_calls_the_channel_once(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    fake = FakeTelegram(TG_TOKEN, chats=("1001",))
    cat = Catalog(topic_prefix)
    ensure_topics(kafka_bootstrap, cat.specs(partitions=PARTITIONS))
    marker = tmp_path / "killed"
    with Background(fake.app()) as url:
        worker = Worker(
            kafka_bootstrap,
            topic_prefix,
            tmp_path,
            app="tests.kafka.outcomes_bot:bot",
            provider="telegram",
            env={
                "TELEGRAM_BOT_TOKEN": TG_TOKEN,
                "TELEGRAM_API_URL": url,
                "BOTMESH_TEST_CRASH_MARKER": str(marker),
            },
        )
        await produce_inbound(
            kafka_bootstrap,
            cat.inbound,
            [
                Inbound(id="go-1", chat_id="1001", text="go"),
                Inbound(id="done-1", chat_id="1001", text="done"),
            ],
        )
        worker.start()
        deadline = time.monotonic() + WAIT_S
        while not marker.exists() or worker.child is None or worker.child.alive():
            if time.monotonic() > deadline:
                pytest.fail("the worker was not killed after the edit")
            await asyncio.sleep(0.1)
        worker.start()
        try:
            await _receipts_until(
                worker,
                cat,
                lambda rs: any(r.key == "done-1:1" and r.state == "sent" for r in rs),
                "the edit's receipt",
            )
            deadline = time.monotonic() + WAIT_S
            while worker.handled()["done-1"] < 2:  # the replay of "done" ran its handler
                worker.check_alive()
                if time.monotonic() > deadline:
                    pytest.fail(f"'done' was not replayed: {worker.handled()}")
                await asyncio.sleep(0.1)
        finally:
            assert worker.stop() == 0
    assert fake.calls.count("editMessageText") == 1
    assert fake.calls.count("sendMessage") == 1
    assert [m.text for m in fake.messages] == ["done"]
    assert ("1001", "typing") in fake.actions

"""A send's fallback on a real worker: ``botmesh worker`` (a subprocess) on the real WhatsApp
adapter, talking to the local Graph fake served from this test process. A chat whose 24-hour
window is closed gets the approved template, once, and its receipt on ``<prefix>.sent``
carries ``fallback_key``; a chat whose window is open gets the text and a receipt without
it. The worker is then stopped and started again: the journal answers, nothing is sent
twice."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from botmesh import Inbound
from botmesh.streams.ops.tools import end_offsets, produce_inbound
from botmesh.streams.provision import ensure_topics
from botmesh.topics import Catalog
from tests.kafka.worker import PARTITIONS, Worker, collect
from tests.providers.fakes.graph import VERSION, GraphFake
from tests.providers.serve import Background

pytestmark = pytest.mark.kafka

CLOSED, OPEN = "15551230001", "15551230002"


@pytest.fixture
def graph() -> Iterator[tuple[GraphFake, str]]:
    fake = GraphFake()
    fake.closed_windows.add(CLOSED)
    with Background(fake.app()) as url:
        yield fake, url


@pytest.fixture
def worker(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path, graph: tuple[GraphFake, str]
) -> Iterator[Worker]:
    fake, url = graph
    ensure_topics(kafka_bootstrap, Catalog(topic_prefix).specs(partitions=PARTITIONS))
    w = Worker(
        kafka_bootstrap,
        topic_prefix,
        tmp_path,
        app="tests.kafka.fallback_bot:bot",
        provider="whatsapp",
        env={
            "WHATSAPP_ACCESS_TOKEN": fake.whatsapp_token,
            "WHATSAPP_PHONE_NUMBER_ID": fake.phone_number_id,
            "WHATSAPP_API_URL": f"{url}/{VERSION}",
        },
    )
    yield w
    w.close()


async def test_a_closed_window_gets_the_template_once_with_its_receipt(
    worker: Worker, graph: tuple[GraphFake, str]
) -> None:
    fake, _ = graph
    cat = Catalog(worker.prefix)
    start = await end_offsets(worker.bootstrap, cat.sent)
    records = [
        Inbound(id="in-closed", chat_id=CLOSED, text="where is my order"),
        Inbound(id="in-open", chat_id=OPEN, text="hello"),
    ]
    await produce_inbound(worker.bootstrap, cat.inbound, records)
    worker.start()
    seen = await collect(worker, cat.sent, start, {"in-closed", "in-open"})
    assert worker.stop() == 0
    receipts = {s.receipt.inbound_id: s.receipt for s in seen}
    closed, opened = receipts["in-closed"], receipts["in-open"]
    assert closed.state == "sent" and closed.fallback_key == "in-closed:1~fallback"
    assert opened.state == "sent" and opened.fallback_key is None
    bodies = worker_bodies(fake)
    assert bodies == {CLOSED: ["template:hello_world"], OPEN: ["text:re: hello"]}
    assert closed.message_id == next(a.id for a in fake.accepted["whatsapp"] if a.chat_id == CLOSED)

    # the same records again (a producer's retry), then one new message per chat: by the time
    # the new ones are answered, the copies before them on their partitions were handled,
    # answered from the journal, and nothing went out twice
    after = [
        Inbound(id="in-closed-2", chat_id=CLOSED, text="anyone?"),
        Inbound(id="in-open-2", chat_id=OPEN, text="thanks"),
    ]
    again = await end_offsets(worker.bootstrap, cat.sent)
    await produce_inbound(worker.bootstrap, cat.inbound, [*records, *after])
    worker.start()
    await collect(worker, cat.sent, again, {"in-closed-2", "in-open-2"})
    assert worker.stop() == 0
    assert worker_bodies(fake) == {
        CLOSED: ["template:hello_world", "template:hello_world"],
        OPEN: ["text:re: hello", "text:re: thanks"],
    }


def worker_bodies(fake: GraphFake) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for a in list(fake.accepted["whatsapp"]):
        kind = a.body["type"]
        what = a.body["template"]["name"] if kind == "template" else a.body["text"]["body"]
        out.setdefault(a.chat_id, []).append(f"{kind}:{what}")
    return out

"""End to end on each channel: a webhook signed as the channel signs it reaches ``botmesh
gateway`` (a real process), lands on ``<prefix>.inbound``, a real ``botmesh worker`` runs
``tests/kafka/channel_bot.py`` on the channel's real adapter, and the reply arrives at a
local fake of the channel's HTTP API (served from this test process, outside the worker).

Per channel, three messages: one with media, during which the worker is SIGKILLed after
downloading it and before replying (the replay rebuilds the media from the journal's
reference and downloads it again: the reply carries the bytes' size and digest); one during
which the worker is SIGKILLed after its reply went out (the replay answers from the outbox);
one plain, delivered three times by the "channel" (a webhook retry) and produced once. At
the end the fake holds exactly one reply per message, each with a receipt on
``<prefix>.sent``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from providers.webhooks import hmac_hex
from streams.provision import ensure_topics
from streams.tools import end_offsets
from tests.kafka.worker import PARTITIONS, WAIT_S, Worker, collect, read_all
from tests.kill import Child, python
from tests.providers.fakes.graph import GraphFake
from tests.providers.fakes.telegram import FakeTelegram
from tests.providers.serve import Background
from topics import Catalog

pytestmark = [pytest.mark.kafka, pytest.mark.crash]

PHOTO = bytes(range(256)) * 40  # 10,240 bytes the channel stores and serves back
DIGEST = f"[{len(PHOTO)} bytes {hashlib.sha256(PHOTO).hexdigest()[:8]}]"


@dataclass
class Case:
    """One channel as the test drives it."""

    name: str
    app: web.Application
    #: Worker environment (credentials, the fake's URL) given the fake's base URL.
    worker_env: Callable[[str], dict[str, str]]
    gateway_env: dict[str, str]
    #: ``(n, chat, text, with_media) -> (headers, body)`` of the webhook for message n.
    webhook: Callable[[int, str, str, bool], tuple[dict[str, str], bytes]]
    #: ``chat -> [reply texts]`` as the fake recorded them.
    replies: Callable[[], dict[str, list[str]]]
    chat: str
    #: The inbound ids the three messages get (as the channel's adapter names them).
    ids: list[str] = field(default_factory=list)


# -- Telegram ------------------------------------------------------------------------------

TG_TOKEN = "123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw"
TG_SECRET = "e2e-webhook-secret"


def telegram() -> Case:
    fake = FakeTelegram(TG_TOKEN, chats=("1001",))
    file_id = fake.add_file(PHOTO, "image/jpeg")

    def webhook(n: int, chat: str, text: str, media: bool) -> tuple[dict[str, str], bytes]:
        message: dict[str, Any] = {
            "message_id": n,
            "date": int(time.time()),
            "chat": {"id": int(chat), "type": "private"},
            "from": {"id": int(chat), "is_bot": False, "first_name": "Ann"},
        }
        if media:
            message["photo"] = [{"file_id": file_id, "file_unique_id": "U1", "width": 9}]
            message["caption"] = text
        else:
            message["text"] = text
        body = json.dumps({"update_id": 500 + n, "message": message}).encode()
        return {"X-Telegram-Bot-Api-Secret-Token": TG_SECRET}, body

    def replies() -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for m in fake.messages:
            out.setdefault(m.chat_id, []).append(m.text or m.caption or "")
        return out

    return Case(
        name="telegram",
        app=fake.app(),
        worker_env=lambda url: {
            "TELEGRAM_BOT_TOKEN": TG_TOKEN,
            "TELEGRAM_API_URL": url,
            "TELEGRAM_ALLOW_PRIVATE_MEDIA": "1",
        },
        gateway_env={"TELEGRAM_WEBHOOK_SECRET": TG_SECRET},
        webhook=webhook,
        replies=replies,
        chat="1001",
        ids=["tg:1001:1", "tg:1001:2", "tg:1001:3"],
    )


# -- WhatsApp, Messenger (the Graph API) ----------------------------------------------------

META_SECRET = "e2e-meta-app-secret"


def _meta_headers(body: bytes) -> dict[str, str]:
    return {
        "Content-Type": "application/json",
        "X-Hub-Signature-256": "sha256=" + hmac_hex(META_SECRET, body),
    }


def whatsapp() -> Case:
    fake = GraphFake()
    media_id = fake.add_media(PHOTO, "image/jpeg")
    chat = "15551230001"

    def webhook(n: int, chat: str, text: str, media: bool) -> tuple[dict[str, str], bytes]:
        msg: dict[str, Any] = {
            "from": chat,
            "id": f"wamid.E2E{n}",
            "timestamp": str(int(time.time())),
        }
        if media:
            msg.update(
                type="image",
                image={
                    "id": media_id,
                    "mime_type": "image/jpeg",
                    "sha256": hashlib.sha256(PHOTO).hexdigest(),
                    "caption": text,
                },
            )
        else:
            msg.update(type="text", text={"body": text})
        body = json.dumps(
            {
                "object": "whatsapp_business_account",
                "entry": [
                    {
                        "id": "1",
                        "changes": [
                            {
                                "field": "messages",
                                "value": {
                                    "messaging_product": "whatsapp",
                                    "metadata": {
                                        "display_phone_number": "1555",
                                        "phone_number_id": fake.phone_number_id,
                                    },
                                    "contacts": [{"profile": {"name": "Ann"}, "wa_id": chat}],
                                    "messages": [msg],
                                },
                            }
                        ],
                    }
                ],
            }
        ).encode()
        return _meta_headers(body), body

    return Case(
        name="whatsapp",
        app=fake.app(),
        worker_env=lambda url: {
            "WHATSAPP_ACCESS_TOKEN": fake.whatsapp_token,
            "WHATSAPP_PHONE_NUMBER_ID": fake.phone_number_id,
            "WHATSAPP_API_URL": url + "/v21.0",
            "WHATSAPP_ALLOW_PRIVATE_MEDIA": "1",
        },
        gateway_env={"META_APP_SECRET": META_SECRET, "META_VERIFY_TOKEN": "v"},
        webhook=webhook,
        replies=lambda: fake.texts("whatsapp"),
        chat=chat,
        ids=["wamid.E2E1", "wamid.E2E2", "wamid.E2E3"],
    )


def messenger() -> Case:
    fake = GraphFake()
    fake.cdn["photo.jpg"] = PHOTO
    chat = "24000000000000001"
    holder: dict[str, str] = {}

    def webhook(n: int, chat: str, text: str, media: bool) -> tuple[dict[str, str], bytes]:
        message: dict[str, Any] = {"mid": f"m_E2E{n}"}
        if media:
            message["attachments"] = [
                {"type": "image", "payload": {"url": holder["url"] + "/cdn/photo.jpg"}}
            ]
            message["text"] = text
        else:
            message["text"] = text
        body = json.dumps(
            {
                "object": "page",
                "entry": [
                    {
                        "id": "1",
                        "time": 1,
                        "messaging": [
                            {
                                "sender": {"id": chat},
                                "recipient": {"id": "1"},
                                "timestamp": int(time.time() * 1000),
                                "message": message,
                            }
                        ],
                    }
                ],
            }
        ).encode()
        return _meta_headers(body), body

    def env(url: str) -> dict[str, str]:
        holder["url"] = url
        return {
            "MESSENGER_PAGE_TOKEN": fake.page_token,
            "MESSENGER_API_URL": url + "/v21.0",
            "MESSENGER_ALLOW_PRIVATE_MEDIA": "1",
            "MESSENGER_MEDIA_REF_HOSTS": "127.0.0.1",
        }

    return Case(
        name="messenger",
        app=fake.app(),
        worker_env=env,
        gateway_env={"META_APP_SECRET": META_SECRET, "META_VERIFY_TOKEN": "v"},
        webhook=webhook,
        replies=lambda: fake.texts("messenger"),
        chat=chat,
        ids=["m_E2E1", "m_E2E2", "m_E2E3"],
    )


CASES: dict[str, Callable[[], Case]] = {
    "telegram": telegram,
    "whatsapp": whatsapp,
    "messenger": messenger,
}


# -- the gateway process ---------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Gateway:
    child: Child
    url: str

    def post(self, path: str, headers: dict[str, str], body: bytes) -> int:
        req = urllib.request.Request(self.url + path, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/readyz", timeout=5) as resp:
                return int(resp.status) == 200
        except (urllib.error.URLError, OSError):
            return False


@pytest.fixture
def gateway_for(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> Iterator[Callable[[Case], Gateway]]:
    started: list[Child] = []

    def start(case: Case) -> Gateway:
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        argv = python(
            "-m",
            "botmesh",
            "gateway",
            "--channel",
            case.name,
            "--port",
            str(port),
            "--public-url",
            url,
            "--bootstrap",
            kafka_bootstrap,
            "--prefix",
            topic_prefix,
            "--loglevel",
            "warning",
        )
        child = Child(argv, env=case.gateway_env, log=tmp_path / "gateway.log").start()
        started.append(child)
        gw = Gateway(child, url)
        deadline = time.monotonic() + WAIT_S
        while not gw.ready():
            if not child.alive():
                pytest.fail(f"the gateway exited:\n{child.tail(40)}")
            if time.monotonic() > deadline:
                pytest.fail(f"the gateway never became ready:\n{child.tail(40)}")
            time.sleep(0.1)
        return gw

    yield start
    for child in started:
        child.stop()


def _wait_dead(worker: Worker) -> None:
    child = worker.child
    assert child is not None
    deadline = time.monotonic() + WAIT_S
    while child.alive():
        if time.monotonic() > deadline:
            pytest.fail(f"the worker was not killed by its handler:\n{child.tail(40)}")
        time.sleep(0.05)


@pytest.mark.parametrize("channel", sorted(CASES))
async def test_a_webhook_in_a_reply_out_and_a_sigkill_replay_sends_nothing_twice(
    channel: str,
    kafka_bootstrap: str,
    topic_prefix: str,
    tmp_path: Path,
    gateway_for: Callable[[Case], Gateway],
) -> None:
    case = CASES[channel]()
    catalog = Catalog(topic_prefix)
    ensure_topics(kafka_bootstrap, catalog.specs(partitions=PARTITIONS))
    start = await end_offsets(kafka_bootstrap, catalog.sent)
    with Background(case.app) as api:
        env = {**case.worker_env(api), "BOTMESH_TEST_CRASH_MARKER": str(tmp_path / "crash")}
        worker = Worker(
            kafka_bootstrap,
            topic_prefix,
            tmp_path,
            env=env,
            provider=channel,
            app="tests.kafka.channel_bot:bot",
        )
        worker.start()
        try:
            gw = await asyncio.to_thread(gateway_for, case)
            path = f"/{channel}"
            messages = [(1, "crash-before 1", True), (2, "crash-after 2", False)]
            for n, text, media in messages:  # each kills the worker once; restart it
                headers, body = case.webhook(n, case.chat, text, media)
                assert await asyncio.to_thread(gw.post, path, headers, body) == 200
                await asyncio.to_thread(_wait_dead, worker)
                worker.start()
            headers, body = case.webhook(3, case.chat, "plain 3", False)
            for _ in range(3):  # the channel retries a webhook: produced once
                assert await asyncio.to_thread(gw.post, path, headers, body) == 200
            seen = await collect(worker, catalog.sent, start, set(case.ids))
        finally:
            worker.close()
        replies = case.replies()
        inbound = await read_all(kafka_bootstrap, catalog.inbound)

    assert sorted(replies) == [case.chat]
    assert sorted(replies[case.chat]) == sorted(
        [f"echo crash-before 1 {DIGEST}", "echo crash-after 2", "echo plain 3"]
    ), "one reply per message, none twice; the replayed media downloaded intact"
    assert len(inbound) == 3, "the retried webhook was produced once"
    assert {s.receipt.inbound_id for s in seen} >= set(case.ids)
    runs = [line.split() for line in worker.handled_file.read_text().splitlines()]
    first = [how for rid, how in runs if rid == case.ids[0]]
    assert first[:2] == ["live", "rebuilt"], f"the media's runs: {first}"

"""End to end on each channel: a webhook signed as the channel signs it reaches ``botmesh
gateway`` (a real process), lands on ``<prefix>.inbound``, a real ``botmesh worker`` runs
``tests/kafka/channel_bot.py`` on the channel's real adapter, and the reply arrives at a
local fake of the channel's API (served from this test process, outside the worker: an
aiohttp app, or for email the aiosmtpd server the reply is mailed to).

Per channel, three messages: one with media, during which the worker is SIGKILLed after
downloading it and before replying (the replay rebuilds the media from the journal's
reference and downloads it again: the reply carries the bytes' size and digest); one during
which the worker is SIGKILLed after its reply went out (the replay answers from the outbox);
one plain, delivered three times by the "channel" (a webhook retry) and produced once. At
the end the fake holds exactly one reply per message, each with a receipt on
``<prefix>.sent``, and the journal holds the media's reference, never its bytes.

The channels: Telegram (a message with a photo's ``file_id``), WhatsApp (a media id),
Messenger and Instagram (a CDN URL), Discord (Interactions signed with Ed25519: a slash
command with an attachment option, a button, a modal), Twilio (a form signed with
``X-Twilio-Signature`` over the gateway's public URL, ``MediaUrl0`` on the API) and email
(the raw message signed with ``x-botmesh-signature``, the reply by SMTP). Email has no IMAP:
the attachment's bytes travel in the live record only, the journal keeps its Message-ID,
index and digest, so the replay cannot download it again (``rehydrate-failed``). The
WhatsApp Web bridges: Baileys (the bridge inlines the photo for the live run; the replay
finds the bridge without it and decrypts it from the CDN with the journaled media key),
Evolution (a webhook signed with its ``jwt_key`` JWT; the replay asks for the media by its
key) and WPPConnect (the secret in the webhook URL; the media by its message id). Gupshup
(an unsigned callback, the secret in its URL; the photo a URL on its file manager, fetched
with the API key), GoHighLevel (Ed25519 ``X-GHL-Signature``; a public attachment URL) and
TikTok (``TikTok-Signature`` HMAC; an image with no caption, found again on the replay by its
conversation and message ids).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from email.message import EmailMessage
from email.utils import format_datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from botmesh.providers.tiktok import tiktok_signature
from botmesh.providers.twilio import twilio_signature
from botmesh.providers.webhooks import hmac_hex
from botmesh.streams.ops.tools import end_offsets
from botmesh.streams.provision import ensure_topics
from botmesh.topics import Catalog
from tests.kafka.channel_bot import bot
from tests.kafka.gateway import Gateway, start_gateway
from tests.kafka.worker import PARTITIONS, WAIT_S, Worker, collect, read_all, read_journal
from tests.providers.fakes.baileys import FakeBaileys
from tests.providers.fakes.baileys import message as baileys_message
from tests.providers.fakes.baileys import upsert as baileys_upsert
from tests.providers.fakes.discord import FakeDiscord
from tests.providers.fakes.evolution import FakeEvolution, jwt_for, received
from tests.providers.fakes.evolution import upsert as evolution_upsert
from tests.providers.fakes.gohighlevel import FakeHighLevel
from tests.providers.fakes.graph import GraphFake
from tests.providers.fakes.gupshup import FakeGupshup
from tests.providers.fakes.smtp import FakeSmtp
from tests.providers.fakes.telegram import FakeTelegram
from tests.providers.fakes.tiktok import BASE as TIKTOK_BASE
from tests.providers.fakes.tiktok import FakeTikTok
from tests.providers.fakes.twilio import FakeTwilio
from tests.providers.fakes.wppconnect import FakeWppConnect, onmessage
from tests.providers.serve import Background

pytestmark = [pytest.mark.kafka, pytest.mark.crash]

PHOTO = bytes(range(256)) * 40  # 10,240 bytes the channel stores and serves back
DIGEST = f"[{len(PHOTO)} bytes {hashlib.sha256(PHOTO).hexdigest()[:8]}]"
#: The texts of the three messages (the bot crashes on the first two, once each).
TEXTS = ("crash-before 1", "crash-after 2", "plain 3")

#: ``(n, chat, text, with_media, url) -> (headers, body)``: the webhook of message ``n``,
#: to be posted to ``url`` (the gateway's public URL of the channel's path).
Webhook = Callable[[int, str, str, bool, str], tuple[dict[str, str], bytes]]


@dataclass
class Case:
    """One channel as the test drives it."""

    name: str
    #: The fake of the channel's API; entered (once), it gives its base URL.
    fake: AbstractContextManager[str]
    #: Worker environment (credentials, the fake's URL) given the fake's base URL.
    worker_env: Callable[[str], dict[str, str]]
    gateway_env: dict[str, str]
    webhook: Webhook
    #: ``chat -> [reply texts]`` as the fake recorded them.
    replies: Callable[[], dict[str, list[str]]]
    chat: str
    #: The inbound ids the three messages get (as the channel's adapter names them).
    ids: list[str]
    #: The ``data`` of the media reference the journal must hold for message 1.
    ref: Callable[[], dict[str, Any]]
    #: The texts of the three messages, as the adapter gives them to the bot.
    texts: tuple[str, str, str] = TEXTS
    #: What the reply to message 1 says of its media once the replay ran.
    media_after_replay: str = DIGEST
    #: Further checks of what the fake recorded, after the run.
    check: Callable[[], None] = lambda: None
    #: The query of the webhook URL (a channel that puts its secret there).
    query: str = ""

    def expected(self) -> list[str]:
        first, second, third = self.texts
        return [f"echo {first} {self.media_after_replay}", f"echo {second}", f"echo {third}"]


def _served(fake: Any) -> AbstractContextManager[str]:
    """An aiohttp fake served from a thread of this process (``fake.app()``)."""
    return Background(fake.app())


# -- Telegram ------------------------------------------------------------------------------

TG_TOKEN = "123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw"
TG_SECRET = "e2e-webhook-secret"


def telegram() -> Case:
    fake = FakeTelegram(TG_TOKEN, chats=("1001",))
    file_id = fake.add_file(PHOTO, "image/jpeg")

    def webhook(
        n: int, chat: str, text: str, media: bool, url: str
    ) -> tuple[dict[str, str], bytes]:
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
        fake=_served(fake),
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
        ref=lambda: {"file_id": file_id, "file_unique_id": "U1"},
    )


# -- WhatsApp, Messenger, Instagram (the Graph API) -----------------------------------------

META_SECRET = "e2e-meta-app-secret"


def _meta_headers(body: bytes, secret: str = META_SECRET) -> dict[str, str]:
    return {
        "Content-Type": "application/json",
        "X-Hub-Signature-256": "sha256=" + hmac_hex(secret, body),
    }


def whatsapp() -> Case:
    fake = GraphFake()
    media_id = fake.add_media(PHOTO, "image/jpeg")
    chat = "15551230001"

    def webhook(
        n: int, chat: str, text: str, media: bool, url: str
    ) -> tuple[dict[str, str], bytes]:
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
        fake=_served(fake),
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
        ref=lambda: {"id": media_id},
    )


def _page_messaging(
    channel: str, *, secret: str, mid: str, chat: str, text: str, media_url: str | None
) -> tuple[dict[str, str], bytes]:
    """A Messenger (``object: page``) or Instagram (``object: instagram``) message webhook."""
    message: dict[str, Any] = {"mid": mid, "text": text}
    if media_url is not None:
        message["attachments"] = [{"type": "image", "payload": {"url": media_url}}]
    body = json.dumps(
        {
            "object": "instagram" if channel == "instagram" else "page",
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
    return _meta_headers(body, secret), body


def messenger() -> Case:
    fake = GraphFake()
    fake.cdn["photo.jpg"] = PHOTO
    holder: dict[str, str] = {}

    def webhook(
        n: int, chat: str, text: str, media: bool, url: str
    ) -> tuple[dict[str, str], bytes]:
        photo = holder["url"] + "/cdn/photo.jpg" if media else None
        return _page_messaging(
            "messenger", secret=META_SECRET, mid=f"m_E2E{n}", chat=chat, text=text, media_url=photo
        )

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
        fake=_served(fake),
        worker_env=env,
        gateway_env={"META_APP_SECRET": META_SECRET, "META_VERIFY_TOKEN": "v"},
        webhook=webhook,
        replies=lambda: fake.texts("messenger"),
        chat="24000000000000001",
        ids=["m_E2E1", "m_E2E2", "m_E2E3"],
        ref=lambda: {"url": holder["url"] + "/cdn/photo.jpg"},
    )


IG_SECRET = "e2e-instagram-app-secret"


def instagram() -> Case:
    """As Messenger, with ``object: instagram``, the Instagram token and the channel's own
    app secret and verify token (``INSTAGRAM_APP_SECRET`` over ``META_APP_SECRET``)."""
    fake = GraphFake()
    fake.cdn["ig.jpg"] = PHOTO
    holder: dict[str, str] = {}

    def webhook(
        n: int, chat: str, text: str, media: bool, url: str
    ) -> tuple[dict[str, str], bytes]:
        photo = holder["url"] + "/cdn/ig.jpg" if media else None
        return _page_messaging(
            "instagram", secret=IG_SECRET, mid=f"aWdfE2E{n}", chat=chat, text=text, media_url=photo
        )

    def env(url: str) -> dict[str, str]:
        holder["url"] = url
        return {
            "INSTAGRAM_ACCESS_TOKEN": fake.instagram_token,
            "INSTAGRAM_API_URL": url + "/v21.0",
            "INSTAGRAM_ALLOW_PRIVATE_MEDIA": "1",
            "INSTAGRAM_MEDIA_REF_HOSTS": "127.0.0.1",
        }

    return Case(
        name="instagram",
        fake=_served(fake),
        worker_env=env,
        gateway_env={
            "INSTAGRAM_APP_SECRET": IG_SECRET,
            "INSTAGRAM_VERIFY_TOKEN": "v",
            "META_APP_SECRET": "not-the-instagram-secret",
            "META_VERIFY_TOKEN": "v",
        },
        webhook=webhook,
        replies=lambda: fake.texts("instagram"),
        chat="17841400000000001",
        ids=["aWdfE2E1", "aWdfE2E2", "aWdfE2E3"],
        ref=lambda: {"url": holder["url"] + "/cdn/ig.jpg"},
    )


# -- Discord (the Interactions Endpoint) ----------------------------------------------------

DC_TOKEN = "MTEwMDAwMDAwMDAwMDAwMDAwMQ.GhIjKl.e2e-discord-bot-token-000000000000000"
DC_CHANNEL = "2200000000000000001"
DC_APP = "1100000000000000009"
#: Discord's epoch (2015-01-01) in milliseconds.
DISCORD_EPOCH_MS = 1420070400000


def discord() -> Case:
    """Message 1 is the slash command ``/crash-before-1`` with an attachment option (its
    resolved attachment on the fake's CDN), message 2 a click on a button whose
    ``custom_id`` is ``crash-after-2``, message 3 the submit of the modal ``plain-3``: the
    adapter gives the command's name or the ``custom_id`` as the text (a command name has
    no spaces, hence the dashes). Signed with Ed25519 by a key made here; the bot answers
    with a channel message made by ``send_keyed`` (a nonce)."""
    fake = FakeDiscord(DC_TOKEN, channels=(DC_CHANNEL,))
    att_id, att_path = fake.add_attachment(DC_CHANNEL, PHOTO, "image/jpeg", "photo.jpg")
    key = Ed25519PrivateKey.generate()
    public = key.public_key().public_bytes_raw().hex()
    # Interaction ids are snowflakes: the time since Discord's epoch, shifted by 22 bits.
    base = (int(time.time() * 1000) - DISCORD_EPOCH_MS) << 22
    holder: dict[str, str] = {}
    user = {"id": "3300000000000000001", "username": "ann", "discriminator": "0"}

    def webhook(
        n: int, chat: str, text: str, media: bool, url: str
    ) -> tuple[dict[str, str], bytes]:
        body: dict[str, Any] = {
            "id": str(base + n),
            "application_id": DC_APP,
            "channel_id": chat,
            "channel": {"id": chat, "type": 1},
            "user": user,
            "token": f"aW50ZXJhY3Rpb246e2e-token-{n}",
            "version": 1,
            "locale": "en-US",
        }
        if n == 1:
            body["type"] = 2  # APPLICATION_COMMAND
            data: dict[str, Any] = {"id": "4400000000000000001", "name": text, "type": 1}
            if media:
                data["options"] = [{"name": "file", "type": 11, "value": att_id}]
                data["resolved"] = {
                    "attachments": {
                        att_id: {
                            "id": att_id,
                            "filename": "photo.jpg",
                            "size": len(PHOTO),
                            "content_type": "image/jpeg",
                            "url": holder["url"] + att_path,
                            "proxy_url": holder["url"] + att_path,
                        }
                    }
                }
            body["data"] = data
        elif n == 2:
            body["type"] = 3  # MESSAGE_COMPONENT: a button
            body["data"] = {"custom_id": text, "component_type": 2}
            body["message"] = {"id": "1300000000000000999", "channel_id": chat}
        else:
            body["type"] = 5  # MODAL_SUBMIT
            body["data"] = {
                "custom_id": text,
                "components": [
                    {"type": 1, "components": [{"type": 4, "custom_id": "why", "value": "hi"}]}
                ],
            }
        raw = json.dumps(body).encode()
        stamp = str(int(time.time()))
        signature = key.sign(stamp.encode() + raw).hex()
        headers = {
            "Content-Type": "application/json",
            "X-Signature-Ed25519": signature,
            "X-Signature-Timestamp": stamp,
        }
        return headers, raw

    def replies() -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for m in fake.messages:
            out.setdefault(m.channel_id, []).append(m.content)
        return out

    def check() -> None:
        # Each reply was made with a nonce (send_keyed), one per send key, Discord-sized.
        nonces = [m.nonce for m in fake.messages]
        assert all(n is not None and len(n) == 25 for n in nonces), nonces
        assert len(set(nonces)) == len(nonces), nonces
        assert all(m.payload.get("enforce_nonce") is True for m in fake.messages)

    def env(url: str) -> dict[str, str]:
        holder["url"] = url
        return {
            "DISCORD_BOT_TOKEN": DC_TOKEN,
            "DISCORD_API_URL": url + "/api/v10",
            "DISCORD_ALLOW_PRIVATE_MEDIA": "1",
            "DISCORD_MEDIA_REF_HOSTS": "127.0.0.1",
        }

    return Case(
        name="discord",
        fake=_served(fake),
        worker_env=env,
        gateway_env={"DISCORD_PUBLIC_KEY": public},
        webhook=webhook,
        replies=replies,
        chat=DC_CHANNEL,
        ids=[f"dc:{base + n}" for n in (1, 2, 3)],
        ref=lambda: {"url": holder["url"] + att_path},
        texts=("crash-before-1", "crash-after-2", "plain-3"),
        check=check,
    )


# -- Twilio ---------------------------------------------------------------------------------

TW_FROM = "+15557654321"


def twilio() -> Case:
    """An incoming SMS/MMS webhook (a form) signed with ``X-Twilio-Signature`` over the URL
    Twilio posts to (the gateway's ``--public-url`` + ``/twilio``) and the sorted form;
    the photo is ``MediaUrl0`` on the API (downloaded with basic auth)."""
    fake = FakeTwilio()
    media_path = fake.add_media(PHOTO, "image/jpeg")
    holder: dict[str, str] = {}
    sids = [f"SM{hashlib.sha256(f'e2e{n}'.encode()).hexdigest()[:32]}" for n in (1, 2, 3)]

    def webhook(
        n: int, chat: str, text: str, media: bool, url: str
    ) -> tuple[dict[str, str], bytes]:
        form = {
            "ToCountry": "US",
            "SmsMessageSid": sids[n - 1],
            "NumMedia": "1" if media else "0",
            "SmsSid": sids[n - 1],
            "SmsStatus": "received",
            "Body": text,
            "To": TW_FROM,
            "NumSegments": "1",
            "MessageSid": sids[n - 1],
            "AccountSid": fake.account_sid,
            "From": chat,
            "ApiVersion": "2010-04-01",
        }
        if media:
            form["MediaContentType0"] = "image/jpeg"
            form["MediaUrl0"] = holder["url"] + media_path
        signature = twilio_signature(fake.auth_token, url, list(form.items()))
        headers = {
            "Content-Type": "application/x-www-form-urlencoded",
            "X-Twilio-Signature": signature,
        }
        return headers, urlencode(form).encode()

    def replies() -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for m in fake.messages:
            assert m["from"] == TW_FROM
            out.setdefault(m["to"], []).append(m["body"])
        return out

    def env(url: str) -> dict[str, str]:
        holder["url"] = url
        return {
            "TWILIO_ACCOUNT_SID": fake.account_sid,
            "TWILIO_AUTH_TOKEN": fake.auth_token,
            "TWILIO_FROM": TW_FROM,
            "TWILIO_API_URL": url,
            "TWILIO_ALLOW_PRIVATE_MEDIA": "1",
            "TWILIO_MEDIA_REF_HOSTS": "127.0.0.1",
        }

    return Case(
        name="twilio",
        fake=_served(fake),
        worker_env=env,
        gateway_env={"TWILIO_AUTH_TOKEN": fake.auth_token},
        webhook=webhook,
        replies=replies,
        chat="+15551230002",
        ids=sids,
        ref=lambda: {"url": holder["url"] + media_path},
    )


# -- Email ----------------------------------------------------------------------------------

EMAIL_SECRET = "e2e-email-relay-secret"
EMAIL_BOT = "bot@botmesh.test"


@contextlib.contextmanager
def _smtp(server: FakeSmtp) -> Iterator[str]:
    with server:
        yield f"smtp://127.0.0.1:{server.port}"


def email() -> Case:
    """The relay posts the raw message (``message/rfc822``) signed with
    ``x-botmesh-signature``; the bot answers by SMTP to the local server. Message 1 has the
    photo attached: the live record carries its bytes, the journal only its Message-ID,
    index and digest, and with no IMAP to fetch it again the replay cannot download it.

    One reply to message 1 needs the inbox to rerun a done record that a replay settled
    with the journal's media, not with the live record's bytes: the SIGKILLed worker's
    offset was not committed, so the restarted worker gets message 1 again from Kafka
    after the replay answered it; with the bytes its reply differs, and
    ``outbox.on_diverged="send"`` sends that second reply under a new key."""
    server = FakeSmtp()
    chat = "ann@example.com"

    def webhook(
        n: int, chat: str, text: str, media: bool, url: str
    ) -> tuple[dict[str, str], bytes]:
        mail = EmailMessage()
        mail["From"] = f"Ann <{chat}>"
        mail["To"] = EMAIL_BOT
        mail["Subject"] = f"e2e {n}"
        mail["Date"] = format_datetime(datetime.now(UTC))
        mail["Message-ID"] = f"<e2e-{n}@example.com>"
        mail.set_content(text)
        if media:
            mail.add_attachment(PHOTO, maintype="image", subtype="jpeg", filename="photo.jpg")
        raw = mail.as_bytes()
        headers = {
            "Content-Type": "message/rfc822",
            "x-botmesh-signature": "sha256=" + hmac_hex(EMAIL_SECRET, raw),
        }
        return headers, raw

    def replies() -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for m in server.messages:
            assert m.mail_from == EMAIL_BOT
            body = m.message.get_body(preferencelist=("plain",))
            assert body is not None
            for rcpt in m.rcpt_tos:
                out.setdefault(rcpt, []).append(str(body.get_content()).strip())
        return out

    return Case(
        name="email",
        fake=_smtp(server),
        worker_env=lambda url: {"EMAIL_SMTP_URL": url, "EMAIL_FROM": EMAIL_BOT},
        gateway_env={"EMAIL_WEBHOOK_SECRET": EMAIL_SECRET},
        webhook=webhook,
        replies=replies,
        chat=chat,
        ids=["e2e-1@example.com", "e2e-2@example.com", "e2e-3@example.com"],
        ref=lambda: {
            "message_id": "e2e-1@example.com",
            "index": 0,
            "sha256": hashlib.sha256(PHOTO).hexdigest(),
        },
        media_after_replay="[media unavailable: rehydrate-failed]",
    )


# -- the WhatsApp Web bridges: Baileys, Evolution, WPPConnect -----------------------------------

WA_JID = "5511999990001@s.whatsapp.net"
WA_SECRET = "e2e-bridge-webhook-secret"


def baileys() -> Case:
    """The bridge's ``messages.upsert``, its ``webhookVerifyToken`` in the body. Message 1 is a
    photo on the fake CDN, its bytes inlined for the live run (``includeMedia``); the bridge
    has no file of it, so the replay decrypts it from the CDN with the journaled key."""
    fake = FakeBaileys()
    ids = [f"3EB0E2E{n}0000" for n in (1, 2, 3)]
    holder: dict[str, Any] = {}

    def webhook(
        n: int, chat: str, text: str, media: bool, url: str
    ) -> tuple[dict[str, str], bytes]:
        if media:
            part = fake.add_cdn_media(holder["url"], PHOTO, "image/jpeg", "image")
            holder["part"] = part
            content: dict[str, Any] = {"imageMessage": {**part, "caption": text}}
        else:
            content = {"conversation": text}
        inline = {ids[n - 1]: PHOTO} if media else None
        msg = baileys_message(ids[n - 1], chat, content)
        body = baileys_upsert([msg], WA_SECRET, inline=inline)
        return {"Content-Type": "application/json"}, body

    def ref() -> dict[str, Any]:
        part = holder["part"]
        buffers = ("mediaKey", "fileSha256", "fileEncSha256")
        media: dict[str, Any] = {
            k: base64.b64encode(bytes(part[k]["data"])).decode() for k in buffers
        }
        media.update(url=part["url"], directPath=part["directPath"], mimetype="image/jpeg")
        media["fileLength"] = len(PHOTO)
        key = {"remoteJid": WA_JID, "id": ids[0], "fromMe": False}
        return {"media": media, "key": key, "type": "image"}

    def env(url: str) -> dict[str, str]:
        holder["url"] = url
        return {
            "BAILEYS_API_URL": url,
            "BAILEYS_API_KEY": fake.api_key,
            "BAILEYS_PHONE_NUMBER": fake.phone,
            "BAILEYS_ALLOW_PRIVATE_MEDIA": "1",
            "BAILEYS_MEDIA_REF_HOSTS": "127.0.0.1",
        }

    def check() -> None:
        # a rebuilt run asked the bridge, which had no file, and decrypted the CDN's copy
        assert f"GET /media/{ids[0]}" in fake.calls and fake.cdn_downloads, fake.calls

    return Case(
        name="baileys",
        fake=_served(fake),
        worker_env=env,
        gateway_env={"BAILEYS_WEBHOOK_VERIFY_TOKEN": WA_SECRET},
        webhook=webhook,
        replies=fake.texts,
        chat=WA_JID,
        ids=ids,
        ref=ref,
        check=check,
    )


def evolution() -> Case:
    """Evolution's ``messages.upsert``, with the ``Authorization`` JWT of its ``jwt_key``;
    both runs of message 1 download the photo with ``getBase64FromMediaMessage``."""
    fake = FakeEvolution()
    ids = [f"BAE5E2E{n}" for n in (1, 2, 3)]
    fake.media[ids[0]] = (PHOTO, "image/jpeg")

    def webhook(
        n: int, chat: str, text: str, media: bool, url: str
    ) -> tuple[dict[str, str], bytes]:
        if media:
            part = {"url": "https://mmg.whatsapp.net/x.enc", "mimetype": "image/jpeg"}
            message: dict[str, Any] = {"imageMessage": {**part, "caption": text}}
        else:
            message = {"conversation": text}
        body = evolution_upsert(fake.instance, received(ids[n - 1], chat, message))
        headers = {
            "Content-Type": "application/json",
            "Authorization": f"Bearer {jwt_for(WA_SECRET)}",
        }
        return headers, body

    return Case(
        name="evolution",
        fake=_served(fake),
        worker_env=lambda url: {
            "EVOLUTION_API_URL": url,
            "EVOLUTION_API_KEY": fake.token,
            "EVOLUTION_INSTANCE": fake.instance,
        },
        gateway_env={"EVOLUTION_WEBHOOK_SECRET": WA_SECRET, "EVOLUTION_INSTANCE": fake.instance},
        webhook=webhook,
        replies=fake.texts,
        chat=WA_JID,
        ids=ids,
        ref=lambda: {"key": {"remoteJid": WA_JID, "id": ids[0], "fromMe": False}},
    )


def wppconnect() -> Case:
    """WPPConnect's ``onmessage``, the secret in the webhook URL; both runs of message 1
    download the photo with ``get-media-by-message``."""
    fake = FakeWppConnect()
    chat = "5511999990001@c.us"
    ids = [f"false_{chat}_3EB0E2E{n}" for n in (1, 2, 3)]
    fake.media[ids[0]] = (PHOTO, "image/jpeg")

    def webhook(
        n: int, chat: str, text: str, media: bool, url: str
    ) -> tuple[dict[str, str], bytes]:
        if media:
            more: dict[str, Any] = {"caption": text, "mimetype": "image/jpeg", "isMedia": True}
            body = onmessage(ids[n - 1], chat, "image", session=fake.session, **more)
        else:
            body = onmessage(ids[n - 1], chat, "chat", session=fake.session, body=text)
        return {"Content-Type": "application/json"}, body

    return Case(
        name="wppconnect",
        fake=_served(fake),
        worker_env=lambda url: {
            "WPPCONNECT_API_URL": url,
            "WPPCONNECT_TOKEN": fake.token,
            "WPPCONNECT_SESSION": fake.session,
        },
        gateway_env={"WPPCONNECT_WEBHOOK_SECRET": WA_SECRET},
        webhook=webhook,
        replies=fake.texts,
        chat=chat,
        ids=ids,
        ref=lambda: {"message_id": ids[0]},
        query=f"?secret={WA_SECRET}",
    )


# -- Gupshup, GoHighLevel, TikTok -------------------------------------------------------------

GS_SECRET = "e2e-gupshup-callback-token-0123"


def gupshup() -> Case:
    """A Gupshup app's callback (the Gupshup format, version 2), which Gupshup does not sign:
    the secret is the ``token`` of the callback URL. Message 1 is an image whose ``url`` is
    on the fake's file manager, served only with the ``apikey`` header: both runs download
    it with the key, which is never journaled (the reference is the URL alone)."""
    fake = FakeGupshup()
    media_path = fake.add_media(PHOTO, "image/jpeg")
    holder: dict[str, str] = {}
    ids = [f"ABEGkYaYVSEEAhAL3SLAWwHKeKrE2E{n}" for n in (1, 2, 3)]

    def webhook(
        n: int, chat: str, text: str, media: bool, url: str
    ) -> tuple[dict[str, str], bytes]:
        if media:
            part: dict[str, Any] = {
                "caption": text,
                "url": holder["url"] + media_path,
                "contentType": "image/jpeg",
                "urlExpiry": int(time.time() * 1000) + 86_400_000,
            }
            kind = "image"
        else:
            part, kind = {"text": text}, "text"
        body = json.dumps(
            {
                "app": fake.app_name,
                "timestamp": int(time.time() * 1000),
                "version": 2,
                "type": "message",
                "payload": {
                    "id": ids[n - 1],
                    "source": chat,
                    "type": kind,
                    "payload": part,
                    "sender": {
                        "phone": chat,
                        "name": "Ann",
                        "country_code": "91",
                        "dial_code": chat[2:],
                    },
                },
            }
        ).encode()
        return {"Content-Type": "application/json"}, body

    def replies() -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for m in fake.messages:
            assert m["message"]["type"] == "text", m
            out.setdefault(m["destination"], []).append(m["message"]["text"])
        return out

    def check() -> None:
        # every download of the photo (live and rebuilt) carried the app's key
        keys = fake.media_keys
        assert len(keys) >= 2 and set(keys) == {fake.api_key}, keys

    def env(url: str) -> dict[str, str]:
        holder["url"] = url
        return {
            "GUPSHUP_API_KEY": fake.api_key,
            "GUPSHUP_SOURCE": fake.source,
            "GUPSHUP_APP_NAME": fake.app_name,
            "GUPSHUP_API_URL": url,
            "GUPSHUP_ALLOW_PRIVATE_MEDIA": "1",
        }

    return Case(
        name="gupshup",
        fake=_served(fake),
        worker_env=env,
        gateway_env={"GUPSHUP_WEBHOOK_SECRET": GS_SECRET},
        webhook=webhook,
        replies=replies,
        chat="919876543210",
        ids=ids,
        ref=lambda: {"url": holder["url"] + media_path},
        check=check,
        query=f"?token={GS_SECRET}",
    )


def gohighlevel() -> Case:
    """HighLevel's ``InboundMessage`` webhook signed with Ed25519 over the raw body
    (``X-GHL-Signature``, base64) by a key pair made here, its public key given to the
    gateway in PEM as HighLevel publishes it. Message 1 has an attachment URL on the fake's
    storage, public as HighLevel's is; the bot answers by SMS (the default type)."""
    fake = FakeHighLevel()
    media_path = fake.add_media(PHOTO, "image/jpeg")
    key = Ed25519PrivateKey.generate()
    pem = key.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
    holder: dict[str, str] = {}
    ids = [f"tGbLJuTNFN4IFJJE2E0{n}" for n in (1, 2, 3)]

    def webhook(
        n: int, chat: str, text: str, media: bool, url: str
    ) -> tuple[dict[str, str], bytes]:
        body = json.dumps(
            {
                "type": "InboundMessage",
                "locationId": fake.location_id,
                "attachments": [holder["url"] + media_path] if media else [],
                "body": text,
                "contactId": chat,
                "contentType": "text/plain",
                "conversationId": "fcanlLgpbQgQhderivVs",
                "dateAdded": datetime.now(UTC).isoformat(timespec="milliseconds"),
                "direction": "inbound",
                "messageType": "SMS",
                "messageId": ids[n - 1],
                "status": "delivered",
            }
        ).encode()
        headers = {
            "Content-Type": "application/json",
            "X-GHL-Signature": base64.b64encode(key.sign(body)).decode(),
        }
        return headers, body

    def replies() -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for m in fake.messages:
            assert m["type"] == "SMS" and not m.get("attachments"), m
            out.setdefault(m["contactId"], []).append(m["message"])
        return out

    def env(url: str) -> dict[str, str]:
        holder["url"] = url
        return {
            "GOHIGHLEVEL_TOKEN": fake.token,
            "GOHIGHLEVEL_API_URL": url,
            "GOHIGHLEVEL_ALLOW_PRIVATE_MEDIA": "1",
        }

    [contact] = fake.contacts
    return Case(
        name="gohighlevel",
        fake=_served(fake),
        worker_env=env,
        gateway_env={"GOHIGHLEVEL_WEBHOOK_PUBLIC_KEY": pem.decode()},
        webhook=webhook,
        replies=replies,
        chat=contact,
        ids=ids,
        ref=lambda: {"url": holder["url"] + media_path},
    )


TT_SECRET = "e2e-tiktok-app-secret"


def tiktok() -> Case:
    """TikTok's ``im_receive_msg`` signed with ``TikTok-Signature`` (``t=<now>,s=<HMAC of
    "<t>.<body>" under the app secret>``). Message 1 is an image the user sent in the
    conversation: TikTok's images carry no caption, so the bot sees no text (and takes a
    text-less media message as ``crash-before``). The live run downloads it by its
    ``media_id``; the journal keeps its conversation and message ids only, so the replay
    finds the ``media_id`` again in the conversation's latest messages; both downloads
    carry the token in ``x-user``. The bot answers the conversation with a text."""
    fake = FakeTikTok()
    chat = fake.conversation()
    image_id, media_id = fake.user_message(chat, "image", PHOTO)
    ids = [image_id, "7310000000000000002", "7310000000000000003"]

    def webhook(
        n: int, chat: str, text: str, media: bool, url: str
    ) -> tuple[dict[str, str], bytes]:
        kind, part = ("image", {"media_id": media_id}) if media else ("text", {"body": text})
        content = {
            "conversation_id": chat,
            "message_id": ids[n - 1],
            "timestamp": int(time.time() * 1000),
            "type": kind,
            kind: part,
            "from": "ann",
            "from_user": {"id": fake.user_id, "role": "PERSONAL_ACCOUNT"},
            "to": "business",
            "to_user": {"id": fake.business_id, "role": "BUSINESS_ACCOUNT"},
        }
        body = json.dumps(
            {
                "client_key": "awe2e0tiktok0key",
                "event": "im_receive_msg",
                "create_time": int(time.time()),
                "user_openid": fake.business_id,
                "content": json.dumps(content),
            }
        ).encode()
        stamp = str(int(time.time()))
        headers = {
            "Content-Type": "application/json",
            "TikTok-Signature": f"t={stamp},s={tiktok_signature(TT_SECRET, stamp, body)}",
        }
        return headers, body

    def replies() -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for m in fake.sent:
            assert m["message_type"] == "TEXT", m
            out.setdefault(m["recipient"], []).append(m["text"]["body"])
        return out

    def check() -> None:
        # every download of the image (live and rebuilt) went to the fake's CDN with the token
        users = fake.cdn_users
        assert len(users) >= 2 and set(users) == {fake.token}, users

    return Case(
        name="tiktok",
        fake=_served(fake),
        worker_env=lambda url: {
            "TIKTOK_ACCESS_TOKEN": fake.token,
            "TIKTOK_BUSINESS_ID": fake.business_id,
            "TIKTOK_API_URL": url + TIKTOK_BASE,
            "TIKTOK_ALLOW_PRIVATE_MEDIA": "1",
        },
        gateway_env={"TIKTOK_APP_SECRET": TT_SECRET},
        webhook=webhook,
        replies=replies,
        chat=chat,
        ids=ids,
        ref=lambda: {"conversation_id": chat, "message_id": image_id, "index": 0, "type": "image"},
        texts=("", "crash-after 2", "plain 3"),
        check=check,
    )


CASES: dict[str, Callable[[], Case]] = {
    "telegram": telegram,
    "whatsapp": whatsapp,
    "messenger": messenger,
    "instagram": instagram,
    "discord": discord,
    "twilio": twilio,
    "email": email,
    "baileys": baileys,
    "evolution": evolution,
    "wppconnect": wppconnect,
    "gupshup": gupshup,
    "gohighlevel": gohighlevel,
    "tiktok": tiktok,
}


# -- the gateway process ---------------------------------------------------------------------


@pytest.fixture
def gateway_for(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> Iterator[Callable[[Case], Gateway]]:
    started: list[Gateway] = []

    def start(case: Case) -> Gateway:
        gw = start_gateway(
            case.name,
            case.gateway_env,
            bootstrap=kafka_bootstrap,
            prefix=topic_prefix,
            log=tmp_path / "gateway.log",
        )
        started.append(gw)
        return gw

    yield start
    for gw in started:
        gw.child.stop()


def _wait_dead(worker: Worker) -> None:
    child = worker.child
    assert child is not None
    deadline = time.monotonic() + WAIT_S
    while child.alive():
        if time.monotonic() > deadline:
            pytest.fail(f"the worker was not killed by its handler:\n{child.tail(40)}")
        time.sleep(0.05)


def _media_of(journal: dict[str, dict[str, Any]], inbound_id: str) -> dict[str, Any]:
    """The media of ``inbound_id``'s inbox record, as the journal holds it."""
    records = [v for k, v in journal.items() if k.startswith(f"{bot.scope}/in/")]
    found = [v for v in records if v.get("id") == inbound_id]
    assert len(found) == 1, f"no inbox record of {inbound_id} in {sorted(journal)}"
    media = found[0]["message"].get("media")
    assert isinstance(media, dict), found[0]
    return media


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
    with case.fake as api:
        env = {**case.worker_env(api), "BOTMESH_TEST_CRASH_MARKER": str(tmp_path / "crash")}
        worker = Worker(
            kafka_bootstrap,
            topic_prefix,
            tmp_path,
            env=env,
            provider=channel,
            app="tests.kafka.channel_bot:bot",
        )
        try:
            gw = await asyncio.to_thread(gateway_for, case)
            path = f"/{channel}{case.query}"
            first, second, third = case.texts
            for n, text, media in [(1, first, True), (2, second, False)]:
                # each kills the worker once; restart it. The first is on the log before the
                # worker is given its partition (so it is journaled before its handler runs,
                # and its run after the kill is rebuilt from the journal); the second comes
                # in fresh (journaled with its reply's claim, which its kill comes after)
                headers, body = case.webhook(n, case.chat, text, media, gw.url + path)
                assert await asyncio.to_thread(gw.post, path, headers, body) == 200
                if n == 1:
                    worker.start()
                await asyncio.to_thread(_wait_dead, worker)
                worker.start()
            headers, body = case.webhook(3, case.chat, third, False, gw.url + path)
            for _ in range(3):  # the channel retries a webhook: produced once
                assert await asyncio.to_thread(gw.post, path, headers, body) == 200
            seen = await collect(worker, catalog.sent, start, set(case.ids))
        finally:
            worker.close()
        replies = case.replies()
        case.check()
        inbound = await read_all(kafka_bootstrap, catalog.inbound)
    journal = await read_journal(worker)

    assert sorted(replies) == [case.chat]
    assert sorted(replies[case.chat]) == sorted(case.expected()), (
        f"one reply per message, none twice; the replayed media as the channel allows: {replies}"
    )
    assert len(inbound) == 3, "the retried webhook was produced once"
    assert {s.receipt.inbound_id for s in seen} >= set(case.ids)
    runs = [line.split() for line in worker.handled_file.read_text().splitlines()]
    first_runs = [how for rid, how in runs if rid == case.ids[0]]
    assert first_runs[:2] == ["live", "rebuilt"], f"the media's runs: {first_runs}"
    # The journal holds the media's durable reference, never its bytes.
    stored = _media_of(journal, case.ids[0])
    assert stored.get("ref") == {"v": 1, "data": case.ref()}, stored
    assert not {"data", "url", "id", "path"} & set(stored), stored
    dump = json.dumps(journal)
    assert base64.b64encode(PHOTO[:3000]).decode() not in dump, "the media's bytes journaled"

"""``botmesh.providers.gohighlevel`` against the local fake of HighLevel's conversations API
(``tests/providers/fakes/gohighlevel.py``), over real HTTP; its webhook on ``InboundMessage``
bodies signed with Ed25519 as HighLevel signs them; the engine's retry and replay, and the
gateway, with the real adapter."""

from __future__ import annotations

import base64
import json
import logging
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from botmesh.providers.channels import provider_from_env, webhook_from_env
from botmesh.providers.gohighlevel import GoHighLevelProvider, GoHighLevelWebhook
from botmesh.providers.webhooks import BadSignature, MalformedWebhook, WebhookRequest
from botmesh.state.errors import (
    ConfigError,
    PayloadTooLargeError,
    RateLimitedError,
    RecipientUnreachableError,
    SendError,
    UnsupportedContentError,
)
from botmesh.state.messages import Inbound, Media, Outbound
from botmesh.state.ports import AmbiguityResolver, KeyedSends, MediaDownloads, MediaRefs, Provider
from botmesh.topics.records import chat_key
from tests.kafka.conftest import kafka_bootstrap, topic_prefix
from tests.providers.channel_paths import post_through_gateway, replay_media, send_through_engine
from tests.providers.fakes.gohighlevel import FakeHighLevel
from tests.providers.serve import serving

__all__ = ["kafka_bootstrap", "topic_prefix"]  # the broker fixtures of the gateway test

CONTACT = "cI08i1Bls3iTB9bKgFJh"
KEY = Ed25519PrivateKey.generate()
PUBLIC_PEM = KEY.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo).decode()


@dataclass
class Rig:
    fake: FakeHighLevel
    url: str
    provider: GoHighLevelProvider


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    fake = FakeHighLevel()
    async with serving(fake.app()) as url:
        provider = GoHighLevelProvider(fake.token, base_url=url, allow_private_media=True)
        try:
            yield Rig(fake, url, provider)
        finally:
            await provider.close()


# -- sending ------------------------------------------------------------------------------


async def test_the_provider_has_the_channel_contract(rig: Rig) -> None:
    p = rig.provider
    assert (p.name, p.media_channel, p.text_limit) == ("gohighlevel", "gohighlevel", 1600)
    assert isinstance(p, Provider) and isinstance(p, MediaRefs) and isinstance(p, MediaDownloads)
    assert not isinstance(p, KeyedSends) and not isinstance(p, AmbiguityResolver)
    assert rig.fake.token not in repr(p)
    whatsapp = GoHighLevelProvider("t", message_type="whatsapp")
    assert (whatsapp.message_type, whatsapp.text_limit) == ("WhatsApp", 4096)
    assert GoHighLevelProvider("t", message_type="Live_Chat").text_limit is None


async def test_text_goes_to_the_contact_and_returns_the_message_id(rig: Rig) -> None:
    result = await rig.provider.send(Outbound(CONTACT, "hello"))
    [sent] = rig.fake.messages
    assert result.message_id == sent["id"]
    assert {k: sent[k] for k in ("type", "contactId", "message")} == {
        "type": "SMS",
        "contactId": CONTACT,
        "message": "hello",
    }
    assert "attachments" not in sent


async def test_media_goes_as_an_attachment_and_the_type_can_change_per_send(rig: Rig) -> None:
    media = Media(url="https://cdn.example.com/a.png", mime="image/png")
    await rig.provider.send(Outbound(CONTACT, "look", media, options={"type": "whatsapp"}))
    await rig.provider.send(Outbound(CONTACT, None, media))
    first, second = rig.fake.messages
    assert (first["type"], first["message"], first["attachments"]) == (
        "WhatsApp",
        "look",
        ["https://cdn.example.com/a.png"],
    )
    assert second["type"] == "SMS" and "message" not in second
    assert first["conversationId"] == second["conversationId"]


@pytest.mark.parametrize(
    ("message", "kind", "match"),
    [
        (Outbound(CONTACT, ""), UnsupportedContentError, "neither text nor media"),
        (Outbound(CONTACT, "x", Media(data=b"x")), UnsupportedContentError, "URL"),
        (Outbound(CONTACT, "x" * 1601), PayloadTooLargeError, "1600"),
        (Outbound(CONTACT, "x" * 1001, options={"type": "IG"}), PayloadTooLargeError, "1000"),
        (Outbound(CONTACT, "x", options={"type": "Email"}), ConfigError, "not a message type"),
    ],
)
async def test_what_highlevel_cannot_take_is_refused_before_any_call(
    rig: Rig, message: Outbound, kind: type[Exception], match: str
) -> None:
    with pytest.raises(kind, match=match):
        await rig.provider.send(message)
    assert rig.fake.attempts == 0


# -- error mapping, each against the fake ----------------------------------------------------


async def test_a_wrong_token_is_final_names_the_variable_and_never_shows(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    bad = GoHighLevelProvider("pit-wrong-token-must-not-leak", base_url=rig.url)
    try:
        with pytest.raises(SendError, match="GOHIGHLEVEL_TOKEN") as err:
            await bad.send(Outbound(CONTACT, "hi"))
    finally:
        await bad.close()
    assert err.value.retryable is False and "Invalid JWT" in str(err.value)
    assert "pit-wrong-token-must-not-leak" not in str(err.value)
    assert caplog.records and "pit-wrong-token-must-not-leak" not in caplog.text


async def test_an_unknown_or_dnd_contact_is_unreachable(rig: Rig) -> None:
    rig.fake.contacts.add("dndContact0000000000")
    rig.fake.dnd.add("dndContact0000000000")
    for contact, said in (
        ("unknownContact000000", "Contact not found"),
        ("dndContact0000000000", "DND"),
    ):
        with pytest.raises(RecipientUnreachableError, match=said) as err:
            await rig.provider.send(Outbound(contact, "hi"))
        assert err.value.retryable is False
    assert rig.fake.messages == []


async def test_a_validation_error_is_final_with_its_messages(rig: Rig) -> None:
    rig.fake.fail_next(422, "message should not be empty")
    with pytest.raises(SendError, match="should not be empty") as err:
        await rig.provider.send(Outbound(CONTACT, "hi"))
    assert type(err.value) is SendError and err.value.retryable is False


async def test_429_waits_its_retry_after_or_the_burst_window(rig: Rig) -> None:
    rig.fake.fail_next(429, "Too many requests", retry_after="3")
    rig.fake.fail_next(429, "Too many requests")
    with pytest.raises(RateLimitedError) as err:
        await rig.provider.send(Outbound(CONTACT, "hi"))
    assert err.value.retry_after == 3.0
    with pytest.raises(RateLimitedError) as err:
        await rig.provider.send(Outbound(CONTACT, "hi"))
    assert err.value.retry_after == 10.0


@pytest.mark.parametrize("status", [500, 502, 504])
async def test_server_errors_are_retryable(rig: Rig, status: int) -> None:
    rig.fake.fail_next(status, "Internal server error")
    with pytest.raises(SendError) as err:
        await rig.provider.send(Outbound(CONTACT, "hi"))
    assert type(err.value) is SendError and err.value.retryable is True


async def test_a_refused_connection_is_retryable_without_the_token() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = GoHighLevelProvider("pit-transport-secret", base_url=f"http://127.0.0.1:{port}")
    try:
        with pytest.raises(SendError) as err:
            await p.send(Outbound(CONTACT, "hi"))
    finally:
        await p.close()
    assert err.value.retryable is True and "pit-transport-secret" not in str(err.value)


async def test_the_engine_waits_the_retry_after_then_sends_once(rig: Rig) -> None:
    rig.fake.fail_next(429, "Too many requests", retry_after="5")
    receipt, waited = await send_through_engine(rig.provider, CONTACT, "after the wait")
    assert receipt.state == "sent" and waited == 5.0
    [sent] = rig.fake.messages
    assert receipt.message_id == sent["id"] and rig.fake.attempts == 2


async def test_the_engine_retries_a_5xx_with_its_backoff(rig: Rig) -> None:
    rig.fake.fail_next(503, "Service Unavailable")
    rig.fake.fail_next(502, "Bad Gateway")
    receipt, waited = await send_through_engine(rig.provider, CONTACT, "x", base="2s")
    assert receipt.state == "sent" and waited == 2.0 + 4.0 and rig.fake.attempts == 3


# -- webhooks -----------------------------------------------------------------------------


def _event(**over: Any) -> bytes:
    event = {
        "type": "InboundMessage",
        "locationId": "ve9EPM428h8vShlRW1KT",
        "attachments": [],
        "body": "This is a test message",
        "contactId": CONTACT,
        "contentType": "text/plain",
        "conversationId": "fcanlLgpbQgQhderivVs",
        "dateAdded": "2021-04-21T11:31:45.750Z",
        "direction": "inbound",
        "messageType": "SMS",
        "messageId": "tGbLJuTNFN4IFJJJOSAT",
        "status": "delivered",
    }
    event.update(over)
    return json.dumps(event).encode()


def _signed(body: bytes, key: Ed25519PrivateKey = KEY) -> dict[str, str]:
    return {
        "content-type": "application/json",
        "x-ghl-signature": base64.b64encode(key.sign(body)).decode(),
    }


def _request(body: bytes, headers: dict[str, str] | None = None) -> WebhookRequest:
    return WebhookRequest(
        "POST",
        "/gohighlevel",
        "https://hooks.example.com/gohighlevel",
        headers if headers is not None else _signed(body),
        {},
        body,
    )


def test_the_signature_is_checked_with_the_public_key() -> None:
    hook = GoHighLevelWebhook(PUBLIC_PEM)
    body = _event()
    hook.verify(_request(body))
    assert hook.handshake(_request(body)) is None
    with pytest.raises(BadSignature, match="no X-GHL-Signature"):
        hook.verify(_request(body, {}))
    with pytest.raises(BadSignature, match="does not match"):
        hook.verify(_request(body, _signed(body, Ed25519PrivateKey.generate())))
    with pytest.raises(BadSignature, match="does not match"):
        hook.verify(_request(body + b" ", _signed(body)))
    with pytest.raises(BadSignature, match="does not match"):
        hook.verify(_request(body, {"x-ghl-signature": "not base64!"}))


def test_the_public_key_comes_from_the_environment_even_on_one_line() -> None:
    one_line = PUBLIC_PEM.replace("\n", "\\n")
    hook = webhook_from_env("gohighlevel", {"GOHIGHLEVEL_WEBHOOK_PUBLIC_KEY": one_line})
    assert isinstance(hook, GoHighLevelWebhook)
    hook.verify(_request(_event()))
    with pytest.raises(ConfigError, match="GOHIGHLEVEL_WEBHOOK_PUBLIC_KEY"):
        GoHighLevelWebhook.from_env({})
    with pytest.raises(ConfigError, match="Ed25519"):
        GoHighLevelWebhook.from_env({"GOHIGHLEVEL_WEBHOOK_PUBLIC_KEY": "a shared secret"})


def test_parse_an_inbound_sms() -> None:
    [rec] = GoHighLevelWebhook(PUBLIC_PEM).parse(_request(_event()))
    assert rec.id == "tGbLJuTNFN4IFJJJOSAT"
    assert (rec.chat_id, rec.sender, rec.channel) == (CONTACT, CONTACT, "gohighlevel")
    assert (rec.text, rec.media, rec.kind) == ("This is a test message", None, "message")
    assert rec.ts == 1619004705.75
    assert rec.data == {
        "message_type": "SMS",
        "conversation_id": "fcanlLgpbQgQhderivVs",
        "location_id": "ve9EPM428h8vShlRW1KT",
    }


def test_parse_attachments() -> None:
    urls = [
        "https://storage.googleapis.com/msgsndr/ve9EPM428h8vShlRW1KT/media/a.png",
        "https://storage.googleapis.com/msgsndr/ve9EPM428h8vShlRW1KT/media/b.pdf",
    ]
    [rec] = GoHighLevelWebhook(PUBLIC_PEM).parse(_request(_event(attachments=urls, body="")))
    assert rec.media == Media(provider="gohighlevel", url=urls[0], mime="image/png")
    assert rec.data["more_media"] == [{"url": urls[1], "mime": "application/pdf"}]
    assert rec.text is None


@pytest.mark.parametrize(
    "body",
    [
        _event(type="OutboundMessage", direction="outbound"),  # the bot's own message
        _event(direction="outbound"),
        _event(type="ContactCreate"),
        _event(type="LCEmailStats"),
    ],
)
def test_what_is_not_an_inbound_message_gives_no_record(body: bytes) -> None:
    assert GoHighLevelWebhook(PUBLIC_PEM).parse(_request(body)) == []


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (b"<html>", "not JSON"),
        (b'{"locationId": "x"}', "no type"),
        (_event(messageId=None), "without messageId"),
        (_event(contactId=""), "without messageId or contactId"),
    ],
)
def test_a_body_that_is_not_highlevels_is_malformed(body: bytes, match: str) -> None:
    with pytest.raises(MalformedWebhook, match=match):
        GoHighLevelWebhook(PUBLIC_PEM).parse(_request(body))


def test_a_retried_webhook_gives_the_same_id() -> None:
    hook, body = GoHighLevelWebhook(PUBLIC_PEM), _event()
    assert hook.parse(_request(body))[0].id == hook.parse(_request(body))[0].id
    assert hook.reply(_request(body), []).status == 200


async def test_an_attachment_replays_from_the_journal_and_downloads_again(rig: Rig) -> None:
    path = rig.fake.add_media(b"the-picture", "image/png", "png")
    url = f"{rig.url}{path}"
    [inbound] = GoHighLevelWebhook(PUBLIC_PEM).parse(
        _request(_event(attachments=[url + "?token=one-time-secret"]))
    )
    seen = await replay_media(rig.provider, inbound)
    assert seen.errors == [] and seen.loaded == [b"the-picture", b"the-picture"]
    assert seen.journaled["ref"] == {"v": 1, "data": {"url": url}}  # no credential parameter
    assert "one-time-secret" not in json.dumps(seen.journaled)


async def test_a_replayed_attachment_that_is_gone_reports_rehydrate_failed(rig: Rig) -> None:
    url = rig.url + rig.fake.add_media(b"x", "image/png", "png")
    [inbound] = GoHighLevelWebhook(PUBLIC_PEM).parse(_request(_event(attachments=[url])))
    seen = await replay_media(rig.provider, inbound, before_replay=rig.fake.media.clear)
    assert seen.loaded == [b"x"] and seen.errors == ["rehydrate-failed"]


# -- from_env ----------------------------------------------------------------------------


def test_from_env_reads_the_settings_through_the_registry() -> None:
    p = provider_from_env("gohighlevel", {"GOHIGHLEVEL_TOKEN": "pit-1"})
    assert isinstance(p, GoHighLevelProvider)
    assert (p.base_url, p.message_type) == ("https://services.leadconnectorhq.com", "SMS")
    local = GoHighLevelProvider.from_env(
        {
            "GOHIGHLEVEL_TOKEN": "pit-1",
            "GOHIGHLEVEL_MESSAGE_TYPE": "WhatsApp",
            "GOHIGHLEVEL_API_URL": "http://127.0.0.1:9",
            "GOHIGHLEVEL_ALLOW_PRIVATE_MEDIA": "1",
        }
    )
    assert (local.base_url, local.message_type, local.allow_private_media) == (
        "http://127.0.0.1:9",
        "WhatsApp",
        True,
    )


@pytest.mark.parametrize(
    ("env", "field"),
    [
        ({}, "GOHIGHLEVEL_TOKEN"),
        (
            {"GOHIGHLEVEL_TOKEN": "t", "GOHIGHLEVEL_MESSAGE_TYPE": "Email"},
            "GOHIGHLEVEL_MESSAGE_TYPE",
        ),
        (
            {"GOHIGHLEVEL_TOKEN": "t", "GOHIGHLEVEL_API_URL": "http://x.example"},
            "GOHIGHLEVEL_API_URL",
        ),
        (
            {"GOHIGHLEVEL_TOKEN": "t", "GOHIGHLEVEL_ALLOW_PRIVATE_MEDIA": "1"},
            "GOHIGHLEVEL_ALLOW_PRIVATE_MEDIA",
        ),
    ],
)
def test_from_env_names_a_missing_or_bad_variable(env: dict[str, str], field: str) -> None:
    with pytest.raises(ConfigError) as err:
        GoHighLevelProvider.from_env(env)
    assert err.value.field == field


@pytest.mark.kafka
async def test_a_signed_webhook_through_the_gateway_is_one_record_keyed_by_the_contact(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    hook = webhook_from_env("gohighlevel", {"GOHIGHLEVEL_WEBHOOK_PUBLIC_KEY": PUBLIC_PEM})
    body = _event(body="through the gateway")
    forged = _signed(body, Ed25519PrivateKey.generate())
    bad, none = await post_through_gateway(kafka_bootstrap, topic_prefix, hook, body, forged)
    assert bad == [401] and none == []
    statuses, records = await post_through_gateway(
        kafka_bootstrap, topic_prefix, hook, body, _signed(body), times=2
    )
    assert statuses == [200, 200]
    [(key, rec)] = records
    assert key == chat_key(CONTACT)
    assert rec == Inbound(
        id="tGbLJuTNFN4IFJJJOSAT",
        chat_id=CONTACT,
        sender=CONTACT,
        channel="gohighlevel",
        ts=1619004705.75,
        text="through the gateway",
        data={
            "message_type": "SMS",
            "conversation_id": "fcanlLgpbQgQhderivVs",
            "location_id": "ve9EPM428h8vShlRW1KT",
        },
    )

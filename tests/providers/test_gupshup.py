"""``botmesh.providers.gupshup`` against the local fake of Gupshup's WhatsApp API
(``tests/providers/fakes/gupshup.py``), over real HTTP; its webhook on callbacks written as
Gupshup documents them; the engine's retry and replay, and the gateway, with the real
adapter."""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest

from botmesh.providers.channels import provider_from_env, webhook_from_env
from botmesh.providers.gupshup import GupshupProvider, GupshupWebhook
from botmesh.providers.webhooks import BadSignature, MalformedWebhook, WebhookRequest
from botmesh.state.errors import (
    ConfigError,
    PayloadTooLargeError,
    ProviderError,
    RateLimitedError,
    RecipientUnreachableError,
    SendError,
    UnsupportedContentError,
)
from botmesh.state.messages import Inbound, Media, Outbound
from botmesh.state.ports import (
    AmbiguityResolver,
    KeyedSends,
    MediaDownloads,
    MediaRefs,
    Provider,
)
from botmesh.topics.records import chat_key
from tests.kafka.conftest import kafka_bootstrap, topic_prefix
from tests.providers.channel_paths import post_through_gateway, replay_media, send_through_engine
from tests.providers.fakes.gupshup import FakeGupshup
from tests.providers.serve import serving

__all__ = ["kafka_bootstrap", "topic_prefix"]  # the broker fixtures of the gateway test

USER = "919876543210"
SECRET = "gupshup-hook-secret-0123456789"


@dataclass
class Rig:
    fake: FakeGupshup
    url: str
    provider: GupshupProvider


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    fake = FakeGupshup()
    async with serving(fake.app()) as url:
        provider = GupshupProvider(
            fake.api_key, fake.source, fake.app_name, base_url=url, allow_private_media=True
        )
        try:
            yield Rig(fake, url, provider)
        finally:
            await provider.close()


# -- sending ------------------------------------------------------------------------------


async def test_the_provider_has_the_channel_contract(rig: Rig) -> None:
    p = rig.provider
    assert (p.name, p.media_channel, p.text_limit) == ("gupshup", "gupshup", 4096)
    assert isinstance(p, Provider) and isinstance(p, MediaRefs) and isinstance(p, MediaDownloads)
    # Gupshup takes no idempotency key and cannot be asked what went out.
    assert not isinstance(p, KeyedSends) and not isinstance(p, AmbiguityResolver)
    assert rig.fake.api_key not in repr(p)


async def test_text_goes_as_the_form_and_returns_the_message_id(rig: Rig) -> None:
    result = await rig.provider.send(Outbound("+" + USER, "hello", options={"disable_preview": 1}))
    [sent] = rig.fake.messages
    assert result.message_id == sent["id"]
    assert (sent["channel"], sent["source"], sent["src.name"]) == (
        "whatsapp",
        "917834811114",
        "DemoAPI",
    )
    assert sent["destination"] == USER  # the "+" is dropped: Gupshup wants digits
    assert sent["message"] == {"type": "text", "text": "hello"}
    assert sent["form"]["disablePreview"] == "true"


async def test_media_urls_go_by_type_with_their_caption(rig: Rig) -> None:
    p = rig.provider
    await p.send(
        Outbound(USER, "look", Media(url="https://cdn.example.com/a.jpg", mime="image/jpeg"))
    )
    await p.send(Outbound(USER, "invoice", Media(url="https://cdn.example.com/x/inv.pdf")))
    await p.send(Outbound(USER, None, Media(url="https://cdn.example.com/v.ogg", mime="audio/ogg")))
    image, doc, audio = (m["message"] for m in rig.fake.messages)
    assert image == {
        "type": "image",
        "originalUrl": "https://cdn.example.com/a.jpg",
        "previewUrl": "https://cdn.example.com/a.jpg",
        "caption": "look",
    }
    assert doc == {
        "type": "file",
        "url": "https://cdn.example.com/x/inv.pdf",
        "filename": "inv.pdf",
        "caption": "invoice",
    }
    assert audio == {"type": "audio", "url": "https://cdn.example.com/v.ogg"}


async def test_a_media_url_without_a_type_goes_by_its_file_name(rig: Rig) -> None:
    """``botmesh.providers.media_kinds``: the URL's path says the type (before, every
    media without a MIME type went as a file)."""
    p = rig.provider
    await p.send(Outbound(USER, None, Media(url="https://cdn.example.com/p/cat.jpg?x=1")))
    await p.send(Outbound(USER, None, Media(url="https://cdn.example.com/s.webp")))
    image, sticker = (m["message"] for m in rig.fake.messages)
    assert image["type"] == "image" and sticker["type"] == "sticker"


@pytest.mark.parametrize(
    ("message", "kind", "match"),
    [
        (Outbound(USER, ""), UnsupportedContentError, "neither text nor media"),
        (Outbound(USER, "x", Media(data=b"x", mime="image/png")), UnsupportedContentError, "URL"),
        (Outbound(USER, "x", Media(path="/tmp/a.png")), UnsupportedContentError, "URL"),
        (
            Outbound(USER, "hi", Media(url="https://e.example/a.ogg", mime="audio/ogg")),
            UnsupportedContentError,
            "no caption",
        ),
        (Outbound(USER, "x" * 4097), PayloadTooLargeError, "4096"),
        (
            Outbound(USER, "x" * 1025, Media(url="https://e.example/a.png", mime="image/png")),
            PayloadTooLargeError,
            "1024",
        ),
    ],
)
async def test_what_gupshup_cannot_take_is_refused_before_any_call(
    rig: Rig, message: Outbound, kind: type[SendError], match: str
) -> None:
    with pytest.raises(kind, match=match) as err:
        await rig.provider.send(message)
    assert err.value.retryable is False
    assert rig.fake.messages == []


async def test_a_text_at_the_limit_goes_out(rig: Rig) -> None:
    await rig.provider.send(Outbound(USER, "x" * 4096))
    assert len(rig.fake.messages) == 1


# -- error mapping, each against the fake ----------------------------------------------------


async def test_a_wrong_api_key_is_final_names_the_variable_and_never_shows(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    bad = GupshupProvider(
        "wrong-key-that-must-not-leak", "917834811114", "DemoAPI", base_url=rig.url
    )
    try:
        with pytest.raises(SendError, match="GUPSHUP_API_KEY") as err:
            await bad.send(Outbound(USER, "hi"))
    finally:
        await bad.close()
    assert err.value.retryable is False and "Authentication Failed" in str(err.value)
    assert "wrong-key-that-must-not-leak" not in str(err.value)
    assert "wrong-key-that-must-not-leak" not in caplog.text and caplog.records


@pytest.mark.parametrize("chat", ["not-a-number", "919000000001"])
async def test_invalid_or_not_opted_in_destinations_are_unreachable(rig: Rig, chat: str) -> None:
    rig.fake.not_opted_in.add("919000000001")
    with pytest.raises(RecipientUnreachableError) as err:
        await rig.provider.send(Outbound(chat, "hi"))
    assert err.value.retryable is False
    assert rig.fake.messages == []


async def test_429_waits_its_retry_after_or_the_default(rig: Rig) -> None:
    rig.fake.fail_next(429, "Too Many Requests", retry_after="7")
    rig.fake.fail_next(429, "Too Many Requests")
    with pytest.raises(RateLimitedError) as err:
        await rig.provider.send(Outbound(USER, "hi"))
    assert err.value.retryable and err.value.retry_after == 7.0
    with pytest.raises(RateLimitedError) as err:
        await rig.provider.send(Outbound(USER, "hi"))
    assert err.value.retry_after == rig.provider.rate_limit_wait == 1.0
    await rig.provider.send(Outbound(USER, "hi"))  # the script is spent
    assert len(rig.fake.messages) == 1


@pytest.mark.parametrize("status", [500, 502, 503])
async def test_server_errors_are_retryable(rig: Rig, status: int) -> None:
    rig.fake.fail_next(status, "Internal Server Error")
    with pytest.raises(SendError) as err:
        await rig.provider.send(Outbound(USER, "hi"))
    assert type(err.value) is SendError and err.value.retryable is True


async def test_other_4xx_are_final(rig: Rig) -> None:
    bad = GupshupProvider(rig.fake.api_key, "911111111111", "Other", base_url=rig.url)
    try:
        with pytest.raises(SendError, match="Invalid App Details") as err:
            await bad.send(Outbound(USER, "hi"))
    finally:
        await bad.close()
    assert type(err.value) is SendError and err.value.retryable is False


async def test_a_refused_connection_is_retryable_without_the_key() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = GupshupProvider(
        "key-0123456789", "917834811114", "DemoAPI", base_url=f"http://127.0.0.1:{port}"
    )
    try:
        with pytest.raises(SendError) as err:
            await p.send(Outbound(USER, "hi"))
    finally:
        await p.close()
    assert err.value.retryable is True and "key-0123456789" not in str(err.value)


async def test_the_engine_waits_the_retry_after_then_sends_once(rig: Rig) -> None:
    rig.fake.fail_next(429, "Too Many Requests", retry_after="7")
    receipt, waited = await send_through_engine(rig.provider, USER, "after the wait")
    assert receipt.state == "sent" and waited == 7.0  # not the 1 s backoff
    [sent] = rig.fake.messages
    assert receipt.message_id == sent["id"] and sent["message"]["text"] == "after the wait"


async def test_the_engine_dead_letters_an_unreachable_number_at_once(rig: Rig) -> None:
    rig.fake.not_opted_in.add(USER)
    with pytest.raises(RecipientUnreachableError):
        await send_through_engine(rig.provider, USER, "hi")
    assert rig.fake.attempts == 1  # final: never retried


# -- media downloads ----------------------------------------------------------------------


async def test_download_adds_the_api_key_only_for_gupshup_hosts(rig: Rig) -> None:
    path = rig.fake.add_media(b"\x89PNG-bytes", "image/png")
    assert await rig.provider.download_media(Media(url=rig.url + path)) == b"\x89PNG-bytes"
    assert rig.fake.media_keys == [rig.fake.api_key]
    _, headers = await rig.provider.media_url(Media(url="https://filemanager.gupshup.io/fm/x"))
    assert headers == {"apikey": rig.fake.api_key}
    _, headers = await rig.provider.media_url(Media(url="https://evil.example.com/fm/x"))
    assert headers == {}
    with pytest.raises(ProviderError, match="no URL"):
        await rig.provider.media_url(Media(id="x"))


async def test_a_download_without_the_key_is_refused_by_gupshup(rig: Rig) -> None:
    path = rig.fake.add_media(b"x", "image/png")
    with pytest.raises(ProviderError, match="HTTP 401"):
        await rig.provider.fetch_media(rig.url + path)


def _callback(
    kind: str, part: dict[str, Any], *, mid: str = "ABEGkYaYVSEEAhAL3SLAWwHKeKrt6s3FKB0c"
) -> bytes:
    return json.dumps(
        {
            "app": "DemoAPI",
            "timestamp": 1580227766370,
            "version": 2,
            "type": "message",
            "payload": {
                "id": mid,
                "source": USER,
                "type": kind,
                "payload": part,
                "sender": {
                    "phone": USER,
                    "name": "Smit",
                    "country_code": "91",
                    "dial_code": "9876543210",
                },
            },
        }
    ).encode()


def _request(body: bytes, token: str | None = SECRET) -> WebhookRequest:
    query = {"token": token} if token is not None else {}
    return WebhookRequest(
        "POST",
        "/gupshup",
        "https://hooks.example.com/gupshup",
        {"content-type": "application/json"},
        query,
        body,
    )


async def test_a_parsed_media_url_replays_from_the_journal_and_downloads_again(rig: Rig) -> None:
    path = rig.fake.add_media(b"the-photo-bytes", "image/jpeg")
    part = {"caption": "cat", "url": f"{rig.url}{path}?download=false&apikey={rig.fake.api_key}"}
    [inbound] = GupshupWebhook(SECRET).parse(
        _request(_callback("image", {**part, "contentType": "image/jpeg"}))
    )
    seen = await replay_media(rig.provider, inbound)
    assert seen.errors == [] and seen.loaded == [b"the-photo-bytes", b"the-photo-bytes"]
    journaled = json.dumps(seen.journaled)
    assert seen.journaled["ref"] == {"v": 1, "data": {"url": f"{rig.url}{path}?download=false"}}
    assert rig.fake.api_key not in journaled and "the-photo-bytes" not in journaled
    assert rig.fake.media_keys == [rig.fake.api_key] * 2  # added at download time, both runs


async def test_a_replayed_url_that_expired_reports_rehydrate_failed(rig: Rig) -> None:
    path = rig.fake.add_media(b"bytes", "image/jpeg")
    [inbound] = GupshupWebhook(SECRET).parse(_request(_callback("image", {"url": rig.url + path})))
    seen = await replay_media(rig.provider, inbound, before_replay=rig.fake.media.clear)
    assert seen.loaded == [b"bytes"] and seen.errors == ["rehydrate-failed"]


# -- from_env ----------------------------------------------------------------------------


ENV = {
    "GUPSHUP_API_KEY": "k" * 32,
    "GUPSHUP_SOURCE": "917834811114",
    "GUPSHUP_APP_NAME": "DemoAPI",
    "GUPSHUP_WEBHOOK_SECRET": SECRET,
}


def test_from_env_reads_the_settings_through_the_registry() -> None:
    p = provider_from_env("gupshup", ENV)
    assert isinstance(p, GupshupProvider)
    assert (p.base_url, p.source, p.app_name) == (
        "https://api.gupshup.io",
        "917834811114",
        "DemoAPI",
    )
    local = GupshupProvider.from_env(
        {**ENV, "GUPSHUP_API_URL": "http://127.0.0.1:9/", "GUPSHUP_ALLOW_PRIVATE_MEDIA": "1"}
    )
    assert local.base_url == "http://127.0.0.1:9" and local.allow_private_media
    assert isinstance(webhook_from_env("gupshup", ENV), GupshupWebhook)


@pytest.mark.parametrize("missing", ["GUPSHUP_API_KEY", "GUPSHUP_SOURCE", "GUPSHUP_APP_NAME"])
def test_from_env_names_a_missing_variable(missing: str) -> None:
    env = {k: v for k, v in ENV.items() if k != missing}
    with pytest.raises(ConfigError) as err:
        GupshupProvider.from_env(env)
    assert err.value.field == missing


@pytest.mark.parametrize(
    ("env", "field"),
    [
        ({**ENV, "GUPSHUP_SOURCE": "+91 78348 11114"}, "gupshup.source"),
        ({**ENV, "GUPSHUP_API_URL": "http://api.gupshup.io"}, "GUPSHUP_API_URL"),
        ({**ENV, "GUPSHUP_ALLOW_PRIVATE_MEDIA": "1"}, "GUPSHUP_ALLOW_PRIVATE_MEDIA"),
    ],
)
def test_from_env_refuses_bad_settings(env: dict[str, str], field: str) -> None:
    with pytest.raises(ConfigError) as err:
        GupshupProvider.from_env(env)
    assert err.value.field == field


def test_the_webhook_needs_a_long_enough_secret() -> None:
    with pytest.raises(ConfigError, match="GUPSHUP_WEBHOOK_SECRET"):
        GupshupWebhook.from_env({})
    with pytest.raises(ConfigError, match="16"):
        GupshupWebhook.from_env({"GUPSHUP_WEBHOOK_SECRET": "short"})


# -- the webhook ---------------------------------------------------------------------------


def test_the_token_is_checked() -> None:
    hook = GupshupWebhook(SECRET)
    body = _callback("text", {"text": "hi"})
    hook.verify(_request(body))
    assert hook.handshake(_request(body)) is None
    with pytest.raises(BadSignature, match="no"):
        hook.verify(_request(body, token=None))
    with pytest.raises(BadSignature, match="wrong"):
        hook.verify(_request(body, token=SECRET[:-1] + "x"))
    assert SECRET not in repr(hook)


def test_parse_a_text() -> None:
    [rec] = GupshupWebhook(SECRET).parse(_request(_callback("text", {"text": "Hi there"})))
    assert rec.id == "ABEGkYaYVSEEAhAL3SLAWwHKeKrt6s3FKB0c"
    assert (rec.chat_id, rec.sender, rec.channel) == (USER, USER, "gupshup")
    assert (rec.text, rec.kind, rec.media) == ("Hi there", "message", None)
    assert rec.ts == 1580227766.37
    assert rec.data == {"type": "text", "app": "DemoAPI", "profile_name": "Smit"}


@pytest.mark.parametrize(
    ("kind", "part", "media", "text"),
    [
        (
            "image",
            {
                "caption": "Sample image",
                "url": "https://filemanager.gupshup.io/fm/wamedia/DemoAPI/a",
                "contentType": "image/jpeg",
                "urlExpiry": 1580832566370,
            },
            Media(
                provider="gupshup",
                url="https://filemanager.gupshup.io/fm/wamedia/DemoAPI/a",
                mime="image/jpeg",
            ),
            "Sample image",
        ),
        (
            "file",
            {
                "caption": "inv",
                "name": "inv.pdf",
                "url": "https://filemanager.gupshup.io/fm/b",
                "contentType": "application/pdf",
            },
            Media(
                provider="gupshup",
                url="https://filemanager.gupshup.io/fm/b",
                mime="application/pdf",
                name="inv.pdf",
            ),
            "inv",
        ),
        (
            "audio",
            {"url": "https://filemanager.gupshup.io/fm/c", "contentType": "audio/ogg; codecs=opus"},
            Media(
                provider="gupshup",
                url="https://filemanager.gupshup.io/fm/c",
                mime="audio/ogg; codecs=opus",
            ),
            None,
        ),
    ],
)
def test_parse_media(kind: str, part: dict[str, Any], media: Media, text: str | None) -> None:
    [rec] = GupshupWebhook(SECRET).parse(_request(_callback(kind, part)))
    assert rec.media == media and rec.text == text and rec.kind == "message"


def test_parse_a_button_reply_as_an_interaction() -> None:
    part = {"title": "Yes", "id": "qr-yes", "reply": "Yes 1"}
    [rec] = GupshupWebhook(SECRET).parse(_request(_callback("button_reply", part)))
    assert rec.kind == "interaction" and rec.text == "Yes" and rec.data["payload"] == "qr-yes"


def test_a_location_is_kept_in_data() -> None:
    part = {"longitude": 72.8, "latitude": 19.0}
    [rec] = GupshupWebhook(SECRET).parse(_request(_callback("location", part)))
    assert rec.data["location"] == part and rec.text is None


@pytest.mark.parametrize(
    "event",
    [
        # the status of a message the bot sent: never a message to answer
        {
            "app": "DemoAPI",
            "timestamp": 1580546677791,
            "version": 2,
            "type": "message-event",
            "payload": {
                "id": "59f8db90",
                "gsId": "ee4a68a0",
                "type": "delivered",
                "destination": USER,
                "payload": {"ts": 1580546678},
            },
        },
        {
            "app": "DemoAPI",
            "timestamp": 1580546677791,
            "version": 2,
            "type": "user-event",
            "payload": {"phone": USER, "type": "opted-in"},
        },
        {
            "app": "DemoAPI",
            "timestamp": 1580546677791,
            "version": 2,
            "type": "billing-event",
            "payload": {},
        },
    ],
)
def test_events_that_are_not_messages_give_no_record(event: dict[str, Any]) -> None:
    assert GupshupWebhook(SECRET).parse(_request(json.dumps(event).encode())) == []


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (b"<html>", "not JSON"),
        (b"[]", "no type"),
        (
            json.dumps({"object": "whatsapp_business_account", "entry": [], "type": "x"}).encode(),
            "Gupshup format",
        ),
        (json.dumps({"type": "message", "payload": {"type": "text"}}).encode(), "without id"),
        (_callback("image", {"caption": "no url"}), "no url"),
    ],
)
def test_a_body_that_is_not_a_gupshup_message_is_malformed(body: bytes, match: str) -> None:
    with pytest.raises(MalformedWebhook, match=match):
        GupshupWebhook(SECRET).parse(_request(body))


def test_a_retried_callback_gives_the_same_id_and_the_reply_is_a_200() -> None:
    hook, body = GupshupWebhook(SECRET), _callback("text", {"text": "hi"})
    assert hook.parse(_request(body))[0].id == hook.parse(_request(body))[0].id
    assert hook.reply(_request(body), []).status == 200


@pytest.mark.kafka
async def test_a_callback_through_the_gateway_is_one_record_keyed_by_the_number(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    hook = webhook_from_env("gupshup", ENV)
    body = _callback("text", {"text": "through the gateway"})
    headers = {"Content-Type": "application/json"}
    bad, none = await post_through_gateway(
        kafka_bootstrap, topic_prefix, hook, body, headers, query="?token=wrong-token-0123456789"
    )
    assert bad == [401] and none == []
    statuses, records = await post_through_gateway(
        kafka_bootstrap, topic_prefix, hook, body, headers, query=f"?token={SECRET}", times=3
    )
    assert statuses == [200, 200, 200]  # Gupshup retried it: produced once
    [(key, rec)] = records
    assert key == chat_key(USER)
    assert rec == Inbound(
        id="ABEGkYaYVSEEAhAL3SLAWwHKeKrt6s3FKB0c",
        chat_id=USER,
        sender=USER,
        channel="gupshup",
        ts=1580227766.37,
        text="through the gateway",
        data={"type": "text", "app": "DemoAPI", "profile_name": "Smit"},
    )

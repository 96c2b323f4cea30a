"""``botmesh.providers.tiktok`` against the local fake of TikTok's Business Messaging API
(``tests/providers/fakes/tiktok.py``), over real HTTP; its webhook on ``DIRECT_MESSAGE``
events signed as TikTok signs them; the engine's retry and replay, and the gateway, with the
real adapter."""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from botmesh.providers.channels import provider_from_env, webhook_from_env
from botmesh.providers.tiktok import TikTokProvider, TikTokWebhook, tiktok_signature
from botmesh.providers.webhooks import BadSignature, MalformedWebhook, WebhookRequest
from botmesh.state.errors import (
    ConfigError,
    PayloadTooLargeError,
    ProviderError,
    RateLimitedError,
    SendError,
    UnsupportedContentError,
)
from botmesh.state.messages import Inbound, Media, Outbound
from botmesh.state.ports import AmbiguityResolver, KeyedSends, MediaDownloads, MediaRefs, Provider
from botmesh.topics.records import chat_key
from tests.kafka.conftest import kafka_bootstrap, topic_prefix
from tests.providers.channel_paths import post_through_gateway, replay_media, send_through_engine
from tests.providers.fakes.tiktok import BASE, FakeTikTok
from tests.providers.serve import serving

__all__ = ["kafka_bootstrap", "topic_prefix"]  # the broker fixtures of the gateway test

APP_SECRET = "tiktok-app-secret-5b1e"
PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(200))


@dataclass
class Rig:
    fake: FakeTikTok
    url: str
    provider: TikTokProvider
    chat: str


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    fake = FakeTikTok()
    async with serving(fake.app()) as url:
        provider = TikTokProvider(
            fake.token, fake.business_id, base_url=url + BASE, allow_private_media=True
        )
        try:
            yield Rig(fake, url, provider, fake.conversation())
        finally:
            await provider.close()


# -- sending ------------------------------------------------------------------------------


async def test_the_provider_has_the_channel_contract(rig: Rig) -> None:
    p = rig.provider
    assert (p.name, p.media_channel, p.text_limit) == ("tiktok", "tiktok", 6000)
    assert isinstance(p, Provider) and isinstance(p, MediaRefs) and isinstance(p, MediaDownloads)
    assert not isinstance(p, KeyedSends) and not isinstance(p, AmbiguityResolver)
    assert rig.fake.token not in repr(p)


async def test_text_goes_to_the_conversation_and_returns_the_message_id(rig: Rig) -> None:
    result = await rig.provider.send(Outbound(rig.chat, "hello", options={"reply_to": "7301"}))
    [sent] = rig.fake.sent
    assert result.message_id == sent["message_id"]
    assert {k: v for k, v in sent.items() if k != "message_id"} == {
        "business_id": rig.fake.business_id,
        "recipient_type": "CONVERSATION",
        "recipient": rig.chat,
        "message_type": "TEXT",
        "text": {"body": "hello"},
        "referenced_message_info": {"referenced_message_id": "7301"},
    }


async def test_an_image_is_uploaded_then_sent_by_media_id(rig: Rig, tmp_path: Path) -> None:
    path = tmp_path / "photo.png"
    path.write_bytes(PNG)
    by_data = await rig.provider.send(Outbound(rig.chat, None, Media(data=PNG, mime="image/png")))
    by_path = await rig.provider.send(Outbound(rig.chat, None, Media(path=str(path))))
    assert len(rig.fake.sent) == 2 and len(rig.fake.uploads) == 2  # one upload, one send each
    for sent, result in zip(rig.fake.sent, (by_data, by_path), strict=True):
        assert result.message_id == sent["message_id"]
        assert (sent["recipient"], sent["message_type"]) == (rig.chat, "IMAGE")
        assert rig.fake.uploads[sent["image"]["media_id"]] == (PNG, "image/png")


async def test_an_image_by_url_is_fetched_then_uploaded(rig: Rig) -> None:
    async def png(request: web.Request) -> web.Response:
        return web.Response(body=PNG, content_type="image/png")

    host = web.Application()
    host.router.add_get("/photo.png", png)
    async with serving(host) as site:
        await rig.provider.send(Outbound(rig.chat, None, Media(url=f"{site}/photo.png")))
    [sent] = rig.fake.sent
    assert rig.fake.uploads[sent["image"]["media_id"]] == (PNG, "image/png")


@pytest.mark.parametrize(
    ("media", "text", "kind", "match"),
    [
        (Media(data=PNG, mime="image/png"), "caption", UnsupportedContentError, "no caption"),
        (Media(data=b"GIF89a", mime="image/gif"), None, UnsupportedContentError, "JPG and PNG"),
        (
            Media(data=b"x" * (3 * 1024 * 1024 + 1), mime="image/jpeg"),
            None,
            PayloadTooLargeError,
            "3145728",
        ),
        (Media(id="m1"), None, UnsupportedContentError, "upload"),
        (None, "x" * 6001, PayloadTooLargeError, "6000"),
        (None, "", UnsupportedContentError, "neither"),
    ],
)
async def test_what_tiktok_cannot_take_is_refused_before_any_call(
    rig: Rig, media: Media | None, text: str | None, kind: type[SendError], match: str
) -> None:
    with pytest.raises(kind, match=match) as err:
        await rig.provider.send(Outbound(rig.chat, text, media))
    assert err.value.retryable is False and rig.fake.attempts == 0


# -- error mapping: HTTP 200 with a code, each against the fake ------------------------------


async def test_a_wrong_token_is_final_names_the_variable_and_never_shows(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    bad = TikTokProvider(
        "act.wrong-token-must-not-leak", rig.fake.business_id, base_url=rig.url + BASE
    )
    try:
        with pytest.raises(SendError, match="TIKTOK_ACCESS_TOKEN") as err:
            await bad.send(Outbound(rig.chat, "hi"))
    finally:
        await bad.close()
    assert err.value.retryable is False and "40105" in str(err.value)
    assert "act.wrong-token-must-not-leak" not in str(err.value)
    assert caplog.records and "act.wrong-token-must-not-leak" not in caplog.text


async def test_another_business_id_is_final(rig: Rig) -> None:
    other = TikTokProvider(rig.fake.token, "-000not-ours", base_url=rig.url + BASE)
    try:
        with pytest.raises(SendError, match="40001") as err:
            await other.send(Outbound(rig.chat, "hi"))
    finally:
        await other.close()
    assert err.value.retryable is False


async def test_code_40100_is_rate_limited_with_retry_after_or_the_default(rig: Rig) -> None:
    rig.fake.fail_next(40100, "Too many requests. Please retry in some time.")
    rig.fake.fail_next(40100, "Too many requests.", status=429, retry_after="4")
    with pytest.raises(RateLimitedError) as err:
        await rig.provider.send(Outbound(rig.chat, "hi"))
    assert err.value.retry_after == 1.0 and "request_id" in str(err.value)
    with pytest.raises(RateLimitedError) as err:
        await rig.provider.send(Outbound(rig.chat, "hi"))
    assert err.value.retry_after == 4.0


async def test_system_errors_are_retryable_and_param_errors_final(rig: Rig) -> None:
    rig.fake.fail_next(50000, "System error")
    with pytest.raises(SendError) as err:
        await rig.provider.send(Outbound(rig.chat, "hi"))
    assert type(err.value) is SendError and err.value.retryable is True
    with pytest.raises(SendError, match="conversation does not exist") as err:
        await rig.provider.send(Outbound("0:1:1:2", "hi"))
    assert type(err.value) is SendError and err.value.retryable is False


async def test_a_length_error_from_tiktok_is_payload_too_large(rig: Rig) -> None:
    rig.fake.fail_next(40002, "text.body: Length must be between 1 and 6000.")
    with pytest.raises(PayloadTooLargeError):
        await rig.provider.send(Outbound(rig.chat, "hi"))


@pytest.mark.parametrize("status", [500, 502])
async def test_http_server_errors_are_retryable(rig: Rig, status: int) -> None:
    rig.fake.fail_next(51000, "Internal error", status=status)
    with pytest.raises(SendError) as err:
        await rig.provider.send(Outbound(rig.chat, "hi"))
    assert err.value.retryable is True


async def test_a_refused_connection_is_retryable_without_the_token() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = TikTokProvider("act.transport-secret", "b1", base_url=f"http://127.0.0.1:{port}{BASE}")
    try:
        with pytest.raises(SendError) as err:
            await p.send(Outbound("0:1:2:3", "hi"))
    finally:
        await p.close()
    assert err.value.retryable is True and "act.transport-secret" not in str(err.value)


async def test_the_engine_waits_the_retry_after_then_sends_once(rig: Rig) -> None:
    rig.fake.fail_next(40100, "Too many requests.", status=429, retry_after="6")
    receipt, waited = await send_through_engine(rig.provider, rig.chat, "after the wait")
    assert receipt.state == "sent" and waited == 6.0
    [sent] = rig.fake.sent
    assert receipt.message_id == sent["message_id"] and rig.fake.attempts == 2


async def test_the_engine_retries_a_system_error_that_came_as_http_200(rig: Rig) -> None:
    rig.fake.fail_next(50000, "System error")
    receipt, waited = await send_through_engine(rig.provider, rig.chat, "x", base="3s")
    assert receipt.state == "sent" and waited == 3.0 and len(rig.fake.sent) == 1


# -- inbound media -----------------------------------------------------------------------


def _event(content: dict[str, Any], event: str = "im_receive_msg") -> bytes:
    return json.dumps(
        {
            "client_key": "awjzux1u41cywjgt",
            "event": event,
            "create_time": 1752894700,
            "user_openid": "-000business",
            "content": json.dumps(content),
        }
    ).encode()


def _message(
    conversation: str, mid: str, kind: str, part: dict[str, Any], **more: Any
) -> dict[str, Any]:
    return {
        "conversation_id": conversation,
        "message_id": mid,
        "timestamp": 1752894700622,
        "type": kind,
        kind: part,
        "from": "user",
        "from_user": {"id": "-000user", "role": "PERSONAL_ACCOUNT"},
        "to": "biz",
        "to_user": {"id": "-000business", "role": "BUSINESS_ACCOUNT"},
        **more,
    }


def _request(body: bytes, *, at: float | None = None, secret: str = APP_SECRET) -> WebhookRequest:
    stamp = str(int(time.time() if at is None else at))
    header = f"t={stamp},s={tiktok_signature(secret, stamp, body)}"
    return WebhookRequest(
        "POST",
        "/tiktok",
        "https://hooks.example.com/tiktok",
        {"content-type": "application/json", "tiktok-signature": header},
        {},
        body,
    )


async def test_a_received_image_downloads_with_the_token_in_x_user(rig: Rig) -> None:
    mid, media_id = rig.fake.user_message(rig.chat, "image", b"jpeg-bytes")
    body = _event(_message(rig.chat, mid, "image", {"media_id": media_id}))
    [inbound] = TikTokWebhook(APP_SECRET).parse(_request(body))
    assert inbound.media is not None and inbound.media.id == media_id
    assert await rig.provider.download_media(inbound.media) == b"jpeg-bytes"
    assert rig.fake.cdn_users == [rig.fake.token]


async def test_a_replayed_image_is_found_again_by_its_coordinates(rig: Rig) -> None:
    mid, media_id = rig.fake.user_message(rig.chat, "image", b"the-image")
    body = _event(_message(rig.chat, mid, "image", {"media_id": media_id}))
    [inbound] = TikTokWebhook(APP_SECRET).parse(_request(body))
    seen = await replay_media(rig.provider, inbound)
    assert seen.errors == [] and seen.loaded == [b"the-image", b"the-image"]
    assert seen.journaled["ref"] == {
        "v": 1,
        "data": {"conversation_id": rig.chat, "message_id": mid, "index": 0, "type": "image"},
    }
    assert rig.fake.token not in json.dumps(seen.journaled)
    replayed = seen.media[1]
    assert replayed.id is None and replayed.extra["message_id"] == mid


async def test_a_replay_after_20_newer_messages_reports_rehydrate_failed(rig: Rig) -> None:
    mid, media_id = rig.fake.user_message(rig.chat, "image", b"old")
    body = _event(_message(rig.chat, mid, "image", {"media_id": media_id}))
    [inbound] = TikTokWebhook(APP_SECRET).parse(_request(body))

    def twenty_more() -> None:
        for _ in range(20):
            rig.fake.user_message(rig.chat, "image", b"newer")

    seen = await replay_media(rig.provider, inbound, before_replay=twenty_more)
    assert seen.loaded == [b"old"] and seen.errors == ["rehydrate-failed"]


async def test_the_token_is_not_sent_to_a_foreign_download_host(rig: Rig) -> None:
    assert rig.provider.credentialed("https://p16-sign.tiktokcdn-us.com/obj/x")
    assert not rig.provider.credentialed("https://evil.example.com/x")
    assert not rig.provider.credentialed("http://p16.tiktokcdn.com/x")
    with pytest.raises(ProviderError, match="no media"):
        await rig.provider.media_url(
            Media(extra={"conversation_id": rig.chat, "message_id": "1", "type": "text"})
        )


# -- from_env ----------------------------------------------------------------------------


ENV = {
    "TIKTOK_ACCESS_TOKEN": "act.x",
    "TIKTOK_BUSINESS_ID": "-000b",
    "TIKTOK_APP_SECRET": APP_SECRET,
}


def test_from_env_reads_the_settings_through_the_registry() -> None:
    p = provider_from_env("tiktok", ENV)
    assert isinstance(p, TikTokProvider)
    assert (p.base_url, p.business_id) == ("https://business-api.tiktok.com/open_api/v1.3", "-000b")
    assert isinstance(webhook_from_env("tiktok", ENV), TikTokWebhook)


@pytest.mark.parametrize(
    ("env", "field"),
    [
        ({"TIKTOK_BUSINESS_ID": "b"}, "TIKTOK_ACCESS_TOKEN"),
        ({"TIKTOK_ACCESS_TOKEN": "t"}, "TIKTOK_BUSINESS_ID"),
        ({**ENV, "TIKTOK_API_URL": "ftp://x"}, "TIKTOK_API_URL"),
        ({**ENV, "TIKTOK_ALLOW_PRIVATE_MEDIA": "1"}, "TIKTOK_ALLOW_PRIVATE_MEDIA"),
    ],
)
def test_from_env_names_a_missing_or_bad_variable(env: dict[str, str], field: str) -> None:
    with pytest.raises(ConfigError) as err:
        TikTokProvider.from_env(env)
    assert err.value.field == field
    with pytest.raises(ConfigError, match="TIKTOK_APP_SECRET"):
        TikTokWebhook.from_env({})


# -- the webhook ---------------------------------------------------------------------------


def test_the_signature_is_checked_with_its_time() -> None:
    hook = TikTokWebhook(APP_SECRET, clock=lambda: 1_752_894_800.0)
    body = _event(_message("0:1:2:3", "7312", "text", {"body": "hi"}))
    hook.verify(_request(body, at=1_752_894_700))
    assert hook.handshake(_request(body)) is None
    with pytest.raises(BadSignature, match="does not match"):
        hook.verify(_request(body, at=1_752_894_700, secret="another-app"))
    with pytest.raises(BadSignature, match="more than 300 s"):
        hook.verify(_request(body, at=1_752_894_400))
    tampered = _request(body, at=1_752_894_700)
    with pytest.raises(BadSignature, match="does not match"):
        hook.verify(_tamper(tampered))
    with pytest.raises(BadSignature, match="no TikTok-Signature"):
        hook.verify(WebhookRequest("POST", "/tiktok", "u", {}, {}, body))
    with pytest.raises(BadSignature, match="no t="):
        hook.verify(WebhookRequest("POST", "/tiktok", "u", {"tiktok-signature": "s=ab"}, {}, body))
    assert APP_SECRET not in repr(hook)


def _tamper(request: WebhookRequest) -> WebhookRequest:
    return WebhookRequest(
        request.method,
        request.path,
        request.url,
        request.headers,
        request.query,
        request.body + b" ",
    )


def test_parse_a_text() -> None:
    msg = _message("0:1:7310:7311", "7312345678901234567", "text", {"body": "Do you ship?"})
    [rec] = TikTokWebhook(APP_SECRET).parse(_request(_event(msg)))
    assert rec.id == "7312345678901234567"
    assert (rec.chat_id, rec.sender, rec.channel) == ("0:1:7310:7311", "-000user", "tiktok")
    assert (rec.text, rec.media, rec.kind, rec.ts) == (
        "Do you ship?",
        None,
        "message",
        1752894700.622,
    )
    assert rec.data == {"type": "text", "business_id": "-000business"}


def test_parse_an_image_a_video_and_a_sticker() -> None:
    hook = TikTokWebhook(APP_SECRET)
    [image] = hook.parse(_request(_event(_message("0:1:2:3", "71", "image", {"media_id": "vm1"}))))
    assert image.media == Media(
        provider="tiktok",
        id="vm1",
        mime="image/jpeg",
        extra={"conversation_id": "0:1:2:3", "message_id": "71", "index": 0, "type": "image"},
    )
    [video] = hook.parse(_request(_event(_message("0:1:2:3", "72", "video", {"media_id": "vv1"}))))
    assert video.media is not None and video.media.mime == "video/mp4"
    url = "https://p16-sign.tiktokcdn-us.com/obj/sticker.webp?x-expires=1700000000&x-signature=Ab"
    [sticker] = hook.parse(_request(_event(_message("0:1:2:3", "73", "sticker", {"url": url}))))
    assert sticker.media == Media(provider="tiktok", url=url, mime="image/webp")


def test_a_quoted_reply_names_what_it_quotes() -> None:
    msg = _message(
        "0:1:2:3",
        "74",
        "text",
        {"body": "this"},
        referenced_message_info={"referenced_message_id": "70"},
    )
    [rec] = TikTokWebhook(APP_SECRET).parse(_request(_event(msg)))
    assert rec.data["reply_to"] == "70"


@pytest.mark.parametrize(
    "body",
    [
        _event(_message("0:1:2:3", "75", "text", {"body": "ours"}), event="im_send_msg"),
        _event({"conversation_id": "0:1:2:3"}, event="im_mark_read_msg"),
        _event({"comment_id": 1}, event="comment.update"),
        # echoed with the business as sender
        _event(
            {
                **_message("0:1:2:3", "76", "text", {"body": "ours"}),
                "from_user": {"id": "b", "role": "BUSINESS_ACCOUNT"},
            }
        ),
    ],
)
def test_what_is_not_a_users_message_gives_no_record(body: bytes) -> None:
    assert TikTokWebhook(APP_SECRET).parse(_request(body)) == []


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (b"<html>", "not JSON"),
        (b'{"content": "{}"}', "no event"),
        (json.dumps({"event": "im_receive_msg", "content": "not json"}).encode(), "content"),
        (_event({"type": "text", "text": {"body": "x"}}), "without conversation_id"),
        (_event(_message("0:1:2:3", "77", "image", {})), "no media_id"),
    ],
)
def test_a_body_that_is_not_tiktoks_is_malformed(body: bytes, match: str) -> None:
    with pytest.raises(MalformedWebhook, match=match):
        TikTokWebhook(APP_SECRET).parse(_request(body))


def test_a_retried_webhook_gives_the_same_id() -> None:
    hook = TikTokWebhook(APP_SECRET)
    body = _event(_message("0:1:2:3", "78", "text", {"body": "hi"}))
    assert hook.parse(_request(body))[0].id == hook.parse(_request(body))[0].id == "78"
    assert hook.reply(_request(body), []).status == 200


@pytest.mark.kafka
async def test_a_signed_webhook_through_the_gateway_is_one_record_keyed_by_the_conversation(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    hook = webhook_from_env("tiktok", ENV)
    body = _event(_message("0:1:7310:7311", "7312", "text", {"body": "through the gateway"}))
    forged = _request(body, secret="not-the-app-secret").headers
    bad, none = await post_through_gateway(kafka_bootstrap, topic_prefix, hook, body, dict(forged))
    assert bad == [401] and none == []
    signed = dict(_request(body).headers)
    statuses, records = await post_through_gateway(
        kafka_bootstrap, topic_prefix, hook, body, signed, times=2
    )
    assert statuses == [200, 200]
    [(key, rec)] = records
    assert key == chat_key("0:1:7310:7311")
    assert rec == Inbound(
        id="7312",
        chat_id="0:1:7310:7311",
        sender="-000user",
        channel="tiktok",
        ts=1752894700.622,
        text="through the gateway",
        data={"type": "text", "business_id": "-000business"},
    )

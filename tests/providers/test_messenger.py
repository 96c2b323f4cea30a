"""The Messenger adapter against the fake Graph API (real HTTP on 127.0.0.1), and its webhook
on bodies written as Meta documents them."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

from botmesh.providers.http import MediaUrlRefused
from botmesh.providers.messenger import MessengerProvider, MessengerWebhook
from botmesh.providers.webhooks import BadSignature, MalformedWebhook, WebhookRequest, hmac_hex
from botmesh.state.errors import (
    ConfigError,
    OutsideSessionWindowError,
    PayloadTooLargeError,
    RateLimitedError,
    RecipientUnreachableError,
    SendError,
    UnsupportedContentError,
)
from botmesh.state.messages import Media, Outbound
from botmesh.state.ports import Deletes, Edits, Typing
from tests.providers.fakes.graph import VERSION, GraphFake
from tests.providers.serve import serving

PSID = "24000000000000001"
PAGE = "106540352242922"
SECRET = "meta-app-secret-xyz"
VERIFY = "verify-me-123"


@pytest.fixture
async def fake() -> AsyncIterator[tuple[GraphFake, str]]:
    graph = GraphFake()
    async with serving(graph.app()) as base:
        yield graph, base


@pytest.fixture
async def fb(fake: tuple[GraphFake, str]) -> AsyncIterator[MessengerProvider]:
    graph, base = fake
    provider = MessengerProvider(graph.page_token, api_url=f"{base}/{VERSION}")
    yield provider
    await provider.close()


# -- sending ------------------------------------------------------------------------------


async def test_text_goes_to_me_messages_and_returns_the_mid(
    fake: tuple[GraphFake, str], fb: MessengerProvider
) -> None:
    graph, _ = fake
    result = await fb.send(Outbound(PSID, "hello"))
    [got] = graph.accepted["messenger"]
    assert result.message_id == got.id and got.id.startswith("m_")
    assert got.body == {
        "recipient": {"id": PSID},
        "messaging_type": "RESPONSE",
        "message": {"text": "hello"},
    }
    assert (fb.name, fb.text_limit, fb.media_channel) == ("messenger", 2000, "messenger")


async def test_a_message_tag_is_sent_as_message_tag(
    fake: tuple[GraphFake, str], fb: MessengerProvider
) -> None:
    graph, _ = fake
    await fb.send(Outbound(PSID, "update", options={"tag": "HUMAN_AGENT"}))
    body = graph.accepted["messenger"][0].body
    assert body["messaging_type"] == "MESSAGE_TAG" and body["tag"] == "HUMAN_AGENT"


@pytest.mark.parametrize(
    ("media", "kind"),
    [
        (Media(url="https://example.com/cat.jpg", mime="image/jpeg"), "image"),
        (Media(url="https://example.com/clip.mp4"), "video"),
        (Media(url="https://example.com/voice.mp3", mime="audio/mpeg"), "audio"),
        (Media(url="https://example.com/report.pdf", mime="application/pdf"), "file"),
        (Media(url="https://example.com/p/cat.jpg?size=large"), "image"),
        (Media(url="https://example.com/smile.webp"), "image"),  # no stickers here
    ],
)
async def test_media_by_url_is_a_reusable_attachment(
    fake: tuple[GraphFake, str], fb: MessengerProvider, media: Media, kind: str
) -> None:
    graph, _ = fake
    await fb.send(Outbound(PSID, None, media))
    assert graph.accepted["messenger"][0].body["message"] == {
        "attachment": {"type": kind, "payload": {"url": media.url, "is_reusable": True}}
    }


async def test_bytes_are_uploaded_as_filedata_in_the_same_call(
    fake: tuple[GraphFake, str], fb: MessengerProvider
) -> None:
    graph, _ = fake
    result = await fb.send(Outbound(PSID, None, Media(data=b"\x89PNG", name="a.png")))
    [got] = graph.accepted["messenger"]
    assert result.message_id == got.id
    assert got.body["recipient"] == {"id": PSID}
    assert got.body["message"] == {
        "attachment": {"type": "image", "payload": {"is_reusable": True}}
    }
    assert got.body["filedata"] == {"filename": "a.png", "content_type": "image/png", "size": 4}


async def test_text_and_media_together_are_refused_before_any_call(
    fake: tuple[GraphFake, str], fb: MessengerProvider
) -> None:
    graph, _ = fake
    with pytest.raises(UnsupportedContentError, match="not both"):
        await fb.send(Outbound(PSID, "caption", Media(url="https://example.com/a.jpg")))
    assert graph.accepted["messenger"] == []


# -- each error mapping, against the fake ----------------------------------------------------


async def test_a_closed_window_is_outside_session(
    fake: tuple[GraphFake, str], fb: MessengerProvider
) -> None:
    graph, _ = fake
    graph.closed_windows.add(PSID)
    with pytest.raises(OutsideSessionWindowError, match="2018278") as err:
        await fb.send(Outbound(PSID, "hi"))
    assert err.value.retryable is False


async def test_551_saying_outside_window_is_outside_session(
    fake: tuple[GraphFake, str], fb: MessengerProvider
) -> None:
    graph, _ = fake
    graph.fail_next(
        "messenger", 551, message="(#551) This message is sent outside of allowed window."
    )
    with pytest.raises(OutsideSessionWindowError):
        await fb.send(Outbound(PSID, "hi"))


async def test_an_unavailable_person_is_unreachable(
    fake: tuple[GraphFake, str], fb: MessengerProvider
) -> None:
    graph, _ = fake
    graph.unavailable.add(PSID)
    with pytest.raises(RecipientUnreachableError, match="isn't available") as err:
        await fb.send(Outbound(PSID, "hi"))
    assert err.value.retryable is False


async def test_an_unknown_psid_is_unreachable(fb: MessengerProvider) -> None:
    with pytest.raises(RecipientUnreachableError, match="No matching user found"):
        await fb.send(Outbound("99999", "hi"))


async def test_a_text_over_2000_is_too_large(
    fake: tuple[GraphFake, str], fb: MessengerProvider
) -> None:
    graph, _ = fake
    await fb.send(Outbound(PSID, "x" * 2000))
    with pytest.raises(PayloadTooLargeError, match="less than or equal to 2000"):
        await fb.send(Outbound(PSID, "x" * 2001))
    assert len(graph.accepted["messenger"]) == 1


async def test_an_attachment_over_the_size_limit_is_too_large(
    fake: tuple[GraphFake, str], fb: MessengerProvider
) -> None:
    graph, _ = fake
    graph.fail_next(
        "messenger", 4, subcode=2018109, message="Attachment size exceeds allowable limit"
    )
    with pytest.raises(PayloadTooLargeError):
        await fb.send(Outbound(PSID, None, Media(url="https://example.com/big.mp4")))


@pytest.mark.parametrize(("code", "wait"), [(613, 60.0), (4, 60.0), (32, 60.0), (17, 60.0)])
async def test_call_limits_are_rate_limits(
    fake: tuple[GraphFake, str], fb: MessengerProvider, code: int, wait: float
) -> None:
    graph, _ = fake
    graph.fail_next("messenger", code)
    with pytest.raises(RateLimitedError) as err:
        await fb.send(Outbound(PSID, "hi"))
    assert err.value.retry_after == wait
    graph.fail_next("messenger", code, status=429, headers={"Retry-After": "12"})
    with pytest.raises(RateLimitedError) as err:
        await fb.send(Outbound(PSID, "hi"))
    assert err.value.retry_after == 12.0


@pytest.mark.parametrize("code", [1, 2, 1200])
async def test_temporary_failures_are_retryable(
    fake: tuple[GraphFake, str], fb: MessengerProvider, code: int
) -> None:
    graph, _ = fake
    graph.fail_next("messenger", code)
    with pytest.raises(SendError) as err:
        await fb.send(Outbound(PSID, "hi"))
    assert type(err.value) is SendError and err.value.retryable is True


async def test_another_4xx_is_final(fake: tuple[GraphFake, str], fb: MessengerProvider) -> None:
    graph, _ = fake
    graph.fail_next("messenger", 200, message="(#200) The user hasn't authorized the app")
    with pytest.raises(SendError) as err:
        await fb.send(Outbound(PSID, "hi"))
    assert type(err.value) is SendError and err.value.retryable is False


async def test_a_wrong_page_token_is_final_and_never_shown(
    fake: tuple[GraphFake, str], caplog: pytest.LogCaptureFixture
) -> None:
    graph, base = fake
    caplog.set_level(logging.DEBUG)
    bad = "EAAbad-page-token-never-shown"
    provider = MessengerProvider(bad, api_url=f"{base}/{VERSION}")
    try:
        with pytest.raises(SendError, match="MESSENGER_PAGE_TOKEN") as err:
            await provider.send(Outbound(PSID, "hi"))
    finally:
        await provider.close()
    assert err.value.retryable is False
    assert bad not in str(err.value) and bad not in caplog.text
    graph.fail_next("messenger", 190, message=f"Malformed access token {graph.page_token}")
    good = MessengerProvider(graph.page_token, api_url=f"{base}/{VERSION}")
    try:
        with pytest.raises(SendError) as err:
            await good.send(Outbound(PSID, "hi"))
    finally:
        await good.close()
    assert graph.page_token not in str(err.value) and graph.page_token not in caplog.text


# -- typing -------------------------------------------------------------------------------


async def test_typing_sends_the_typing_on_sender_action(
    fake: tuple[GraphFake, str], fb: MessengerProvider
) -> None:
    graph, _ = fake
    assert isinstance(fb, Typing)
    # The Send API cannot edit or delete a message.
    assert not isinstance(fb, Edits) and not isinstance(fb, Deletes)
    await fb.typing(PSID)
    assert graph.actions["messenger"] == [(PSID, "typing_on")]
    assert graph.accepted["messenger"] == []


async def test_typing_maps_errors_as_send_does(
    fake: tuple[GraphFake, str], fb: MessengerProvider
) -> None:
    graph, base = fake
    with pytest.raises(RecipientUnreachableError, match="No matching user found"):
        await fb.typing("99999")
    graph.fail_next("messenger", 613)
    with pytest.raises(RateLimitedError):
        await fb.typing(PSID)
    wrong = MessengerProvider("EAAnot-the-page-token", api_url=f"{base}/{VERSION}")
    try:
        with pytest.raises(SendError) as err:
            await wrong.typing(PSID)
    finally:
        await wrong.close()
    assert err.value.retryable is False
    assert graph.actions["messenger"] == []


# -- media downloads ---------------------------------------------------------------------


async def test_an_attachment_url_on_127_0_0_1_is_refused_without_allow_private_media(
    fake: tuple[GraphFake, str], fb: MessengerProvider
) -> None:
    graph, base = fake
    graph.cdn["cat.jpg"] = b"jpeg"
    port = base.rsplit(":", 1)[1]
    with pytest.raises(MediaUrlRefused, match="private or loopback"):
        await fb.download_media(Media(provider="messenger", url=f"https://127.0.0.1:{port}/cdn/x"))
    with pytest.raises(MediaUrlRefused):
        await fb.download_media(Media(provider="messenger", url=f"{base}/cdn/cat.jpg"))
    with pytest.raises(MediaUrlRefused):
        await fb.fetch_media(f"{base}/cdn/cat.jpg")


async def test_an_attachment_url_downloads_when_private_media_is_allowed(
    fake: tuple[GraphFake, str],
) -> None:
    graph, base = fake
    graph.cdn["cat.jpg"] = b"jpeg-bytes"
    provider = MessengerProvider(
        graph.page_token, api_url=f"{base}/{VERSION}", allow_private_media=True
    )
    try:
        assert (
            await provider.download_media(Media(provider="messenger", url=f"{base}/cdn/cat.jpg"))
            == b"jpeg-bytes"
        )
    finally:
        await provider.close()


# -- from_env ---------------------------------------------------------------------------


def test_from_env() -> None:
    p = MessengerProvider.from_env({"MESSENGER_PAGE_TOKEN": "tok"})
    assert p.api_url == "https://graph.facebook.com/v21.0"
    p = MessengerProvider.from_env(
        {
            "MESSENGER_PAGE_TOKEN": "tok",
            "MESSENGER_API_URL": "http://127.0.0.1:1/v21.0",
            "MESSENGER_ALLOW_PRIVATE_MEDIA": "1",
        }
    )
    assert p.allow_private_media and p.api_url == "http://127.0.0.1:1/v21.0"
    p = MessengerProvider.from_env(
        {"MESSENGER_PAGE_TOKEN": "tok", "MESSENGER_MEDIA_REF_HOSTS": "fbcdn.net"}
    )
    assert p.media_ref_hosts == ("fbcdn.net",) and not p.allow_private_media
    with pytest.raises(ConfigError, match="MESSENGER_PAGE_TOKEN"):
        MessengerProvider.from_env({})
    hook = MessengerWebhook.from_env(
        {"META_APP_SECRET": "s", "META_VERIFY_TOKEN": "v", "MESSENGER_VERIFY_TOKEN": "own"}
    )
    ok = {"hub.mode": "subscribe", "hub.verify_token": "own", "hub.challenge": "c"}
    reply = hook.handshake(_request(b"", method="GET", query=ok))
    assert reply is not None and reply.status == 200


# -- webhooks ---------------------------------------------------------------------------


def _request(
    body: bytes,
    *,
    method: str = "POST",
    query: dict[str, str] | None = None,
    signature: str | None = None,
) -> WebhookRequest:
    headers = {"content-type": "application/json"}
    if signature is not None:
        headers["x-hub-signature-256"] = signature
    return WebhookRequest(
        method, "/messenger", "https://bot.example.com/messenger", headers, query or {}, body
    )


def _page(*events: dict[str, Any]) -> bytes:
    return json.dumps(
        {
            "object": "page",
            "entry": [{"id": PAGE, "time": 1458692752478, "messaging": list(events)}],
        }
    ).encode()


def _event(**what: Any) -> dict[str, Any]:
    return {"sender": {"id": PSID}, "recipient": {"id": PAGE}, "timestamp": 1458692752478, **what}


@pytest.fixture
def hook() -> MessengerWebhook:
    return MessengerWebhook(SECRET, VERIFY)


def test_handshake(hook: MessengerWebhook) -> None:
    q = {"hub.mode": "subscribe", "hub.verify_token": VERIFY, "hub.challenge": "CHALLENGE_ACCEPTED"}
    reply = hook.handshake(_request(b"", method="GET", query=q))
    assert reply is not None and (reply.status, reply.body) == (200, b"CHALLENGE_ACCEPTED")
    reply = hook.handshake(_request(b"", method="GET", query={**q, "hub.verify_token": "no"}))
    assert reply is not None and reply.status == 403


def test_signature(hook: MessengerWebhook) -> None:
    body = _page(_event(message={"mid": "m_1", "text": "hi"}))
    hook.verify(_request(body, signature="sha256=" + hmac_hex(SECRET, body)))
    with pytest.raises(BadSignature):
        hook.verify(_request(body, signature="sha256=" + hmac_hex("other", body)))
    with pytest.raises(BadSignature):
        hook.verify(_request(body))


def test_parse_a_text_and_a_quick_reply(hook: MessengerWebhook) -> None:
    [rec] = hook.parse(
        _request(_page(_event(message={"mid": "m_AG5Hz2Uq7tuwNEhXfYYKj8mJEM_", "text": "hello"})))
    )
    assert (rec.id, rec.chat_id, rec.sender, rec.channel) == (
        "m_AG5Hz2Uq7tuwNEhXfYYKj8mJEM_",
        PSID,
        PSID,
        "messenger",
    )
    assert rec.text == "hello" and rec.kind == "message" and rec.ts == 1458692752.478
    [tap] = hook.parse(
        _request(
            _page(_event(message={"mid": "m_2", "text": "Red", "quick_reply": {"payload": "RED"}}))
        )
    )
    assert tap.kind == "interaction" and tap.text == "Red" and tap.data == {"payload": "RED"}


def test_parse_attachments_one_record_each(hook: MessengerWebhook) -> None:
    cdn = "https://scontent.xx.fbcdn.net/v/t1.15752-9/123_n.jpg?_nc_cat=1&oh=00_AfA&oe=6650A1B2"
    message = {
        "mid": "m_3",
        "attachments": [
            {"type": "image", "payload": {"url": cdn}},
            {"type": "file", "payload": {"url": "https://cdn.fbsbx.com/v/t59/doc.pdf?oh=1&oe=2"}},
            {"type": "fallback", "payload": None, "title": "a link", "URL": "https://x.test"},
        ],
    }
    first, second = hook.parse(_request(_page(_event(message=message))))
    assert first.id == "m_3" and second.id == "m_3:2"
    assert first.media == Media(
        provider="messenger", url=cdn, mime="image/*", extra={"type": "image"}
    )
    assert second.media is not None and second.media.mime == "application/octet-stream"


def test_parse_a_postback(hook: MessengerWebhook) -> None:
    postback = {"title": "Get Started", "payload": "GET_STARTED", "mid": "m_pb1"}
    [rec] = hook.parse(_request(_page(_event(postback=postback))))
    assert rec.kind == "interaction" and rec.id == "m_pb1"
    assert rec.text == "Get Started" and rec.data == {"payload": "GET_STARTED"}
    [old] = hook.parse(_request(_page(_event(postback={"title": "Go", "payload": "GO"}))))
    assert old.id == f"pb:{PSID}:1458692752478"


def test_echoes_reads_and_deliveries_give_no_record(hook: MessengerWebhook) -> None:
    echo = {
        "sender": {"id": PAGE},
        "recipient": {"id": PSID},
        "timestamp": 1458692752478,
        "message": {"is_echo": True, "app_id": 1517776481860111, "mid": "m_echo", "text": "hi"},
    }
    read = _event(read={"watermark": 1458668856253})
    delivery = {
        "sender": {"id": PSID},
        "recipient": {"id": PAGE},
        "delivery": {"mids": ["m_1"], "watermark": 1458668856253},
    }
    assert hook.parse(_request(_page(echo, read, delivery))) == []


def test_malformed(hook: MessengerWebhook) -> None:
    with pytest.raises(MalformedWebhook, match="expected 'page'"):
        hook.parse(_request(json.dumps({"object": "instagram", "entry": []}).encode()))
    with pytest.raises(MalformedWebhook):
        hook.parse(_request(_page(_event(message={"text": "no mid"}))))


def test_a_cdn_attachment_url_is_journaled_and_read_back(
    fb: MessengerProvider, hook: MessengerWebhook
) -> None:
    cdn = "https://scontent.xx.fbcdn.net/v/t1.15752-9/123_n.jpg?oh=00_AfA&oe=6650A1B2"
    message = {"mid": "m_9", "attachments": [{"type": "image", "payload": {"url": cdn}}]}
    [rec] = hook.parse(_request(_page(_event(message=message))))
    assert rec.media is not None
    stored = fb.serialize_media_ref(rec.media)
    assert stored is not None
    back = fb.rehydrate_media_ref(json.loads(json.dumps(stored)), rec.media)
    assert back.url is not None and back.url.startswith("https://scontent.xx.fbcdn.net/v/")
    assert "oh=00_AfA" in back.url and "oe=6650A1B2" in back.url
    assert back.provider == "messenger"

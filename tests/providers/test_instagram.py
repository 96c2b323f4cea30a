"""The Instagram adapter (Messenger Platform API) against the fake Graph API, and its webhook
on bodies written as Meta documents them."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

from botmesh.providers.instagram import InstagramProvider, InstagramWebhook
from botmesh.providers.webhooks import BadSignature, MalformedWebhook, WebhookRequest, hmac_hex
from botmesh.state.errors import (
    ConfigError,
    OutsideSessionWindowError,
    PayloadTooLargeError,
    RateLimitedError,
    RecipientUnreachableError,
    SendError,
)
from botmesh.state.messages import Media, Outbound
from tests.providers.fakes.graph import VERSION, GraphFake
from tests.providers.serve import serving

IGSID = "17841400000000001"
IG_ID = "17841405822304914"
SECRET = "meta-app-secret-xyz"


@pytest.fixture
async def fake() -> AsyncIterator[tuple[GraphFake, str]]:
    graph = GraphFake()
    async with serving(graph.app()) as base:
        yield graph, base


@pytest.fixture
async def ig(fake: tuple[GraphFake, str]) -> AsyncIterator[InstagramProvider]:
    graph, base = fake
    provider = InstagramProvider(graph.instagram_token, api_url=f"{base}/{VERSION}")
    yield provider
    await provider.close()


async def test_text_is_sent_and_recorded_as_instagram(
    fake: tuple[GraphFake, str], ig: InstagramProvider
) -> None:
    graph, _ = fake
    result = await ig.send(Outbound(IGSID, "hi there"))
    [got] = graph.accepted["instagram"]
    assert result.message_id == got.id and graph.accepted["messenger"] == []
    assert got.body["message"] == {"text": "hi there"} and got.body["recipient"] == {"id": IGSID}
    assert (ig.name, ig.text_limit, ig.media_channel) == ("instagram", 1000, "instagram")


async def test_a_text_over_1000_is_too_large(
    fake: tuple[GraphFake, str], ig: InstagramProvider
) -> None:
    graph, _ = fake
    await ig.send(Outbound(IGSID, "x" * 1000))
    with pytest.raises(PayloadTooLargeError, match="1000"):
        await ig.send(Outbound(IGSID, "x" * 1001))
    assert len(graph.accepted["instagram"]) == 1


async def test_instagram_errors(fake: tuple[GraphFake, str], ig: InstagramProvider) -> None:
    graph, _ = fake
    graph.closed_windows.add(IGSID)
    with pytest.raises(OutsideSessionWindowError, match="2534022"):
        await ig.send(Outbound(IGSID, "hi"))
    graph.closed_windows.clear()
    with pytest.raises(RecipientUnreachableError, match="2534014"):
        await ig.send(Outbound("404", "hi"))
    graph.unavailable.add(IGSID)
    with pytest.raises(RecipientUnreachableError, match="551"):
        await ig.send(Outbound(IGSID, "hi"))
    graph.unavailable.clear()
    graph.fail_next("instagram", 613)
    with pytest.raises(RateLimitedError) as err:
        await ig.send(Outbound(IGSID, "hi"))
    assert err.value.retry_after == 60.0
    graph.fail_next("instagram", 2)
    with pytest.raises(SendError) as serr:
        await ig.send(Outbound(IGSID, "hi"))
    assert serr.value.retryable is True
    assert graph.accepted["instagram"] == []


async def test_typing_is_a_typing_on_sender_action(
    fake: tuple[GraphFake, str], ig: InstagramProvider
) -> None:
    graph, _ = fake
    await ig.typing(IGSID)
    assert graph.actions["instagram"] == [(IGSID, "typing_on")]
    with pytest.raises(RecipientUnreachableError, match="2534014"):
        await ig.typing("404")
    graph.fail_next("instagram", 613)
    with pytest.raises(RateLimitedError):
        await ig.typing(IGSID)
    assert graph.actions["messenger"] == []


async def test_the_messenger_token_does_not_send_as_instagram_and_no_token_leaks(
    fake: tuple[GraphFake, str], caplog: pytest.LogCaptureFixture
) -> None:
    _, base = fake
    caplog.set_level(logging.DEBUG)
    provider = InstagramProvider("EAAnot-the-ig-token", api_url=f"{base}/{VERSION}")
    try:
        with pytest.raises(SendError, match="INSTAGRAM_ACCESS_TOKEN") as err:
            await provider.send(Outbound(IGSID, "hi"))
    finally:
        await provider.close()
    assert err.value.retryable is False
    assert "EAAnot-the-ig-token" not in str(err.value) + caplog.text


def test_from_env() -> None:
    p = InstagramProvider.from_env({"INSTAGRAM_ACCESS_TOKEN": "tok"})
    assert p.api_url == "https://graph.facebook.com/v21.0" and p.name == "instagram"
    with pytest.raises(ConfigError, match="INSTAGRAM_ACCESS_TOKEN"):
        InstagramProvider.from_env({"MESSENGER_PAGE_TOKEN": "tok"})
    with pytest.raises(ConfigError, match="INSTAGRAM_ALLOW_PRIVATE_MEDIA"):
        InstagramProvider.from_env(
            {"INSTAGRAM_ACCESS_TOKEN": "tok", "INSTAGRAM_ALLOW_PRIVATE_MEDIA": "yes"}
        )
    hook = InstagramWebhook.from_env({"META_APP_SECRET": "s", "META_VERIFY_TOKEN": "v"})
    assert hook.channel == "instagram"


# -- webhooks ---------------------------------------------------------------------------


def _request(body: bytes, signature: str | None = None) -> WebhookRequest:
    headers = {"x-hub-signature-256": signature} if signature else {}
    return WebhookRequest(
        "POST", "/instagram", "https://bot.example.com/instagram", headers, {}, body
    )


def _ig(*events: dict[str, Any]) -> bytes:
    return json.dumps(
        {
            "object": "instagram",
            "entry": [{"time": 1569262486134, "id": IG_ID, "messaging": list(events)}],
        }
    ).encode()


def _event(**what: Any) -> dict[str, Any]:
    return {"sender": {"id": IGSID}, "recipient": {"id": IG_ID}, "timestamp": 1569262485349, **what}


@pytest.fixture
def hook() -> InstagramWebhook:
    return InstagramWebhook(SECRET, "verify")


def test_signature(hook: InstagramWebhook) -> None:
    body = _ig(_event(message={"mid": "aWdfZAG1", "text": "hi"}))
    hook.verify(_request(body, "sha256=" + hmac_hex(SECRET, body)))
    with pytest.raises(BadSignature):
        hook.verify(_request(body, "sha256=" + "0" * 64))


def test_parse_text_media_story_mention_and_postback(hook: InstagramWebhook) -> None:
    url = "https://lookaside.fbsbx.com/ig_messaging_cdn/?asset_id=17895695668004550&signature=Ab"
    story = "https://scontent.cdninstagram.com/v/t51.2885-15/123_n.jpg?oh=1&oe=2"
    body = _ig(
        _event(message={"mid": "aWdfZAG1_text", "text": "hello"}),
        _event(
            message={
                "mid": "aWdfZAG1_img",
                "attachments": [{"type": "image", "payload": {"url": url}}],
            }
        ),
        _event(
            message={
                "mid": "aWdfZAG1_story",
                "attachments": [{"type": "story_mention", "payload": {"url": story}}],
            }
        ),
        _event(postback={"mid": "aWdfZAG1_pb", "title": "Yes", "payload": "YES"}),
    )
    text, image, mention, postback = hook.parse(_request(body))
    assert (text.id, text.chat_id, text.channel, text.text) == (
        "aWdfZAG1_text",
        IGSID,
        "instagram",
        "hello",
    )
    assert image.media == Media(
        provider="instagram", url=url, mime="image/*", extra={"type": "image"}
    )
    assert mention.media is not None and mention.media.url == story
    assert mention.media.mime is None and mention.media.extra == {"type": "story_mention"}
    assert postback.kind == "interaction" and postback.data == {"payload": "YES"}


def test_echoes_deletions_and_reads_give_no_record(hook: InstagramWebhook) -> None:
    echo = {
        "sender": {"id": IG_ID},
        "recipient": {"id": IGSID},
        "timestamp": 1569262485349,
        "message": {"mid": "aWdfZAG1_echo", "text": "ours", "is_echo": True},
    }
    deleted = _event(message={"mid": "aWdfZAG1_del", "is_deleted": True})
    read = _event(read={"mid": "aWdfZAG1_text"})
    assert hook.parse(_request(_ig(echo, deleted, read))) == []


def test_a_page_webhook_is_not_instagram(hook: InstagramWebhook) -> None:
    with pytest.raises(MalformedWebhook, match="expected 'instagram'"):
        hook.parse(_request(json.dumps({"object": "page", "entry": []}).encode()))

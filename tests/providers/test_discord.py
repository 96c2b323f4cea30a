"""The Discord adapter against the fake REST API (real HTTP on 127.0.0.1), and its
Interactions Endpoint webhook on signed bodies."""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from botmesh.providers.discord import DiscordProvider, DiscordWebhook, nonce_of
from botmesh.providers.http import MediaUrlRefused
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
from botmesh.state.messages import Media, Outbound
from botmesh.state.ports import (
    AmbiguityResolver,
    Deletes,
    Edits,
    KeyedSends,
    MediaDownloads,
    MediaRefs,
    Provider,
    Typing,
)
from tests.providers.fakes.discord import FakeDiscord
from tests.providers.serve import serving

TOKEN = "MTEwMDAwMDAwMDAwMDAwMDAwMQ.GhJkLm.s3cr3tPartOfTheDiscordBotTokenXYZ"
CH = "2200000000000000001"
CH2 = "2200000000000000002"


@dataclass
class Env:
    fake: FakeDiscord
    dc: DiscordProvider
    base: str


@pytest.fixture(autouse=True)
def no_token_in_logs(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    caplog.set_level(logging.DEBUG)
    yield
    logged = [r.getMessage() for when in ("setup", "call") for r in caplog.get_records(when)]
    assert all(TOKEN not in line for line in logged)


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    fake = FakeDiscord(TOKEN)
    async with serving(fake.app()) as base:
        dc = DiscordProvider(
            TOKEN,
            base_url=f"{base}/api/v10",
            allow_private_media=True,
            media_ref_hosts=["127.0.0.1"],
        )
        try:
            yield Env(fake, dc, base)
        finally:
            await dc.close()


def clean(exc: BaseException) -> str:
    assert TOKEN not in str(exc)
    assert TOKEN not in repr(exc.args)
    return str(exc)


# -- shape ----------------------------------------------------------------------------------


def test_the_provider_has_the_channel_contract() -> None:
    dc = DiscordProvider(TOKEN)
    assert (dc.name, dc.media_channel, dc.text_limit) == ("discord", "discord", 2000)
    for port in (Provider, KeyedSends, AmbiguityResolver, MediaRefs, MediaDownloads):
        assert isinstance(dc, port)
    assert dc.media_hosts == ("discordapp.com", "discordapp.net")
    assert dc.nonce_window == 60


def test_the_nonce_is_25_characters_and_deterministic() -> None:
    n = nonce_of("inbound-1:1")
    assert len(n) == 25
    assert n == nonce_of("inbound-1:1")
    assert n != nonce_of("inbound-1:1#2")


def test_from_env() -> None:
    dc = DiscordProvider.from_env(
        {
            "DISCORD_BOT_TOKEN": TOKEN,
            "DISCORD_API_URL": "http://127.0.0.1:9/api/v10/",
            "DISCORD_ALLOW_PRIVATE_MEDIA": "1",
        }
    )
    assert (dc.base_url, dc.allow_private_media) == ("http://127.0.0.1:9/api/v10", True)
    assert DiscordProvider.from_env({"DISCORD_BOT_TOKEN": TOKEN}).base_url == (
        "https://discord.com/api/v10"
    )


@pytest.mark.parametrize(
    ("env", "field"),
    [
        ({}, "DISCORD_BOT_TOKEN"),
        ({"DISCORD_BOT_TOKEN": f"Bot {TOKEN}"}, "DISCORD_BOT_TOKEN"),
        ({"DISCORD_BOT_TOKEN": TOKEN, "DISCORD_API_URL": "http://x.example"}, "DISCORD_API_URL"),
        (
            {"DISCORD_BOT_TOKEN": TOKEN, "DISCORD_ALLOW_PRIVATE_MEDIA": "1"},
            "DISCORD_ALLOW_PRIVATE_MEDIA",
        ),
    ],
)
def test_from_env_refuses_bad_settings(env: dict[str, str], field: str) -> None:
    with pytest.raises(ConfigError) as err:
        DiscordProvider.from_env(env)
    assert err.value.field == field
    assert TOKEN not in str(err.value)


@pytest.mark.parametrize("window", [0, -1, 121])
def test_a_nonce_window_beyond_discords_is_refused(window: float) -> None:
    with pytest.raises(ConfigError) as err:
        DiscordProvider(TOKEN, nonce_window=window)
    assert err.value.field == "nonce_window"


# -- sending --------------------------------------------------------------------------------


async def test_send_posts_the_content_and_returns_the_message_id(env: Env) -> None:
    result = await env.dc.send(Outbound(CH, "hello"))
    [msg] = env.fake.messages
    assert (result.message_id, msg.channel_id, msg.content, msg.nonce) == (
        msg.id,
        CH,
        "hello",
        None,
    )
    assert "enforce_nonce" not in msg.payload


async def test_options_pass_through(env: Env) -> None:
    embeds = [{"title": "t", "description": "d"}]
    await env.dc.send(Outbound(CH, "hi", options={"embeds": embeds, "tts": False}))
    assert env.fake.messages[0].payload["embeds"] == embeds


async def test_send_keyed_carries_the_nonce_and_a_resend_is_not_a_second_message(
    env: Env,
) -> None:
    first = await env.dc.send_keyed(Outbound(CH, "once"), "in-1:1")
    again = await env.dc.send_keyed(Outbound(CH, "once"), "in-1:1")
    other = await env.dc.send_keyed(Outbound(CH, "once"), "in-1:2")
    assert first == again
    assert other != first
    assert [m.nonce for m in env.fake.messages] == [nonce_of("in-1:1"), nonce_of("in-1:2")]
    assert env.fake.messages[0].payload["enforce_nonce"] is True


async def test_the_fake_forgets_a_nonce_after_its_window() -> None:
    now = [0.0]
    fake = FakeDiscord(TOKEN, nonce_window=120, clock=lambda: now[0])
    async with serving(fake.app()) as base:
        dc = DiscordProvider(TOKEN, base_url=f"{base}/api/v10")
        try:
            a = await dc.send_keyed(Outbound(CH, "x"), "k")
            now[0] = 121.0
            b = await dc.send_keyed(Outbound(CH, "x"), "k")
        finally:
            await dc.close()
    assert a != b
    assert len(fake.messages) == 2


async def test_a_media_url_goes_in_the_content(env: Env) -> None:
    url = "https://cdn.example.com/cat.png"
    await env.dc.send(Outbound(CH, "a cat", media=Media(url=url, mime="image/png")))
    await env.dc.send(Outbound(CH, media=Media(url=url)))
    assert [m.content for m in env.fake.messages] == [f"a cat\n{url}", url]


async def test_bytes_are_uploaded_and_downloaded_back(env: Env) -> None:
    media = Media(data=b"\x89PNG...", mime="image/png", name="cat.png")
    result = await env.dc.send_keyed(Outbound(CH, "look", media=media), "k-up")
    [msg] = env.fake.messages
    assert (msg.id, msg.content, msg.nonce) == (result.message_id, "look", nonce_of("k-up"))
    [att] = msg.attachments
    assert (att.filename, att.content_type, att.data) == ("cat.png", "image/png", b"\x89PNG...")
    url = f"{env.base}/attachments/{CH}/{att.id}/cat.png"
    got = await env.dc.download_media(Media(provider="discord", url=url, mime="image/png"))
    assert got == b"\x89PNG..."


async def test_a_file_at_a_path_is_uploaded(env: Env, tmp_path: Path) -> None:
    f = tmp_path / "notes.txt"
    f.write_bytes(b"notes")
    await env.dc.send(Outbound(CH, media=Media(path=str(f), mime="text/plain")))
    assert env.fake.messages[0].attachments[0].filename == "notes.txt"


async def test_downloads_come_from_the_cdn_hosts_only(env: Env) -> None:
    dc = DiscordProvider(TOKEN, base_url=f"{env.base}/api/v10", allow_private_media=True)
    try:
        with pytest.raises(MediaUrlRefused) as err:
            await dc.download_media(Media(url=f"{env.base}/attachments/{CH}/1/x.png"))
    finally:
        await dc.close()
    assert "not an allowed media host" in str(err.value)


async def test_a_chat_id_that_is_not_a_snowflake_is_refused_before_the_call(env: Env) -> None:
    with pytest.raises(RecipientUnreachableError):
        await env.dc.send(Outbound("../users/@me", "hi"))
    assert env.fake.calls == 0


# -- ambiguity ------------------------------------------------------------------------------


async def test_an_answer_lost_after_the_message_went_out_resolves_to_that_message(
    env: Env,
) -> None:
    message = Outbound(CH, "important")
    since = time.time()
    env.fake.lose_next_answer()
    with pytest.raises(SendError) as err:
        await env.dc.send_keyed(message, "in-7:1")
    assert err.value.retryable is True
    [original] = env.fake.messages  # it went out
    result = await env.dc.resolve_ambiguous(message, "in-7:1", since)
    assert result is not None
    assert result.message_id == original.id
    assert len(env.fake.messages) == 1
    assert env.fake.calls == 2


async def test_a_send_that_never_went_out_is_sent_once_by_resolve(env: Env) -> None:
    message = Outbound(CH, "important")
    since = time.time()
    env.fake.drop_next_request()
    with pytest.raises(SendError):
        await env.dc.send_keyed(message, "in-8:1")
    assert env.fake.messages == []
    result = await env.dc.resolve_ambiguous(message, "in-8:1", since)
    [msg] = env.fake.messages
    assert result is not None
    assert result.message_id == msg.id


async def test_after_the_nonce_window_resolve_cannot_tell(env: Env) -> None:
    message = Outbound(CH, "important")
    since = time.time() - env.dc.nonce_window - 1
    with pytest.raises(ProviderError) as err:
        await env.dc.resolve_ambiguous(message, "in-9:1", since)
    assert "cannot tell" in str(err.value)
    assert env.fake.calls == 0


# -- error mapping, one test each -----------------------------------------------------------


async def test_wrong_token_is_final_and_says_so(env: Env) -> None:
    dc = DiscordProvider("wrong.token.value", base_url=f"{env.base}/api/v10")
    try:
        with pytest.raises(SendError) as err:
            await dc.send(Outbound(CH, "hi"))
    finally:
        await dc.close()
    assert type(err.value) is SendError
    assert err.value.retryable is False
    assert "token is wrong" in str(err.value)
    assert "wrong.token.value" not in str(err.value)


async def test_rate_limit_takes_retry_after_from_the_body(env: Env) -> None:
    env.fake.rate_limit(1.5)
    with pytest.raises(RateLimitedError) as err:
        await env.dc.send(Outbound(CH, "hi"))
    assert err.value.retry_after == 1.5  # the header says 2
    assert "route limit" in clean(err.value)
    env.fake.rate_limit(0.25, glob=True)
    with pytest.raises(RateLimitedError) as err:
        await env.dc.send(Outbound(CH, "hi"))
    assert err.value.retry_after == 0.25
    assert "global limit" in clean(err.value)
    assert env.fake.messages == []


@pytest.mark.parametrize(
    ("where", "code"),
    [("blocked_dms", 50007), ("no_access", 50001), ("no_permission", 50013), (None, 10003)],
)
async def test_unreachable_recipients(env: Env, where: str | None, code: int) -> None:
    chat = "3300000000000000009"
    if where is not None:
        getattr(env.fake, where).add(chat)
    with pytest.raises(RecipientUnreachableError) as err:
        await env.dc.send(Outbound(chat, "hi"))
    assert f"code {code}" in clean(err.value)
    assert err.value.retryable is False


async def test_content_over_2000_is_payload_too_large(env: Env) -> None:
    with pytest.raises(PayloadTooLargeError) as err:
        await env.dc.send(Outbound(CH, "x" * 2001))
    assert "content: BASE_TYPE_MAX_LENGTH" in clean(err.value)
    assert env.fake.messages == []


async def test_content_at_2000_goes_out(env: Env) -> None:
    await env.dc.send(Outbound(CH, "x" * 2000))
    assert len(env.fake.messages) == 1


async def test_another_invalid_form_body_is_final(env: Env) -> None:
    embeds = [{"description": "d" * 4097}]
    with pytest.raises(SendError) as err:
        await env.dc.send(Outbound(CH, "hi", options={"embeds": embeds}))
    assert type(err.value) is SendError
    assert err.value.retryable is False
    assert "embeds.0.description: BASE_TYPE_MAX_LENGTH" in clean(err.value)


async def test_an_upload_over_the_limit_is_payload_too_large() -> None:
    fake = FakeDiscord(TOKEN, max_upload=1000)
    async with serving(fake.app()) as base:
        dc = DiscordProvider(TOKEN, base_url=f"{base}/api/v10")
        try:
            with pytest.raises(PayloadTooLargeError) as err:
                await dc.send(Outbound(CH, media=Media(data=b"x" * 5000, name="big.bin")))
        finally:
            await dc.close()
    assert "code 40005" in clean(err.value)


async def test_an_empty_message_is_unsupported_content(env: Env) -> None:
    with pytest.raises(UnsupportedContentError) as err:
        await env.dc.send(Outbound(CH, ""))
    assert "code 50006" in clean(err.value)


@pytest.mark.parametrize("status", [500, 502, 503])
async def test_server_errors_are_retryable(env: Env, status: int) -> None:
    env.fake.fail_next(status)
    with pytest.raises(SendError) as err:
        await env.dc.send(Outbound(CH, "hi"))
    assert err.value.retryable is True
    assert str(status) in clean(err.value)


async def test_another_4xx_is_final(env: Env) -> None:
    env.fake.fail_next(403, "Cannot send messages in a non-text channel", 50008)
    with pytest.raises(SendError) as err:
        await env.dc.send(Outbound(CH, "hi"))
    assert type(err.value) is SendError
    assert err.value.retryable is False
    assert "non-text channel" in clean(err.value)


async def test_errors_are_logged_without_the_token(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    env.fake.rate_limit(1.5)
    with pytest.raises(RateLimitedError):
        await env.dc.send(Outbound(CH, "hi"))
    with pytest.raises(RecipientUnreachableError):
        await env.dc.send(Outbound("3300000000000000009", "hi"))
    lines = [r.getMessage() for r in caplog.records if r.name == "botmesh.providers.discord"]
    assert any("rate limited" in line for line in lines)
    assert any("Unknown Channel" in line for line in lines)
    assert all(TOKEN not in line for line in lines)


async def test_transport_error_is_retryable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dc = DiscordProvider(TOKEN, base_url=f"http://127.0.0.1:{port}/api/v10")
    try:
        with pytest.raises(SendError) as err:
            await dc.send(Outbound(CH, "hi"))
    finally:
        await dc.close()
    assert err.value.retryable is True
    clean(err.value)


# -- edit, delete, typing -------------------------------------------------------------------


async def test_edit_replaces_the_content_and_keeps_the_id(env: Env) -> None:
    assert isinstance(env.dc, Edits)
    sent = await env.dc.send(Outbound(CH, "draft"))
    edited = await env.dc.edit(Outbound(CH, "final"), sent.message_id)
    assert edited.message_id == sent.message_id
    assert [m.content for m in env.fake.in_channel(CH)] == ["final"]


async def test_editing_an_unknown_message_is_final(env: Env) -> None:
    with pytest.raises(SendError) as err:
        await env.dc.edit(Outbound(CH, "x"), "1300000000000009999")
    assert err.value.retryable is False
    assert "Unknown Message" in clean(err.value)
    with pytest.raises(SendError) as bad:
        await env.dc.edit(Outbound(CH, "x"), "not-a-snowflake")
    assert bad.value.retryable is False


async def test_an_edit_over_2000_is_payload_too_large(env: Env) -> None:
    sent = await env.dc.send(Outbound(CH, "short"))
    with pytest.raises(PayloadTooLargeError):
        await env.dc.edit(Outbound(CH, "x" * 2001), sent.message_id)
    assert [m.content for m in env.fake.in_channel(CH)] == ["short"]


async def test_delete_removes_the_message_and_twice_is_fine(env: Env) -> None:
    assert isinstance(env.dc, Deletes)
    keep = await env.dc.send(Outbound(CH, "keep"))
    gone = await env.dc.send(Outbound(CH, "gone"))
    await env.dc.delete(CH, gone.message_id)
    assert [m.id for m in env.fake.in_channel(CH)] == [keep.message_id]
    await env.dc.delete(CH, gone.message_id)  # 404 Unknown Message: already gone
    with pytest.raises(RecipientUnreachableError):
        await env.dc.delete("2200000000000000999", gone.message_id)  # Unknown Channel


async def test_typing_is_recorded(env: Env) -> None:
    assert isinstance(env.dc, Typing)
    await env.dc.typing(CH)
    assert env.fake.typing == [CH]
    env.fake.blocked_dms.add(CH2)
    with pytest.raises(RecipientUnreachableError):
        await env.dc.typing(CH2)


async def test_edit_delete_and_typing_map_errors_as_send_does(env: Env) -> None:
    sent = await env.dc.send(Outbound(CH, "hi"))
    env.fake.rate_limit(1.5, times=3)
    for call in (
        env.dc.edit(Outbound(CH, "x"), sent.message_id),
        env.dc.delete(CH, sent.message_id),
        env.dc.typing(CH),
    ):
        with pytest.raises(RateLimitedError) as err:
            await call
        assert err.value.retry_after == 1.5
    env.fake.fail_next(503)
    with pytest.raises(SendError) as down:
        await env.dc.delete(CH, sent.message_id)
    assert down.value.retryable is True
    dc = DiscordProvider("wrong.token.value", base_url=f"{env.base}/api/v10")
    try:
        with pytest.raises(SendError) as refused:
            await dc.edit(Outbound(CH, "x"), sent.message_id)
    finally:
        await dc.close()
    assert refused.value.retryable is False
    assert "token is wrong" in str(refused.value)
    assert [m.content for m in env.fake.in_channel(CH)] == ["hi"]


# -- webhook (Interactions Endpoint) --------------------------------------------------------

PRIVATE = Ed25519PrivateKey.generate()
PUBLIC_HEX = PRIVATE.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw).hex()
INTERACTION_TOKEN = "aW50ZXJhY3Rpb246MTIzNDU2Nzg5MDEyMzQ1Njc4OTp0b2tlbg"


def signed(
    body: Any, *, key: Ed25519PrivateKey = PRIVATE, stamp: str = "1767225600"
) -> WebhookRequest:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    sig = key.sign(stamp.encode() + raw).hex()
    headers = {"x-signature-ed25519": sig, "x-signature-timestamp": stamp}
    return WebhookRequest("POST", "/discord", "https://bot.example/discord", headers, {}, raw)


def interaction(kind: int, data: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "id": "1300000000000000123",
        "application_id": "1100000000000000001",
        "type": kind,
        "data": data,
        "guild_id": "4400000000000000001",
        "channel_id": CH,
        "member": {"user": {"id": "5500000000000000001", "username": "ann"}},
        "token": INTERACTION_TOKEN,
        "version": 1,
        **extra,
    }


def test_webhook_from_env() -> None:
    assert DiscordWebhook.from_env({"DISCORD_PUBLIC_KEY": PUBLIC_HEX}).channel == "discord"
    for env in ({}, {"DISCORD_PUBLIC_KEY": "abcd"}, {"DISCORD_PUBLIC_KEY": "zz" * 32}):
        with pytest.raises(ConfigError) as err:
            DiscordWebhook.from_env(env)
        assert err.value.field == "DISCORD_PUBLIC_KEY"


def test_verify_accepts_a_good_signature_and_refuses_the_rest() -> None:
    wh = DiscordWebhook(PUBLIC_HEX)
    body = interaction(2, {"name": "ping"})
    wh.verify(signed(body))
    good = signed(body)
    tampered = WebhookRequest(
        good.method, good.path, good.url, good.headers, {}, good.body.replace(b"ping", b"pong")
    )
    other_stamp = WebhookRequest(
        good.method,
        good.path,
        good.url,
        {**good.headers, "x-signature-timestamp": "1"},
        {},
        good.body,
    )
    unsigned = WebhookRequest(good.method, good.path, good.url, {}, {}, good.body)
    not_hex = WebhookRequest(
        good.method,
        good.path,
        good.url,
        {**good.headers, "x-signature-ed25519": "xyz"},
        {},
        good.body,
    )
    for bad in (
        tampered,
        other_stamp,
        unsigned,
        not_hex,
        signed(body, key=Ed25519PrivateKey.generate()),
    ):
        with pytest.raises(BadSignature):
            wh.verify(bad)


def test_ping_is_answered_type_1_and_produces_nothing() -> None:
    wh = DiscordWebhook(PUBLIC_HEX)
    req = signed({"id": "1", "application_id": "2", "type": 1, "version": 1})
    reply = wh.handshake(req)
    assert reply is not None
    assert (reply.status, json.loads(reply.body), reply.content_type) == (
        200,
        {"type": 1},
        "application/json",
    )
    assert wh.parse(req) == []
    assert wh.handshake(signed(interaction(2, {"name": "x"}))) is None


def test_parse_a_slash_command() -> None:
    options = [{"name": "city", "type": 3, "value": "Oslo"}]
    body = interaction(2, {"id": "77", "name": "weather", "type": 1, "options": options})
    [rec] = DiscordWebhook(PUBLIC_HEX).parse(signed(body))
    assert (rec.id, rec.kind, rec.chat_id, rec.channel, rec.sender, rec.text) == (
        "dc:1300000000000000123",
        "interaction",
        CH,
        "discord",
        "5500000000000000001",
        "weather",
    )
    assert rec.data["name"] == "weather"
    assert rec.data["options"] == options
    assert rec.ts == ((1300000000000000123 >> 22) + 1420070400000) / 1000
    assert INTERACTION_TOKEN not in json.dumps(rec.data)
    assert "token" not in rec.data


def test_parse_a_button_in_a_dm() -> None:
    body = interaction(3, {"custom_id": "vote:yes", "component_type": 2}, message={"id": "99"})
    del body["member"], body["guild_id"]
    body["user"] = {"id": "5500000000000000002"}
    [rec] = DiscordWebhook(PUBLIC_HEX).parse(signed(body))
    assert (rec.text, rec.sender) == ("vote:yes", "5500000000000000002")
    assert rec.data["custom_id"] == "vote:yes"
    assert rec.data["message_id"] == "99"


def test_parse_a_modal_submit() -> None:
    rows = [
        {"type": 1, "components": [{"type": 4, "custom_id": "name", "value": "Ann"}]},
        {"type": 1, "components": [{"type": 4, "custom_id": "why", "value": "because"}]},
    ]
    body = interaction(5, {"custom_id": "signup", "components": rows})
    [rec] = DiscordWebhook(PUBLIC_HEX).parse(signed(body))
    assert rec.text == "signup"
    assert rec.data["fields"] == {"name": "Ann", "why": "because"}


def test_parse_a_command_with_an_attachment() -> None:
    att: dict[str, Any] = {
        "id": "66",
        "filename": "a.png",
        "size": 3,
        "url": "https://cdn.discordapp.com/attachments/1/66/a.png?ex=1&is=2&hm=3",
        "content_type": "image/png",
    }
    data: dict[str, Any] = {
        "name": "upload",
        "options": [{"name": "file", "type": 11, "value": "66"}],
    }
    data["resolved"] = {"attachments": {"66": att}}
    [rec] = DiscordWebhook(PUBLIC_HEX).parse(signed(interaction(2, data)))
    assert rec.media == Media(
        provider="discord",
        url=att["url"],
        mime="image/png",
        name="a.png",
        extra={"id": "66", "size": 3},
    )


def test_autocomplete_produces_nothing_and_is_answered_with_no_choices() -> None:
    req = signed(interaction(4, {"name": "weather", "options": []}))
    wh = DiscordWebhook(PUBLIC_HEX)
    assert wh.parse(req) == []
    assert json.loads(wh.reply(req, []).body) == {"type": 8, "data": {"choices": []}}


@pytest.mark.parametrize(
    ("kind", "answer"),
    [
        (2, {"type": 4, "data": {"content": "On it.", "flags": 64}}),  # a command
        (5, {"type": 4, "data": {"content": "On it.", "flags": 64}}),  # a modal
        (3, {"type": 6}),  # a button: acknowledged, nothing shown
    ],
)
def test_an_interaction_is_acknowledged_at_once_never_left_thinking(
    kind: int, answer: dict[str, object]
) -> None:
    data = {"name": "weather"} if kind == 2 else {"custom_id": "b1", "components": []}
    req = signed(interaction(kind, data))
    wh = DiscordWebhook(PUBLIC_HEX, ack_text="On it.")
    reply = wh.reply(req, wh.parse(req))
    assert (reply.status, json.loads(reply.body), reply.content_type) == (
        200,
        answer,
        "application/json",
    )


@pytest.mark.parametrize("body", [b"not json", b"[]", b'{"type": 2}', b'{"id": "1"}'])
def test_a_body_that_is_not_an_interaction_is_malformed(body: bytes) -> None:
    with pytest.raises(MalformedWebhook):
        DiscordWebhook(PUBLIC_HEX).parse(signed(body))


def test_an_interaction_without_a_channel_is_malformed() -> None:
    body = interaction(2, {"name": "x"})
    del body["channel_id"]
    with pytest.raises(MalformedWebhook):
        DiscordWebhook(PUBLIC_HEX).parse(signed(body))

"""The Telegram adapter against the fake Bot API (real HTTP on 127.0.0.1), and its webhook on
recorded update bodies."""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from botmesh.providers.http import MediaUrlRefused
from botmesh.providers.telegram import TelegramProvider, TelegramWebhook
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
from tests.providers.fakes.telegram import FakeTelegram
from tests.providers.serve import serving

TOKEN = "123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw"
SECRET_HALF = TOKEN.split(":", 1)[1]


@dataclass
class Env:
    fake: FakeTelegram
    tg: TelegramProvider
    base: str


@pytest.fixture(autouse=True)
def no_token_in_logs(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """Every test: nothing logged while it ran shows the token or its secret half."""
    caplog.set_level(logging.DEBUG)
    yield
    logged = [r.getMessage() for when in ("setup", "call") for r in caplog.get_records(when)]
    assert all(SECRET_HALF not in line for line in logged)


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    fake = FakeTelegram(TOKEN)
    async with serving(fake.app()) as base:
        tg = TelegramProvider(TOKEN, base_url=base, allow_private_media=True)
        try:
            yield Env(fake, tg, base)
        finally:
            await tg.close()


def clean(exc: BaseException) -> str:
    text = str(exc)
    assert SECRET_HALF not in text
    assert SECRET_HALF not in repr(exc.args)
    return text


# -- shape ----------------------------------------------------------------------------------


def test_the_provider_has_the_channel_contract() -> None:
    tg = TelegramProvider(TOKEN)
    assert (tg.name, tg.media_channel, tg.text_limit) == ("telegram", "telegram", 4096)
    assert isinstance(tg, Provider)
    assert isinstance(tg, MediaRefs)
    assert isinstance(tg, MediaDownloads)
    # No idempotency key and no way to list sent messages in the Bot API.
    assert not isinstance(tg, KeyedSends)
    assert not isinstance(tg, AmbiguityResolver)


def test_long_texts_are_split_in_utf16_units_within_4096() -> None:
    from botmesh.state.splitter import split_text, text_length, unit_of

    tg = TelegramProvider(TOKEN)
    assert unit_of(tg) == "utf-16"
    text = "😀 " * 3000  # 9,000 UTF-16 units, 6,000 code points
    parts = list(split_text(text, 4096, unit_of(tg)))
    assert all(text_length(p, "utf-16") <= 4096 for p in parts)
    assert "".join(parts).replace(" ", "") == text.replace(" ", "")


def test_from_env_reads_the_token_and_the_api_url() -> None:
    tg = TelegramProvider.from_env(
        {
            "TELEGRAM_BOT_TOKEN": TOKEN,
            "TELEGRAM_API_URL": "http://127.0.0.1:9/",
            "TELEGRAM_ALLOW_PRIVATE_MEDIA": "1",
        }
    )
    assert tg.base_url == "http://127.0.0.1:9"
    assert tg.allow_private_media is True
    assert TelegramProvider.from_env({"TELEGRAM_BOT_TOKEN": TOKEN}).base_url == (
        "https://api.telegram.org"
    )


@pytest.mark.parametrize(
    ("env", "field"),
    [
        ({}, "TELEGRAM_BOT_TOKEN"),
        ({"TELEGRAM_BOT_TOKEN": "not a token"}, "TELEGRAM_BOT_TOKEN"),
        ({"TELEGRAM_BOT_TOKEN": TOKEN, "TELEGRAM_API_URL": "ftp://x"}, "TELEGRAM_API_URL"),
        (
            {"TELEGRAM_BOT_TOKEN": TOKEN, "TELEGRAM_API_URL": "http://tg.example.com"},
            "TELEGRAM_API_URL",
        ),
        (
            {"TELEGRAM_BOT_TOKEN": TOKEN, "TELEGRAM_ALLOW_PRIVATE_MEDIA": "1"},
            "TELEGRAM_ALLOW_PRIVATE_MEDIA",
        ),
    ],
)
def test_from_env_refuses_bad_settings_naming_the_variable(env: dict[str, str], field: str) -> None:
    with pytest.raises(ConfigError) as err:
        TelegramProvider.from_env(env)
    assert err.value.field == field
    assert SECRET_HALF not in str(err.value)


# -- text -----------------------------------------------------------------------------------


async def test_text_goes_to_send_message_with_ids_counting_per_chat(env: Env) -> None:
    first = await env.tg.send(Outbound("1001", "hello"))
    second = await env.tg.send(Outbound("1001", "again"))
    other = await env.tg.send(Outbound("1002", "elsewhere"))
    assert (first.message_id, second.message_id, other.message_id) == ("1", "2", "1")
    assert [(m.chat_id, m.method, m.text) for m in env.fake.messages] == [
        ("1001", "sendMessage", "hello"),
        ("1001", "sendMessage", "again"),
        ("1002", "sendMessage", "elsewhere"),
    ]


async def test_options_pass_through(env: Env) -> None:
    await env.tg.send(Outbound("1001", "first"))
    await env.tg.send(
        Outbound("1001", "<b>hi</b>", options={"parse_mode": "HTML", "reply_to_message_id": 1})
    )
    assert env.fake.messages[-1].options == {"parse_mode": "HTML", "reply_to_message_id": 1}


async def test_text_at_the_limit_goes_out(env: Env) -> None:
    await env.tg.send(Outbound("1001", "x" * 4096))
    assert len(env.fake.messages) == 1


async def test_nothing_to_send_is_unsupported(env: Env) -> None:
    with pytest.raises(UnsupportedContentError):
        await env.tg.send(Outbound("1001"))
    assert env.fake.calls == []


# -- error mapping, one test each -----------------------------------------------------------


async def test_wrong_token_is_final_and_says_so_without_the_token(env: Env) -> None:
    tg = TelegramProvider("123456789:WRONGwrongWRONGwrongWRONGwrongWRONG", base_url=env.base)
    try:
        with pytest.raises(SendError) as err:
            await tg.send(Outbound("1001", "hi"))
    finally:
        await tg.close()
    assert err.value.retryable is False
    assert type(err.value) is SendError
    assert "token is wrong" in str(err.value)
    assert "WRONGwrong" not in str(err.value)
    assert env.fake.messages == []


async def test_text_over_4096_is_payload_too_large(env: Env) -> None:
    with pytest.raises(PayloadTooLargeError) as err:
        await env.tg.send(Outbound("1001", "x" * 4097))
    assert "message is too long" in clean(err.value)
    assert err.value.retryable is False
    assert env.fake.messages == []


async def test_upload_over_the_api_limit_413_is_payload_too_large() -> None:
    fake = FakeTelegram(TOKEN, max_upload=1000)
    async with serving(fake.app()) as base:
        tg = TelegramProvider(TOKEN, base_url=base)
        try:
            media = Media(data=b"x" * 5000, mime="application/pdf", name="big.pdf")
            with pytest.raises(PayloadTooLargeError) as err:
                await tg.send(Outbound("1001", media=media))
        finally:
            await tg.close()
    assert "413" in clean(err.value)
    assert fake.messages == []


async def test_unknown_chat_is_unreachable(env: Env) -> None:
    with pytest.raises(RecipientUnreachableError) as err:
        await env.tg.send(Outbound("999", "hi"))
    assert "chat not found" in clean(err.value)


@pytest.mark.parametrize(
    "reason",
    [
        "bot was blocked by the user",
        "user is deactivated",
        "bot was kicked from the group chat",
        "bot can't initiate conversation with a user",
    ],
)
async def test_blocked_deactivated_or_kicked_is_unreachable(env: Env, reason: str) -> None:
    env.fake.block("1001", reason)
    with pytest.raises(RecipientUnreachableError) as err:
        await env.tg.send(Outbound("1001", "hi"))
    assert reason in clean(err.value)
    assert "403" in str(err.value)


async def test_a_group_moved_to_a_supergroup_names_the_new_chat(env: Env) -> None:
    env.fake.fail_next(
        400,
        "Bad Request: group chat was upgraded to a supergroup chat",
        migrate_to_chat_id=-1001234,
    )
    with pytest.raises(RecipientUnreachableError) as err:
        await env.tg.send(Outbound("1001", "hi"))
    assert "-1001234" in clean(err.value)


async def test_flood_limit_is_rate_limited_with_retry_after(env: Env) -> None:
    env.fake.flood(retry_after=7)
    with pytest.raises(RateLimitedError) as err:
        await env.tg.send(Outbound("1001", "hi"))
    assert err.value.retry_after == 7
    assert err.value.retryable is True
    assert "retry after 7" in clean(err.value)
    assert env.fake.messages == []
    await env.tg.send(Outbound("1001", "hi"))  # the flood is over
    assert len(env.fake.messages) == 1


@pytest.mark.parametrize("status", [500, 502])
async def test_server_errors_are_retryable(env: Env, status: int) -> None:
    env.fake.fail_next(status)
    with pytest.raises(SendError) as err:
        await env.tg.send(Outbound("1001", "hi"))
    assert err.value.retryable is True
    assert str(status) in clean(err.value)


async def test_transport_error_is_retryable_and_shows_bot_stars() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tg = TelegramProvider(TOKEN, base_url=f"http://127.0.0.1:{port}")
    try:
        with pytest.raises(SendError) as err:
            await tg.send(Outbound("1001", "hi"))
    finally:
        await tg.close()
    assert err.value.retryable is True
    assert "/bot***/sendMessage" in clean(err.value)


async def test_another_403_is_final(env: Env) -> None:
    env.fake.fail_next(403, "Forbidden: not enough rights to send text messages to the chat")
    with pytest.raises(SendError) as err:
        await env.tg.send(Outbound("1001", "hi"))
    assert type(err.value) is SendError
    assert err.value.retryable is False
    assert "not enough rights" in clean(err.value)


async def test_other_400_is_final(env: Env) -> None:
    with pytest.raises(SendError) as err:
        await env.tg.send(Outbound("1001", "hi", options={"reply_to_message_id": 42}))
    assert type(err.value) is SendError
    assert err.value.retryable is False
    assert "message to be replied not found" in clean(err.value)


@pytest.mark.parametrize(
    ("media", "expected"),
    [
        (Media(id="NOSUCHFILE", mime="image/jpeg"), "wrong file identifier"),
        (Media(url="https://example.com/page", mime="image/png"), "wrong type of the web page"),
        (Media(url="https://example.com/gone.png", mime="image/png"), "failed to get HTTP URL"),
    ],
)
async def test_unusable_media_is_unsupported_content(env: Env, media: Media, expected: str) -> None:
    env.fake.html_urls.add("https://example.com/page")
    env.fake.bad_urls.add("https://example.com/gone.png")
    with pytest.raises(UnsupportedContentError) as err:
        await env.tg.send(Outbound("1001", "look", media=media))
    assert expected in clean(err.value)
    assert env.fake.messages == []


async def test_empty_text_from_the_api_is_unsupported(env: Env) -> None:
    env.fake.fail_next(400, "Bad Request: message text is empty")
    with pytest.raises(UnsupportedContentError):
        await env.tg.send(Outbound("1001", "hi"))


async def test_errors_are_logged_without_the_token(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    env.fake.flood(retry_after=3)
    for chat in ("1001", "999"):
        with pytest.raises(SendError):
            await env.tg.send(Outbound(chat, "hi"))
    with pytest.raises(ProviderError):
        await env.tg.download_media(Media(provider="telegram", id="NOPE"))
    lines = [r.getMessage() for r in caplog.records if r.name == "botmesh.providers.telegram"]
    assert any("retry after 3" in line for line in lines)
    assert any("chat not found" in line for line in lines)
    assert any("getFile" in line for line in lines)
    assert all(SECRET_HALF not in line for line in lines)


# -- media ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mime", "method"),
    [
        ("image/png", "sendPhoto"),
        ("video/mp4", "sendVideo"),
        ("audio/ogg", "sendVoice"),
        ("audio/mpeg", "sendAudio"),
        ("application/pdf", "sendDocument"),
        (None, "sendDocument"),
    ],
)
async def test_uploaded_media_method_follows_the_mime(
    env: Env, mime: str | None, method: str
) -> None:
    media = Media(data=b"\x00bytes\xff", mime=mime, name="f.bin")
    result = await env.tg.send(Outbound("1001", "caption here", media=media))
    sent = env.fake.messages[-1]
    assert (sent.method, sent.caption, result.message_id) == (method, "caption here", "1")
    assert sent.media is not None
    assert env.fake.files[sent.media].data == b"\x00bytes\xff"


async def test_media_by_file_id_and_by_url(env: Env) -> None:
    file_id = env.fake.add_file(b"jpeg", "image/jpeg")
    await env.tg.send(Outbound("1001", media=Media(id=file_id, mime="image/jpeg")))
    url = "https://example.com/cat.jpg"
    await env.tg.send(Outbound("1001", "a cat", media=Media(url=url, mime="image/jpeg")))
    assert [(m.method, m.media, m.caption) for m in env.fake.messages] == [
        ("sendPhoto", file_id, None),
        ("sendPhoto", url, "a cat"),
    ]


async def test_another_channels_media_id_is_unsupported(env: Env) -> None:
    media = Media(provider="whatsapp", id="1234567890", mime="image/jpeg")
    with pytest.raises(UnsupportedContentError) as err:
        await env.tg.send(Outbound("1001", media=media))
    assert "whatsapp media id" in str(err.value)
    assert env.fake.calls == []


async def test_media_from_a_path_is_uploaded(env: Env, tmp_path: Any) -> None:
    f = tmp_path / "report.pdf"
    f.write_bytes(b"%PDF-1.4")
    await env.tg.send(Outbound("1001", media=Media(path=str(f), mime="application/pdf")))
    sent = env.fake.messages[-1]
    assert sent.method == "sendDocument"
    assert sent.media is not None
    assert env.fake.files[sent.media].data == b"%PDF-1.4"


async def test_a_caption_over_1024_is_refused_before_the_call(env: Env) -> None:
    media = Media(data=b"png", mime="image/png")
    with pytest.raises(PayloadTooLargeError) as err:
        await env.tg.send(Outbound("1001", "c" * 1025, media=media))
    assert "1024" in str(err.value)
    assert env.fake.calls == []


async def test_with_parse_mode_telegram_judges_the_caption(env: Env) -> None:
    media = Media(data=b"png", mime="image/png")
    with pytest.raises(PayloadTooLargeError) as err:
        await env.tg.send(Outbound("1001", "c" * 1025, media=media, options={"parse_mode": "HTML"}))
    assert "caption is too long" in clean(err.value)
    assert env.fake.calls == ["sendPhoto"]


async def test_download_media_by_file_id(env: Env) -> None:
    file_id = env.fake.add_file(b"voice bytes", "audio/ogg")
    got = await env.tg.download_media(Media(provider="telegram", id=file_id, mime="audio/ogg"))
    assert got == b"voice bytes"
    assert env.fake.calls == ["getFile"]


async def test_download_of_an_unknown_file_is_a_provider_error(env: Env) -> None:
    with pytest.raises(ProviderError) as err:
        await env.tg.download_media(Media(provider="telegram", id="NOPE"))
    assert "invalid file_id" in clean(err.value)


async def test_downloads_only_come_from_the_api_host(env: Env) -> None:
    assert env.tg.media_hosts == ("127.0.0.1",)
    file_id = env.fake.add_file(b"x", "image/jpeg")
    url, headers = await env.tg.media_url(Media(provider="telegram", id=file_id))
    assert url.startswith(f"{env.base}/file/bot{TOKEN}/")
    assert headers == {}
    other = url.replace("127.0.0.1", "localhost")
    with pytest.raises(MediaUrlRefused) as err:
        await env.tg.fetch_media(other)
    assert "not an allowed media host" in clean(err.value)


async def test_without_allow_private_media_a_loopback_api_cannot_serve_media(env: Env) -> None:
    tg = TelegramProvider(TOKEN, base_url=env.base)
    try:
        file_id = env.fake.add_file(b"x", "image/jpeg")
        with pytest.raises(MediaUrlRefused):
            await tg.download_media(Media(provider="telegram", id=file_id))
    finally:
        await tg.close()


# -- edit, delete, typing -------------------------------------------------------------------


async def test_edit_replaces_the_text_and_keeps_the_id(env: Env) -> None:
    assert isinstance(env.tg, Edits)
    sent = await env.tg.send(Outbound("1001", "draft"))
    edited = await env.tg.edit(Outbound("1001", "final"), sent.message_id)
    assert edited.message_id == sent.message_id
    assert [m.text for m in env.fake.sent_to("1001")] == ["final"]
    # The same text again: Telegram's "message is not modified" is a success.
    await env.tg.edit(Outbound("1001", "final"), sent.message_id)


async def test_editing_an_unknown_message_is_final(env: Env) -> None:
    with pytest.raises(SendError) as err:
        await env.tg.edit(Outbound("1001", "x"), "77")
    assert err.value.retryable is False
    assert "message to edit not found" in clean(err.value)
    with pytest.raises(SendError) as bad:
        await env.tg.edit(Outbound("1001", "x"), "not-an-id")
    assert bad.value.retryable is False
    assert env.fake.calls.count("editMessageText") == 1  # the bad id never left


async def test_editing_a_media_message_is_final(env: Env) -> None:
    file_id = env.fake.add_file(b"img", "image/jpeg")
    sent = await env.tg.send(Outbound("1001", "cap", media=Media(id=file_id, mime="image/jpeg")))
    with pytest.raises(SendError) as err:
        await env.tg.edit(Outbound("1001", "new"), sent.message_id)
    assert err.value.retryable is False
    assert "no text in the message" in clean(err.value)


async def test_delete_removes_the_message_and_twice_is_fine(env: Env) -> None:
    assert isinstance(env.tg, Deletes)
    keep = await env.tg.send(Outbound("1001", "keep"))
    gone = await env.tg.send(Outbound("1001", "gone"))
    await env.tg.delete("1001", gone.message_id)
    assert [m.message_id for m in env.fake.sent_to("1001")] == [int(keep.message_id)]
    await env.tg.delete("1001", gone.message_id)  # "message to delete not found": done
    assert env.fake.calls.count("deleteMessage") == 2


async def test_typing_sends_the_typing_action(env: Env) -> None:
    assert isinstance(env.tg, Typing)
    await env.tg.typing("1001")
    assert env.fake.actions == [("1001", "typing")]
    with pytest.raises(RecipientUnreachableError):
        await env.tg.typing("999")


async def test_edit_delete_and_typing_map_errors_as_send_does(env: Env) -> None:
    sent = await env.tg.send(Outbound("1001", "hi"))
    env.fake.flood(retry_after=3, times=3)
    with pytest.raises(RateLimitedError) as limited:
        await env.tg.edit(Outbound("1001", "x"), sent.message_id)
    assert limited.value.retry_after == 3
    with pytest.raises(RateLimitedError):
        await env.tg.delete("1001", sent.message_id)
    with pytest.raises(RateLimitedError):
        await env.tg.typing("1001")
    env.fake.block("1001")
    with pytest.raises(RecipientUnreachableError):
        await env.tg.delete("1001", sent.message_id)
    tg = TelegramProvider("123456789:WRONGwrongWRONGwrongWRONGwrongWRONG", base_url=env.base)
    try:
        with pytest.raises(SendError) as err:
            await tg.edit(Outbound("1001", "x"), sent.message_id)
    finally:
        await tg.close()
    assert err.value.retryable is False
    assert "token is wrong" in str(err.value)


# -- webhook --------------------------------------------------------------------------------

WH_SECRET = "s3cret_Token-1"


def request(body: Any, secret: str | None = WH_SECRET) -> WebhookRequest:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {} if secret is None else {"x-telegram-bot-api-secret-token": secret}
    return WebhookRequest("POST", "/telegram", "https://bot.example/telegram", headers, {}, raw)


def message(**extra: Any) -> dict[str, Any]:
    return {
        "message_id": 55,
        "from": {"id": 42, "is_bot": False, "first_name": "Ann"},
        "chat": {"id": 1001, "type": "private"},
        "date": 1767225600,
        **extra,
    }


def test_webhook_from_env() -> None:
    assert TelegramWebhook.from_env({"TELEGRAM_WEBHOOK_SECRET": WH_SECRET}).channel == "telegram"
    with pytest.raises(ConfigError) as err:
        TelegramWebhook.from_env({})
    assert err.value.field == "TELEGRAM_WEBHOOK_SECRET"
    with pytest.raises(ConfigError):
        TelegramWebhook.from_env({"TELEGRAM_WEBHOOK_SECRET": "has space"})


def test_verify_needs_the_secret_header() -> None:
    wh = TelegramWebhook(WH_SECRET)
    wh.verify(request({"update_id": 1}))
    with pytest.raises(BadSignature):
        wh.verify(request({"update_id": 1}, secret=None))
    with pytest.raises(BadSignature):
        wh.verify(request({"update_id": 1}, secret="s3cret_Token-2"))
    assert wh.handshake(request({"update_id": 1})) is None


def test_parse_a_text_message() -> None:
    [rec] = TelegramWebhook(WH_SECRET).parse(
        request({"update_id": 9, "message": message(text="hi")})
    )
    assert (rec.id, rec.chat_id, rec.channel, rec.sender, rec.text, rec.ts, rec.kind) == (
        "tg:1001:55",
        "1001",
        "telegram",
        "42",
        "hi",
        1767225600.0,
        "message",
    )
    assert rec.media is None


def test_a_retried_update_gives_the_same_id() -> None:
    wh = TelegramWebhook(WH_SECRET)
    body = {"update_id": 9, "message": message(text="hi")}
    assert wh.parse(request(body))[0].id == wh.parse(request(body))[0].id


def test_parse_an_edit_gets_its_own_id() -> None:
    body = {"update_id": 10, "edited_message": message(text="hi!", edit_date=1767225700)}
    [rec] = TelegramWebhook(WH_SECRET).parse(request(body))
    assert rec.id == "tg:1001:55:e1767225700"
    assert rec.text == "hi!"
    assert rec.data["update"] == "edited_message"


def test_parse_a_channel_post() -> None:
    post = {
        "message_id": 7,
        "sender_chat": {"id": -100777, "type": "channel"},
        "chat": {"id": -100777, "type": "channel"},
        "date": 1767225600,
        "text": "news",
    }
    [rec] = TelegramWebhook(WH_SECRET).parse(request({"update_id": 11, "channel_post": post}))
    assert (rec.id, rec.chat_id, rec.sender, rec.text) == (
        "tg:-100777:7",
        "-100777",
        "-100777",
        "news",
    )


def test_parse_a_callback_query() -> None:
    cb = {
        "id": "4382bfdwdsb323b2d9",
        "from": {"id": 42, "is_bot": False, "first_name": "Ann"},
        "message": message(text="pick one"),
        "chat_instance": "-1234",
        "data": "choice:2",
    }
    [rec] = TelegramWebhook(WH_SECRET).parse(request({"update_id": 12, "callback_query": cb}))
    assert (rec.id, rec.kind, rec.chat_id, rec.sender, rec.text) == (
        "tg:cb:4382bfdwdsb323b2d9",
        "interaction",
        "1001",
        "42",
        "choice:2",
    )
    assert rec.data["callback_data"] == "choice:2"
    assert rec.data["message_id"] == "55"


def test_parse_the_largest_photo_size() -> None:
    photo = [
        {"file_id": "small", "file_unique_id": "u1", "width": 90, "height": 90, "file_size": 1},
        {"file_id": "big", "file_unique_id": "u3", "width": 1280, "height": 960, "file_size": 9},
        {"file_id": "mid", "file_unique_id": "u2", "width": 320, "height": 240, "file_size": 5},
    ]
    body = {"update_id": 13, "message": message(photo=photo, caption="look")}
    [rec] = TelegramWebhook(WH_SECRET).parse(request(body))
    assert rec.text == "look"
    assert rec.media == Media(
        provider="telegram", id="big", mime="image/jpeg", extra={"file_unique_id": "u3"}
    )


@pytest.mark.parametrize(
    ("kind", "item", "mime", "name"),
    [
        (
            "document",
            {
                "file_id": "D",
                "file_unique_id": "ud",
                "file_name": "a.pdf",
                "mime_type": "application/pdf",
            },
            "application/pdf",
            "a.pdf",
        ),
        (
            "video",
            {"file_id": "D", "file_unique_id": "ud", "mime_type": "video/mp4"},
            "video/mp4",
            None,
        ),
        (
            "voice",
            {"file_id": "D", "file_unique_id": "ud", "mime_type": "audio/ogg"},
            "audio/ogg",
            None,
        ),
        (
            "audio",
            {
                "file_id": "D",
                "file_unique_id": "ud",
                "mime_type": "audio/mpeg",
                "file_name": "s.mp3",
            },
            "audio/mpeg",
            "s.mp3",
        ),
        (
            "sticker",
            {"file_id": "D", "file_unique_id": "ud", "is_animated": False},
            "image/webp",
            None,
        ),
    ],
)
def test_parse_media_kinds(kind: str, item: dict[str, Any], mime: str, name: str | None) -> None:
    body = {"update_id": 14, "message": message(**{kind: item})}
    [rec] = TelegramWebhook(WH_SECRET).parse(request(body))
    assert rec.media == Media(
        provider="telegram", id="D", mime=mime, name=name, extra={"file_unique_id": "ud"}
    )


def test_an_update_without_a_message_gives_nothing() -> None:
    body = {"update_id": 15, "my_chat_member": {"chat": {"id": 1}, "date": 1}}
    assert TelegramWebhook(WH_SECRET).parse(request(body)) == []


@pytest.mark.parametrize(
    "body", [b"not json", b"[1]", json.dumps({"message": message()}).encode(), b'{"update_id":"x"}']
)
def test_a_body_that_is_not_an_update_is_malformed(body: bytes) -> None:
    with pytest.raises(MalformedWebhook):
        TelegramWebhook(WH_SECRET).parse(request(body))


def test_a_message_without_a_chat_is_malformed() -> None:
    body = {"update_id": 16, "message": {"message_id": 1, "date": 1, "text": "x"}}
    with pytest.raises(MalformedWebhook):
        TelegramWebhook(WH_SECRET).parse(request(body))


def test_reply_is_an_empty_200() -> None:
    reply = TelegramWebhook(WH_SECRET).reply(request({"update_id": 1}), [])
    assert (reply.status, reply.body) == (200, b"")

"""``botmesh.providers.baileys`` against the local fake of the Baileys HTTP bridge and of
WhatsApp's media CDN (``tests/providers/fakes/baileys.py``), over real HTTP: what is sent how,
the bridge's own errors, its idempotency key (a send lost in a crash is found, not sent
twice), media downloaded through the bridge or decrypted from the CDN, also on a replay from
the journal; the webhook on bodies as the bridge posts them, and through the gateway. The
rules the three WhatsApp Web bridges share are tested in ``test_wa_bridges.py``."""

from __future__ import annotations

import base64
import hashlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from botmesh.journal import MemoryKv, Write
from botmesh.providers.baileys import BaileysProvider, BaileysWebhook, decrypt_media, key_id
from botmesh.providers.channels import webhook_from_env
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
from botmesh.state.messages import Inbound, Media, Outbound
from botmesh.state.ports import Deletes, Edits, Typing
from botmesh.testing import ManualClock, SimulatedCrash, crashable
from botmesh.topics.records import chat_key
from tests.kafka.conftest import kafka_bootstrap, topic_prefix
from tests.kit import make_app
from tests.providers.channel_paths import post_through_gateway, replay_media
from tests.providers.fakes.baileys import FakeBaileys, encrypt, message, node_buffer, upsert
from tests.providers.fakes.wa_bridges import refused
from tests.providers.serve import serving

__all__ = ["kafka_bootstrap", "topic_prefix"]  # the broker fixtures of the gateway test

JID = "5511999990001@s.whatsapp.net"
GROUP = "120363041234567890@g.us"
TOKEN = "verify-token-0123"
PHOTO = bytes(range(256)) * 8


@dataclass
class Rig:
    fake: FakeBaileys
    url: str
    provider: BaileysProvider


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    fake = FakeBaileys()
    async with serving(fake.app()) as url:
        provider = BaileysProvider(
            url,
            fake.api_key,
            fake.phone,
            allow_private_media=True,
            media_ref_hosts=("127.0.0.1",),
        )
        try:
            yield Rig(fake, url, provider)
        finally:
            await provider.close()


# -- sending ----------------------------------------------------------------------------------


async def test_a_text_goes_to_the_connection_as_the_jid(rig: Rig) -> None:
    result = await rig.provider.send(Outbound("+55 11 99999-0001", "hello"))
    [sent] = rig.fake.sent
    assert result.message_id == sent.id
    assert sent.body == {"jid": JID, "messageContent": {"text": "hello"}}
    assert rig.fake.calls == [f"POST /connections/{rig.fake.phone}/send-message"]


async def test_a_jid_goes_as_it_is_and_options_go_into_the_content(rig: Rig) -> None:
    await rig.provider.send(Outbound(GROUP, "all", options={"mentions": [JID]}))
    assert rig.fake.sent[0].body["messageContent"] == {"text": "all", "mentions": [JID]}
    assert rig.fake.sent[0].chat == GROUP


@pytest.mark.parametrize(
    ("media", "kind", "extra"),
    [
        (Media(data=PHOTO, mime="image/png"), "image", {}),
        (Media(data=b"mp4", mime="video/mp4"), "video", {}),
        (Media(data=b"%PDF", name="invoice.pdf"), "document", {"fileName": "invoice.pdf"}),
    ],
)
async def test_media_goes_as_base64_by_its_type_with_the_caption(
    rig: Rig, media: Media, kind: str, extra: dict[str, str]
) -> None:
    await rig.provider.send(Outbound(JID, "look", media))
    [sent] = rig.fake.sent
    assert (sent.kind, sent.media, sent.caption) == (kind, media.data, "look")
    content = sent.body["messageContent"]
    assert content["mimetype"] == (media.mime or "application/pdf")
    assert {k: content[k] for k in extra} == extra


async def test_a_file_is_read_and_a_voice_note_takes_its_options(rig: Rig, tmp_path: Path) -> None:
    voice = tmp_path / "note.ogg"
    voice.write_bytes(b"OggS-voice")
    await rig.provider.send(Outbound(JID, None, Media(path=str(voice)), options={"ptt": True}))
    [sent] = rig.fake.sent
    assert (sent.kind, sent.media, sent.mime) == ("audio", b"OggS-voice", "audio/ogg")
    assert sent.body["messageContent"]["ptt"] is True


@pytest.mark.parametrize(
    ("message", "error", "says"),
    [
        (Outbound(JID), UnsupportedContentError, "neither text nor media"),
        (
            Outbound(JID, None, Media(url="https://example.com/a.jpg")),
            UnsupportedContentError,
            "bytes only",
        ),
        (
            Outbound(JID, None, Media(id="1049", provider="whatsapp")),
            UnsupportedContentError,
            "bytes",
        ),
        (
            Outbound(JID, "hi", Media(data=b"OggS", mime="audio/ogg")),
            UnsupportedContentError,
            "no caption",
        ),
        (Outbound("a@s.whatsapp.net,b@g.us", "hi"), RecipientUnreachableError, "JID"),
        (Outbound("../../admin", "hi"), RecipientUnreachableError, "JID"),
    ],
)
async def test_what_the_bridge_cannot_take_is_refused_before_any_call(
    rig: Rig, message: Outbound, error: type[SendError], says: str
) -> None:
    with pytest.raises(error, match=says) as err:
        await rig.provider.send(message)
    assert err.value.retryable is False and rig.fake.calls == []


# -- the bridge's own errors ----------------------------------------------------------------


async def test_a_connection_that_is_down_is_retried(rig: Rig) -> None:
    rig.fake.connected = False
    with pytest.raises(SendError, match="no live session for") as err:
        await rig.provider.send(Outbound(JID, "hi"))
    assert type(err.value) is SendError and err.value.retryable is True
    rig.fake.connected = True
    await rig.provider.send(Outbound(JID, "hi"))
    assert len(rig.fake.sent) == 1


async def test_a_number_of_another_api_key_is_final(rig: Rig) -> None:
    rig.fake.other_phones.add("+5511999990009")
    err = await refused(
        BaileysProvider(rig.url, rig.fake.api_key, "+5511999990009"), Outbound(JID, "hi")
    )
    assert "HTTP 403" in str(err) and "BAILEYS_API_KEY" in str(err) and err.retryable is False


@pytest.mark.parametrize(
    ("status", "body", "kind", "retryable"),
    [
        (409, "Message is already being processed", SendError, True),
        (413, "Payload Too Large", PayloadTooLargeError, False),
        (422, {"type": "validation", "on": "body", "message": "jid"}, SendError, False),
        (400, {"error": "Bad Request"}, SendError, False),
    ],
)
async def test_scripted_bridge_errors(
    rig: Rig, status: int, body: Any, kind: type[SendError], retryable: bool
) -> None:
    rig.fake.fail_next(status, body)
    with pytest.raises(kind) as err:
        await rig.provider.send(Outbound(JID, "hi"))
    assert type(err.value) is kind and err.value.retryable is retryable


async def test_an_answer_without_a_key_is_retried_only_when_the_send_had_one(rig: Rig) -> None:
    rig.fake.fail_next(200, {"data": None})
    with pytest.raises(SendError, match="it may be out") as err:
        await rig.provider.send(Outbound(JID, "hi"))
    assert err.value.retryable is False
    rig.fake.fail_next(200, {"data": None})
    with pytest.raises(SendError, match="same key is safe") as err:
        await rig.provider.send_keyed(Outbound(JID, "hi"), "in-1:1")
    assert err.value.retryable is True


# -- the idempotency key ----------------------------------------------------------------------


async def test_a_keyed_resend_answers_the_message_already_made(rig: Rig) -> None:
    first = await rig.provider.send_keyed(Outbound(JID, "once"), "in-1:1")
    again = await rig.provider.send_keyed(Outbound(JID, "once"), "in-1:1")
    other = await rig.provider.send_keyed(Outbound(JID, "once"), "in-1:2")
    assert first == again != other and len(rig.fake.sent) == 2
    assert rig.fake.sent[0].body["chatwootMessageId"] == key_id("in-1:1")
    assert key_id("in-1:1").startswith("botmesh-") and len(key_id("in-1:1")) == 48


async def test_a_lost_answer_is_resolved_by_the_key(rig: Rig) -> None:
    message = Outbound(JID, "lost")
    since = time.time()
    rig.fake.lose_next_answer()
    with pytest.raises(SendError, match="HTTP 504") as err:
        await rig.provider.send_keyed(message, "in-7:1")
    assert err.value.retryable is True
    result = await rig.provider.resolve_ambiguous(message, "in-7:1", since)
    assert result is not None and result.message_id == rig.fake.sent[0].id
    assert len(rig.fake.sent) == 1  # found, not sent again
    never = await rig.provider.resolve_ambiguous(Outbound(JID, "never"), "in-8:1", since)
    assert never is not None and len(rig.fake.sent) == 2  # it had not gone out: sent once


async def test_after_the_key_window_it_cannot_tell(rig: Rig) -> None:
    with pytest.raises(ProviderError, match="cannot tell"):
        await rig.provider.resolve_ambiguous(Outbound(JID, "x"), "in-9:1", time.time() - 301)
    assert rig.fake.calls == []
    with pytest.raises(ConfigError, match="key_window"):
        BaileysProvider(rig.url, rig.fake.api_key, rig.fake.phone, key_window=600)


async def test_a_send_lost_in_a_crash_is_found_by_the_engine_not_sent_twice(rig: Rig) -> None:
    shared, clock = MemoryKv(), ManualClock(time.time())
    dying = crashable(shared)
    dying.crash_before(Write.OUTBOX_MARK_SENT)  # the bridge sent it; the journal never knew
    first = await make_app(rig.provider, kv=dying, clock=clock)
    with pytest.raises(SimulatedCrash):
        await first.runtime.send(JID, "hello", idempotency_key="k")
    [sent] = rig.fake.sent
    again = await make_app(rig.provider, kv=shared, clock=clock, outbox={"on_ambiguous": "skip"})
    try:
        rec = await again.ops.outbox.get("k")
        assert rec is not None and rec.state == "sent" and rec.message_id == sent.id
        assert len(rig.fake.sent) == 1
        m = again.ops.metrics()
        assert (m["outboxResolvedSent"], m["outboxAmbiguous"]) == (1, 0)
    finally:
        await again.stop()


# -- edit, delete, typing -----------------------------------------------------------------------


async def test_edit_replaces_the_text_and_keeps_the_id(rig: Rig) -> None:
    assert isinstance(rig.provider, Edits)
    sent = await rig.provider.send(Outbound("+55 11 99999-0001", "draft"))
    edited = await rig.provider.edit(
        Outbound("5511999990001", "final", options={"mentions": [JID], "ptt": True}),
        sent.message_id,
    )
    assert edited.message_id == sent.message_id
    assert rig.fake.texts() == {JID: ["final"]}
    assert rig.fake.edits == [(JID, sent.message_id, "final")]
    assert rig.fake.calls[-1] == f"PATCH /connections/{rig.fake.phone}/messages"
    with pytest.raises(UnsupportedContentError):
        await rig.provider.edit(Outbound(JID, ""), sent.message_id)


async def test_an_edit_of_an_unknown_message_goes_out_and_changes_nothing(rig: Rig) -> None:
    kept = await rig.provider.send(Outbound(JID, "kept"))
    edited = await rig.provider.edit(Outbound(JID, "x"), "3EB0NOPE")
    assert edited.message_id == "3EB0NOPE"
    assert rig.fake.texts() == {JID: ["kept"]} and kept.message_id != "3EB0NOPE"


async def test_delete_revokes_the_message_and_twice_is_fine(rig: Rig) -> None:
    assert isinstance(rig.provider, Deletes)
    keep = await rig.provider.send(Outbound(GROUP, "keep"))
    gone = await rig.provider.send(Outbound(GROUP, "gone"))
    await rig.provider.delete(GROUP, gone.message_id)
    assert [m.id for m in rig.fake.sent] == [keep.message_id]
    await rig.provider.delete(GROUP, gone.message_id)
    assert rig.fake.revoked == {gone.message_id}
    assert rig.fake.calls[-1] == f"DELETE /connections/{rig.fake.phone}/messages"


async def test_typing_sends_composing_to_the_chat(rig: Rig) -> None:
    assert isinstance(rig.provider, Typing)
    await rig.provider.typing("5511999990001")
    assert rig.fake.presences == [(JID, "composing")]
    with pytest.raises(RecipientUnreachableError):
        await rig.provider.typing("not a chat")
    assert rig.fake.calls == [f"PATCH /connections/{rig.fake.phone}/presence"]


async def test_edit_delete_and_typing_map_errors_as_send_does(rig: Rig) -> None:
    sent = await rig.provider.send(Outbound(JID, "hi"))
    rig.fake.rate_limit("4")
    with pytest.raises(RateLimitedError) as limited:
        await rig.provider.edit(Outbound(JID, "x"), sent.message_id)
    assert limited.value.retry_after == 4
    rig.fake.connected = False
    for call in (
        rig.provider.edit(Outbound(JID, "x"), sent.message_id),
        rig.provider.delete(JID, sent.message_id),
        rig.provider.typing(JID),
    ):
        with pytest.raises(SendError, match="Phone number not connected") as down:
            await call
        assert down.value.retryable is True
    rig.fake.connected = True
    wrong = BaileysProvider(rig.url, "bk_not-the-key", rig.fake.phone)
    try:
        with pytest.raises(SendError, match="BAILEYS_API_KEY") as err:
            await wrong.delete(JID, sent.message_id)
    finally:
        await wrong.close()
    assert err.value.retryable is False
    assert rig.fake.texts() == {JID: ["hi"]} and rig.fake.presences == []


# -- media downloads --------------------------------------------------------------------------


def _request(body: bytes) -> WebhookRequest:
    return WebhookRequest("POST", "/baileys", "https://hooks.example.com/baileys", {}, {}, body)


def _image(rig: Rig, mid: str = "3EB0AAA1", *, view_once: bool = False) -> Inbound:
    part = rig.fake.add_cdn_media(rig.url, PHOTO, "image/jpeg", "image")
    content: dict[str, Any] = {"imageMessage": {**part, "caption": "a photo"}}
    if view_once:
        content = {"viewOnceMessageV2": {"message": content}}
    [inbound] = BaileysWebhook(TOKEN).parse(_request(upsert([message(mid, JID, content)], TOKEN)))
    return inbound


async def test_a_parsed_image_keeps_what_baileys_needs_never_the_thumbnail(rig: Rig) -> None:
    inbound = _image(rig)
    media = inbound.media
    assert media is not None and media.provider == "baileys" and media.mime == "image/jpeg"
    assert inbound.text == "a photo" and media.data is None
    extra = media.extra
    assert extra["key"] == {"remoteJid": JID, "id": "3EB0AAA1", "fromMe": False}
    assert extra["type"] == "image" and extra["fileLength"] == len(PHOTO)
    assert base64.b64decode(extra["fileSha256"]) == hashlib.sha256(PHOTO).digest()
    assert "jpegThumbnail" not in extra and "caption" not in extra


async def test_media_downloads_through_the_bridge_with_the_api_key(rig: Rig) -> None:
    inbound = _image(rig)
    assert inbound.media is not None
    rig.fake.media["3EB0AAA1"] = (b"from-the-bridge", "image/jpeg")
    assert await rig.provider.download_media(inbound.media) == b"from-the-bridge"
    assert rig.fake.calls == ["GET /media/3EB0AAA1"] and rig.fake.cdn_downloads == []


async def test_when_the_bridge_no_longer_has_it_the_cdn_file_is_decrypted(rig: Rig) -> None:
    inbound = _image(rig)
    assert inbound.media is not None
    assert await rig.provider.download_media(inbound.media) == PHOTO
    assert rig.fake.calls[0] == "GET /media/3EB0AAA1" and len(rig.fake.cdn_downloads) == 1


async def test_a_tampered_cdn_file_is_refused(rig: Rig) -> None:
    inbound = _image(rig)
    assert inbound.media is not None
    [path] = rig.fake.cdn
    rig.fake.cdn[path] = rig.fake.cdn[path][:-1] + bytes([rig.fake.cdn[path][-1] ^ 1])
    with pytest.raises(ProviderError, match="fileEncSha256"):
        await rig.provider.download_media(inbound.media)
    extra = {k: v for k, v in inbound.media.extra.items() if k != "fileEncSha256"}
    with pytest.raises(ProviderError, match="HMAC"):
        await rig.provider.download_media(Media(provider="baileys", extra=extra))


def test_decrypt_media_is_the_inverse_of_whatsapps_encryption() -> None:
    key = bytes(range(32))
    for kind in ("image", "video", "audio", "document"):
        assert decrypt_media(encrypt(b"x" * 33, key, kind), key, kind) == b"x" * 33
    with pytest.raises(ProviderError, match="HMAC"):
        decrypt_media(encrypt(b"x", key, "image"), key, "video")  # another type's keys
    with pytest.raises(ProviderError, match="no decryption keys"):
        decrypt_media(b"x" * 26, key, "poll")


async def test_the_cdn_is_whatsapps_unless_media_ref_hosts_says_otherwise(rig: Rig) -> None:
    inbound = _image(rig)
    assert inbound.media is not None
    provider = BaileysProvider(rig.url, rig.fake.api_key, rig.fake.phone, allow_private_media=True)
    try:
        assert provider.media_hosts == ("whatsapp.net",)
        with pytest.raises(MediaUrlRefused, match="not an allowed media host"):
            await provider.download_media(inbound.media)
    finally:
        await provider.close()
    assert rig.fake.cdn_downloads == []


async def test_bytes_the_bridge_inlined_serve_the_live_run(rig: Rig) -> None:
    part = rig.fake.add_cdn_media(rig.url, PHOTO, "image/jpeg", "image")
    msg = message("3EB0AAA2", JID, {"imageMessage": part})
    body = upsert([msg], TOKEN, inline={"3EB0AAA2": b"inline-bytes"})
    [inbound] = BaileysWebhook(TOKEN).parse(_request(body))
    assert inbound.media is not None and inbound.media.data == b"inline-bytes"
    assert await rig.provider.download_media(inbound.media) == b"inline-bytes"
    assert rig.fake.calls == []


async def test_the_journal_keeps_the_reference_and_the_replay_downloads_again(rig: Rig) -> None:
    inbound = _image(rig)
    rig.fake.media["3EB0AAA1"] = (PHOTO, "image/jpeg")
    # the bridge cleans its media folder between the crash and the replay: the CDN serves it
    seen = await replay_media(rig.provider, inbound, before_replay=rig.fake.media.clear)
    assert seen.errors == [] and seen.loaded == [PHOTO, PHOTO]
    ref = seen.journaled["ref"]
    assert ref["v"] == 1 and ref["data"]["key"] == {
        "remoteJid": JID,
        "id": "3EB0AAA1",
        "fromMe": False,
    }
    assert ref["data"]["type"] == "image" and "mediaKey" in ref["data"]["media"]
    dump = json.dumps(seen.journaled)
    assert base64.b64encode(PHOTO[:60]).decode() not in dump and "THUMB" not in dump
    assert rig.fake.api_key not in dump
    assert len(rig.fake.cdn_downloads) == 1  # the live run had the bridge's copy


async def test_view_once_media_is_not_journaled_unless_asked(rig: Rig) -> None:
    inbound = _image(rig, view_once=True)
    assert inbound.data["view_once"] is True
    seen = await replay_media(rig.provider, inbound)
    assert seen.loaded == [PHOTO] and seen.errors == ["not-durable"]
    provider = BaileysProvider.from_env(
        {
            "BAILEYS_API_URL": rig.url,
            "BAILEYS_API_KEY": rig.fake.api_key,
            "BAILEYS_PHONE_NUMBER": rig.fake.phone,
            "BAILEYS_MEDIA_VIEW_ONCE": "1",
            "BAILEYS_MEDIA_REF_HOSTS": "127.0.0.1",
            "BAILEYS_ALLOW_PRIVATE_MEDIA": "1",
        }
    )
    try:
        seen = await replay_media(provider, _image(rig, "3EB0AAA3", view_once=True))
    finally:
        await provider.close()
    assert seen.errors == [] and seen.loaded == [PHOTO, PHOTO]


# -- from_env ---------------------------------------------------------------------------------


def test_from_env_checks_the_phone_number_and_the_view_once_flag() -> None:
    env = {
        "BAILEYS_API_URL": "https://bridge.example.com",
        "BAILEYS_API_KEY": "k",
        "BAILEYS_PHONE_NUMBER": "+5511999990000",
    }
    provider = BaileysProvider.from_env(env)
    assert provider.session == "+5511999990000" and not provider.media_view_once
    with pytest.raises(ConfigError) as err:
        BaileysProvider.from_env({**env, "BAILEYS_PHONE_NUMBER": "5511999990000"})
    assert err.value.field == "BAILEYS_PHONE_NUMBER"
    with pytest.raises(ConfigError) as err:
        BaileysProvider.from_env({**env, "BAILEYS_MEDIA_VIEW_ONCE": "yes"})
    assert err.value.field == "BAILEYS_MEDIA_VIEW_ONCE"


def test_the_webhook_needs_the_verify_token() -> None:
    assert isinstance(
        webhook_from_env("baileys", {"BAILEYS_WEBHOOK_VERIFY_TOKEN": TOKEN}), BaileysWebhook
    )
    for env in ({}, {"BAILEYS_WEBHOOK_VERIFY_TOKEN": "short"}):
        with pytest.raises(ConfigError) as err:
            webhook_from_env("baileys", env)
        assert err.value.field == "BAILEYS_WEBHOOK_VERIFY_TOKEN"


# -- the webhook ------------------------------------------------------------------------------


def _text(mid: str = "3EB0C767D097B7", jid: str = JID, **more: Any) -> bytes:
    return upsert([message(mid, jid, {"conversation": "hi there"}, **more)], TOKEN)


def test_the_verify_token_is_checked() -> None:
    hook = BaileysWebhook(TOKEN)
    hook.verify(_request(_text()))
    wrong = upsert([], "another-token")
    for body in (wrong, b'{"event": "messages.upsert"}', b"not json"):
        with pytest.raises(BadSignature):
            hook.verify(_request(body))


def test_parse_a_text() -> None:
    [rec] = BaileysWebhook(TOKEN).parse(_request(_text()))
    assert rec == Inbound(
        id="3EB0C767D097B7",
        chat_id=JID,
        sender=JID,
        channel="baileys",
        ts=1767225600.0,
        text="hi there",
        data={"type": "conversation", "profile_name": "Ana"},
    )


def test_parse_a_group_message_names_its_participant() -> None:
    body = _text(jid=GROUP, participant=JID)
    [rec] = BaileysWebhook(TOKEN).parse(_request(body))
    assert (rec.chat_id, rec.sender) == (GROUP, JID)


def test_parse_a_button_reply_as_an_interaction() -> None:
    content = {
        "buttonsResponseMessage": {
            "selectedButtonId": "yes",
            "selectedDisplayText": "Yes",
            "contextInfo": {"stanzaId": "3EB0QUESTION"},
        }
    }
    [rec] = BaileysWebhook(TOKEN).parse(_request(upsert([message("3EB0B", JID, content)], TOKEN)))
    assert (rec.kind, rec.text) == ("interaction", "Yes")
    assert rec.data["payload"] == "yes" and rec.data["reply_to"] == "3EB0QUESTION"


@pytest.mark.parametrize(
    "body",
    [
        _text(from_me=True),  # sent by this account
        _text(jid="status@broadcast"),
        upsert([message("3EB0P", JID, {"protocolMessage": {"type": 0}})], TOKEN),  # a revoke
        upsert([message("3EB0H", JID, {"conversation": "old"})], TOKEN, kind="append"),
        upsert([], TOKEN, event="messages.update"),
        json.dumps(
            {
                "event": "connection.update",
                "data": {"connection": "open"},
                "webhookVerifyToken": TOKEN,
            }
        ).encode(),
    ],
)
def test_what_is_not_a_message_from_someone_else_gives_no_record(body: bytes) -> None:
    assert BaileysWebhook(TOKEN).parse(_request(body)) == []


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"[1, 2]", "not a JSON object"),
        (b'{"data": {}}', "no event"),
        (b'{"event": "messages.upsert", "data": {"type": "notify"}}', "messages list"),
        (upsert([{"message": {"conversation": "x"}}], TOKEN), "key.remoteJid and key.id"),
    ],
)
def test_a_body_that_is_not_the_bridges_is_malformed(body: bytes, says: str) -> None:
    with pytest.raises(MalformedWebhook, match=says):
        BaileysWebhook(TOKEN).parse(_request(body))


def test_a_retried_webhook_gives_the_same_id_and_a_bare_200() -> None:
    hook = BaileysWebhook(TOKEN)
    assert hook.parse(_request(_text()))[0].id == hook.parse(_request(_text()))[0].id
    assert hook.reply(_request(_text()), []).status == 200
    assert hook.handshake(_request(_text())) is None


def test_byte_fields_in_base64_read_as_buffers_do() -> None:
    key = bytes(range(32))
    part = {"url": "https://mmg.whatsapp.net/v/x.enc", "mimetype": "audio/ogg", "ptt": True}
    for form in (node_buffer(key), base64.b64encode(key).decode()):
        body = upsert([message("3EB0V", JID, {"audioMessage": {**part, "mediaKey": form}})], TOKEN)
        [rec] = BaileysWebhook(TOKEN).parse(_request(body))
        assert rec.media is not None
        assert rec.media.extra["mediaKey"] == base64.b64encode(key).decode()
        assert rec.media.extra["type"] == "audio"


@pytest.mark.kafka
async def test_a_webhook_through_the_gateway_is_one_record_keyed_by_the_chat(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    hook = webhook_from_env("baileys", {"BAILEYS_WEBHOOK_VERIFY_TOKEN": TOKEN})
    headers = {"Content-Type": "application/json"}
    wrong = upsert([message("3EB0GW", JID, {"conversation": "x"})], "wrong-token")
    bad, none = await post_through_gateway(kafka_bootstrap, topic_prefix, hook, wrong, headers)
    assert bad == [401] and none == []
    body = upsert([message("3EB0GW", JID, {"conversation": "through the gateway"})], TOKEN)
    statuses, records = await post_through_gateway(
        kafka_bootstrap, topic_prefix, hook, body, headers, times=3
    )
    assert statuses == [200, 200, 200]  # the bridge retried it: produced once
    [(key, rec)] = records
    assert key == chat_key(JID)
    assert (rec.id, rec.chat_id, rec.text, rec.channel) == (
        "3EB0GW",
        JID,
        "through the gateway",
        "baileys",
    )

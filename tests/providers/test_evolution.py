"""``botmesh.providers.evolution`` against the local fake of Evolution API v2
(``tests/providers/fakes/evolution.py``), over real HTTP: what is sent how, Evolution's own
errors, media downloaded by the message key, also on a replay from the journal; the webhook
(the JWT of its ``jwt_key``, or the body's ``apikey``) on bodies as Evolution posts them, and
through the gateway. The rules the three WhatsApp Web bridges share are tested in
``test_wa_bridges.py``."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest

from botmesh.providers.channels import webhook_from_env
from botmesh.providers.evolution import EvolutionProvider, EvolutionWebhook, jwt_problem
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
from botmesh.topics.records import chat_key
from tests.kafka.conftest import kafka_bootstrap, topic_prefix
from tests.providers.channel_paths import post_through_gateway, replay_media, send_through_engine
from tests.providers.fakes.evolution import FakeEvolution, jwt_for, received, upsert
from tests.providers.fakes.wa_bridges import refused
from tests.providers.serve import serving

__all__ = ["kafka_bootstrap", "topic_prefix"]  # the broker fixtures of the gateway test

NUMBER = "5511999990001"
JID = f"{NUMBER}@s.whatsapp.net"
SECRET = "evolution-jwt-key-0123"
INSTANCE = "support-bot"


@dataclass
class Rig:
    fake: FakeEvolution
    url: str
    provider: EvolutionProvider


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    fake = FakeEvolution(INSTANCE)
    async with serving(fake.app()) as url:
        provider = EvolutionProvider(url, fake.token, INSTANCE)
        try:
            yield Rig(fake, url, provider)
        finally:
            await provider.close()


# -- sending ----------------------------------------------------------------------------------


async def test_a_text_goes_to_send_text_of_the_instance(rig: Rig) -> None:
    result = await rig.provider.send(Outbound(JID, "hello", options={"linkPreview": False}))
    [sent] = rig.fake.sent
    assert result.message_id == sent.id and sent.chat == JID
    assert sent.body == {"number": JID, "text": "hello", "linkPreview": False}
    assert rig.fake.calls == [f"POST /message/sendText/{INSTANCE}"]


async def test_the_global_key_works_too(rig: Rig) -> None:
    provider = EvolutionProvider(rig.url, rig.fake.global_key, INSTANCE)
    try:
        await provider.send(Outbound(NUMBER, "hi"))
    finally:
        await provider.close()
    assert rig.fake.texts() == {JID: ["hi"]}


@pytest.mark.parametrize(
    ("media", "fields"),
    [
        (
            Media(url="https://cdn.example.com/cat.jpg", mime="image/jpeg"),
            {
                "mediatype": "image",
                "mimetype": "image/jpeg",
                "media": "https://cdn.example.com/cat.jpg",
            },
        ),
        (
            Media(data=b"%PDF-1.4", name="invoice.pdf"),
            {
                "mediatype": "document",
                "mimetype": "application/pdf",
                "media": base64.b64encode(b"%PDF-1.4").decode(),
                "fileName": "invoice.pdf",
            },
        ),
        (
            Media(url="https://cdn.example.com/files/report.pdf"),
            {
                "mediatype": "document",
                "mimetype": "application/pdf",
                "media": "https://cdn.example.com/files/report.pdf",
                "fileName": "report.pdf",
            },
        ),
    ],
)
async def test_media_goes_to_send_media_by_url_or_base64_with_the_caption(
    rig: Rig, media: Media, fields: dict[str, str]
) -> None:
    result = await rig.provider.send(Outbound(JID, "look", media))
    [sent] = rig.fake.sent
    assert result.message_id == sent.id
    assert sent.body == {"number": JID, "caption": "look", **fields}
    assert rig.fake.calls == [f"POST /message/sendMedia/{INSTANCE}"]


@pytest.mark.parametrize(
    ("message", "says"),
    [
        (Outbound(JID), "neither text nor media"),
        (Outbound(JID, None, Media(id="1049", provider="whatsapp")), "cannot be sent"),
        (Outbound(JID, None, Media(url="ftp://example.com/a.jpg")), "http"),
        (Outbound(JID, "hi", Media(data=b"OggS", mime="audio/ogg")), "no caption"),
    ],
)
async def test_what_evolution_cannot_take_is_refused_before_any_call(
    rig: Rig, message: Outbound, says: str
) -> None:
    with pytest.raises(UnsupportedContentError, match=says):
        await rig.provider.send(message)
    assert rig.fake.calls == []


# -- Evolution's own errors -------------------------------------------------------------------


async def test_a_number_without_whatsapp_is_unreachable(rig: Rig) -> None:
    with pytest.raises(RecipientUnreachableError, match='"exists": false') as err:
        await rig.provider.send(Outbound("5511000000000", "hi"))
    assert err.value.retryable is False


async def test_a_closed_session_is_retried(rig: Rig) -> None:
    rig.fake.connected = False
    with pytest.raises(SendError, match="Connection Closed") as err:
        await rig.provider.send(Outbound(JID, "hi"))
    assert type(err.value) is SendError and err.value.retryable is True


async def test_an_unknown_instance_is_final_and_names_the_variable(rig: Rig) -> None:
    err = await refused(EvolutionProvider(rig.url, rig.fake.token, "nope"), Outbound(JID, "hi"))
    assert "EVOLUTION_INSTANCE" in str(err) and "does not exist" in str(err)
    assert err.retryable is False


@pytest.mark.parametrize(
    ("status", "message", "kind", "retryable"),
    [
        (400, ["Text is required"], SendError, False),
        (400, ["Error: Timed Out"], SendError, True),
        (413, "request entity too large", PayloadTooLargeError, False),
        (403, ["Missing global api key"], SendError, False),
    ],
)
async def test_scripted_evolution_errors(
    rig: Rig, status: int, message: Any, kind: type[SendError], retryable: bool
) -> None:
    rig.fake.fail_next(status, {"status": status, "error": "x", "response": {"message": message}})
    with pytest.raises(kind) as err:
        await rig.provider.send(Outbound(JID, "hi"))
    assert type(err.value) is kind and err.value.retryable is retryable


async def test_a_201_without_a_key_is_final_it_may_be_out(rig: Rig) -> None:
    rig.fake.fail_next(201, {"status": "PENDING"})
    with pytest.raises(SendError, match="may be out") as err:
        await rig.provider.send(Outbound(JID, "hi"))
    assert err.value.retryable is False


async def test_the_engine_dead_letters_a_number_without_whatsapp_at_once(rig: Rig) -> None:
    with pytest.raises(RecipientUnreachableError):
        await send_through_engine(rig.provider, "5511000000000", "hi")
    assert rig.fake.calls == [f"POST /message/sendText/{INSTANCE}"]  # final: never retried


# -- edit, delete, typing -----------------------------------------------------------------------


async def test_edit_replaces_the_text_and_keeps_the_id(rig: Rig) -> None:
    assert isinstance(rig.provider, Edits)
    sent = await rig.provider.send(Outbound(NUMBER, "draft"))
    edited = await rig.provider.edit(Outbound(NUMBER, "final"), sent.message_id)
    assert edited.message_id == sent.message_id
    assert rig.fake.texts() == {JID: ["final"]}
    assert rig.fake.calls[-1] == f"POST /chat/updateMessage/{INSTANCE}"


async def test_editing_an_unknown_message_is_final(rig: Rig) -> None:
    with pytest.raises(SendError, match="Message not compatible") as err:
        await rig.provider.edit(Outbound(JID, "x"), "3EB0NOPE")
    assert err.value.retryable is False


async def test_delete_removes_the_message_and_twice_is_fine(rig: Rig) -> None:
    assert isinstance(rig.provider, Deletes)
    keep = await rig.provider.send(Outbound(JID, "keep"))
    gone = await rig.provider.send(Outbound(JID, "gone"))
    await rig.provider.delete(NUMBER, gone.message_id)
    assert [m.id for m in rig.fake.sent] == [keep.message_id]
    await rig.provider.delete(JID, gone.message_id)
    assert rig.fake.calls[-1] == f"DELETE /chat/deleteMessageForEveryone/{INSTANCE}"


async def test_typing_sends_composing_presence(rig: Rig) -> None:
    assert isinstance(rig.provider, Typing)
    await rig.provider.typing(NUMBER)
    assert rig.fake.presences == [(JID, "composing", EvolutionProvider.typing_ms)]
    with pytest.raises(RecipientUnreachableError):
        await rig.provider.typing("5511000000000")


async def test_edit_delete_and_typing_map_errors_as_send_does(rig: Rig) -> None:
    sent = await rig.provider.send(Outbound(JID, "hi"))
    rig.fake.rate_limit("4")
    with pytest.raises(RateLimitedError) as limited:
        await rig.provider.edit(Outbound(JID, "x"), sent.message_id)
    assert limited.value.retry_after == 4
    rig.fake.connected = False
    with pytest.raises(SendError, match="Connection Closed") as down:
        await rig.provider.delete(JID, sent.message_id)
    assert down.value.retryable is True
    rig.fake.connected = True
    wrong = EvolutionProvider(rig.url, "not-the-token", INSTANCE)
    try:
        with pytest.raises(SendError, match="EVOLUTION_API_KEY") as err:
            await wrong.typing(JID)
    finally:
        await wrong.close()
    assert err.value.retryable is False
    assert rig.fake.texts() == {JID: ["hi"]}


# -- media --------------------------------------------------------------------------------------


def _request(
    body: bytes, *, jwt: str | None = None, query: dict[str, str] | None = None
) -> WebhookRequest:
    headers = {"content-type": "application/json"}
    if jwt is not None:
        headers["authorization"] = f"Bearer {jwt}"
    return WebhookRequest(
        "POST", "/evolution", "https://hooks.example.com/evolution", headers, query or {}, body
    )


def _image(mid: str = "BAE5F2C1A0", **more: Any) -> bytes:
    part = {"url": "https://mmg.whatsapp.net/x.enc", "mimetype": "image/jpeg", "caption": "a photo"}
    return upsert(INSTANCE, received(mid, JID, {"imageMessage": part, **more}))


async def test_media_is_the_key_and_downloads_by_it(rig: Rig) -> None:
    [inbound] = EvolutionWebhook(secret=SECRET).parse(_request(_image()))
    media = inbound.media
    assert media == Media(
        provider="evolution",
        mime="image/jpeg",
        extra={"key": {"remoteJid": JID, "id": "BAE5F2C1A0", "fromMe": False}},
    )
    assert inbound.text == "a photo"
    rig.fake.media["BAE5F2C1A0"] = (b"the-photo", "image/jpeg")
    assert await rig.provider.download_media(media) == b"the-photo"
    assert rig.fake.calls == [f"POST /chat/getBase64FromMediaMessage/{INSTANCE}"]
    with pytest.raises(ProviderError, match="Message not found"):
        await rig.provider.download_media(
            Media(provider="evolution", extra={"key": {"id": "NOPE"}})
        )
    with pytest.raises(ProviderError, match="no message key"):
        await rig.provider.download_media(Media(provider="evolution"))


async def test_bytes_the_webhook_inlined_serve_the_live_run(rig: Rig) -> None:
    body = _image(base64=base64.b64encode(b"inline").decode())
    [inbound] = EvolutionWebhook(secret=SECRET).parse(_request(body))
    assert inbound.media is not None and inbound.media.data == b"inline"
    assert await rig.provider.download_media(inbound.media) == b"inline"
    assert rig.fake.calls == []


async def test_the_journal_keeps_the_key_and_the_replay_downloads_again(rig: Rig) -> None:
    body = _image(base64=base64.b64encode(b"the-photo").decode())
    [inbound] = EvolutionWebhook(secret=SECRET).parse(_request(body))
    rig.fake.media["BAE5F2C1A0"] = (b"the-photo", "image/jpeg")
    seen = await replay_media(rig.provider, inbound)
    assert seen.errors == [] and seen.loaded == [b"the-photo", b"the-photo"]
    key = {"remoteJid": JID, "id": "BAE5F2C1A0", "fromMe": False}
    assert seen.journaled["ref"] == {"v": 1, "data": {"key": key}}
    assert base64.b64encode(b"the-photo").decode() not in json.dumps(seen.journaled)
    # the live run used the inlined bytes, the replay asked Evolution
    assert rig.fake.calls == [f"POST /chat/getBase64FromMediaMessage/{INSTANCE}"]


async def test_a_replayed_media_evolution_no_longer_has_cannot_be_loaded(rig: Rig) -> None:
    [inbound] = EvolutionWebhook(secret=SECRET).parse(_request(_image()))
    rig.fake.media["BAE5F2C1A0"] = (b"x", "image/jpeg")
    seen = await replay_media(rig.provider, inbound, before_replay=rig.fake.media.clear)
    assert seen.loaded == [b"x"] and seen.errors == ["rehydrate-failed"]


# -- the webhook ------------------------------------------------------------------------------


def _text(mid: str = "3EB0C767D097B7", jid: str = JID, **more: Any) -> bytes:
    return upsert(INSTANCE, received(mid, jid, {"conversation": "hi there"}), **more)


def test_the_jwt_of_the_jwt_key_is_checked() -> None:
    now = time.time()
    hook = EvolutionWebhook(secret=SECRET, clock=lambda: now)
    hook.verify(_request(_text(), jwt=jwt_for(SECRET, now)))
    bad = [
        None,  # no Authorization header
        jwt_for("another-key-0123456", now),
        jwt_for(SECRET, now - 700),  # expired ten minutes after it was made
        jwt_for(SECRET, now, alg="HS512"),
        "not.a.jwt",
    ]
    for token in bad:
        with pytest.raises(BadSignature):
            hook.verify(_request(_text(), jwt=token))
    assert jwt_problem(jwt_for(SECRET, now - 620), SECRET, now) is None  # within the leeway


def test_without_a_secret_the_bodys_apikey_must_be_the_instance_token() -> None:
    hook = EvolutionWebhook(api_key="INSTANCE-TOKEN-0123")
    hook.verify(_request(_text(apikey="INSTANCE-TOKEN-0123")))
    for body in (_text(apikey="another"), _text(), b"not json"):
        with pytest.raises(BadSignature):
            hook.verify(_request(body))


def test_from_env_takes_the_secret_or_the_api_key_and_names_what_is_missing() -> None:
    assert isinstance(
        webhook_from_env("evolution", {"EVOLUTION_WEBHOOK_SECRET": SECRET}), EvolutionWebhook
    )
    hook = webhook_from_env("evolution", {"EVOLUTION_API_KEY": "k", "EVOLUTION_INSTANCE": INSTANCE})
    assert isinstance(hook, EvolutionWebhook) and hook.instance == INSTANCE
    with pytest.raises(ConfigError) as err:
        webhook_from_env("evolution", {"EVOLUTION_INSTANCE": INSTANCE})
    assert err.value.field == "EVOLUTION_WEBHOOK_SECRET"


def test_parse_a_text() -> None:
    [rec] = EvolutionWebhook(secret=SECRET).parse(_request(_text()))
    assert rec == Inbound(
        id="3EB0C767D097B7",
        chat_id=JID,
        sender=JID,
        channel="evolution",
        ts=1767225600.0,
        text="hi there",
        data={"type": "conversation", "instance": INSTANCE, "profile_name": "Ana"},
    )


def test_parse_a_list_reply_as_an_interaction() -> None:
    reply = {"title": "Express", "singleSelectReply": {"selectedRowId": "row-2"}}
    body = upsert(INSTANCE, received("3EB0L", JID, {"listResponseMessage": reply}))
    [rec] = EvolutionWebhook(secret=SECRET).parse(_request(body))
    assert (rec.kind, rec.text, rec.data["payload"]) == ("interaction", "Express", "row-2")


def test_an_uppercase_event_name_is_read_too_and_other_instances_are_ignored() -> None:
    body = upsert(INSTANCE, received("3EB0U", JID, {"conversation": "x"}), event="MESSAGES_UPSERT")
    assert len(EvolutionWebhook(secret=SECRET).parse(_request(body))) == 1
    other = upsert("another-instance", received("3EB0O", JID, {"conversation": "x"}))
    assert EvolutionWebhook(secret=SECRET, instance=INSTANCE).parse(_request(other)) == []
    assert len(EvolutionWebhook(secret=SECRET).parse(_request(other))) == 1


@pytest.mark.parametrize(
    "body",
    [
        upsert(
            INSTANCE,
            {
                **received("3EB0M", JID, {"conversation": "x"}),
                "key": {"remoteJid": JID, "fromMe": True, "id": "3EB0M"},
            },
        ),
        _text(jid="status@broadcast"),
        upsert(INSTANCE, received("3EB0P", JID, {"protocolMessage": {"type": "REVOKE"}})),
        upsert(INSTANCE, {"remoteJid": JID, "status": "READ"}, event="messages.update"),
        upsert(INSTANCE, {"state": "open"}, event="connection.update"),
    ],
)
def test_what_is_not_a_message_from_someone_else_gives_no_record(body: bytes) -> None:
    assert EvolutionWebhook(secret=SECRET).parse(_request(body)) == []


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"not json", "not JSON"),
        (b'{"instance": "x"}', "no event"),
        (upsert(INSTANCE, None), "not a message"),  # type: ignore[arg-type]
        (upsert(INSTANCE, {"message": {"conversation": "x"}}), "key.remoteJid and key.id"),
    ],
)
def test_a_body_that_is_not_evolutions_is_malformed(body: bytes, says: str) -> None:
    with pytest.raises(MalformedWebhook, match=says):
        EvolutionWebhook(secret=SECRET).parse(_request(body))


def test_a_retried_webhook_gives_the_same_id_and_a_bare_200() -> None:
    hook = EvolutionWebhook(secret=SECRET)
    assert hook.parse(_request(_text()))[0].id == hook.parse(_request(_text()))[0].id
    assert hook.reply(_request(_text()), []).status == 200


@pytest.mark.kafka
async def test_a_webhook_through_the_gateway_is_one_record_keyed_by_the_chat(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    hook = webhook_from_env("evolution", {"EVOLUTION_WEBHOOK_SECRET": SECRET})
    body = upsert(INSTANCE, received("3EB0GW", JID, {"conversation": "through the gateway"}))
    plain = {"Content-Type": "application/json"}
    bad, none = await post_through_gateway(kafka_bootstrap, topic_prefix, hook, body, plain)
    assert bad == [401] and none == []
    signed = {**plain, "Authorization": f"Bearer {jwt_for(SECRET)}"}
    statuses, records = await post_through_gateway(
        kafka_bootstrap, topic_prefix, hook, body, signed, times=3
    )
    assert statuses == [200, 200, 200]  # Evolution retried it: produced once
    [(key, rec)] = records
    assert key == chat_key(JID)
    assert (rec.id, rec.chat_id, rec.text, rec.channel) == (
        "3EB0GW",
        JID,
        "through the gateway",
        "evolution",
    )

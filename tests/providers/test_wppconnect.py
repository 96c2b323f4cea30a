"""``botmesh.providers.wppconnect`` against the local fake of WPPConnect server
(``tests/providers/fakes/wppconnect.py``), over real HTTP: what is sent how, WPPConnect's own
errors, media downloaded by the message id, also on a replay from the journal; the webhook
(the secret in its URL) on bodies as WPPConnect posts them, and through the gateway. The
rules the three WhatsApp Web bridges share are tested in ``test_wa_bridges.py``."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest

from botmesh.providers.channels import webhook_from_env
from botmesh.providers.webhooks import BadSignature, MalformedWebhook, WebhookRequest
from botmesh.providers.wppconnect import WppConnectProvider, WppConnectWebhook
from botmesh.state.errors import (
    ConfigError,
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
from tests.providers.fakes.wa_bridges import refused
from tests.providers.fakes.wppconnect import FakeWppConnect, onmessage
from tests.providers.serve import serving

__all__ = ["kafka_bootstrap", "topic_prefix"]  # the broker fixtures of the gateway test

CHAT = "5511999990001@c.us"
GROUP = "120363041234567890@g.us"
SECRET = "wpp-webhook-secret-0123456789"
MID = "false_5511999990001@c.us_3EB0C767D097B7"


@dataclass
class Rig:
    fake: FakeWppConnect
    url: str
    provider: WppConnectProvider


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    fake = FakeWppConnect("support")
    async with serving(fake.app()) as url:
        provider = WppConnectProvider(url, fake.token, "support")
        try:
            yield Rig(fake, url, provider)
        finally:
            await provider.close()


# -- sending ----------------------------------------------------------------------------------


async def test_a_text_goes_to_send_message_of_the_session(rig: Rig) -> None:
    result = await rig.provider.send(Outbound(CHAT, "hello", options={"quotedMsg": MID}))
    [sent] = rig.fake.sent
    assert result.message_id == sent.id == f"true_{CHAT}_{sent.id.rsplit('_', 1)[1]}"
    assert sent.body == {
        "phone": CHAT,
        "isGroup": False,
        "isLid": False,
        "message": "hello",
        "options": {"quotedMsg": MID},
    }
    assert rig.fake.calls == ["POST /api/support/send-message"]


async def test_a_group_and_a_lid_chat_say_so(rig: Rig) -> None:
    await rig.provider.send(Outbound(GROUP, "all"))
    await rig.provider.send(Outbound("5511999990002@lid", "you"))
    first, second = rig.fake.sent
    assert (first.chat, first.body["isGroup"]) == (GROUP, True)
    assert (second.chat, second.body["isLid"]) == ("5511999990002@lid", True)


async def test_media_by_url_and_by_bytes(rig: Rig) -> None:
    await rig.provider.send(Outbound(CHAT, "cat", Media(url="https://cdn.example.com/a/cat.jpg")))
    await rig.provider.send(Outbound(CHAT, None, Media(data=b"%PDF", name="invoice.pdf")))
    by_url, by_bytes = rig.fake.sent
    assert (by_url.media, by_url.name, by_url.caption) == (
        "https://cdn.example.com/a/cat.jpg",
        "cat.jpg",
        "cat",
    )
    assert (by_bytes.media, by_bytes.name, by_bytes.mime) == (
        b"%PDF",
        "invoice.pdf",
        "application/pdf",
    )
    assert (
        by_bytes.body["base64"]
        == "data:application/pdf;base64," + base64.b64encode(b"%PDF").decode()
    )
    assert rig.fake.calls == ["POST /api/support/send-file", "POST /api/support/send-file-base64"]


@pytest.mark.parametrize(
    ("message", "error", "says"),
    [
        (Outbound(CHAT), UnsupportedContentError, "neither text nor media"),
        (Outbound(CHAT, None, Media(id=MID, provider="wppconnect")), UnsupportedContentError, "id"),
        (Outbound("5511999990001,5511999990002", "hi"), RecipientUnreachableError, "chat id"),
        (Outbound("5511999990001@c.us/../../x", "hi"), RecipientUnreachableError, "chat id"),
    ],
)
async def test_what_wppconnect_cannot_take_is_refused_before_any_call(
    rig: Rig, message: Outbound, error: type[SendError], says: str
) -> None:
    with pytest.raises(error, match=says) as err:
        await rig.provider.send(message)
    assert err.value.retryable is False and rig.fake.calls == []


# -- WPPConnect's own errors ------------------------------------------------------------------


async def test_a_number_without_whatsapp_is_unreachable(rig: Rig) -> None:
    with pytest.raises(RecipientUnreachableError, match="não existe") as err:
        await rig.provider.send(Outbound("5511000000000", "hi"))
    assert err.value.retryable is False


async def test_a_session_that_is_not_running_is_retried(rig: Rig) -> None:
    rig.fake.connected = False
    with pytest.raises(SendError, match="not running") as err:
        await rig.provider.send(Outbound(CHAT, "hi"))
    assert type(err.value) is SendError and err.value.retryable is True


async def test_a_failed_send_is_a_retryable_500(rig: Rig) -> None:
    error = {"message": "Chat not found", "code": "chat_not_found"}
    rig.fake.fail_next(
        500, {"status": "Error", "message": "Erro ao enviar a mensagem.", "error": error}
    )
    with pytest.raises(SendError, match="Erro ao enviar") as err:
        await rig.provider.send(Outbound(CHAT, "hi"))
    assert type(err.value) is SendError and err.value.retryable is True


async def test_a_missing_token_and_another_session_are_final(rig: Rig) -> None:
    err = await refused(WppConnectProvider(rig.url, rig.fake.token, "other"), Outbound(CHAT, "x"))
    assert "WPPCONNECT_TOKEN" in str(err) and "Session and Token" in str(err)
    assert err.retryable is False


@pytest.mark.parametrize(
    "answer",
    [
        {"status": "Error", "response": []},
        {"status": "success", "response": []},
        {"status": "success", "response": [{"ack": 0}]},
    ],
)
async def test_a_201_that_names_no_message_is_final_it_may_be_out(
    rig: Rig, answer: dict[str, Any]
) -> None:
    rig.fake.fail_next(201, answer)
    with pytest.raises(SendError, match="may be out") as err:
        await rig.provider.send(Outbound(CHAT, "hi"))
    assert err.value.retryable is False


async def test_a_wa_js_id_object_is_read_too(rig: Rig) -> None:
    rig.fake.fail_next(201, {"status": "success", "response": [{"id": {"_serialized": MID}}]})
    assert (await rig.provider.send(Outbound(CHAT, "hi"))).message_id == MID


async def test_the_engine_dead_letters_a_number_without_whatsapp_at_once(rig: Rig) -> None:
    with pytest.raises(RecipientUnreachableError):
        await send_through_engine(rig.provider, "5511000000000", "hi")
    assert rig.fake.calls == ["POST /api/support/send-message"]  # final: never retried


# -- edit, delete, typing -----------------------------------------------------------------------


async def test_edit_replaces_the_text_and_keeps_the_id(rig: Rig) -> None:
    assert isinstance(rig.provider, Edits)
    sent = await rig.provider.send(Outbound("5511999990001", "draft"))
    edited = await rig.provider.edit(Outbound(CHAT, "final "), sent.message_id)
    assert edited.message_id == sent.message_id
    assert rig.fake.texts() == {CHAT: ["final"]}  # wa-js trims the new text
    assert rig.fake.calls[-1] == "POST /api/support/edit-message"
    with pytest.raises(UnsupportedContentError):
        await rig.provider.edit(Outbound(CHAT, ""), sent.message_id)


async def test_editing_an_unknown_message_is_a_500_retried_as_a_send_is(rig: Rig) -> None:
    with pytest.raises(SendError, match="Erro ao enviar a mensagem") as err:
        await rig.provider.edit(Outbound(CHAT, "x"), MID)
    assert err.value.retryable is True


async def test_delete_revokes_the_message_and_twice_is_fine(rig: Rig) -> None:
    assert isinstance(rig.provider, Deletes)
    keep = await rig.provider.send(Outbound(CHAT, "keep"))
    gone = await rig.provider.send(Outbound(CHAT, "gone"))
    await rig.provider.delete("5511999990001", gone.message_id)
    assert [m.id for m in rig.fake.sent] == [keep.message_id]
    await rig.provider.delete(CHAT, gone.message_id)
    assert rig.fake.revoked == {gone.message_id}
    assert rig.fake.calls[-1] == "POST /api/support/delete-message"
    with pytest.raises(SendError, match="Error on delete message"):
        await rig.provider.delete(CHAT, MID)


async def test_typing_marks_the_chat_composing(rig: Rig) -> None:
    assert isinstance(rig.provider, Typing)
    await rig.provider.typing(CHAT)
    await rig.provider.typing(GROUP)
    assert rig.fake.typings == [(CHAT, True), (GROUP, True)]
    with pytest.raises(RecipientUnreachableError):
        await rig.provider.typing("5511000000000")
    with pytest.raises(RecipientUnreachableError):
        await rig.provider.typing("5511999990001,5511999990002")
    assert len(rig.fake.typings) == 2


async def test_edit_delete_and_typing_map_errors_as_send_does(rig: Rig) -> None:
    sent = await rig.provider.send(Outbound(CHAT, "hi"))
    rig.fake.rate_limit("4")
    with pytest.raises(RateLimitedError) as limited:
        await rig.provider.edit(Outbound(CHAT, "x"), sent.message_id)
    assert limited.value.retry_after == 4
    rig.fake.connected = False
    for call in (
        rig.provider.edit(Outbound(CHAT, "x"), sent.message_id),
        rig.provider.delete(CHAT, sent.message_id),
        rig.provider.typing(CHAT),
    ):
        with pytest.raises(SendError, match="not running now") as down:
            await call
        assert down.value.retryable is True
    rig.fake.connected = True
    rig.fake.fail_next(401, {"status": "error", "response": {"message": "Error unknown"}})
    with pytest.raises(SendError, match="deleted nothing") as nothing:
        await rig.provider.delete(CHAT, sent.message_id)
    assert nothing.value.retryable is False
    wrong = WppConnectProvider(rig.url, "not-the-token", "support")
    try:
        with pytest.raises(SendError, match="WPPCONNECT_TOKEN") as err:
            await wrong.typing(CHAT)
    finally:
        await wrong.close()
    assert err.value.retryable is False
    assert rig.fake.texts() == {CHAT: ["hi"]} and rig.fake.typings == []


# -- media --------------------------------------------------------------------------------------


def _request(body: bytes, secret: str | None = SECRET) -> WebhookRequest:
    query = {"secret": secret} if secret is not None else {}
    return WebhookRequest(
        "POST", "/wppconnect", "https://hooks.example.com/wppconnect", {}, query, body
    )


def _image(mid: str = MID) -> bytes:
    return onmessage(
        mid,
        "5511999990001@c.us",
        "image",
        body="/9j/4AAQSkZJRgABAQAAAQABAAD-thumbnail",
        caption="a photo",
        mimetype="image/jpeg",
        isMedia=True,
        mediaKey="g3Qk1Y0mT9lQ",
    )


async def test_media_is_the_message_id_and_downloads_by_it(rig: Rig) -> None:
    [inbound] = WppConnectWebhook(SECRET).parse(_request(_image()))
    assert inbound.media == Media(
        provider="wppconnect", id=MID, mime="image/jpeg", extra={"message_id": MID}
    )
    assert inbound.text == "a photo"  # never the thumbnail in ``body``
    rig.fake.media[MID] = (b"the-photo", "image/jpeg")
    assert await rig.provider.download_media(inbound.media) == b"the-photo"
    assert rig.fake.calls == [f"GET /api/support/get-media-by-message/{MID}"]
    with pytest.raises(ProviderError, match="Message not found"):
        await rig.provider.download_media(Media(provider="wppconnect", id="true_1@c.us_NOPE"))
    with pytest.raises(ProviderError, match="no message id"):
        await rig.provider.download_media(Media(provider="wppconnect", id="../../x"))


async def test_the_journal_keeps_the_message_id_and_the_replay_downloads_again(rig: Rig) -> None:
    [inbound] = WppConnectWebhook(SECRET).parse(_request(_image()))
    rig.fake.media[MID] = (b"the-photo", "image/jpeg")
    seen = await replay_media(rig.provider, inbound)
    assert seen.errors == [] and seen.loaded == [b"the-photo", b"the-photo"]
    assert seen.journaled["ref"] == {"v": 1, "data": {"message_id": MID}}
    assert "the-photo" not in json.dumps(seen.journaled)
    assert rig.fake.token not in json.dumps(seen.journaled)


async def test_a_replayed_media_the_session_lost_cannot_be_loaded(rig: Rig) -> None:
    [inbound] = WppConnectWebhook(SECRET).parse(_request(_image()))
    rig.fake.media[MID] = (b"x", "image/jpeg")
    seen = await replay_media(rig.provider, inbound, before_replay=rig.fake.media.clear)
    assert seen.loaded == [b"x"] and seen.errors == ["rehydrate-failed"]


# -- the webhook ------------------------------------------------------------------------------


def _text(mid: str = MID, chat: str = CHAT, **more: Any) -> bytes:
    return onmessage(mid, chat, "chat", body="hi there", **more)


def test_the_secret_in_the_url_is_checked() -> None:
    hook = WppConnectWebhook(SECRET)
    hook.verify(_request(_text()))
    for secret in (None, "", "wrong-secret-0123456789"):
        with pytest.raises(BadSignature):
            hook.verify(_request(_text(), secret))


def test_from_env_needs_a_long_enough_secret() -> None:
    hook = webhook_from_env(
        "wppconnect", {"WPPCONNECT_WEBHOOK_SECRET": SECRET, "WPPCONNECT_SESSION": "support"}
    )
    assert isinstance(hook, WppConnectWebhook) and hook.session == "support"
    for env in ({}, {"WPPCONNECT_WEBHOOK_SECRET": "short"}):
        with pytest.raises(ConfigError) as err:
            webhook_from_env("wppconnect", env)
        assert err.value.field == "WPPCONNECT_WEBHOOK_SECRET"


def test_parse_a_text() -> None:
    [rec] = WppConnectWebhook(SECRET).parse(_request(_text(quotedMsgId="true_x@c.us_3EB0Q")))
    assert rec == Inbound(
        id=MID,
        chat_id=CHAT,
        sender=CHAT,
        channel="wppconnect",
        ts=1767225600.0,
        text="hi there",
        data={
            "type": "chat",
            "session": "support",
            "reply_to": "true_x@c.us_3EB0Q",
            "profile_name": "Ana",
        },
    )


def test_parse_a_group_message_names_its_author() -> None:
    body = _text(f"false_{GROUP}_3EB0G_{CHAT}", GROUP, author=CHAT)
    [rec] = WppConnectWebhook(SECRET).parse(_request(body))
    assert (rec.chat_id, rec.sender) == (GROUP, CHAT)


@pytest.mark.parametrize(
    ("more", "text", "payload"),
    [
        ({"type": "buttons_response", "body": "Yes", "selectedButtonId": "yes"}, "Yes", "yes"),
        (
            {
                "type": "list_response",
                "body": "Express",
                "listResponse": {"title": "Express", "singleSelectReply": {"selectedRowId": "r2"}},
            },
            "Express",
            "r2",
        ),
        ({"type": "template_button_reply", "body": "Go", "selectedId": "t1"}, "Go", "t1"),
    ],
)
def test_parse_replies_as_interactions(more: dict[str, Any], text: str, payload: str) -> None:
    body = json.loads(_text())
    body.update(more)
    [rec] = WppConnectWebhook(SECRET).parse(_request(json.dumps(body).encode()))
    assert (rec.kind, rec.text, rec.data["payload"]) == ("interaction", text, payload)


def test_a_location_is_kept_in_data() -> None:
    body = onmessage(MID, CHAT, "location", lat=-23.5, lng=-46.6, loc="Paulista")
    [rec] = WppConnectWebhook(SECRET).parse(_request(body))
    assert rec.text is None and rec.data["location"] == {
        "lat": -23.5,
        "lng": -46.6,
        "loc": "Paulista",
    }


@pytest.mark.parametrize(
    "body",
    [
        _text(fromMe=True),
        _text(chat="status@broadcast"),
        onmessage(MID, CHAT, "e2e_notification"),
        onmessage(MID, CHAT, "revoked"),
        json.dumps({"event": "onack", "session": "support", "id": MID, "ack": 3}).encode(),
        json.dumps({"event": "onpresencechanged", "session": "support"}).encode(),
        _text(session="another"),  # with WPPCONNECT_SESSION=support
    ],
)
def test_what_is_not_a_message_from_someone_else_gives_no_record(body: bytes) -> None:
    assert WppConnectWebhook(SECRET, session="support").parse(_request(body)) == []


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"not json", "not JSON"),
        (b'{"session": "support"}', "no event"),
        (json.dumps({"event": "onmessage", "from": CHAT}).encode(), "without id or from"),
    ],
)
def test_a_body_that_is_not_wppconnects_is_malformed(body: bytes, says: str) -> None:
    with pytest.raises(MalformedWebhook, match=says):
        WppConnectWebhook(SECRET).parse(_request(body))


def test_a_retried_webhook_gives_the_same_id_and_a_bare_200() -> None:
    hook = WppConnectWebhook(SECRET)
    assert hook.parse(_request(_text()))[0].id == hook.parse(_request(_text()))[0].id
    assert hook.reply(_request(_text()), []).status == 200


@pytest.mark.kafka
async def test_a_webhook_through_the_gateway_is_one_record_keyed_by_the_chat(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    hook = webhook_from_env("wppconnect", {"WPPCONNECT_WEBHOOK_SECRET": SECRET})
    body = onmessage(MID, CHAT, "chat", body="through the gateway")
    headers = {"Content-Type": "application/json"}
    bad, none = await post_through_gateway(
        kafka_bootstrap, topic_prefix, hook, body, headers, query="?secret=wrong-secret-012345"
    )
    assert bad == [401] and none == []
    statuses, records = await post_through_gateway(
        kafka_bootstrap, topic_prefix, hook, body, headers, query=f"?secret={SECRET}", times=3
    )
    assert statuses == [200, 200, 200]  # WPPConnect retried it: produced once
    [(key, rec)] = records
    assert key == chat_key(CHAT)
    assert (rec.id, rec.chat_id, rec.text, rec.channel) == (
        MID,
        CHAT,
        "through the gateway",
        "wppconnect",
    )

"""Delivery status webhooks (``StatusWebhook.statuses``) of every channel that posts them:
recorded bodies as each channel documents them, bad shapes, and the status webhooks the
fakes post, checked with the channel's own ``verify``."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlencode

import aiohttp
import pytest
from aiohttp import web

from botmesh.providers.baileys import BaileysProvider, BaileysWebhook
from botmesh.providers.evolution import EvolutionProvider, EvolutionWebhook
from botmesh.providers.gupshup import GupshupProvider, GupshupWebhook
from botmesh.providers.instagram import InstagramProvider, InstagramWebhook
from botmesh.providers.messenger import MessengerProvider, MessengerWebhook
from botmesh.providers.twilio import TwilioProvider, TwilioWebhook, twilio_signature
from botmesh.providers.webhooks import (
    BadSignature,
    ChannelWebhook,
    MalformedWebhook,
    StatusWebhook,
    WebhookRequest,
)
from botmesh.providers.whatsapp import WhatsAppProvider, WhatsAppWebhook
from botmesh.providers.wppconnect import WppConnectProvider, WppConnectWebhook
from botmesh.state.errors import RecipientUnreachableError
from botmesh.state.messages import DeliveryState, DeliveryStatus, Outbound
from tests.providers.fakes.baileys import FakeBaileys
from tests.providers.fakes.evolution import FakeEvolution
from tests.providers.fakes.graph import VERSION, GraphFake
from tests.providers.fakes.gupshup import FakeGupshup
from tests.providers.fakes.twilio import FakeTwilio
from tests.providers.fakes.wppconnect import FakeWppConnect
from tests.providers.serve import serving

S = DeliveryState


def _request(
    body: bytes | dict[str, Any],
    *,
    path: str = "/hook",
    headers: dict[str, str] | None = None,
    query: dict[str, str] | None = None,
    form: dict[str, str] | None = None,
) -> WebhookRequest:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return WebhookRequest(
        "POST",
        path,
        f"https://bot.example.com{path}",
        headers or {"content-type": "application/json"},
        query or {},
        raw,
        form or {},
    )


def _states(found: list[DeliveryStatus]) -> list[tuple[str, str, DeliveryState]]:
    return [(s.chat_id, s.message_id, s.status) for s in found]


def test_every_channel_with_status_webhooks_implements_the_protocol() -> None:
    hooks: list[object] = [
        WhatsAppWebhook("s", "v"),
        MessengerWebhook("s", "v"),
        InstagramWebhook("s", "v"),
        TwilioWebhook("t" * 32),
        GupshupWebhook("g" * 16),
        EvolutionWebhook(api_key="k"),
        WppConnectWebhook("w" * 16),
        BaileysWebhook("b" * 6),
    ]
    for hook in hooks:
        assert isinstance(hook, StatusWebhook) and isinstance(hook, ChannelWebhook), hook


# -- WhatsApp Cloud API ------------------------------------------------------------------------

WAMID = "wamid.HBgLMTY1MDU1NTEyMzQVAgARGBIyRUFBRjM2QTcyQjk5MUE5AA=="


def _wa(*statuses: dict[str, Any], messages: list[Any] | None = None) -> dict[str, Any]:
    value: dict[str, Any] = {
        "messaging_product": "whatsapp",
        "metadata": {"display_phone_number": "15550783881", "phone_number_id": "106540352242922"},
        "statuses": list(statuses),
    }
    if messages is not None:
        value = {**value, "messages": messages}
        if not statuses:
            del value["statuses"]
    return {
        "object": "whatsapp_business_account",
        "entry": [{"id": "102290129340398", "changes": [{"value": value, "field": "messages"}]}],
    }


def _wa_status(status: str, **more: Any) -> dict[str, Any]:
    return {
        "id": WAMID,
        "status": status,
        "timestamp": "1750263773",
        "recipient_id": "16505551234",
        **more,
    }


FAILED_131047 = {
    "code": 131047,
    "title": "Re-engagement message",
    "message": "Re-engagement message",
    "error_data": {
        "details": "Message failed to send because more than 24 hours have passed since the "
        "customer last replied to this number."
    },
    "href": "https://developers.facebook.com/docs/whatsapp/cloud-api/support/error-codes/",
}


def test_whatsapp_sent_delivered_read_and_failed() -> None:
    hook = WhatsAppWebhook("secret", "verify")
    pricing = {"billable": True, "pricing_model": "PMP", "category": "utility"}
    body = _wa(
        _wa_status("sent", pricing=pricing, conversation={"id": "c1"}),
        _wa_status("delivered"),
        _wa_status("read"),
        _wa_status("failed", errors=[FAILED_131047]),
    )
    found = hook.statuses(_request(body))
    assert _states(found) == [
        ("16505551234", WAMID, S.SENT),
        ("16505551234", WAMID, S.DELIVERED),
        ("16505551234", WAMID, S.READ),
        ("16505551234", WAMID, S.FAILED),
    ]
    assert all(s.channel == "whatsapp" and s.ts == 1750263773.0 and s.id == "" for s in found)
    assert [(s.code, s.error) for s in found] == [(None, None)] * 3 + [
        ("131047", "Re-engagement message")
    ]
    assert hook.parse(_request(body)) == []


def test_whatsapp_other_statuses_and_message_bodies_give_none() -> None:
    hook = WhatsAppWebhook("secret", "verify")
    assert hook.statuses(_request(_wa(_wa_status("deleted"), _wa_status("warning")))) == []
    message = {"from": "16505551234", "id": "wamid.IN", "timestamp": "1", "type": "text"}
    only_messages = _wa(messages=[{**message, "text": {"body": "hi"}}])
    assert hook.statuses(_request(only_messages)) == []
    assert len(hook.parse(_request(only_messages))) == 1


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        {"object": "page", "entry": []},
        _wa({"status": "sent", "recipient_id": "1"}),  # no id
        _wa({"id": WAMID, "status": "read"}),  # no recipient_id
        _wa(["not", "an", "object"]),  # type: ignore[arg-type]
        _wa(_wa_status("sent", timestamp="yesterday")),
        {
            "object": "whatsapp_business_account",
            "entry": [{"changes": [{"value": {"statuses": {"id": WAMID}}}]}],
        },
    ],
)
def test_whatsapp_bad_status_shapes_are_malformed(body: bytes | dict[str, Any]) -> None:
    with pytest.raises(MalformedWebhook):
        WhatsAppWebhook("secret", "verify").statuses(_request(body))


@dataclass
class Receiver:
    """An in-test webhook endpoint: keeps what was posted, answers ``status``."""

    status: int = 200
    got: list[tuple[dict[str, str], bytes]] = field(default_factory=list)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/{channel}", self._post)
        return app

    async def _post(self, request: web.Request) -> web.Response:
        headers = {k.lower(): v for k, v in request.headers.items()}
        self.got.append((headers, await request.read()))
        return web.Response(status=self.status)


@pytest.fixture
async def graph() -> AsyncIterator[tuple[GraphFake, WhatsAppProvider, Receiver]]:
    fake, receiver = GraphFake(), Receiver()
    async with serving(fake.app()) as base, serving(receiver.app()) as hooks:
        fake.webhook_url = f"{hooks}/whatsapp"
        provider = WhatsAppProvider(
            fake.whatsapp_token, fake.phone_number_id, api_url=f"{base}/{VERSION}"
        )
        try:
            yield fake, provider, receiver
        finally:
            await fake.settle()
            await provider.close()


def _received(fake: GraphFake, receiver: Receiver) -> list[DeliveryStatus]:
    """What the gateway would take from each post: verified, then parsed."""
    hook = WhatsAppWebhook(fake.app_secret, "verify")
    out: list[DeliveryStatus] = []
    for headers, body in receiver.got:
        request = _request(body, path="/whatsapp", headers=headers)
        hook.verify(request)
        assert hook.parse(request) == []
        out.extend(hook.statuses(request))
    return out


async def test_the_graph_fake_posts_signed_sent_delivered_read(
    graph: tuple[GraphFake, WhatsAppProvider, Receiver],
) -> None:
    fake, provider, receiver = graph
    result = await provider.send(Outbound("15551230001", "hello"))
    await fake.settle()
    found = _received(fake, receiver)
    assert _states(found) == [
        ("15551230001", result.message_id, S.SENT),
        ("15551230001", result.message_id, S.DELIVERED),
        ("15551230001", result.message_id, S.READ),
    ]
    assert fake.posted == [(result.message_id, s, 200) for s in ("sent", "delivered", "read")]
    headers, body = receiver.got[0]
    assert headers["content-type"] == "application/json"
    assert json.loads(body)["entry"][0]["changes"][0]["value"]["metadata"] == {
        "display_phone_number": "15550783881",
        "phone_number_id": fake.phone_number_id,
    }


async def test_a_wrong_app_secret_does_not_verify(
    graph: tuple[GraphFake, WhatsAppProvider, Receiver],
) -> None:
    fake, provider, receiver = graph
    fake.app_secret = "another-app-secret"
    await provider.send(Outbound("15551230001", "hello"))
    await fake.settle()
    with pytest.raises(BadSignature, match="X-Hub-Signature-256"):
        WhatsAppWebhook("graph-fake-app-secret-0004", "v").verify(
            _request(receiver.got[0][1], headers=receiver.got[0][0])
        )


async def test_fail_after_accept_gives_sent_then_failed_with_the_code(
    graph: tuple[GraphFake, WhatsAppProvider, Receiver],
) -> None:
    fake, provider, receiver = graph
    fake.fail_after_accept["15559990000"] = 131047  # not in fake.numbers: accepted anyway
    result = await provider.send(Outbound("15559990000", "hello"))
    await fake.settle()
    found = _received(fake, receiver)
    assert [(s.message_id, s.status, s.code, s.error) for s in found] == [
        (result.message_id, S.SENT, None, None),
        (result.message_id, S.FAILED, "131047", "Re-engagement message"),
    ]
    body = json.loads(receiver.got[1][1])
    [error] = body["entry"][0]["changes"][0]["value"]["statuses"][0]["errors"]
    assert error["code"] == 131047 and "24 hours" in error["error_data"]["details"]


async def test_a_template_to_a_failing_number_goes_through(
    graph: tuple[GraphFake, WhatsAppProvider, Receiver],
) -> None:
    fake, provider, receiver = graph
    fake.fail_after_accept["15559990000"] = 131047
    template = {"name": "hello_world", "language": "en_US"}
    result = await provider.send(Outbound("15559990000", "", options={"template": template}))
    await fake.settle()
    assert [s.status for s in _received(fake, receiver)] == [S.SENT, S.DELIVERED, S.READ]
    fake.fail_after_accept_templates["15559990000"] = 131049
    receiver.got.clear()
    again = await provider.send(Outbound("15559990000", "", options={"template": template}))
    await fake.settle()
    found = _received(fake, receiver)
    assert [(s.status, s.code) for s in found] == [(S.SENT, None), (S.FAILED, "131049")]
    assert found[1].error == (
        "This message was not delivered to maintain healthy ecosystem engagement."
    )
    assert again.message_id != result.message_id


async def test_status_copies_and_post_status_by_hand(
    graph: tuple[GraphFake, WhatsAppProvider, Receiver],
) -> None:
    fake, provider, receiver = graph
    fake.status_copies = 2
    result = await provider.send(Outbound("15551230001", "hello"))
    await fake.settle()
    statuses = [s for _, s, _ in fake.posted]
    assert statuses == ["sent", "sent", "delivered", "delivered", "read", "read"]
    assert len(receiver.got) == 6 and receiver.got[0][1] == receiver.got[1][1]
    receiver.status = 500
    fake.status_copies = 1
    answered = await fake.post_status(result.message_id, "15551230001", "failed", code=131026)
    assert answered == 500 and fake.posted[-1] == (result.message_id, "failed", 500)
    [last] = WhatsAppWebhook(fake.app_secret, "v").statuses(_request(receiver.got[-1][1]))
    assert (last.status, last.code, last.error) == (S.FAILED, "131026", "Message undeliverable")


async def test_a_refused_send_posts_nothing(
    graph: tuple[GraphFake, WhatsAppProvider, Receiver],
) -> None:
    fake, provider, receiver = graph
    with pytest.raises(RecipientUnreachableError):
        await provider.send(Outbound("15550000000", "hello"))  # not a WhatsApp number
    await fake.settle()
    assert receiver.got == [] and fake.posted == []


# -- Messenger and Instagram -------------------------------------------------------------------


def _page(obj: str, *events: dict[str, Any]) -> dict[str, Any]:
    return {"object": obj, "entry": [{"id": "PAGE", "time": 1458692752478, "messaging": events}]}


def test_messenger_deliveries_give_one_status_per_mid_and_watermark_reads_none() -> None:
    hook = MessengerWebhook("secret", "verify")
    delivery = {
        "sender": {"id": "24000000000000001"},
        "recipient": {"id": "PAGE"},
        "delivery": {"mids": ["m_AAA", "m_BBB"], "watermark": 1458668856253},
    }
    read = {
        "sender": {"id": "24000000000000001"},
        "recipient": {"id": "PAGE"},
        "timestamp": 1458668856463,
        "read": {"watermark": 1458668856253},
    }
    found = hook.statuses(_request(_page("page", delivery, read)))
    assert _states(found) == [
        ("24000000000000001", "m_AAA", S.DELIVERED),
        ("24000000000000001", "m_BBB", S.DELIVERED),
    ]
    assert found[0].ts == 1458668856.253 and found[0].channel == "messenger"
    assert hook.parse(_request(_page("page", delivery, read))) == []
    no_mids = {**delivery, "delivery": {"watermark": 1458668856253}}
    assert hook.statuses(_request(_page("page", no_mids))) == []


def test_instagram_seen_names_the_message() -> None:
    hook = InstagramWebhook("secret", "verify")
    seen = {
        "sender": {"id": "17841400000000001"},
        "recipient": {"id": "IGID"},
        "timestamp": 1700000000000,
        "read": {"mid": "aWdfZAG1faXRlbToxOklHTWVzc2FnZAUlEOjE3ODQx"},
    }
    [status] = hook.statuses(_request(_page("instagram", seen)))
    assert _states([status]) == [
        ("17841400000000001", "aWdfZAG1faXRlbToxOklHTWVzc2FnZAUlEOjE3ODQx", S.READ)
    ]
    assert status.channel == "instagram" and status.ts == 1700000000.0


def test_messenger_text_gives_no_status_and_bad_shapes_are_malformed() -> None:
    hook = MessengerWebhook("secret", "verify")
    text = {
        "sender": {"id": "1"},
        "recipient": {"id": "PAGE"},
        "timestamp": 1,
        "message": {"mid": "m_1", "text": "hi"},
    }
    assert hook.statuses(_request(_page("page", text))) == []
    for bad in (
        {"recipient": {"id": "PAGE"}, "delivery": {"mids": ["m_1"]}},
        {"sender": {"id": "1"}, "delivery": {"mids": "m_1"}},
        {"sender": {"id": "1"}, "read": "yes"},
    ):
        with pytest.raises(MalformedWebhook):
            hook.statuses(_request(_page("page", bad)))


# -- Twilio ------------------------------------------------------------------------------------

TOKEN = "twilio-auth-token-0123456789abcdef"


def _twilio(params: dict[str, str]) -> WebhookRequest:
    body = urlencode(params).encode()
    url = "https://bot.example.com/twilio"
    signature = twilio_signature(TOKEN, url, list(params.items()))
    headers = {
        "content-type": "application/x-www-form-urlencoded",
        "x-twilio-signature": signature,
    }
    return WebhookRequest("POST", "/twilio", url, headers, {}, body, dict(parse_qsl(body.decode())))


def _callback(status: str, **more: str) -> dict[str, str]:
    return {
        "AccountSid": "AC" + "0" * 32,
        "ApiVersion": "2010-04-01",
        "From": "whatsapp:+14155238886",
        "To": "whatsapp:+15005550006",
        "MessageSid": "SM" + "1" * 32,
        "SmsSid": "SM" + "1" * 32,
        "MessageStatus": status,
        "SmsStatus": status,
        **more,
    }


@pytest.mark.parametrize(
    ("status", "state"),
    [
        ("sent", S.SENT),
        ("delivered", S.DELIVERED),
        ("read", S.READ),
        ("undelivered", S.FAILED),
        ("failed", S.FAILED),
    ],
)
def test_twilio_status_callbacks(status: str, state: DeliveryState) -> None:
    hook = TwilioWebhook(TOKEN)
    extra = {"ErrorCode": "30003"} if state is S.FAILED else {}
    request = _twilio(_callback(status, **extra))
    hook.verify(request)
    assert hook.parse(request) == []
    [found] = hook.statuses(request)
    assert _states([found]) == [("whatsapp:+15005550006", "SM" + "1" * 32, state)]
    assert found.code == ("30003" if state is S.FAILED else None) and found.channel == "twilio"


def test_twilio_early_statuses_and_messages_give_none_and_bad_shapes_raise() -> None:
    hook = TwilioWebhook(TOKEN)
    for early in ("queued", "accepted", "sending", "scheduled", "canceled"):
        assert hook.statuses(_twilio(_callback(early))) == []
    message = _callback("received", Body="hi", NumMedia="0")
    assert hook.statuses(_twilio(message)) == []
    no_sid = {k: v for k, v in _callback("sent").items() if k not in ("MessageSid", "SmsSid")}
    with pytest.raises(MalformedWebhook):
        hook.statuses(_twilio(no_sid))
    with pytest.raises(MalformedWebhook):
        hook.statuses(_twilio({k: v for k, v in _callback("sent").items() if k != "To"}))


@pytest.fixture
async def twilio() -> AsyncIterator[tuple[FakeTwilio, TwilioProvider, Receiver, str]]:
    fake, receiver = FakeTwilio(), Receiver()
    async with serving(fake.app()) as base, serving(receiver.app()) as hooks:
        fake.webhook_url = f"{hooks}/twilio"
        provider = TwilioProvider(
            fake.account_sid, fake.auth_token, "whatsapp:+14155238886", base_url=base
        )
        try:
            yield fake, provider, receiver, base
        finally:
            await fake.settle()
            await provider.close()


def _twilio_received(fake: FakeTwilio, receiver: Receiver, url: str) -> list[DeliveryStatus]:
    hook = TwilioWebhook(fake.auth_token)
    out: list[DeliveryStatus] = []
    for headers, body in receiver.got:
        form = dict(parse_qsl(body.decode()))
        request = WebhookRequest("POST", "/twilio", url, headers, {}, body, form)
        hook.verify(request)
        assert hook.parse(request) == []
        out.extend(hook.statuses(request))
    return out


async def test_the_twilio_fake_posts_signed_status_callbacks(
    twilio: tuple[FakeTwilio, TwilioProvider, Receiver, str],
) -> None:
    fake, provider, receiver, _ = twilio
    url = str(fake.webhook_url)
    result = await provider.send(Outbound("+14155550100", "hello"))
    await fake.settle()
    chat = "whatsapp:+14155550100"
    assert [p[1] for p in fake.posted] == ["queued", "sent", "delivered", "read"]
    assert _states(_twilio_received(fake, receiver, url)) == [
        (chat, result.message_id, S.SENT),
        (chat, result.message_id, S.DELIVERED),
        (chat, result.message_id, S.READ),
    ]
    fake.fail_after_accept[chat] = 63016
    fake.status_copies = 2
    receiver.got.clear()
    failed = await provider.send(Outbound(chat, "hello again"))
    await fake.settle()
    found = _twilio_received(fake, receiver, url)
    assert [(s.message_id, s.status, s.code) for s in found] == [
        (failed.message_id, S.SENT, None),
        (failed.message_id, S.SENT, None),
        (failed.message_id, S.FAILED, "63016"),
        (failed.message_id, S.FAILED, "63016"),
    ]
    with pytest.raises(BadSignature):
        TwilioWebhook("another-auth-token").verify(
            WebhookRequest("POST", "/twilio", url, receiver.got[0][0], {}, receiver.got[0][1])
        )


async def test_the_twilio_fake_takes_the_sends_status_callback_and_sms_undelivered(
    twilio: tuple[FakeTwilio, TwilioProvider, Receiver, str],
) -> None:
    fake, provider, receiver, base = twilio
    url = str(fake.webhook_url)
    fake.fail_after_accept["whatsapp:+14155550101"] = 30003
    result = await provider.send(Outbound("+14155550101", "hello"))
    await fake.settle()
    assert [p[1:] for p in fake.posted] == [("queued", 200), ("sent", 200), ("undelivered", 200)]
    [*_, last] = _twilio_received(fake, receiver, url)
    assert (last.message_id, last.status, last.code) == (result.message_id, S.FAILED, "30003")
    # A send that names its own StatusCallback gets its callbacks there, signed for it.
    elsewhere = url.rsplit("/", 1)[0] + "/elsewhere"
    form = {"To": "+14155550102", "From": "+15005550006", "Body": "hi", "StatusCallback": elsewhere}
    auth = "Basic " + base64.b64encode(f"{fake.account_sid}:{fake.auth_token}".encode()).decode()
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{base}/2010-04-01/Accounts/{fake.account_sid}/Messages.json",
            data=form,
            headers={"Authorization": auth},
        ) as answer,
    ):
        assert answer.status == 201
        sid = (await answer.json())["sid"]
    await fake.settle()
    receiver.got.clear()
    assert await fake.post_status(sid, "+14155550102", "delivered") == 200
    headers, body = receiver.got[-1]
    request = WebhookRequest("POST", "/elsewhere", elsewhere, headers, {}, body)
    TwilioWebhook(fake.auth_token).verify(request)
    assert _states(TwilioWebhook(fake.auth_token).statuses(request)) == [
        ("+14155550102", sid, S.DELIVERED)
    ]


# -- Gupshup -----------------------------------------------------------------------------------

GS_ID = "ee4a68a0-1203-4c85-8dc3-49d0b3226a35"


def _gupshup(payload: dict[str, Any]) -> dict[str, Any]:
    return {
        "app": "DemoAPI",
        "timestamp": 1580546677791,
        "version": 2,
        "type": "message-event",
        "payload": payload,
    }


def test_gupshup_message_events() -> None:
    hook = GupshupWebhook("g" * 16)
    enqueued = {
        "id": GS_ID,
        "type": "enqueued",
        "destination": "918x98xx21x4",
        "payload": {"whatsappMessageId": "gBEGkYiEB1VXAglK1ZEqA1YKPrU", "type": "session"},
    }
    sent = {
        "id": "gBEGkYiEB1VXAglK1ZEqA1YKPrU",
        "gsId": GS_ID,
        "type": "sent",
        "destination": "918x98xx21x4",
        "payload": {"ts": 1592228981},
    }
    failed = {
        "id": GS_ID,
        "type": "failed",
        "destination": "918x98xx21x4",
        "payload": {"code": 1002, "reason": "Number Does Not Exists On WhatsApp"},
    }
    assert hook.statuses(_request(_gupshup(enqueued))) == []
    [s] = hook.statuses(_request(_gupshup(sent)))
    assert _states([s]) == [("918x98xx21x4", GS_ID, S.SENT)] and s.ts == 1592228981.0
    [f] = hook.statuses(_request(_gupshup(failed)))
    assert (f.message_id, f.status, f.code, f.error) == (
        GS_ID,
        S.FAILED,
        "1002",
        "Number Does Not Exists On WhatsApp",
    )
    assert f.ts == 1580546677.791
    for kind, state in (("delivered", S.DELIVERED), ("read", S.READ)):
        [d] = hook.statuses(_request(_gupshup({**sent, "type": kind})))
        assert d.status is state
    assert hook.parse(_request(_gupshup(sent))) == []


def test_gupshup_messages_give_no_status_and_bad_events_raise() -> None:
    hook = GupshupWebhook("g" * 16)
    assert hook.statuses(_request({"type": "message", "payload": {}})) == []
    for bad in (
        _gupshup({"type": "sent", "destination": "91"}),
        _gupshup({"id": GS_ID, "type": "sent"}),
        {"type": "message-event"},
        {"no": "type"},
    ):
        with pytest.raises(MalformedWebhook):
            hook.statuses(_request(bad))


async def test_the_gupshup_fake_posts_message_events_to_the_tokened_url() -> None:
    fake, receiver, secret = FakeGupshup(), Receiver(), "gupshup-callback-secret-0123"
    async with serving(fake.app()) as base, serving(receiver.app()) as hooks:
        fake.webhook_url = f"{hooks}/gupshup?token={secret}"
        fake.fail_after_accept["15550001111"] = 1026
        provider = GupshupProvider(fake.api_key, fake.source, fake.app_name, base_url=base)
        try:
            ok = await provider.send(Outbound("15550002222", "hello"))
            failed = await provider.send(Outbound("15550001111", "hello"))
            await fake.settle()
        finally:
            await provider.close()
    hook = GupshupWebhook(secret)
    found: list[DeliveryStatus] = []
    for headers, body in receiver.got:
        request = _request(body, path="/gupshup", headers=headers, query={"token": secret})
        hook.verify(request)
        assert hook.parse(request) == []
        found.extend(hook.statuses(request))
    by_message = {
        mid: [(s.status, s.code) for s in found if s.message_id == mid]
        for mid in (ok.message_id, failed.message_id)
    }
    assert by_message == {
        ok.message_id: [(S.SENT, None), (S.DELIVERED, None), (S.READ, None)],
        failed.message_id: [(S.FAILED, "1026")],
    }
    assert {s.chat_id for s in found if s.message_id == ok.message_id} == {"15550002222"}
    assert [p[1] for p in fake.posted if p[0] == ok.message_id] == [
        "enqueued",
        "sent",
        "delivered",
        "read",
    ]


# -- Evolution, WPPConnect, Baileys (WhatsApp Web bridges) ---------------------------------------


def _evolution(status: str, *, from_me: bool = True, **more: Any) -> dict[str, Any]:
    return {
        "event": "messages.update",
        "instance": "botmesh",
        "data": {
            "messageId": "cm1xyz",
            "keyId": "3EB0C767D26A1D8B4A4B",
            "remoteJid": "5511999999999@s.whatsapp.net",
            "fromMe": from_me,
            "participant": "5511999999999@s.whatsapp.net",
            "status": status,
            "instanceId": "af6c5b7c-ee27-4f94-9ea8-192393746ddd",
            **more,
        },
        "date_time": "2025-01-19T14:12:48.643Z",
        "sender": "5511888888888@s.whatsapp.net",
        "apikey": "k",
    }


@pytest.mark.parametrize(
    ("status", "state"),
    [
        ("SERVER_ACK", S.SENT),
        ("DELIVERY_ACK", S.DELIVERED),
        ("READ", S.READ),
        ("PLAYED", S.READ),
        ("ERROR", S.FAILED),
        ("PENDING", None),
        ("DELETED", None),
    ],
)
def test_evolution_messages_update(status: str, state: DeliveryState | None) -> None:
    hook = EvolutionWebhook(api_key="k")
    found = hook.statuses(_request(_evolution(status)))
    if state is None:
        assert found == []
        return
    assert _states(found) == [("5511999999999@s.whatsapp.net", "3EB0C767D26A1D8B4A4B", state)]
    assert found[0].ts == pytest.approx(1737295968.643) and found[0].channel == "evolution"


def test_evolution_skips_others_messages_other_instances_and_raises_on_bad_data() -> None:
    hook = EvolutionWebhook(api_key="k", instance="botmesh")
    assert hook.statuses(_request(_evolution("READ", from_me=False))) == []
    assert hook.statuses(_request({**_evolution("READ"), "instance": "other"})) == []
    assert hook.parse(_request(_evolution("READ"))) == []
    with pytest.raises(MalformedWebhook):
        hook.statuses(_request(_evolution("READ", keyId=None, remoteJid=None)))
    with pytest.raises(MalformedWebhook):
        hook.statuses(_request({**_evolution("READ"), "data": "x"}))


def _ack(ack: int, *, from_me: bool = True) -> dict[str, Any]:
    return {
        "event": "onack",
        "session": "botmesh",
        "id": {
            "fromMe": from_me,
            "remote": "5511999999999@c.us",
            "id": "3EB0C767D26A1D8B4A4B",
            "_serialized": "true_5511999999999@c.us_3EB0C767D26A1D8B4A4B",
        },
        "ack": ack,
        "from": "5511888888888@c.us",
        "to": "5511999999999@c.us",
        "t": 1737295968,
        "body": "hello",
    }


def test_wppconnect_acks() -> None:
    hook = WppConnectWebhook("w" * 16)
    mid = "true_5511999999999@c.us_3EB0C767D26A1D8B4A4B"
    for ack, state in ((1, S.SENT), (2, S.DELIVERED), (3, S.READ), (4, S.READ)):
        [found] = hook.statuses(_request(_ack(ack)))
        assert _states([found]) == [("5511999999999@c.us", mid, state)] and found.ts == 1737295968
    [failed] = hook.statuses(_request(_ack(-1)))
    assert (failed.status, failed.code, failed.error) == (S.FAILED, "-1", "FAILED")
    assert hook.statuses(_request(_ack(0))) == []
    assert hook.statuses(_request(_ack(3, from_me=False))) == []
    assert hook.parse(_request(_ack(3))) == []
    with pytest.raises(MalformedWebhook):
        hook.statuses(_request({**_ack(2), "ack": "2"}))
    with pytest.raises(MalformedWebhook):
        hook.statuses(_request({**_ack(2), "id": None, "to": None}))


def _baileys(*updates: dict[str, Any]) -> dict[str, Any]:
    return {"event": "messages.update", "data": list(updates), "webhookVerifyToken": "b" * 6}


def _update(status: int | None, *, from_me: bool = True, **more: Any) -> dict[str, Any]:
    update: dict[str, Any] = {} if status is None else {"status": status}
    key = {"remoteJid": "5511999999999@s.whatsapp.net", "fromMe": from_me, "id": "3EB0AB"}
    return {"key": key, "update": {**update, **more}}


def test_baileys_messages_update() -> None:
    hook = BaileysWebhook("b" * 6)
    body = _baileys(
        _update(2),
        _update(3),
        _update(4),
        _update(5),
        _update(1),
        _update(None, message={"editedMessage": {}}),
        _update(4, from_me=False),
        _update(0, messageStubParameters=["463"]),
    )
    found = hook.statuses(_request(body))
    chat = "5511999999999@s.whatsapp.net"
    assert _states(found) == [
        (chat, "3EB0AB", S.SENT),
        (chat, "3EB0AB", S.DELIVERED),
        (chat, "3EB0AB", S.READ),
        (chat, "3EB0AB", S.READ),
        (chat, "3EB0AB", S.FAILED),
    ]
    assert found[-1].code == "463" and found[0].code is None
    assert hook.parse(_request(body)) == []
    with pytest.raises(MalformedWebhook):
        hook.statuses(_request({**body, "data": {"key": {}}}))
    with pytest.raises(MalformedWebhook):
        hook.statuses(_request(_baileys({"key": {"fromMe": True}, "update": {"status": 3}})))


# -- the bridges' fakes post statuses ------------------------------------------------------------


def _bridge_received(
    hook: EvolutionWebhook | WppConnectWebhook | BaileysWebhook,
    receiver: Receiver,
    path: str,
    query: dict[str, str] | None = None,
) -> list[DeliveryStatus]:
    """What ``hook`` (verified first) reads of every post ``receiver`` got."""
    out: list[DeliveryStatus] = []
    for headers, body in receiver.got:
        request = _request(body, path=path, headers=headers, query=query)
        hook.verify(request)
        assert hook.parse(request) == []
        out.extend(hook.statuses(request))
    return out


def _by_message(found: list[DeliveryStatus]) -> dict[str, list[tuple[DeliveryState, str | None]]]:
    out: dict[str, list[tuple[DeliveryState, str | None]]] = {}
    for s in found:
        out.setdefault(s.message_id, []).append((s.status, s.code))
    return out


async def test_the_evolution_fake_posts_messages_update_with_the_instance_token_or_a_jwt() -> None:
    fake, receiver = FakeEvolution("support-bot"), Receiver()
    async with serving(fake.app()) as base, serving(receiver.app()) as hooks:
        fake.webhook_url = f"{hooks}/evolution"
        fake.fail_after_accept["5511999990009"] = "ERROR"
        provider = EvolutionProvider(base, fake.token, fake.instance)
        try:
            ok = await provider.send(Outbound("5511999990001", "hello"))
            failed = await provider.send(Outbound("5511999990009", "hello"))
            await fake.settle()
            by_token = EvolutionWebhook(api_key=fake.token, instance=fake.instance)
            found = _bridge_received(by_token, receiver, "/evolution")
            fake.webhook_jwt_key = "evolution-jwt-key-0123"
            receiver.got.clear()
            again = await provider.send(Outbound("5511999990002", "hello again"))
            await fake.settle()
        finally:
            await provider.close()
    assert _by_message(found) == {
        ok.message_id: [(S.SENT, None), (S.DELIVERED, None), (S.READ, None)],
        failed.message_id: [(S.FAILED, None)],
    }
    assert {s.chat_id for s in found if s.message_id == ok.message_id} == {
        "5511999990001@s.whatsapp.net"
    }
    by_jwt = EvolutionWebhook(secret="evolution-jwt-key-0123")
    jwt_found = _bridge_received(by_jwt, receiver, "/evolution")
    assert _states(jwt_found) == [
        ("5511999990002@s.whatsapp.net", again.message_id, state)
        for state in (S.SENT, S.DELIVERED, S.READ)
    ]
    with pytest.raises(BadSignature):
        EvolutionWebhook(secret="another-jwt-key-0123").verify(
            _request(receiver.got[0][1], headers=receiver.got[0][0])
        )
    assert [p[1] for p in fake.posted if p[0] == ok.message_id] == [
        "SERVER_ACK",
        "DELIVERY_ACK",
        "READ",
    ]


async def test_the_wppconnect_fake_posts_onack_to_the_url_with_the_secret() -> None:
    fake, receiver, secret = FakeWppConnect("support"), Receiver(), "wppconnect-secret-0123"
    async with serving(fake.app()) as base, serving(receiver.app()) as hooks:
        fake.webhook_url = f"{hooks}/wppconnect?secret={secret}"
        fake.fail_after_accept["5511999990009"] = -1
        fake.status_copies = 2
        provider = WppConnectProvider(base, fake.token, fake.session)
        try:
            ok = await provider.send(Outbound("5511999990001", "hello"))
            failed = await provider.send(Outbound("5511999990009@c.us", "hello"))
            await fake.settle()
        finally:
            await provider.close()
    hook = WppConnectWebhook(secret, session="support")
    found = _bridge_received(hook, receiver, "/wppconnect", query={"secret": secret})
    twice = [(S.SENT, None)] * 2 + [(S.DELIVERED, None)] * 2 + [(S.READ, None)] * 2
    assert _by_message(found) == {
        ok.message_id: twice,
        failed.message_id: [(S.FAILED, "-1")] * 2,
    }
    assert {s.chat_id for s in found} == {"5511999990001@c.us", "5511999990009@c.us"}
    assert [p[1] for p in fake.posted if p[0] == ok.message_id][::2] == [
        "SENT",
        "RECEIVED",
        "READ",
    ]
    with pytest.raises(BadSignature):
        hook.verify(_request(receiver.got[0][1], query={"secret": "not-the-secret-0123"}))


async def test_the_baileys_fake_posts_messages_update_with_the_verify_token() -> None:
    fake, receiver = FakeBaileys(), Receiver()
    async with serving(fake.app()) as base, serving(receiver.app()) as hooks:
        fake.webhook_url = f"{hooks}/baileys"
        fake.fail_after_accept["5511999990009"] = 463
        provider = BaileysProvider(base, fake.api_key, fake.phone)
        try:
            ok = await provider.send(Outbound("5511999990001", "hello"))
            failed = await provider.send(Outbound("5511999990009@s.whatsapp.net", "hello"))
            await fake.settle()
        finally:
            await provider.close()
    found = _bridge_received(BaileysWebhook(fake.webhook_verify_token), receiver, "/baileys")
    assert _by_message(found) == {
        ok.message_id: [(S.SENT, None), (S.DELIVERED, None), (S.READ, None)],
        failed.message_id: [(S.FAILED, "463")],
    }
    assert {s.chat_id for s in found if s.message_id == ok.message_id} == {
        "5511999990001@s.whatsapp.net"
    }
    assert [p[1:] for p in fake.posted if p[0] == failed.message_id] == [("ERROR", 200)]
    with pytest.raises(BadSignature):
        BaileysWebhook("another-token").verify(_request(receiver.got[0][1]))


@pytest.mark.parametrize(
    ("channel", "state"),
    [("messenger", DeliveryState.DELIVERED), ("instagram", DeliveryState.READ)],
)
async def test_the_graph_fake_posts_messengers_delivery_and_instagrams_read(
    channel: str, state: DeliveryState
) -> None:
    fake, receiver = GraphFake(), Receiver()
    user = "24000000000000001" if channel == "messenger" else "17841400000000001"
    async with serving(fake.app()) as base, serving(receiver.app()) as hooks:
        fake.page_webhook_urls[channel] = f"{hooks}/{channel}"
        fake.status_copies = 2
        if channel == "messenger":
            provider: MessengerProvider = MessengerProvider(
                fake.page_token, api_url=f"{base}/{VERSION}"
            )
            hook: MessengerWebhook = MessengerWebhook(fake.app_secret, "verify")
        else:
            provider = InstagramProvider(fake.instagram_token, api_url=f"{base}/{VERSION}")
            hook = InstagramWebhook(fake.app_secret, "verify")
        try:
            result = await provider.send(Outbound(user, "hello"))
            await fake.settle()
        finally:
            await provider.close()
    found: list[DeliveryStatus] = []
    for headers, body in receiver.got:
        request = _request(body, path=f"/{channel}", headers=headers)
        hook.verify(request)
        assert hook.parse(request) == []
        found.extend(hook.statuses(request))
    assert _states(found) == [(user, result.message_id, state)] * 2  # posted twice
    assert fake.posted == [(result.message_id, state.value, 200)] * 2

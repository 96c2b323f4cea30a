"""The WhatsApp Cloud API adapter against the fake Graph API (real HTTP on 127.0.0.1), and
its webhook on bodies written as Meta documents them."""

from __future__ import annotations

import hashlib
import json
import logging
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest

from botmesh.providers.http import MediaUrlRefused
from botmesh.providers.webhooks import BadSignature, MalformedWebhook, WebhookRequest, hmac_hex
from botmesh.providers.whatsapp import WhatsAppProvider, WhatsAppWebhook
from botmesh.state.errors import (
    ConfigError,
    OutsideSessionWindowError,
    PayloadTooLargeError,
    ProviderError,
    RateLimitedError,
    RecipientUnreachableError,
    SendError,
    UnsupportedContentError,
)
from botmesh.state.messages import DeliveryState, DeliveryStatus, Media, Outbound
from tests.providers.fakes.graph import VERSION, GraphFake
from tests.providers.serve import serving

USER = "15551230001"
SECRET = "meta-app-secret-xyz"
VERIFY = "verify-me-123"


@pytest.fixture
async def fake() -> AsyncIterator[tuple[GraphFake, str]]:
    graph = GraphFake()
    async with serving(graph.app()) as base:
        yield graph, base


@pytest.fixture
async def wa(fake: tuple[GraphFake, str]) -> AsyncIterator[WhatsAppProvider]:
    graph, base = fake
    provider = WhatsAppProvider(
        graph.whatsapp_token,
        graph.phone_number_id,
        api_url=f"{base}/{VERSION}",
        allow_private_media=True,
    )
    yield provider
    await provider.close()


# -- sending ------------------------------------------------------------------------------


async def test_text_goes_to_the_phone_number_and_returns_the_wamid(
    fake: tuple[GraphFake, str], wa: WhatsAppProvider
) -> None:
    graph, _ = fake
    result = await wa.send(Outbound(USER, "hello", options={"reply_to": "wamid.ABC"}))
    [got] = graph.accepted["whatsapp"]
    assert result.message_id == got.id and got.id.startswith("wamid.")
    assert got.body == {
        "messaging_product": "whatsapp",
        "recipient_type": "individual",
        "to": USER,
        "type": "text",
        "text": {"body": "hello"},
        "context": {"message_id": "wamid.ABC"},
    }
    assert wa.name == "whatsapp" and wa.text_limit == 4096 and wa.media_channel == "whatsapp"


async def test_media_by_link_and_by_id_carry_the_caption(
    fake: tuple[GraphFake, str], wa: WhatsAppProvider
) -> None:
    graph, _ = fake
    media_id = graph.add_media(b"%PDF", "application/pdf")
    await wa.send(Outbound(USER, "look", Media(url="https://example.com/a.jpg", mime="image/jpeg")))
    await wa.send(Outbound(USER, "invoice", Media(id=media_id, name="inv.pdf")))
    assert graph.texts("whatsapp") == {USER: ["look", "invoice"]}
    first, second = (a.body for a in graph.accepted["whatsapp"])
    assert first["type"] == "image"
    assert first["image"] == {"link": "https://example.com/a.jpg", "caption": "look"}
    assert second["type"] == "document"
    assert second["document"] == {"id": media_id, "caption": "invoice", "filename": "inv.pdf"}


async def test_a_webp_goes_as_a_sticker_and_a_link_without_a_type_by_its_name(
    fake: tuple[GraphFake, str], wa: WhatsAppProvider
) -> None:
    """WhatsApp takes no WebP image, only a WebP sticker; a link without a MIME type goes
    by what its file name says (``botmesh.providers.media_kinds``)."""
    graph, _ = fake
    await wa.send(Outbound(USER, None, Media(url="https://example.com/s.webp")))
    await wa.send(Outbound(USER, None, Media(url="https://example.com/v/clip.mp4?sig=1")))
    with pytest.raises(UnsupportedContentError, match="sticker messages take no caption"):
        await wa.send(Outbound(USER, "hi", Media(url="https://e.example/s", mime="image/webp")))
    sticker, video = (a.body for a in graph.accepted["whatsapp"])
    assert sticker["type"] == "sticker"
    assert sticker["sticker"] == {"link": "https://example.com/s.webp"}
    assert video["type"] == "video"


async def test_bytes_are_uploaded_first_then_sent_by_id(
    fake: tuple[GraphFake, str], wa: WhatsAppProvider
) -> None:
    graph, _ = fake
    await wa.send(Outbound(USER, None, Media(data=b"OggS-voice", mime="audio/ogg")))
    [got] = graph.accepted["whatsapp"]
    media_id = got.body["audio"]["id"]
    assert graph.media[media_id] == (b"OggS-voice", "audio/ogg")


async def test_audio_with_a_caption_is_refused_before_any_call(
    fake: tuple[GraphFake, str], wa: WhatsAppProvider
) -> None:
    graph, _ = fake
    with pytest.raises(UnsupportedContentError, match="no caption"):
        await wa.send(Outbound(USER, "hi", Media(id="1", mime="audio/ogg")))
    assert graph.accepted["whatsapp"] == []


# -- each error mapping, against the fake ----------------------------------------------------


async def test_a_closed_window_is_outside_session(
    fake: tuple[GraphFake, str], wa: WhatsAppProvider
) -> None:
    graph, _ = fake
    graph.closed_windows.add(USER)
    with pytest.raises(OutsideSessionWindowError, match="131047") as err:
        await wa.send(Outbound(USER, "hi"))
    assert err.value.retryable is False
    assert graph.accepted["whatsapp"] == []


async def test_an_unknown_number_is_unreachable(wa: WhatsAppProvider) -> None:
    with pytest.raises(RecipientUnreachableError, match="131026") as err:
        await wa.send(Outbound("15559999999", "hi"))
    assert err.value.retryable is False


async def test_a_text_over_4096_is_too_large(wa: WhatsAppProvider) -> None:
    with pytest.raises(PayloadTooLargeError, match="at most 4096") as err:
        await wa.send(Outbound(USER, "x" * 4097))
    assert err.value.retryable is False


async def test_a_link_meta_cannot_fetch_is_unsupported(wa: WhatsAppProvider) -> None:
    with pytest.raises(UnsupportedContentError, match="131053"):
        await wa.send(Outbound(USER, None, Media(url="https://example.com/missing.png")))


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (130429, 60.0),
        (80007, 60.0),
        (131056, 6.0),
        (4, 60.0),
    ],
)
async def test_rate_limits_without_retry_after_wait_the_documented_default(
    fake: tuple[GraphFake, str], wa: WhatsAppProvider, code: int, expected: float
) -> None:
    graph, _ = fake
    graph.fail_next("whatsapp", code)
    with pytest.raises(RateLimitedError, match=str(code)) as err:
        await wa.send(Outbound(USER, "hi"))
    assert err.value.retryable is True and err.value.retry_after == expected
    assert graph.accepted["whatsapp"] == []
    await wa.send(Outbound(USER, "hi"))  # the script is spent: the next call goes through
    assert len(graph.accepted["whatsapp"]) == 1


@pytest.mark.parametrize("code", [130429, 80007])
async def test_rate_limits_with_retry_after_wait_that_long(
    fake: tuple[GraphFake, str], wa: WhatsAppProvider, code: int
) -> None:
    graph, _ = fake
    graph.fail_next("whatsapp", code, status=429, headers={"Retry-After": "7"})
    with pytest.raises(RateLimitedError) as err:
        await wa.send(Outbound(USER, "hi"))
    assert err.value.retry_after == 7.0


async def test_a_business_use_case_header_gives_the_wait(
    fake: tuple[GraphFake, str], wa: WhatsAppProvider
) -> None:
    graph, _ = fake
    usage = {"102290129340398": [{"type": "whatsapp", "estimated_time_to_regain_access": 3}]}
    graph.fail_next("whatsapp", 80007, headers={"X-Business-Use-Case-Usage": json.dumps(usage)})
    with pytest.raises(RateLimitedError) as err:
        await wa.send(Outbound(USER, "hi"))
    assert err.value.retry_after == 180.0


@pytest.mark.parametrize(
    ("code", "status", "kind"),
    [
        (131030, None, RecipientUnreachableError),
        (131051, None, UnsupportedContentError),
        (131052, None, PayloadTooLargeError),
        (100, 413, PayloadTooLargeError),
    ],
)
async def test_scripted_final_errors(
    fake: tuple[GraphFake, str],
    wa: WhatsAppProvider,
    code: int,
    status: int | None,
    kind: type[SendError],
) -> None:
    graph, _ = fake
    graph.fail_next("whatsapp", code, status=status)
    with pytest.raises(kind) as err:
        await wa.send(Outbound(USER, "hi"))
    assert err.value.retryable is False


@pytest.mark.parametrize(("code", "status"), [(1, None), (2, None), (131000, None), (131016, None)])
async def test_temporary_errors_are_retryable(
    fake: tuple[GraphFake, str], wa: WhatsAppProvider, code: int, status: int | None
) -> None:
    graph, _ = fake
    graph.fail_next("whatsapp", code, status=status)
    with pytest.raises(SendError) as err:
        await wa.send(Outbound(USER, "hi"))
    assert type(err.value) is SendError and err.value.retryable is True
    # by the code alone: a 400 without is_transient
    graph.fail_next("whatsapp", code, status=400, transient=False)
    with pytest.raises(SendError) as err:
        await wa.send(Outbound(USER, "hi"))
    assert type(err.value) is SendError and err.value.retryable is True


async def test_a_bare_500_is_retryable_and_other_4xx_final(
    fake: tuple[GraphFake, str], wa: WhatsAppProvider
) -> None:
    graph, _ = fake
    graph.fail_next("whatsapp", 999, status=500, message="Internal error")
    with pytest.raises(SendError) as err:
        await wa.send(Outbound(USER, "hi"))
    assert err.value.retryable is True
    graph.fail_next("whatsapp", 131009, message="(#131009) Parameter value is not valid")
    with pytest.raises(SendError, match="131009") as err:
        await wa.send(Outbound(USER, "hi"))
    assert type(err.value) is SendError and err.value.retryable is False
    graph.fail_next("whatsapp", 131009, transient=True)
    with pytest.raises(SendError) as err:
        await wa.send(Outbound(USER, "hi"))
    assert err.value.retryable is True  # Graph's is_transient wins over the 400


async def test_a_wrong_token_is_final_and_names_the_variable(
    fake: tuple[GraphFake, str], caplog: pytest.LogCaptureFixture
) -> None:
    graph, base = fake
    bad = "EAAwrong-token-that-must-not-leak"
    provider = WhatsAppProvider(bad, graph.phone_number_id, api_url=f"{base}/{VERSION}")
    caplog.set_level(logging.DEBUG)
    try:
        with pytest.raises(SendError, match="WHATSAPP_ACCESS_TOKEN") as err:
            await provider.send(Outbound(USER, "hi"))
    finally:
        await provider.close()
    assert err.value.retryable is False and "invalid or expired" in str(err.value)
    assert bad not in str(err.value) and bad not in caplog.text


async def test_the_token_never_appears_in_errors_or_logs(
    fake: tuple[GraphFake, str], wa: WhatsAppProvider, caplog: pytest.LogCaptureFixture
) -> None:
    graph, _ = fake
    caplog.set_level(logging.DEBUG)
    token = graph.whatsapp_token
    errors: list[BaseException] = []
    # Graph quotes a malformed token back; a 500's body may quote anything.
    graph.fail_next("whatsapp", 190, message=f"Malformed access token {token}")
    graph.fail_next("whatsapp", 1, message=f"unknown error for {token}")
    graph.fail_next("whatsapp", 130429, details=f"token {token}")
    for _ in range(3):
        with pytest.raises(SendError) as err:
            await wa.send(Outbound(USER, "hi"))
        errors.append(err.value)
    with pytest.raises(ProviderError) as perr:
        await wa.download_media(Media(id="does-not-exist", provider="whatsapp"))
    errors.append(perr.value)
    assert "***" in str(errors[0])
    for e in errors:
        assert token not in str(e) and token not in repr(e.args)
    assert caplog.records, "the adapter logs its failures"
    assert token not in caplog.text
    assert token not in repr(wa)


# -- inbound media -----------------------------------------------------------------------


async def test_a_media_id_downloads_through_graph_with_the_bearer_header(
    fake: tuple[GraphFake, str], wa: WhatsAppProvider
) -> None:
    graph, base = fake
    media_id = graph.add_media(b"\x89PNG-bytes", "image/png")
    media = Media(provider="whatsapp", id=media_id, mime="image/png")
    url, headers = await wa.media_url(media)
    assert url.startswith(f"{base}/lookaside/{media_id}")
    assert headers == {"Authorization": f"Bearer {graph.whatsapp_token}"}
    assert await wa.download_media(media) == b"\x89PNG-bytes"
    assert graph.downloads[-1] == f"Bearer {graph.whatsapp_token}"


async def test_the_lookaside_refuses_a_download_without_the_token(
    fake: tuple[GraphFake, str], wa: WhatsAppProvider
) -> None:
    graph, base = fake
    media_id = graph.add_media(b"x", "image/png")
    with pytest.raises(ProviderError, match="HTTP 401"):
        await wa.fetch_media(f"{base}/lookaside/{media_id}")


async def test_a_download_that_does_not_match_its_sha256_fails(
    fake: tuple[GraphFake, str], wa: WhatsAppProvider
) -> None:
    graph, _ = fake
    media_id = graph.add_media(b"original", "image/png")
    info = await wa.media_info(media_id)
    assert info["sha256"] == hashlib.sha256(b"original").hexdigest()
    graph.corrupt[media_id] = b"tampered"  # the CDN serves other bytes than Graph hashed
    with pytest.raises(ProviderError, match="sha256"):
        await wa.download_media(Media(provider="whatsapp", id=media_id))


async def test_the_token_is_not_sent_to_a_foreign_media_host(
    fake: tuple[GraphFake, str], wa: WhatsAppProvider
) -> None:
    graph, base = fake
    media_id = graph.add_media(b"\x89PNG-bytes", "image/png")
    media = Media(provider="whatsapp", id=media_id, mime="image/png")
    # Graph answers a media URL on another host than the API's and Meta's ("localhost"
    # reaches the fake too: without the check the token would get there and be recorded).
    graph.media_origin = base.replace("127.0.0.1", "localhost")
    with pytest.raises(ProviderError, match="'localhost' is not a Meta media host"):
        await wa.media_url(media)
    with pytest.raises(ProviderError, match="'localhost' is not a Meta media host"):
        await wa.download_media(media)
    assert graph.downloads == []
    wa.check_download_host("https://lookaside.fbsbx.com/whatsapp_business/attachments/?mid=1")


async def test_a_media_id_that_is_not_a_graph_id_is_refused(wa: WhatsAppProvider) -> None:
    with pytest.raises(ProviderError, match="not a Graph id"):
        await wa.media_url(Media(provider="whatsapp", id="../me/messages"))


async def test_without_allow_private_media_the_fake_download_is_refused(
    fake: tuple[GraphFake, str],
) -> None:
    graph, base = fake
    media_id = graph.add_media(b"x", "image/png")
    provider = WhatsAppProvider(
        graph.whatsapp_token, graph.phone_number_id, api_url=base + "/v21.0"
    )
    try:
        with pytest.raises(MediaUrlRefused):
            await provider.download_media(Media(provider="whatsapp", id=media_id))
    finally:
        await provider.close()
    assert graph.downloads == []


# -- from_env ---------------------------------------------------------------------------


def test_from_env_reads_the_settings_and_names_what_is_missing() -> None:
    env = {"WHATSAPP_ACCESS_TOKEN": "tok", "WHATSAPP_PHONE_NUMBER_ID": "106540352242922"}
    p = WhatsAppProvider.from_env(env)
    assert p.api_url == "https://graph.facebook.com/v21.0" and not p.allow_private_media
    local = {
        **env,
        "WHATSAPP_API_URL": "http://127.0.0.1:9/v21.0",
        "WHATSAPP_ALLOW_PRIVATE_MEDIA": "1",
    }
    p = WhatsAppProvider.from_env(local)
    assert p.api_url == "http://127.0.0.1:9/v21.0" and p.allow_private_media
    with pytest.raises(ConfigError, match="WHATSAPP_ACCESS_TOKEN"):
        WhatsAppProvider.from_env({"WHATSAPP_PHONE_NUMBER_ID": "1"})
    with pytest.raises(ConfigError, match="WHATSAPP_PHONE_NUMBER_ID"):
        WhatsAppProvider.from_env({"WHATSAPP_ACCESS_TOKEN": "tok"})
    with pytest.raises(ConfigError, match="not the phone number itself"):
        WhatsAppProvider.from_env({**env, "WHATSAPP_PHONE_NUMBER_ID": "+1 555 123"})
    with pytest.raises(ConfigError, match="WHATSAPP_ALLOW_PRIVATE_MEDIA"):
        WhatsAppProvider.from_env({**env, "WHATSAPP_ALLOW_PRIVATE_MEDIA": "1"})
    with pytest.raises(ConfigError, match="WHATSAPP_API_URL"):
        WhatsAppProvider.from_env({**env, "WHATSAPP_API_URL": "graph.facebook.com"})


def test_webhook_from_env_takes_the_shared_meta_secrets_or_the_channel_override() -> None:
    hook = WhatsAppWebhook.from_env({"META_APP_SECRET": "s", "META_VERIFY_TOKEN": "v"})
    assert hook.channel == "whatsapp"
    own = WhatsAppWebhook.from_env(
        {"META_APP_SECRET": "s", "WHATSAPP_APP_SECRET": "mine", "META_VERIFY_TOKEN": "v"}
    )
    _signed(own, b"{}", secret="mine")  # raises unless the override is the secret
    with pytest.raises(ConfigError, match="META_APP_SECRET"):
        WhatsAppWebhook.from_env({"META_VERIFY_TOKEN": "v"})
    with pytest.raises(ConfigError, match="META_VERIFY_TOKEN"):
        WhatsAppWebhook.from_env({"META_APP_SECRET": "s"})


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
        method, "/whatsapp", "https://bot.example.com/whatsapp", headers, query or {}, body
    )


def _signed(hook: WhatsAppWebhook, body: bytes, secret: str = SECRET) -> None:
    hook.verify(_request(body, signature="sha256=" + hmac_hex(secret, body)))


def _envelope(value: dict[str, Any]) -> bytes:
    return json.dumps(
        {
            "object": "whatsapp_business_account",
            "entry": [
                {
                    "id": "102290129340398",
                    "changes": [
                        {
                            "value": {
                                "messaging_product": "whatsapp",
                                "metadata": {
                                    "display_phone_number": "15550783881",
                                    "phone_number_id": "106540352242922",
                                },
                                **value,
                            },
                            "field": "messages",
                        }
                    ],
                }
            ],
        }
    ).encode()


CONTACTS = [{"profile": {"name": "Sheena Nelson"}, "wa_id": "16505551234"}]


def _message(kind: str, part: dict[str, Any], **more: Any) -> bytes:
    msg = {
        "from": "16505551234",
        "id": f"wamid.HBgLMTY1MDU1NTEyMzQVAgASGBQzQTRB{kind.upper()}",
        "timestamp": "1749416383",
        "type": kind,
        kind: part,
        **more,
    }
    return _envelope({"contacts": CONTACTS, "messages": [msg]})


@pytest.fixture
def hook() -> WhatsAppWebhook:
    return WhatsAppWebhook(SECRET, VERIFY)


def test_handshake_answers_the_challenge_only_with_our_verify_token(hook: WhatsAppWebhook) -> None:
    good = {"hub.mode": "subscribe", "hub.verify_token": VERIFY, "hub.challenge": "1158201444"}
    reply = hook.handshake(_request(b"", method="GET", query=good))
    assert reply is not None and reply.status == 200 and reply.body == b"1158201444"
    bad = {**good, "hub.verify_token": "guess"}
    reply = hook.handshake(_request(b"", method="GET", query=bad))
    assert reply is not None and reply.status == 403 and b"1158201444" not in reply.body
    assert hook.handshake(_request(b"{}")) is None


def test_signature_good_bad_and_missing(hook: WhatsAppWebhook) -> None:
    body = _message("text", {"body": "hi"})
    _signed(hook, body)
    refused = []
    with pytest.raises(BadSignature) as wrong_secret:
        _signed(hook, body, secret="another-app")
    refused.append((body, wrong_secret.value))
    with pytest.raises(BadSignature) as wrong_body:
        hook.verify(_request(body + b" ", signature="sha256=" + hmac_hex(SECRET, body)))
    refused.append((body + b" ", wrong_body.value))
    with pytest.raises(BadSignature, match="no X-Hub-Signature-256") as missing:
        hook.verify(_request(body))
    refused.append((body, missing.value))
    with pytest.raises(BadSignature) as wrong_scheme:
        hook.verify(_request(body, signature="sha1=" + hmac_hex(SECRET, body)))
    refused.append((body, wrong_scheme.value))
    # What the refusals say (answered, logged) names neither the app secret nor the
    # signature that would have passed (with it, anyone could sign that body).
    for signed, e in refused:
        said = f"{e} {e!r}"
        assert SECRET not in said and hmac_hex(SECRET, signed) not in said, said


def test_parse_a_text(hook: WhatsAppWebhook) -> None:
    [rec] = hook.parse(_request(_message("text", {"body": "Does it come in another color?"})))
    assert rec.id == "wamid.HBgLMTY1MDU1NTEyMzQVAgASGBQzQTRBTEXT"
    assert (rec.chat_id, rec.sender, rec.channel) == ("16505551234", "16505551234", "whatsapp")
    assert rec.ts == 1749416383 and rec.text == "Does it come in another color?"
    assert rec.kind == "message" and rec.media is None
    assert rec.data["profile_name"] == "Sheena Nelson"
    assert rec.data["phone_number_id"] == "106540352242922"


MEDIA_PARTS: dict[str, dict[str, Any]] = {
    "image": {
        "caption": "Pic",
        "mime_type": "image/jpeg",
        "sha256": "aa",
        "id": "1003383421387256",
    },
    "document": {
        "caption": "Lucky Shrub Invoice",
        "filename": "lucky-shrub-invoice.pdf",
        "mime_type": "application/pdf",
        "sha256": "bb",
        "id": "1003383421387256",
    },
    "audio": {
        "mime_type": "audio/ogg; codecs=opus",
        "sha256": "cc",
        "id": "1003383421387256",
        "voice": True,
    },
    "video": {"mime_type": "video/mp4", "sha256": "dd", "id": "1003383421387256"},
    "sticker": {
        "mime_type": "image/webp",
        "sha256": "ee",
        "id": "1003383421387256",
        "animated": False,
    },
}


@pytest.mark.parametrize("kind", sorted(MEDIA_PARTS))
def test_parse_media_gives_the_media_id_never_a_url(hook: WhatsAppWebhook, kind: str) -> None:
    part = MEDIA_PARTS[kind]
    [rec] = hook.parse(_request(_message(kind, part)))
    assert rec.media == Media(
        provider="whatsapp",
        id="1003383421387256",
        mime=str(part["mime_type"]),
        name=part.get("filename"),
    )
    assert rec.text == part.get("caption") and rec.kind == "message"
    assert rec.data["type"] == kind


def test_parse_button_and_interactive_replies_as_interactions(hook: WhatsAppWebhook) -> None:
    context = {"context": {"from": "15550783881", "id": "wamid.ORIGINAL"}}
    [button] = hook.parse(
        _request(_message("button", {"payload": "Unsubscribe", "text": "Stop"}, **context))
    )
    assert button.kind == "interaction" and button.text == "Stop"
    assert button.data["payload"] == "Unsubscribe" and button.data["reply_to"] == "wamid.ORIGINAL"
    [tap] = hook.parse(
        _request(
            _message(
                "interactive",
                {
                    "type": "button_reply",
                    "button_reply": {"id": "cancel-button", "title": "Cancel"},
                },
            )
        )
    )
    assert tap.kind == "interaction" and tap.text == "Cancel"
    assert tap.data["payload"] == "cancel-button" and tap.data["interactive"] == "button_reply"
    [pick] = hook.parse(
        _request(
            _message(
                "interactive",
                {
                    "type": "list_reply",
                    "list_reply": {
                        "id": "priority_express",
                        "title": "Express Shipping",
                        "description": "Next Day to 2 Days",
                    },
                },
            )
        )
    )
    assert pick.text == "Express Shipping" and pick.data["payload"] == "priority_express"


def test_parse_a_location_keeps_it_in_data(hook: WhatsAppWebhook) -> None:
    loc = {"latitude": 37.483, "longitude": -122.148, "name": "Philz", "address": "1 Hacker Way"}
    [rec] = hook.parse(_request(_message("location", loc)))
    assert rec.data["location"] == loc and rec.text is None


def test_statuses_give_no_record_and_come_from_statuses(hook: WhatsAppWebhook) -> None:
    status = {
        "statuses": [
            {
                "id": "wamid.HBgLMTY1MDU1NTEyMzQVAgARGBI3",
                "status": "delivered",
                "timestamp": "1749416400",
                "recipient_id": "16505551234",
                "conversation": {"id": "CONVERSATION_ID", "origin": {"type": "service"}},
                "pricing": {"billable": True, "pricing_model": "CBP", "category": "service"},
            }
        ]
    }
    assert hook.parse(_request(_envelope(status))) == []
    assert hook.statuses(_request(_envelope(status))) == [
        DeliveryStatus(
            chat_id="16505551234",
            message_id="wamid.HBgLMTY1MDU1NTEyMzQVAgARGBI3",
            status=DeliveryState.DELIVERED,
            channel="whatsapp",
            ts=1749416400.0,
        )
    ]
    errors = {"errors": [{"code": 131047, "title": "Re-engagement message"}]}
    assert hook.parse(_request(_envelope(errors))) == []
    assert hook.statuses(_request(_envelope(errors))) == []
    assert hook.statuses(_request(_message("text", {"body": "hi"}))) == []


def test_a_redelivered_webhook_gives_the_same_id(hook: WhatsAppWebhook) -> None:
    body = _message("text", {"body": "hi"})
    assert hook.parse(_request(body))[0].id == hook.parse(_request(body))[0].id


def test_another_object_or_a_broken_body_is_malformed(hook: WhatsAppWebhook) -> None:
    with pytest.raises(MalformedWebhook, match="whatsapp_business_account"):
        hook.parse(_request(json.dumps({"object": "page", "entry": []}).encode()))
    with pytest.raises(MalformedWebhook, match="not JSON"):
        hook.parse(_request(b"<html>"))
    with pytest.raises(MalformedWebhook):
        hook.parse(_request(_envelope({"messages": [{"type": "text", "text": {"body": "x"}}]})))


def test_reply_is_a_bare_200(hook: WhatsAppWebhook) -> None:
    assert hook.reply(_request(b"{}"), []).status == 200


async def test_a_refused_connection_is_retryable_and_shows_no_token(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token = "EAAtransport-token-secret"
    provider = WhatsAppProvider(token, "106540352242922", api_url=f"http://127.0.0.1:{port}/v21.0")
    caplog.set_level(logging.DEBUG)
    try:
        with pytest.raises(SendError) as err:
            await provider.send(Outbound(USER, "hi"))
    finally:
        await provider.close()
    assert err.value.retryable is True and type(err.value) is SendError
    assert token not in str(err.value) and token not in caplog.text


async def test_a_parsed_media_id_survives_the_journal_and_downloads_on_replay(
    fake: tuple[GraphFake, str], wa: WhatsAppProvider, hook: WhatsAppWebhook
) -> None:
    graph, _ = fake
    media_id = graph.add_media(b"OggS-voice-note", "audio/ogg")
    part = {"mime_type": "audio/ogg", "sha256": "x", "id": media_id, "voice": True}
    [rec] = hook.parse(_request(_message("audio", part)))
    assert rec.media is not None
    stored = wa.serialize_media_ref(rec.media)
    assert stored is not None
    assert graph.whatsapp_token not in json.dumps(stored) and "http" not in json.dumps(stored)
    back = wa.rehydrate_media_ref(json.loads(json.dumps(stored)), rec.media)
    assert back.id == media_id
    assert await wa.download_media(back) == b"OggS-voice-note"

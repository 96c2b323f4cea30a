"""``botmesh.providers.twilio`` against the local fake of Twilio's Messages API
(``tests/providers/fakes/twilio.py``), over real HTTP."""

from __future__ import annotations

import base64
import logging
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from urllib.parse import urlencode

import pytest

from botmesh.providers.twilio import TwilioProvider, TwilioWebhook, twilio_signature
from botmesh.providers.webhooks import BadSignature, MalformedWebhook, WebhookRequest
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
from botmesh.state.messages import Media, Outbound
from botmesh.state.ports import AmbiguityResolver, Provider
from tests.providers.fakes.twilio import FakeTwilio
from tests.providers.serve import serving

FROM = "+15005550006"
TO = "+14155550100"


@dataclass
class Rig:
    fake: FakeTwilio
    url: str
    provider: TwilioProvider


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    fake = FakeTwilio()
    async with serving(fake.app()) as url:
        provider = TwilioProvider(
            fake.account_sid, fake.auth_token, FROM, base_url=url, allow_private_media=True
        )
        try:
            yield Rig(fake, url, provider)
        finally:
            await provider.close()


def secrets_of(fake: FakeTwilio) -> list[str]:
    basic = base64.b64encode(f"{fake.account_sid}:{fake.auth_token}".encode()).decode()
    return [fake.auth_token, basic]


# -- sending ------------------------------------------------------------------------------


async def test_send_posts_the_form_and_returns_the_sid(rig: Rig) -> None:
    p = rig.provider
    assert isinstance(p, Provider) and isinstance(p, AmbiguityResolver)
    assert (p.name, p.media_channel, p.text_limit) == ("twilio", "twilio", 1600)
    result = await p.send(Outbound(TO, "hello"))
    [sent] = rig.fake.messages
    assert result.message_id == sent["sid"]
    assert sent["sid"].startswith("SM") and len(sent["sid"]) == 34
    assert (sent["to"], sent["from"], sent["body"], sent["num_media"]) == (TO, FROM, "hello", "0")


async def test_whatsapp_sender_prefixes_the_recipient_once(rig: Rig) -> None:
    p = TwilioProvider(
        rig.fake.account_sid, rig.fake.auth_token, "whatsapp:" + FROM, base_url=rig.url
    )
    try:
        await p.send(Outbound(TO, "a"))
        await p.send(Outbound("whatsapp:" + TO, "b"))
    finally:
        await p.close()
    assert [m["to"] for m in rig.fake.messages] == ["whatsapp:" + TO] * 2
    assert {m["from"] for m in rig.fake.messages} == {"whatsapp:" + FROM}


async def test_media_url_goes_as_media_url(rig: Rig) -> None:
    await rig.provider.send(Outbound(TO, None, Media(url="https://example.com/cat.jpg")))
    assert rig.fake.messages[0]["num_media"] == "1"
    assert rig.fake.messages[0]["body"] == ""


@pytest.mark.parametrize(
    "media",
    [Media(data=b"x", mime="image/png"), Media(path="/tmp/x.png"), Media(id="abc")],
)
async def test_media_without_a_url_is_unsupported_before_any_call(rig: Rig, media: Media) -> None:
    with pytest.raises(UnsupportedContentError, match="public http"):
        await rig.provider.send(Outbound(TO, "see", media))
    assert rig.fake.messages == []


async def test_an_empty_message_is_unsupported(rig: Rig) -> None:
    with pytest.raises(UnsupportedContentError):
        await rig.provider.send(Outbound(TO, ""))


# -- error mapping, each against the fake ----------------------------------------------------


async def test_invalid_number_21211_is_unreachable(rig: Rig) -> None:
    with pytest.raises(RecipientUnreachableError, match="21211") as info:
        await rig.provider.send(Outbound("not-a-number", "hi"))
    assert info.value.retryable is False


@pytest.mark.parametrize("code", [21610, 21614, 21612])
async def test_scripted_recipient_codes_are_unreachable(rig: Rig, code: int) -> None:
    rig.fake.script(TO, code)
    with pytest.raises(RecipientUnreachableError, match=str(code)):
        await rig.provider.send(Outbound(TO, "hi"))
    assert rig.fake.messages == []


async def test_body_over_1600_is_too_large_21617(rig: Rig) -> None:
    with pytest.raises(PayloadTooLargeError, match="21617"):
        await rig.provider.send(Outbound(TO, "x" * 1601))
    await rig.provider.send(Outbound(TO, "x" * 1600))
    assert len(rig.fake.messages) == 1


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        (21620, UnsupportedContentError),
        (63005, UnsupportedContentError),
        (21623, PayloadTooLargeError),
        (63016, OutsideSessionWindowError),
    ],
)
async def test_content_and_window_codes(rig: Rig, code: int, kind: type[SendError]) -> None:
    rig.fake.fail_next(code)
    with pytest.raises(kind, match=str(code)) as info:
        await rig.provider.send(Outbound(TO, "hi", Media(url="https://example.com/a.png")))
    assert info.value.retryable is False


async def test_code_20429_is_rate_limited_with_the_default_wait(rig: Rig) -> None:
    rig.fake.fail_next(20429)
    with pytest.raises(RateLimitedError) as info:
        await rig.provider.send(Outbound(TO, "hi"))
    assert info.value.retryable and info.value.retry_after == rig.provider.rate_limit_wait


async def test_http_429_takes_retry_after(rig: Rig) -> None:
    rig.fake.fail_next(20429, retry_after="7")
    with pytest.raises(RateLimitedError) as info:
        await rig.provider.send(Outbound(TO, "hi"))
    assert info.value.retry_after == 7.0


async def test_code_20429_under_another_status_is_still_rate_limited(rig: Rig) -> None:
    rig.fake.fail_next(20429, status=400)
    with pytest.raises(RateLimitedError):
        await rig.provider.send(Outbound(TO, "hi"))


async def test_5xx_is_retryable(rig: Rig) -> None:
    rig.fake.fail_next(20500)
    with pytest.raises(SendError) as info:
        await rig.provider.send(Outbound(TO, "hi"))
    assert type(info.value) is SendError and info.value.retryable
    assert (await rig.provider.send(Outbound(TO, "again"))).message_id


async def test_other_4xx_is_final(rig: Rig) -> None:
    rig.fake.fail_next(20404)
    with pytest.raises(SendError, match="20404") as info:
        await rig.provider.send(Outbound(TO, "hi"))
    assert type(info.value) is SendError and info.value.retryable is False


async def test_wrong_credentials_20003_are_final_and_never_shown(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    bad = TwilioProvider(rig.fake.account_sid, "wrong-token-123", FROM, base_url=rig.url)
    try:
        with pytest.raises(SendError, match="credentials are wrong") as info:
            await bad.send(Outbound(TO, "hi"))
    finally:
        await bad.close()
    assert info.value.retryable is False
    assert "wrong-token-123" not in str(info.value)
    assert all("wrong-token-123" not in r.getMessage() for r in caplog.records)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_transport_error_is_retryable_without_the_token(rig: Rig) -> None:
    p = TwilioProvider(
        rig.fake.account_sid, rig.fake.auth_token, FROM, base_url=f"http://127.0.0.1:{free_port()}"
    )
    try:
        with pytest.raises(SendError) as info:
            await p.send(Outbound(TO, "hi"))
    finally:
        await p.close()
    assert info.value.retryable
    assert all(s not in str(info.value) for s in secrets_of(rig.fake))


async def test_no_error_or_log_line_carries_the_credentials(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    seen: list[str] = []
    for code in (20429, 20500, 21620, 63016, 20404):
        rig.fake.fail_next(code)
        with pytest.raises(SendError) as info:
            await rig.provider.send(Outbound(TO, "hi"))
        seen += [str(info.value), repr(info.value)]
    await rig.provider.send(Outbound(TO, "ok"))
    rig.fake.list_error = 500
    with pytest.raises(ProviderError) as listing:
        await rig.provider.resolve_ambiguous(Outbound(TO, "x"), "k", time.time())
    seen += [str(listing.value), repr(rig.provider)]
    seen += [r.getMessage() for r in caplog.records]
    assert any("twilio: sent" in line for line in seen)  # the log is really captured
    for secret in secrets_of(rig.fake):
        assert all(secret not in line for line in seen)


# -- resolve_ambiguous -----------------------------------------------------------------------


async def test_resolve_finds_a_send_that_went_out_and_sends_nothing(rig: Rig) -> None:
    since = time.time()
    first = await rig.provider.send(Outbound(TO, "your code is 1234"))
    found = await rig.provider.resolve_ambiguous(Outbound(TO, "your code is 1234"), "k:1", since)
    assert found == first
    assert len(rig.fake.messages) == 1


async def test_resolve_says_none_for_a_send_that_never_went_out(rig: Rig) -> None:
    await rig.provider.send(Outbound(TO, "something else"))
    await rig.provider.send(Outbound("+14155550199", "your code is 1234"))
    since = time.time()
    assert (
        await rig.provider.resolve_ambiguous(Outbound(TO, "your code is 1234"), "k", since) is None
    )
    assert rig.fake.list_calls == 1
    assert len(rig.fake.messages) == 2


async def test_resolve_ignores_an_identical_body_sent_before_the_window(rig: Rig) -> None:
    now = time.time()
    rig.fake.record(TO, FROM, "same", created=now - 600)
    assert await rig.provider.resolve_ambiguous(Outbound(TO, "same"), "k", now) is None
    rig.fake.record(TO, FROM, "same", created=now - 30)  # within the clock skew
    assert await rig.provider.resolve_ambiguous(Outbound(TO, "same"), "k", now) is not None


async def test_resolve_compares_the_media_count(rig: Rig) -> None:
    since = time.time()
    await rig.provider.send(Outbound(TO, "pic"))
    with_media = Outbound(TO, "pic", Media(url="https://example.com/a.png"))
    assert await rig.provider.resolve_ambiguous(with_media, "k", since) is None
    sent = await rig.provider.send(with_media)
    assert await rig.provider.resolve_ambiguous(with_media, "k", since) == sent


async def test_resolve_follows_next_page_uri(rig: Rig) -> None:
    since = time.time()
    sent = await rig.provider.send(Outbound(TO, "needle"))
    for i in range(120):  # newer messages push the needle to the third page
        rig.fake.record(TO, FROM, f"hay {i}", created=since + 1)
    found = await rig.provider.resolve_ambiguous(Outbound(TO, "needle"), "k", since)
    assert found == sent
    assert rig.fake.list_calls == 3


async def test_resolve_raises_when_the_listing_fails(rig: Rig) -> None:
    await rig.provider.send(Outbound(TO, "hi"))
    rig.fake.list_error = 500
    with pytest.raises(ProviderError, match="cannot list"):
        await rig.provider.resolve_ambiguous(Outbound(TO, "hi"), "k", time.time() - 5)


# -- media downloads -------------------------------------------------------------------------


async def test_download_media_adds_basic_auth(rig: Rig) -> None:
    path = rig.fake.add_media(b"\x89PNG...", "image/png")
    media = Media(provider="twilio", url=rig.url + path, mime="image/png")
    assert await rig.provider.download_media(media) == b"\x89PNG..."


async def test_download_media_drops_credentials_on_the_cdn_redirect(rig: Rig) -> None:
    rig.fake.redirect_media = True
    path = rig.fake.add_media(b"jpeg bytes", "image/jpeg")
    media = Media(provider="twilio", url=rig.url + path)
    assert await rig.provider.download_media(media) == b"jpeg bytes"
    assert rig.fake.cdn_auth == [None]


async def test_download_media_refuses_to_send_credentials_elsewhere(rig: Rig) -> None:
    media = Media(provider="twilio", url="https://evil.example.com/Media/ME1")
    with pytest.raises(ProviderError, match="credentials are not sent"):
        await rig.provider.download_media(media)


async def test_download_media_with_a_wrong_token_fails(rig: Rig) -> None:
    path = rig.fake.add_media(b"x", "image/png")
    bad = TwilioProvider(
        rig.fake.account_sid, "nope", FROM, base_url=rig.url, allow_private_media=True
    )
    try:
        with pytest.raises(ProviderError, match="HTTP 401"):
            await bad.download_media(Media(url=rig.url + path))
    finally:
        await bad.close()


# -- from_env ----------------------------------------------------------------------------------


def test_from_env_reads_the_variables() -> None:
    env = {
        "TWILIO_ACCOUNT_SID": "AC" + "0" * 32,
        "TWILIO_AUTH_TOKEN": "tok",
        "TWILIO_FROM": "whatsapp:+15005550006",
        "TWILIO_API_URL": "http://127.0.0.1:9999",
        "TWILIO_ALLOW_PRIVATE_MEDIA": "1",
    }
    p = TwilioProvider.from_env(env)
    assert (p.base_url, p.from_, p.allow_private_media) == (
        "http://127.0.0.1:9999",
        "whatsapp:+15005550006",
        True,
    )
    assert "tok" not in repr(p)
    assert isinstance(TwilioWebhook.from_env(env), TwilioWebhook)


@pytest.mark.parametrize("missing", ["TWILIO_ACCOUNT_SID", "TWILIO_AUTH_TOKEN", "TWILIO_FROM"])
def test_from_env_names_a_missing_variable(missing: str) -> None:
    env = {"TWILIO_ACCOUNT_SID": "AC1", "TWILIO_AUTH_TOKEN": "t", "TWILIO_FROM": "+1"}
    del env[missing]
    with pytest.raises(ConfigError) as info:
        TwilioProvider.from_env(env)
    assert info.value.field == missing and "Twilio console" in str(info.value)


def test_from_env_refuses_private_media_for_the_real_api() -> None:
    env = {
        "TWILIO_ACCOUNT_SID": "AC1",
        "TWILIO_AUTH_TOKEN": "t",
        "TWILIO_FROM": "+1",
        "TWILIO_ALLOW_PRIVATE_MEDIA": "1",
    }
    with pytest.raises(ConfigError, match="TWILIO_ALLOW_PRIVATE_MEDIA"):
        TwilioProvider.from_env(env)
    with pytest.raises(ConfigError, match="TWILIO_AUTH_TOKEN"):
        TwilioWebhook.from_env({})


# -- the webhook -------------------------------------------------------------------------------

# Twilio's published example (its security docs and every helper library's tests):
# auth token 12345, this URL and these parameters sign to this value.
VECTOR_TOKEN = "12345"
VECTOR_URL = "https://mycompany.com/myapp.php?foo=1&bar=2"
VECTOR_PARAMS = {
    "CallSid": "CA1234567890ABCDE",
    "Caller": "+14158675309",
    "Digits": "1234",
    "From": "+14158675309",
    "To": "+18005551212",
}
VECTOR_SIGNATURE = "RSOYDt4T1cUTdK1PDd93/VVr8B8="


def webhook_request(
    params: dict[str, str], *, url: str = VECTOR_URL, signature: str | None = None
) -> WebhookRequest:
    headers = {"content-type": "application/x-www-form-urlencoded"}
    if signature is not None:
        headers["x-twilio-signature"] = signature
    return WebhookRequest(
        method="POST",
        path="/twilio",
        url=url,
        headers=headers,
        query={},
        body=urlencode(params).encode(),
        form=params,
    )


def test_signature_matches_twilios_published_vector() -> None:
    assert twilio_signature(VECTOR_TOKEN, VECTOR_URL, list(VECTOR_PARAMS.items())) == (
        VECTOR_SIGNATURE
    )
    hook = TwilioWebhook(VECTOR_TOKEN)
    hook.verify(webhook_request(VECTOR_PARAMS, signature=VECTOR_SIGNATURE))
    # Proxies disagree about the default port; Twilio's validators accept both forms.
    with_port = "https://mycompany.com:443/myapp.php?foo=1&bar=2"
    hook.verify(webhook_request(VECTOR_PARAMS, url=with_port, signature=VECTOR_SIGNATURE))


@pytest.mark.parametrize(
    ("params", "url", "signature", "token"),
    [
        ({**VECTOR_PARAMS, "Digits": "9999"}, VECTOR_URL, VECTOR_SIGNATURE, VECTOR_TOKEN),
        (VECTOR_PARAMS, VECTOR_URL + "&x=1", VECTOR_SIGNATURE, VECTOR_TOKEN),
        (VECTOR_PARAMS, VECTOR_URL, VECTOR_SIGNATURE, "54321"),
        (VECTOR_PARAMS, VECTOR_URL, "AAAAAAAAAAAAAAAAAAAAAAAAAAA=", VECTOR_TOKEN),
        (VECTOR_PARAMS, VECTOR_URL, None, VECTOR_TOKEN),
    ],
)
def test_bad_signatures_are_refused(
    params: dict[str, str], url: str, signature: str | None, token: str
) -> None:
    with pytest.raises(BadSignature):
        TwilioWebhook(token).verify(webhook_request(params, url=url, signature=signature))


INBOUND = {
    "ToCountry": "US",
    "SmsMessageSid": "SM" + "a" * 32,
    "NumMedia": "0",
    "SmsSid": "SM" + "a" * 32,
    "SmsStatus": "received",
    "Body": "hello bot",
    "To": FROM,
    "NumSegments": "1",
    "MessageSid": "SM" + "a" * 32,
    "AccountSid": "AC" + "b" * 32,
    "From": TO,
    "ApiVersion": "2010-04-01",
}


def test_parse_a_text_message() -> None:
    hook = TwilioWebhook("tok", clock=lambda: 1234.5)
    req = webhook_request(INBOUND, url="https://bot.example.com/twilio")
    [inbound] = hook.parse(req)
    assert inbound.id == "SM" + "a" * 32
    assert (inbound.chat_id, inbound.sender, inbound.channel) == (TO, TO, "twilio")
    assert (inbound.text, inbound.ts, inbound.media) == ("hello bot", 1234.5, None)
    assert inbound.data == {"to": FROM}
    # A webhook retried by Twilio gives the same id.
    assert hook.parse(req)[0].id == inbound.id


def test_parse_whatsapp_media_keeps_the_prefix_and_every_media() -> None:
    params = {
        **INBOUND,
        "From": "whatsapp:" + TO,
        "To": "whatsapp:" + FROM,
        "Body": "",
        "NumMedia": "2",
        "MediaUrl0": "https://api.twilio.com/2010-04-01/Accounts/AC1/Messages/MM1/Media/ME1",
        "MediaContentType0": "image/jpeg",
        "MediaUrl1": "https://api.twilio.com/2010-04-01/Accounts/AC1/Messages/MM1/Media/ME2",
        "MediaContentType1": "application/pdf",
        "ProfileName": "Ana",
        "WaId": "14155550100",
    }
    hook = TwilioWebhook("tok")
    req = webhook_request(params, url="https://bot.example.com/twilio")
    hook.verify(
        webhook_request(
            params,
            url="https://bot.example.com/twilio",
            signature=twilio_signature(
                "tok", "https://bot.example.com/twilio", list(params.items())
            ),
        )
    )
    [inbound] = hook.parse(req)
    assert inbound.chat_id == "whatsapp:" + TO and inbound.text is None
    assert inbound.media == Media(provider="twilio", url=params["MediaUrl0"], mime="image/jpeg")
    assert inbound.data["more_media"] == [{"url": params["MediaUrl1"], "mime": "application/pdf"}]
    assert (inbound.data["profile_name"], inbound.data["wa_id"]) == ("Ana", "14155550100")


def test_status_callbacks_give_no_record() -> None:
    callback = {
        "MessageSid": "SM" + "c" * 32,
        "MessageStatus": "delivered",
        "To": TO,
        "From": FROM,
        "AccountSid": "AC1",
    }
    assert TwilioWebhook("tok").parse(webhook_request(callback)) == []


def test_no_message_sid_is_malformed() -> None:
    params = {k: v for k, v in INBOUND.items() if "Sid" not in k or k == "AccountSid"}
    with pytest.raises(MalformedWebhook, match="MessageSid"):
        TwilioWebhook("tok").parse(webhook_request(params))


def test_reply_is_empty_twiml() -> None:
    reply = TwilioWebhook("tok").reply(webhook_request(INBOUND), [])
    assert reply.status == 200 and reply.content_type == "text/xml"
    assert reply.body == b'<?xml version="1.0" encoding="UTF-8"?><Response></Response>'

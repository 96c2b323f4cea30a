"""What the three WhatsApp Web bridge adapters (Baileys' HTTP bridge, Evolution API,
WPPConnect) promise alike, one suite over the three against their local fakes over real
HTTP (``tests/providers/fakes/``): the channel contract, the settings, the common error
rules (a wrong credential, a proxy's 429 with ``Retry-After`` honoured by the engine, 5xx,
a refused connection), no credential in any error or log line; and the shared reading of a
Baileys message (``botmesh.providers.wa_bridges``). Each channel's own cases are in
``test_baileys.py``, ``test_evolution.py`` and ``test_wppconnect.py``."""

from __future__ import annotations

import base64
import logging
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from botmesh.providers.baileys import BaileysProvider
from botmesh.providers.channels import provider_from_env
from botmesh.providers.evolution import EvolutionProvider
from botmesh.providers.wa_bridges import (
    WA_TEXT_LIMIT,
    BridgeProvider,
    b64_bytes,
    media_kind,
    wa_content,
    wa_long,
)
from botmesh.providers.wppconnect import WppConnectProvider
from botmesh.state.errors import ConfigError, RateLimitedError, SendError
from botmesh.state.messages import Outbound
from botmesh.state.ports import (
    AmbiguityResolver,
    KeyedSends,
    MediaDownloads,
    MediaRefs,
    Provider,
    SessionHooks,
)
from tests.providers.channel_paths import send_through_engine
from tests.providers.fakes.baileys import FakeBaileys
from tests.providers.fakes.evolution import FakeEvolution
from tests.providers.fakes.wa_bridges import BridgeFake, refused
from tests.providers.fakes.wppconnect import FakeWppConnect
from tests.providers.serve import serving

CHAT = "5511999990001"


@dataclass
class Bridge:
    """How one channel is set up against its fake."""

    fake: Callable[[], BridgeFake]
    #: The settings that point the channel at the fake at ``url``.
    env: Callable[[Any, str], dict[str, str]]
    #: The channel's credential variable and its session variable.
    credential: str
    session: str


BRIDGES: dict[str, Bridge] = {
    "baileys": Bridge(
        FakeBaileys,
        lambda f, url: {
            "BAILEYS_API_URL": url,
            "BAILEYS_API_KEY": f.api_key,
            "BAILEYS_PHONE_NUMBER": f.phone,
        },
        "BAILEYS_API_KEY",
        "BAILEYS_PHONE_NUMBER",
    ),
    "evolution": Bridge(
        FakeEvolution,
        lambda f, url: {
            "EVOLUTION_API_URL": url,
            "EVOLUTION_API_KEY": f.token,
            "EVOLUTION_INSTANCE": f.instance,
        },
        "EVOLUTION_API_KEY",
        "EVOLUTION_INSTANCE",
    ),
    "wppconnect": Bridge(
        FakeWppConnect,
        lambda f, url: {
            "WPPCONNECT_API_URL": url,
            "WPPCONNECT_TOKEN": f.token,
            "WPPCONNECT_SESSION": f.session,
        },
        "WPPCONNECT_TOKEN",
        "WPPCONNECT_SESSION",
    ),
}
CLASSES: dict[str, type[BridgeProvider]] = {
    "baileys": BaileysProvider,
    "evolution": EvolutionProvider,
    "wppconnect": WppConnectProvider,
}


@dataclass
class Rig:
    name: str
    fake: Any
    url: str
    env: dict[str, str]
    provider: BridgeProvider

    @property
    def secret(self) -> str:
        return self.env[BRIDGES[self.name].credential]


@pytest.fixture(params=sorted(BRIDGES))
async def rig(request: pytest.FixtureRequest) -> AsyncIterator[Rig]:
    name: str = request.param
    fake = BRIDGES[name].fake()
    async with serving(fake.app()) as url:
        env = BRIDGES[name].env(fake, url)
        provider = provider_from_env(name, env)
        assert isinstance(provider, CLASSES[name])
        try:
            yield Rig(name, fake, url, env, provider)
        finally:
            await provider.close()


# -- the contract -----------------------------------------------------------------------------


async def test_each_is_a_provider_with_media_refs_and_downloads(rig: Rig) -> None:
    p = rig.provider
    assert (p.name, p.media_channel, p.text_limit) == (rig.name, rig.name, WA_TEXT_LIMIT)
    assert isinstance(p, Provider) and isinstance(p, MediaRefs) and isinstance(p, MediaDownloads)
    # Only the Baileys bridge deduplicates a send by a key of ours.
    assert isinstance(p, KeyedSends) is (rig.name == "baileys")
    assert isinstance(p, AmbiguityResolver) is (rig.name == "baileys")
    # The bridge holds the WhatsApp Web session: no leader, no session hooks here.
    assert not isinstance(p, SessionHooks)
    assert rig.secret not in repr(p)


async def test_a_text_goes_out_and_its_message_id_comes_back(rig: Rig) -> None:
    result = await rig.provider.send(Outbound(CHAT, "hello"))
    [sent] = rig.fake.sent
    assert result.message_id == sent.id and sent.text == "hello"


async def test_a_text_at_whatsapp_webs_limit_goes_out(rig: Rig) -> None:
    await rig.provider.send(Outbound(CHAT, "x" * WA_TEXT_LIMIT))
    assert len(rig.fake.sent[0].text or "") == 65536


# -- settings ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(BRIDGES))
def test_from_env_names_each_missing_variable(name: str) -> None:
    bridge = BRIDGES[name]
    env = bridge.env(bridge.fake(), "http://127.0.0.1:9")
    for missing in env:
        with pytest.raises(ConfigError) as err:
            provider_from_env(name, {k: v for k, v in env.items() if k != missing})
        assert err.value.field == missing
        assert env[bridge.credential] not in str(err.value)


@pytest.mark.parametrize("name", sorted(BRIDGES))
@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("bridge.example.com:8080", r"not the http\(s\) URL of the bridge"),
        ("http://bridge.internal:8080", "plain http to a remote host"),
    ],
)
def test_the_api_url_must_keep_the_credential_off_the_wire(name: str, url: str, says: str) -> None:
    bridge = BRIDGES[name]
    env = {**bridge.env(bridge.fake(), url)}
    with pytest.raises(ConfigError, match=says) as err:
        provider_from_env(name, env)
    assert err.value.field == f"{name.upper()}_API_URL"


@pytest.mark.parametrize("name", sorted(BRIDGES))
def test_a_bridge_on_a_private_network_takes_plain_http_only_when_said(
    name: str, caplog: pytest.LogCaptureFixture
) -> None:
    bridge = BRIDGES[name]
    prefix = name.upper()
    env = bridge.env(bridge.fake(), "http://bridge.internal:8080/")
    with pytest.raises(ConfigError, match=f"{prefix}_ALLOW_PLAIN_HTTP=1"):
        provider_from_env(name, env)
    with pytest.raises(ConfigError, match="'yes' is not 1 or 0") as err:
        provider_from_env(name, {**env, f"{prefix}_ALLOW_PLAIN_HTTP": "yes"})
    assert err.value.field == f"{prefix}_ALLOW_PLAIN_HTTP"
    with caplog.at_level(logging.WARNING):
        provider = provider_from_env(name, {**env, f"{prefix}_ALLOW_PLAIN_HTTP": "1"})
    assert isinstance(provider, BridgeProvider)
    assert provider.api_url == "http://bridge.internal:8080"
    assert "travels in clear" in caplog.text and env[bridge.credential] not in caplog.text


@pytest.mark.parametrize("name", sorted(BRIDGES))
def test_private_media_is_honoured_only_with_a_local_api(name: str) -> None:
    bridge = BRIDGES[name]
    prefix = name.upper()
    local = {
        **bridge.env(bridge.fake(), "http://127.0.0.1:9/"),
        f"{prefix}_ALLOW_PRIVATE_MEDIA": "1",
    }
    provider = provider_from_env(name, local)
    assert isinstance(provider, BridgeProvider)
    assert provider.allow_private_media and provider.api_url == "http://127.0.0.1:9"
    remote = {**local, f"{prefix}_API_URL": "https://bridge.example.com"}
    with pytest.raises(ConfigError) as err:
        provider_from_env(name, remote)
    assert err.value.field == f"{prefix}_ALLOW_PRIVATE_MEDIA"


# -- the common error rules --------------------------------------------------------------------


async def test_a_wrong_credential_is_final_names_the_variable_and_never_shows(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    wrong = "wrong-credential-0123456789"
    env = {**rig.env, BRIDGES[rig.name].credential: wrong}
    provider = provider_from_env(rig.name, env)
    assert isinstance(provider, BridgeProvider)
    err = await refused(provider, Outbound(CHAT, "hi"))
    assert type(err) is SendError and err.retryable is False
    assert "HTTP 401" in str(err) and BRIDGES[rig.name].credential in str(err)
    assert wrong not in str(err) and wrong not in caplog.text
    assert rig.fake.sent == []


async def test_a_proxys_429_is_rate_limited_with_its_retry_after(rig: Rig) -> None:
    rig.fake.rate_limit("7")
    with pytest.raises(RateLimitedError) as err:
        await rig.provider.send(Outbound(CHAT, "hi"))
    assert err.value.retryable is True and err.value.retry_after == 7.0
    rig.fake.fail_next(429, "slow down", headers={"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"})
    with pytest.raises(RateLimitedError) as err:
        await rig.provider.send(Outbound(CHAT, "hi"))
    assert err.value.retry_after == 0.0  # a date in the past: no wait beyond the backoff
    assert rig.fake.sent == []


async def test_the_engine_waits_the_retry_after_then_sends_once(rig: Rig) -> None:
    rig.fake.rate_limit("7")
    receipt, waited = await send_through_engine(rig.provider, CHAT, "after the wait")
    assert receipt.state == "sent" and waited == 7.0  # not the 1 s backoff
    [sent] = rig.fake.sent
    assert receipt.message_id == sent.id and sent.text == "after the wait"


@pytest.mark.parametrize("status", [500, 502, 503, 504])
async def test_server_errors_are_retryable(rig: Rig, status: int) -> None:
    rig.fake.fail_next(status, "<html><body>Bad Gateway</body></html>")
    with pytest.raises(SendError) as err:
        await rig.provider.send(Outbound(CHAT, "hi"))
    assert type(err.value) is SendError and err.value.retryable is True
    assert f"HTTP {status}" in str(err.value)


async def test_a_refused_connection_is_retryable_and_shows_no_credential(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**rig.env, f"{rig.name.upper()}_API_URL": f"http://127.0.0.1:{port}"}
    provider = provider_from_env(rig.name, env)
    assert isinstance(provider, BridgeProvider)
    err = await refused(provider, Outbound(CHAT, "hi"))
    assert type(err) is SendError and err.retryable is True
    assert rig.secret not in str(err) and rig.secret not in caplog.text


# -- reading a Baileys message (Baileys' bridge and Evolution) ---------------------------------


def test_wa_content_reads_texts_captions_and_replies() -> None:
    assert wa_content({"conversation": "hi"}).text == "hi"  # type: ignore[union-attr]
    quoted = {"text": "yes", "contextInfo": {"stanzaId": "3EB0AA", "participant": "x"}}
    found = wa_content({"extendedTextMessage": quoted, "messageContextInfo": {}})
    assert found is not None and (found.type, found.text) == ("extendedTextMessage", "yes")
    assert found.data == {"reply_to": "3EB0AA"} and found.media_type is None
    image = {"imageMessage": {"caption": "look", "mimetype": "image/jpeg", "url": "u"}}
    found = wa_content(image)
    assert found is not None and (found.text, found.media_type) == ("look", "image")
    assert found.media["url"] == "u" and not found.view_once


def test_wa_content_unwraps_ephemeral_view_once_and_documents_with_a_caption() -> None:
    inner = {"imageMessage": {"mimetype": "image/jpeg"}}
    found = wa_content({"ephemeralMessage": {"message": {"viewOnceMessageV2": {"message": inner}}}})
    assert found is not None and found.media_type == "image" and found.view_once
    doc = {"documentMessage": {"fileName": "a.pdf", "caption": "invoice"}}
    found = wa_content({"documentWithCaptionMessage": {"message": doc}})
    assert found is not None and (found.media_type, found.text) == ("document", "invoice")


@pytest.mark.parametrize(
    ("message", "text", "payload"),
    [
        (
            {"buttonsResponseMessage": {"selectedButtonId": "yes", "selectedDisplayText": "Yes"}},
            "Yes",
            "yes",
        ),
        (
            {"templateButtonReplyMessage": {"selectedId": "t1", "selectedDisplayText": "Go"}},
            "Go",
            "t1",
        ),
        (
            {"listResponseMessage": {"title": "Pix", "singleSelectReply": {"selectedRowId": "r"}}},
            "Pix",
            "r",
        ),
        (
            {
                "interactiveResponseMessage": {
                    "body": {"text": "Sent"},
                    "nativeFlowResponseMessage": {"name": "flow", "paramsJson": '{"a":1}'},
                }
            },
            "Sent",
            '{"a":1}',
        ),
    ],
)
def test_wa_content_reads_button_and_list_replies_as_interactions(
    message: dict[str, Any], text: str, payload: str
) -> None:
    found = wa_content(message)
    assert found is not None and found.kind == "interaction"
    assert (found.text, found.data["payload"]) == (text, payload)


def test_wa_content_keeps_other_content_in_data_and_drops_protocol_messages() -> None:
    loc = {"degreesLatitude": -23.5, "degreesLongitude": -46.6}
    found = wa_content({"locationMessage": loc})
    assert found is not None and found.data == {"locationMessage": loc} and found.text is None
    assert wa_content({"protocolMessage": {"type": "REVOKE", "key": {}}}) is None
    assert wa_content({"senderKeyDistributionMessage": {}, "messageContextInfo": {}}) is None
    assert wa_content(None) is None and wa_content({}) is None


def test_byte_fields_read_in_every_form_a_bridge_writes() -> None:
    raw = bytes(range(32))
    b64 = base64.b64encode(raw).decode()
    forms = [
        b64,
        f"data:image/png;base64,{b64}",
        {"type": "Buffer", "data": list(raw)},
        {"type": "Buffer", "data": b64},
        {str(i): b for i, b in enumerate(raw)},
        list(raw),
    ]
    assert all(b64_bytes(f) == raw for f in forms)
    assert b64_bytes("not base64!") is None and b64_bytes({"type": "Buffer", "data": [999]}) is None
    assert b64_bytes(None) is None and b64_bytes(12) is None


def test_wa_long_reads_numbers_digits_and_protobuf_longs() -> None:
    assert wa_long(1767225600) == wa_long("1767225600") == 1767225600.0
    assert wa_long({"low": 5, "high": 1, "unsigned": True}) == 2**32 + 5
    assert wa_long({"low": -1, "high": 0}) == 2**32 - 1  # a uint32 written as a signed int
    assert wa_long(None) is None and wa_long("x") is None and wa_long(0) is None
    assert wa_long(True) is None


@pytest.mark.parametrize(
    ("mime", "kind"),
    [
        ("image/png", "image"),
        ("video/mp4", "video"),
        ("audio/ogg; codecs=opus", "audio"),
        ("application/pdf", "document"),
        (None, "document"),
    ],
)
def test_media_kind_follows_the_mime_type(mime: str | None, kind: str) -> None:
    assert media_kind(mime) == kind

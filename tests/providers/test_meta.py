"""What the three Meta channels share (``botmesh.providers.meta``): the Graph error mapping on
answers the fake cannot give (a proxy's HTML page), the handshake's edge cases, and the
environment settings."""

from __future__ import annotations

import json

import pytest

from botmesh.providers.http import HttpAnswer
from botmesh.providers.instagram import InstagramProvider, InstagramWebhook
from botmesh.providers.messenger import MessengerProvider, MessengerWebhook
from botmesh.providers.meta import GRAPH_URL, GraphError, env_api, graph_error
from botmesh.providers.webhooks import ChannelWebhook, WebhookRequest
from botmesh.providers.whatsapp import WhatsAppProvider, WhatsAppWebhook
from botmesh.state.errors import ConfigError, RateLimitedError, SendError
from botmesh.state.ports import MediaDownloads, MediaRefs, Provider


def _answer(status: int, body: object, headers: dict[str, str] | None = None) -> HttpAnswer:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return HttpAnswer(status, headers or {}, raw)


def test_a_body_that_is_not_graph_json_still_maps_by_status() -> None:
    err = graph_error("whatsapp", _answer(502, b"<html>Bad Gateway</html>"))
    assert err.retryable is True and "Bad Gateway" in str(err)
    err = graph_error("whatsapp", _answer(404, b""))
    assert err.retryable is False and "HTTP 404" in str(err)


def test_a_429_without_a_code_waits_the_default_or_retry_after() -> None:
    err = graph_error("messenger", _answer(429, {"error": {"message": "slow down"}}))
    assert isinstance(err, RateLimitedError) and err.retry_after == 60.0
    err = graph_error("messenger", _answer(429, {"error": {"message": "x"}}, {"retry-after": "3"}))
    assert isinstance(err, RateLimitedError) and err.retry_after == 3.0


def test_error_fields_and_description() -> None:
    body = {
        "error": {
            "message": "(#131047) Re-engagement message",
            "type": "OAuthException",
            "code": 131047,
            "error_subcode": "2494010",
            "error_data": {"messaging_product": "whatsapp", "details": "24 hours passed"},
            "fbtrace_id": "Az8or2yhqkZfEZ-_4Qn_Bam",
        }
    }
    e = GraphError.of(_answer(400, body))
    assert (e.code, e.subcode, e.details) == (131047, 2494010, "24 hours passed")
    assert e.describe() == (
        "Graph error 131047/2494010: (#131047) Re-engagement message (24 hours passed) "
        "[fbtrace_id Az8or2yhqkZfEZ-_4Qn_Bam]"
    )


def test_a_token_quoted_in_a_non_json_body_is_redacted() -> None:
    err = graph_error(
        "whatsapp", _answer(500, b"oops EAAsecret"), redact=lambda s: s.replace("EAAsecret", "***")
    )
    assert "EAAsecret" not in str(err) and isinstance(err, SendError)


def test_env_api() -> None:
    assert env_api({}, "MESSENGER") == {"api_url": GRAPH_URL}
    local = {
        "MESSENGER_API_URL": "http://127.0.0.1:8/v21.0",
        "MESSENGER_ALLOW_PRIVATE_MEDIA": "1",
        "MESSENGER_MEDIA_REF_HOSTS": "127.0.0.1, cdn.example.com",
    }
    assert env_api(local, "MESSENGER") == {
        "api_url": "http://127.0.0.1:8/v21.0",
        "allow_private_media": True,
        "media_ref_hosts": ("127.0.0.1", "cdn.example.com"),
    }
    assert env_api({**local, "MESSENGER_ALLOW_PRIVATE_MEDIA": "0"}, "MESSENGER")[
        "api_url"
    ].startswith("http://127.0.0.1")
    with pytest.raises(ConfigError, match="not 1 or 0"):
        env_api({**local, "MESSENGER_ALLOW_PRIVATE_MEDIA": "false"}, "MESSENGER")
    with pytest.raises(ConfigError, match="plain http to a remote host"):
        env_api(
            {
                "MESSENGER_API_URL": "http://127.0.0.1.evil.com/",
                "MESSENGER_ALLOW_PRIVATE_MEDIA": "1",
            },
            "MESSENGER",
        )
    with pytest.raises(ConfigError, match="only honoured with a local"):
        env_api(
            {"MESSENGER_API_URL": "https://graph.example", "MESSENGER_ALLOW_PRIVATE_MEDIA": "1"},
            "MESSENGER",
        )


@pytest.mark.parametrize(
    "query",
    [
        {"hub.mode": "unsubscribe", "hub.verify_token": "v", "hub.challenge": "c"},
        {"hub.mode": "subscribe", "hub.verify_token": "v"},
        {"hub.mode": "subscribe", "hub.challenge": "c"},
    ],
)
def test_a_handshake_that_is_not_a_subscribe_with_our_token_is_403(query: dict[str, str]) -> None:
    hook = MessengerWebhook("secret", "v")
    reply = hook.handshake(
        WebhookRequest("GET", "/messenger", "https://x/messenger", {}, query, b"")
    )
    assert reply is not None and reply.status == 403


def test_the_classes_fit_the_contract() -> None:
    """mypy checks the assignments; isinstance checks the runtime protocols."""
    hooks: list[ChannelWebhook] = [
        WhatsAppWebhook("s", "v"),
        MessengerWebhook("s", "v"),
        InstagramWebhook("s", "v"),
    ]
    providers: list[Provider] = [
        WhatsAppProvider("t", "1"),
        MessengerProvider("t"),
        InstagramProvider("t"),
    ]
    assert [h.channel for h in hooks] == ["whatsapp", "messenger", "instagram"]
    assert [p.name for p in providers] == ["whatsapp", "messenger", "instagram"]
    for p in providers:
        assert isinstance(p, MediaRefs) and isinstance(p, MediaDownloads)
    for h in hooks:
        assert isinstance(h, ChannelWebhook)


def test_empty_secrets_are_refused() -> None:
    with pytest.raises(ConfigError, match="app_secret"):
        MessengerWebhook("", "v")
    with pytest.raises(ConfigError, match="verify_token"):
        MessengerWebhook("s", "")

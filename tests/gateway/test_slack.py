"""``SlackWebhook`` on recorded Events API bodies (no network): signature and replay checks,
``url_verification``, which events become records, and ``from_env``."""

from __future__ import annotations

import json

import pytest

from botmesh.providers.slack import SlackWebhook
from botmesh.providers.webhooks import (
    BadSignature,
    ChannelWebhook,
    MalformedWebhook,
    WebhookRequest,
)
from botmesh.state.errors import ConfigError
from botmesh.state.messages import Inbound
from tests.gateway.kit import SLACK_SECRET, slack_headers, slack_message

NOW = 1_700_000_000.0


def hook() -> SlackWebhook:
    return SlackWebhook(SLACK_SECRET, clock=lambda: NOW)


def request(body: bytes, headers: dict[str, str] | None = None) -> WebhookRequest:
    given = slack_headers(body, at=NOW) if headers is None else headers
    return WebhookRequest(
        method="POST",
        path="/slack",
        url="https://hooks.example.com/slack",
        headers={k.lower(): v for k, v in given.items()},
        query={},
        body=body,
    )


def event(ev: dict[str, object], **top: object) -> bytes:
    return json.dumps(
        {"type": "event_callback", "event_id": "Ev1", "team_id": "T1", "event": ev, **top}
    ).encode()


def test_it_is_a_channel_webhook() -> None:
    assert isinstance(hook(), ChannelWebhook)
    assert hook().channel == "slack"


def test_a_good_signature_passes() -> None:
    body = slack_message()
    hook().verify(request(body))
    hook().verify(request(body, slack_headers(body, at=NOW - 299)))


@pytest.mark.parametrize(
    ("headers", "why"),
    [
        ({"X-Slack-Request-Timestamp": str(int(NOW))}, "header missing"),
        ({"X-Slack-Signature": "v0=00"}, "header missing"),
        ({"X-Slack-Request-Timestamp": "yesterday", "X-Slack-Signature": "v0=00"}, "not a number"),
    ],
)
def test_missing_or_bad_headers_are_refused(headers: dict[str, str], why: str) -> None:
    with pytest.raises(BadSignature, match=why):
        hook().verify(request(slack_message(), headers))


def test_a_wrong_secret_or_a_changed_body_is_refused() -> None:
    body = slack_message()
    with pytest.raises(BadSignature, match="does not match"):
        hook().verify(request(body, slack_headers(body, secret="other", at=NOW)))
    with pytest.raises(BadSignature, match="does not match"):
        hook().verify(request(body + b" ", slack_headers(body, at=NOW)))
    signed = slack_headers(body, at=NOW)
    signed["X-Slack-Signature"] = signed["X-Slack-Signature"].removeprefix("v0=")
    with pytest.raises(BadSignature, match="does not match"):
        hook().verify(request(body, signed))


@pytest.mark.parametrize("offset", [-301, 301, -3600])
def test_a_timestamp_over_5_minutes_away_is_a_replay(offset: int) -> None:
    body = slack_message()
    with pytest.raises(BadSignature, match="more than 300 s"):
        hook().verify(request(body, slack_headers(body, at=NOW + offset)))


def test_the_secret_never_shows() -> None:
    body = slack_message()
    for headers in (slack_headers(body, secret="x", at=NOW), slack_headers(body, at=NOW - 999)):
        with pytest.raises(BadSignature) as caught:
            hook().verify(request(body, headers))
        assert SLACK_SECRET not in str(caught.value)
    assert SLACK_SECRET not in repr(hook())


def test_url_verification_answers_its_challenge() -> None:
    body = json.dumps({"token": "t", "challenge": "abc123", "type": "url_verification"}).encode()
    reply = hook().handshake(request(body))
    assert reply is not None and (reply.status, reply.body) == (200, b"abc123")
    assert hook().handshake(request(slack_message())) is None
    with pytest.raises(MalformedWebhook):
        hook().handshake(request(b'{"type": "url_verification"}'))


def test_a_message_event_is_one_inbound() -> None:
    body = event(
        {
            "type": "message",
            "channel": "C1",
            "user": "U1",
            "text": "hi",
            "ts": "1700000000.000100",
            "thread_ts": "1699999999.000200",
        }
    )
    assert hook().parse(request(body)) == [
        Inbound(
            id="Ev1",
            chat_id="C1",
            channel="slack",
            sender="U1",
            text="hi",
            ts=1700000000.0001,
            data={"team_id": "T1", "thread_ts": "1699999999.000200"},
        )
    ]


def test_a_retried_delivery_keeps_its_event_id() -> None:
    body = slack_message("Ev9")
    first = hook().parse(request(body))
    again = hook().parse(request(body, slack_headers(body, at=NOW, retry=2)))
    assert first == again and first[0].id == "Ev9"


@pytest.mark.parametrize(
    "body",
    [
        event({"type": "message", "subtype": "message_changed", "channel": "C1", "user": "U1"}),
        event({"type": "message", "bot_id": "B1", "channel": "C1", "user": "U1", "text": "x"}),
        event({"type": "reaction_added", "user": "U1", "reaction": "thumbsup"}),
        json.dumps({"type": "app_rate_limited", "team_id": "T1"}).encode(),
    ],
)
def test_other_events_give_no_record(body: bytes) -> None:
    assert hook().parse(request(body)) == []


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[1, 2]",
        b'{"no": "type"}',
        json.dumps({"type": "event_callback", "event_id": "Ev1"}).encode(),
        json.dumps({"type": "event_callback", "event": {"type": "message"}}).encode(),
        event({"type": "message", "text": "no channel"}),
    ],
)
def test_a_malformed_body_is_refused(body: bytes) -> None:
    with pytest.raises(MalformedWebhook):
        hook().parse(request(body))


def test_from_env_reads_the_signing_secret() -> None:
    assert isinstance(SlackWebhook.from_env({"SLACK_SIGNING_SECRET": "s3"}), SlackWebhook)
    with pytest.raises(ConfigError) as caught:
        SlackWebhook.from_env({})
    assert caught.value.field == "SLACK_SIGNING_SECRET"
    assert "Signing Secret" in str(caught.value)

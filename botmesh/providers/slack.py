"""Slack's Events API webhook (``SlackWebhook``); there is no Slack sending adapter.

- **verify**: ``x-slack-signature`` must be ``v0=`` + the hex HMAC-SHA256, under the app's
  *signing secret*, of ``v0:{x-slack-request-timestamp}:{raw body}``; a timestamp more than
  5 minutes from now (either way) is refused too, so a recorded request cannot be replayed.
- **handshake**: ``url_verification`` (signed, so asked after ``verify``) → its ``challenge``.
- **parse**: an ``event_callback`` carrying a ``message`` event without ``subtype`` and not
  from a bot → one ``Inbound`` (``id`` = ``event_id``, ``chat_id`` = the Slack channel id,
  ``sender`` = the user id, ``text``, ``ts``; ``data`` holds ``team_id`` and, in a thread,
  ``thread_ts``); any other event → no record. Slack retries a delivery it got no 2xx for
  (header ``x-slack-retry-num``) with the same ``event_id``, so the gateway's dedupe and the
  worker's inbox recognise it.

Settings (``from_env``): ``SLACK_SIGNING_SECRET`` (Slack app settings → Basic Information →
App Credentials → Signing Secret).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from botmesh.providers.webhooks import (
    BadSignature,
    MalformedWebhook,
    SignedWebhook,
    WebhookReply,
    WebhookRequest,
    hmac_hex,
    same,
)
from botmesh.state.messages import Inbound

__all__ = ["MAX_AGE_S", "SlackWebhook"]

#: How old (or how far ahead) a request's timestamp may be, in seconds.
MAX_AGE_S = 300.0


class SlackWebhook(SignedWebhook):
    """Slack Events API requests: signature, ``url_verification``, ``message`` events."""

    channel = "slack"
    SECRET_ENV = "SLACK_SIGNING_SECRET"
    SECRET_HINT = (
        "set it to the Slack app's Signing Secret (app settings → Basic Information → App "
        "Credentials)"
    )
    SECRET_NAME = "signing_secret"

    def __init__(
        self,
        signing_secret: str,
        *,
        max_age: float = MAX_AGE_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(signing_secret, clock=clock)
        self._max_age = max_age

    # -- ChannelWebhook -------------------------------------------------------------------

    def handshake(self, request: WebhookRequest) -> WebhookReply | None:
        if request.method != "POST":
            return None
        body = _json_or_none(request.body)
        if isinstance(body, dict) and body.get("type") == "url_verification":
            challenge = body.get("challenge")
            if not isinstance(challenge, str) or not challenge:
                raise MalformedWebhook("slack: url_verification without a challenge")
            return WebhookReply(200, challenge.encode(), "text/plain")
        return None

    def verify(self, request: WebhookRequest) -> None:
        signature = request.headers.get("x-slack-signature", "")
        stamp = request.headers.get("x-slack-request-timestamp", "")
        if not signature or not stamp:
            raise BadSignature(
                "slack: x-slack-signature or x-slack-request-timestamp header missing"
            )
        try:
            when = int(stamp)
        except ValueError:
            raise BadSignature("slack: x-slack-request-timestamp is not a number") from None
        age = self._clock() - when
        if abs(age) > self._max_age:
            raise BadSignature(
                f"slack: request timestamp is {age:.0f} s from now (more than "
                f"{self._max_age:.0f} s): a replay, or this host's clock is wrong"
            )
        expected = "v0=" + hmac_hex(self._secret, f"v0:{stamp}:".encode() + request.body)
        if not same(signature, expected):
            raise BadSignature("slack: signature does not match (check SLACK_SIGNING_SECRET)")

    def parse(self, request: WebhookRequest) -> list[Inbound]:
        body = _json_or_none(request.body)
        if not isinstance(body, dict) or not isinstance(body.get("type"), str):
            raise MalformedWebhook("slack: the body is not an Events API JSON object with a type")
        if body["type"] != "event_callback":
            return []
        event = body.get("event")
        event_id = body.get("event_id")
        if not isinstance(event, dict) or not isinstance(event_id, str) or not event_id:
            raise MalformedWebhook("slack: event_callback without an event or an event_id")
        if event.get("type") != "message" or "subtype" in event or event.get("bot_id"):
            return []
        channel, user = event.get("channel"), event.get("user")
        if not isinstance(channel, str) or not channel or not isinstance(user, str):
            raise MalformedWebhook("slack: message event without a channel or a user")
        text = event.get("text")
        data: dict[str, Any] = {}
        if isinstance(body.get("team_id"), str):
            data["team_id"] = body["team_id"]
        if isinstance(event.get("thread_ts"), str):
            data["thread_ts"] = event["thread_ts"]
        return [
            Inbound(
                id=event_id,
                chat_id=channel,
                channel=self.channel,
                sender=user,
                text=text if isinstance(text, str) else None,
                ts=_ts(event.get("ts"), body.get("event_time")),
                data=data,
            )
        ]

    def reply(self, request: WebhookRequest, produced: list[Inbound]) -> WebhookReply:
        return WebhookReply(200)


def _json_or_none(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return None


def _ts(message_ts: Any, event_time: Any) -> float | None:
    for value in (message_ts, event_time):
        try:
            return float(value)
        except (TypeError, ValueError):
            continue
    return None

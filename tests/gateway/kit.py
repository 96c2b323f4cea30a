"""Helpers of the gateway tests: Slack signing, a small test channel (``ProbeWebhook``, with
a GET handshake like Meta's), a gateway served on 127.0.0.1, and reading a topic back."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Message

from botmesh._gateway import Gateway, GatewayConfig, serving
from botmesh.providers.slack import SlackWebhook
from botmesh.providers.webhooks import (
    BadSignature,
    ChannelWebhook,
    MalformedWebhook,
    WebhookReply,
    WebhookRequest,
    hmac_hex,
)
from botmesh.state.messages import Inbound
from botmesh.streams.clients import read_to_end, reader, watermarks
from botmesh.streams.connection import Brokers
from botmesh.streams.provision import existing_topics

SLACK_SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
PROBE_SECRET = "probe-secret-5f1c2e"
PROBE_TOKEN = "probe-verify-token"
CONNECT_S = 60.0


def slack_headers(
    body: bytes, *, secret: str = SLACK_SECRET, at: float | None = None, retry: int | None = None
) -> dict[str, str]:
    """The headers Slack sends with ``body``, signed with ``secret`` at ``at``."""
    stamp = str(int(time.time() if at is None else at))
    headers = {
        "Content-Type": "application/json",
        "X-Slack-Request-Timestamp": stamp,
        "X-Slack-Signature": "v0=" + hmac_hex(secret, f"v0:{stamp}:".encode() + body),
    }
    if retry is not None:
        headers["X-Slack-Retry-Num"] = str(retry)
        headers["X-Slack-Retry-Reason"] = "http_timeout"
    return headers


def slack_message(
    event_id: str = "Ev0PV52K25", channel: str = "C2147483705", text: str = "hello"
) -> bytes:
    """An ``event_callback`` with a user's ``message``, as Slack documents it."""
    return json.dumps(
        {
            "token": "XXYYZZ",
            "team_id": "T123ABC456",
            "api_app_id": "A123ABC456",
            "event": {
                "type": "message",
                "channel": channel,
                "user": "U2147483697",
                "text": text,
                "ts": "1355517523.000005",
                "event_ts": "1355517523.000005",
                "channel_type": "channel",
            },
            "type": "event_callback",
            "event_id": event_id,
            "event_time": 1355517523,
        }
    ).encode()


@dataclass
class ProbeWebhook:
    """A test channel: a Meta-like unsigned GET handshake (``hub.*``), a hex HMAC of the body
    in ``x-probe-signature``, and a JSON body ``{"messages": [{"id", "chat", "text"}]}``
    (``"boom"`` anywhere in the body makes ``parse`` raise a ``KeyError``). It keeps the
    requests it saw."""

    channel: str = "probe"
    secret: str = PROBE_SECRET
    verify_token: str = PROBE_TOKEN
    seen: list[WebhookRequest] = field(default_factory=list)

    def handshake(self, request: WebhookRequest) -> WebhookReply | None:
        if request.method != "GET" or request.query.get("hub.mode") != "subscribe":
            return None
        if request.query.get("hub.verify_token") != self.verify_token:
            return WebhookReply(403, b"wrong verify token")
        return WebhookReply(200, request.query.get("hub.challenge", "").encode())

    def verify(self, request: WebhookRequest) -> None:
        self.seen.append(request)
        if request.headers.get("x-probe-signature") != hmac_hex(self.secret, request.body):
            raise BadSignature("probe: signature does not match")

    def parse(self, request: WebhookRequest) -> list[Inbound]:
        if b"boom" in request.body:
            raise KeyError("boom")
        if request.form:
            return [Inbound(id=request.form["Sid"], chat_id=request.form["From"], text="form")]
        try:
            body = json.loads(request.body)
            return [
                Inbound(id=m["id"], chat_id=m["chat"], text=m.get("text")) for m in body["messages"]
            ]
        except (ValueError, KeyError, TypeError) as exc:
            raise MalformedWebhook(f"probe: not a probe body ({exc!r})") from None

    def reply(self, request: WebhookRequest, produced: list[Inbound]) -> WebhookReply:
        return WebhookReply(200, json.dumps({"ok": len(produced)}).encode(), "application/json")


def probe_body(*messages: tuple[str, str]) -> bytes:
    return json.dumps(
        {"messages": [{"id": i, "chat": c, "text": f"t-{i}"} for i, c in messages]}
    ).encode()


def probe_headers(body: bytes, secret: str = PROBE_SECRET) -> dict[str, str]:
    return {"Content-Type": "application/json", "X-Probe-Signature": hmac_hex(secret, body)}


def webhooks() -> dict[str, ChannelWebhook]:
    return {"slack": SlackWebhook(SLACK_SECRET), "probe": ProbeWebhook()}


@asynccontextmanager
async def gateway_at(
    bootstrap: Brokers,
    prefix: str,
    hooks: Mapping[str, ChannelWebhook] | None = None,
    *,
    connect: bool = True,
    **options: Any,
) -> AsyncIterator[tuple[Gateway, str]]:
    """A gateway on 127.0.0.1 (a free port): yields it and its base URL; with ``connect``,
    once it is connected to Kafka (the seen topic loaded)."""
    gateway = Gateway(
        webhooks() if hooks is None else hooks,
        GatewayConfig(bootstrap=bootstrap, prefix=prefix, **options),
    )
    async with serving(gateway, "127.0.0.1", 0) as url:
        if connect:
            async with asyncio.timeout(CONNECT_S):
                await gateway.wait_connected()
        yield gateway, url


@dataclass(frozen=True)
class Record:
    """A record read back: where it is, its key and value."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes


async def read_topic(bootstrap: Brokers, topic: str) -> list[Record]:
    """Every record of ``topic`` now (all partitions, from the start to the end offsets)."""
    partitions = (await asyncio.to_thread(existing_topics, bootstrap))[topic]
    return await asyncio.to_thread(_read_topic, bootstrap, topic, partitions)


def _read_topic(bootstrap: Brokers, topic: str, partitions: int) -> list[Record]:
    out: list[Record] = []

    def take(m: Message) -> None:
        out.append(Record(m.partition() or 0, m.offset() or 0, m.key(), m.value() or b""))

    consumer = reader(bootstrap, "botmesh-tests")
    try:
        read_to_end(consumer, watermarks(consumer, [(topic, p) for p in range(partitions)]), take)
    finally:
        consumer.close()
    return out

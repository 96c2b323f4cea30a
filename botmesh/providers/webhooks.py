"""What the webhook gateway asks of a channel: answer its verification handshake, check a
request's signature, turn the body into our inbound records.

Each channel module has a ``Webhook`` class implementing ``ChannelWebhook``; the gateway
(``botmesh gateway``) holds the HTTP server and Kafka, and knows nothing channel-specific.
Nothing here touches the network or Kafka: every method is a pure function of the request,
so each channel's parsing and verification is unit-tested on recorded bodies.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, Self, runtime_checkable

from botmesh.state.errors import ConfigError, ProviderError
from botmesh.state.messages import DeliveryStatus, Inbound

__all__ = [
    "BadSignature",
    "ChannelWebhook",
    "MalformedWebhook",
    "SignedWebhook",
    "StatusWebhook",
    "WebhookReply",
    "WebhookRequest",
    "hmac_hex",
    "same",
]


class BadSignature(ProviderError):
    """The request's signature is missing or wrong: answered 401, counted, never produced."""


class MalformedWebhook(ProviderError):
    """The body is not the channel's webhook: answered 400, never produced."""


@dataclass(frozen=True, slots=True)
class WebhookRequest:
    """A webhook as it arrived. ``headers`` keys are lower-case. ``url`` is the public URL
    the channel called (the gateway's ``--public-url`` + path), which some signatures
    cover (Twilio)."""

    method: str
    path: str
    url: str
    headers: Mapping[str, str]
    query: Mapping[str, str]
    body: bytes
    #: The body's form fields, for ``application/x-www-form-urlencoded`` (Twilio).
    form: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class WebhookReply:
    """What the gateway answers."""

    status: int = 200
    body: bytes = b""
    content_type: str = "text/plain"


@runtime_checkable
class ChannelWebhook(Protocol):
    """One channel's webhook rules."""

    #: The channel name (``telegram``, ``whatsapp``…); the gateway's path is ``/<channel>``.
    channel: str

    def handshake(self, request: WebhookRequest) -> WebhookReply | None:
        """The answer to a verification request (Meta's ``hub.challenge`` GET, Slack's
        ``url_verification``, Discord's PING), or ``None`` when this is not one.
        Called after ``verify`` for signed handshakes, before it for unsigned GETs."""
        ...

    def verify(self, request: WebhookRequest) -> None:
        """Raise ``BadSignature`` unless the request is signed by the channel."""
        ...

    def parse(self, request: WebhookRequest) -> list[Inbound]:
        """The inbound records in the body (often one; none for a status callback).
        Each has ``id`` (the channel's event id: a retried webhook has the same one),
        ``chat_id``, ``channel`` and media references. Raise ``MalformedWebhook`` when the
        body is not the channel's."""
        ...

    def reply(self, request: WebhookRequest, produced: list[Inbound]) -> WebhookReply:
        """The answer once every record was acked by the broker (usually a bare 200)."""
        ...


@runtime_checkable
class StatusWebhook(Protocol):
    """A channel that posts status webhooks about the messages it accepted (sent,
    delivered, read, failed). The gateway calls ``statuses`` on every verified request,
    beside ``parse``, and produces what it returns to ``<prefix>.statuses``."""

    def statuses(self, request: WebhookRequest) -> list[DeliveryStatus]:
        """The delivery statuses in the body (none for a body that carries only
        messages). Each has the chat (the recipient of our message), the channel's
        message id as its send API returned it, the status and, on ``failed``, the
        channel's error code and title. Raise ``MalformedWebhook`` on a body that is not
        the channel's."""
        ...


def hmac_hex(secret: str | bytes, body: bytes, digest: Any = hashlib.sha256) -> str:
    """The hex HMAC of ``body`` under ``secret``."""
    key = secret.encode() if isinstance(secret, str) else secret
    return hmac.new(key, body, digest).hexdigest()


def same(a: str | bytes, b: str | bytes) -> bool:
    """Constant-time comparison."""
    x = a.encode() if isinstance(a, str) else a
    y = b.encode() if isinstance(b, str) else b
    return hmac.compare_digest(x, y)


class SignedWebhook:
    """What the webhooks checked with a secret of the channel share (Slack, Twilio, TikTok,
    Gupshup, email): the secret, held and never shown (``repr`` masks it), read from
    ``SECRET_ENV`` by ``from_env`` (``SECRET_HINT`` says where it comes from), at least
    ``MIN_SECRET`` characters; a clock for the signatures that carry a time; no handshake.
    A subclass sets ``channel`` and those, and writes ``verify`` and ``parse``."""

    channel: str
    #: The environment variable ``from_env`` reads the secret from.
    SECRET_ENV: ClassVar[str]
    #: What to set it to, said when it is missing.
    SECRET_HINT: ClassVar[str]
    #: The secret's name in ``repr`` and in a ``ConfigError`` of the constructor.
    SECRET_NAME: ClassVar[str] = "secret"
    #: Fewer characters are refused.
    MIN_SECRET: ClassVar[int] = 1

    def __init__(self, secret: str, *, clock: Callable[[], float] = time.time) -> None:
        if len(secret or "") < self.MIN_SECRET:
            raise ConfigError(
                f"{self.channel}.{self.SECRET_NAME}",
                f"{self._too_short()}; check {self.SECRET_ENV}",
            )
        self._secret = secret
        self._clock = clock

    @classmethod
    def _too_short(cls) -> str:
        return "is empty" if cls.MIN_SECRET <= 1 else f"is shorter than {cls.MIN_SECRET} characters"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.SECRET_NAME}=***)"

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Self:
        secret = env.get(cls.SECRET_ENV, "").strip()
        if not secret:
            raise ConfigError(cls.SECRET_ENV, f"is not set; {cls.SECRET_HINT}")
        if len(secret) < cls.MIN_SECRET:
            raise ConfigError(cls.SECRET_ENV, f"{cls._too_short()}; {cls.SECRET_HINT}")
        return cls(secret)

    def handshake(self, request: WebhookRequest) -> WebhookReply | None:
        return None

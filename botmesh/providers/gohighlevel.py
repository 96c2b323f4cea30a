"""GoHighLevel (HighLevel's LeadConnector conversations API): ``GoHighLevelProvider`` sends
through ``POST /conversations/messages``, ``GoHighLevelWebhook`` verifies and parses
HighLevel's ``InboundMessage`` webhooks.

Sending: JSON ``{"type", "contactId", "message", "attachments"}`` with a location's token
(a Private Integration token or an OAuth location access token) in ``Authorization:
Bearer`` and ``Version: 2021-04-15``. The chat id is the HighLevel contact id: HighLevel
delivers on the contact's channel of ``type`` (``SMS`` by default, ``WhatsApp``, ``FB``,
``IG``, ``GMB``, ``Live_Chat``, ``Custom``; ``options["type"]`` picks another for one send,
e.g. the ``message_type`` of the inbound being answered). Media goes as an attachment URL
(HighLevel fetches it); bytes and paths cannot be sent. HighLevel answers ``{"conversationId",
"messageId", "msg"}``; ``messageId`` is the ``SendResult``. Email (``type: "Email"``, which
needs a subject and HTML) is not sent through this adapter.

Text limits follow the type: SMS 1600 characters (the carrier's concatenation limit), WhatsApp
4096, Messenger 2000, Instagram 1000; other types have none here (HighLevel's own checks
apply).

Errors (``{"statusCode", "message", "error"}``; ``message`` may be a list of validation
messages):

=========================================  ==================================================
HTTP 429                                   ``RateLimitedError``; ``retry_after`` from
                                           ``Retry-After``, else ``rate_limit_wait`` (10 s:
                                           HighLevel's burst limit is 100 calls per 10 s)
HTTP 401, 403                              final ``SendError`` naming ``GOHIGHLEVEL_TOKEN``
                                           (a wrong or expired token, a missing scope, another
                                           location)
HTTP 404, or a 400 naming the contact      ``RecipientUnreachableError``
("contact not found", DND, no phone)
HTTP 413                                   ``PayloadTooLargeError``
HTTP 408, 425, 5xx, transport errors       retryable ``SendError``
any other 4xx (400, 422 validation)        final ``SendError``
=========================================  ==================================================

HighLevel takes no idempotency key and has no lookup of a message by its content, so this
adapter has neither ``send_keyed`` nor ``resolve_ambiguous``.

Inbound media is the attachment URL HighLevel gives (its storage, or the channel's CDN); the
journal keeps it without credential parameters (any public http(s) host,
``botmesh.providers.media_refs``). HighLevel's attachment URLs are public: downloads carry no
credential.

Webhooks: HighLevel signs every webhook with Ed25519 over the raw body, base64 in
``X-GHL-Signature``; the key is HighLevel's published webhook public key, which the operator
sets in ``GOHIGHLEVEL_WEBHOOK_PUBLIC_KEY`` (PEM). Only ``InboundMessage`` events with
``direction: "inbound"`` become records; ``OutboundMessage`` (the bot's own messages and the
team's), status and contact events give none.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import mimetypes
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Self, Unpack
from urllib.parse import urlsplit

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import load_pem_public_key

from botmesh.providers.http import HttpAnswer, status_error
from botmesh.providers.meta import env_value
from botmesh.providers.rest import RestChannel, RestOptions
from botmesh.providers.webhooks import (
    BadSignature,
    MalformedWebhook,
    WebhookReply,
    WebhookRequest,
)
from botmesh.state.errors import (
    ConfigError,
    PayloadTooLargeError,
    RecipientUnreachableError,
    SendError,
    UnsupportedContentError,
)
from botmesh.state.messages import Inbound, Media, Outbound, SendResult

__all__ = ["GoHighLevelProvider", "GoHighLevelWebhook"]

log = logging.getLogger("botmesh.providers.gohighlevel")

API_URL = "https://services.leadconnectorhq.com"
API_VERSION = "2021-04-15"
#: Text limits by message type (characters); a type not here has none.
TEXT_LIMITS: Mapping[str, int] = {"SMS": 1600, "WhatsApp": 4096, "FB": 2000, "IG": 1000}
TYPES = ("SMS", "WhatsApp", "FB", "IG", "GMB", "Live_Chat", "Custom")
_UNREACHABLE = ("contact not found", "dnd", "do not disturb", "no phone", "missing phone")


def _message_type(value: str, field: str) -> str:
    found = next((t for t in TYPES if t.lower() == value.strip().lower()), None)
    if found is None:
        raise ConfigError(
            field,
            f"{value!r} is not a message type this adapter sends ({', '.join(TYPES)}); email "
            "is not sent through it",
        )
    return found


def _mapped(answer: HttpAnswer, what: str, detail: str) -> SendError:
    """HighLevel's own answers (after the rate limit and the token): an unreachable contact,
    too large, else by status."""
    low = detail.lower()
    if answer.status == 404 or (answer.status == 400 and any(s in low for s in _UNREACHABLE)):
        return RecipientUnreachableError(f"{what}; check the contact id, or stop writing to it")
    if answer.status == 413:
        return PayloadTooLargeError(what)
    return status_error("gohighlevel", answer, detail)


class GoHighLevelProvider(RestChannel):
    """Sends as one HighLevel location with its token; ``message_type`` is the default
    ``type`` of a send."""

    name = "gohighlevel"
    media_channel = "gohighlevel"
    text_limit: int | None = TEXT_LIMITS["SMS"]
    default_url = API_URL
    credential_fix = (
        "set GOHIGHLEVEL_TOKEN to a token of this location with the "
        "conversations/message.write scope"
    )
    #: HighLevel's burst limit is 100 calls per 10 s.
    default_rate_limit_wait = 10.0

    def __init__(
        self, token: str, *, message_type: str = "SMS", **options: Unpack[RestOptions]
    ) -> None:
        super().__init__(token, **options)
        self.message_type = _message_type(message_type, "gohighlevel.message_type")
        self.text_limit = TEXT_LIMITS.get(self.message_type)

    def __repr__(self) -> str:
        return f"GoHighLevelProvider(message_type={self.message_type!r})"

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Self:
        """``GOHIGHLEVEL_TOKEN``; optional ``GOHIGHLEVEL_MESSAGE_TYPE`` (``SMS``),
        ``GOHIGHLEVEL_API_URL``, ``GOHIGHLEVEL_MEDIA_REF_HOSTS`` and (with a local API URL)
        ``GOHIGHLEVEL_ALLOW_PRIVATE_MEDIA=1``."""
        token = env_value(
            env,
            "GOHIGHLEVEL_TOKEN",
            "set it to the location's Private Integration token (Settings > Private "
            "Integrations, scope conversations/message.write)",
        )
        kind = env.get("GOHIGHLEVEL_MESSAGE_TYPE", "").strip() or "SMS"
        kind = _message_type(kind, "GOHIGHLEVEL_MESSAGE_TYPE")
        base, media = cls.api_env(env, "GOHIGHLEVEL", API_URL)
        return cls(token, message_type=kind, base_url=base, **media)

    # -- sending --------------------------------------------------------------------------

    def _body(self, message: Outbound) -> dict[str, Any]:
        kind = message.options.get("type")
        kind = self.message_type if kind is None else _message_type(str(kind), "options.type")
        body: dict[str, Any] = {"type": kind, "contactId": message.chat_id}
        text = message.text or ""
        limit = TEXT_LIMITS.get(kind)
        if limit is not None and len(text) > limit:
            raise PayloadTooLargeError(
                f"gohighlevel: a {kind} text is at most {limit} characters, this one has "
                f"{len(text)}"
            )
        if text:
            body["message"] = text
        media = message.media
        if media is not None:
            if media.url is None or urlsplit(media.url).scheme not in ("http", "https"):
                raise UnsupportedContentError(
                    "gohighlevel: media must be a public http(s) URL (HighLevel fetches it); "
                    "bytes, paths and channel ids cannot be sent: host the file and pass its URL"
                )
            body["attachments"] = [media.url]
        if not text and media is None:
            raise UnsupportedContentError("gohighlevel: the message has neither text nor media")
        return body

    async def send(self, message: Outbound) -> SendResult:
        answer = await self.request(
            "POST",
            f"{self.base_url}/conversations/messages",
            json_body=self._body(message),
            headers={
                "Authorization": f"Bearer {self._credential}",
                "Version": API_VERSION,
                "Accept": "application/json",
            },
        )
        body = answer.json()
        if not answer.ok:
            raise self._error(answer, body)
        mid = body.get("messageId") if isinstance(body, dict) else None
        if not isinstance(mid, str) or not mid:
            # Accepted but unreadable: sending again could duplicate it, so it is final.
            raise SendError(
                f"gohighlevel: HTTP {answer.status} without a messageId; check GOHIGHLEVEL_API_URL",
                retryable=False,
            )
        log.debug("gohighlevel: sent %s to %s", mid, message.chat_id)
        return SendResult(mid)

    def _error(self, answer: HttpAnswer, body: Any) -> SendError:
        """The error for a failed answer, by the table in this module's docstring."""
        detail = self.said(answer, body)
        what = f"gohighlevel: HTTP {answer.status}: {detail}"
        err = self.common_error(answer, what, detail) or _mapped(answer, what, detail)
        log.warning("%s", err)
        return err


# -- webhooks ---------------------------------------------------------------------------------


def _public_key(pem: str, field: str) -> Ed25519PublicKey:
    text = pem.strip().replace("\\n", "\n")  # a PEM pasted into one environment line
    try:
        key = load_pem_public_key(text.encode())
    except (ValueError, TypeError):
        key = None
    if not isinstance(key, Ed25519PublicKey):
        raise ConfigError(
            field,
            "not an Ed25519 public key in PEM (-----BEGIN PUBLIC KEY-----…); copy HighLevel's "
            "webhook public key from its webhook documentation",
        )
    return key


def _ts(value: Any) -> float | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


class GoHighLevelWebhook:
    """HighLevel's webhooks, verified with its Ed25519 public key (``X-GHL-Signature``).

    ``parse`` gives one ``Inbound`` per ``InboundMessage``: ``id`` = ``messageId`` (the same
    on a retried webhook), ``chat_id`` = ``contactId`` (what ``send`` takes), ``text`` =
    ``body``, the first attachment as ``media`` (``Media(provider="gohighlevel", url, mime)``,
    the mime guessed from the URL), further ones in ``data["more_media"]``. ``data`` has
    ``message_type`` (pass it as ``options={"type": ...}`` to answer on the same channel),
    ``conversation_id`` and ``location_id``.
    """

    channel = "gohighlevel"

    def __init__(self, public_key_pem: str) -> None:
        self._key = _public_key(public_key_pem, "gohighlevel.public_key")

    def __repr__(self) -> str:
        return "GoHighLevelWebhook()"

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Self:
        """``GOHIGHLEVEL_WEBHOOK_PUBLIC_KEY``: HighLevel's webhook public key (PEM)."""
        pem = env_value(
            env,
            "GOHIGHLEVEL_WEBHOOK_PUBLIC_KEY",
            "set it to HighLevel's webhook public key (PEM, from HighLevel's webhook "
            "documentation)",
        )
        _public_key(pem, "GOHIGHLEVEL_WEBHOOK_PUBLIC_KEY")
        return cls(pem)

    def handshake(self, request: WebhookRequest) -> WebhookReply | None:
        return None

    def verify(self, request: WebhookRequest) -> None:
        given = request.headers.get("x-ghl-signature", "")
        if not given:
            raise BadSignature("gohighlevel: no X-GHL-Signature header")
        try:
            self._key.verify(base64.b64decode(given, validate=True), request.body)
        except (ValueError, binascii.Error, InvalidSignature):
            raise BadSignature(
                "gohighlevel: X-GHL-Signature does not match the body; check "
                "GOHIGHLEVEL_WEBHOOK_PUBLIC_KEY"
            ) from None

    def parse(self, request: WebhookRequest) -> list[Inbound]:
        try:
            event = json.loads(request.body)
        except ValueError:
            raise MalformedWebhook("gohighlevel: the body is not JSON") from None
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            raise MalformedWebhook("gohighlevel: not a HighLevel webhook (no type)")
        if event["type"] != "InboundMessage" or event.get("direction", "inbound") != "inbound":
            return []  # OutboundMessage (ours, the team's), statuses, contact events
        mid, contact = event.get("messageId"), event.get("contactId")
        if not isinstance(mid, str) or not mid or not isinstance(contact, str) or not contact:
            raise MalformedWebhook("gohighlevel: an InboundMessage without messageId or contactId")
        urls = [u for u in event.get("attachments") or () if isinstance(u, str) and u]
        media = [
            Media(provider="gohighlevel", url=u, mime=mimetypes.guess_type(urlsplit(u).path)[0])
            for u in urls
        ]
        data: dict[str, Any] = {
            "message_type": event.get("messageType"),
            "conversation_id": event.get("conversationId"),
            "location_id": event.get("locationId"),
        }
        if len(media) > 1:
            data["more_media"] = [{"url": m.url, "mime": m.mime} for m in media[1:]]
        body = event.get("body")
        return [
            Inbound(
                id=mid,
                chat_id=contact,
                sender=contact,
                channel=self.channel,
                ts=_ts(event.get("dateAdded")),
                text=body if isinstance(body, str) and body else None,
                media=media[0] if media else None,
                data=data,
            )
        ]

    def reply(self, request: WebhookRequest, produced: list[Inbound]) -> WebhookReply:
        return WebhookReply(200, b"")

"""Gupshup (WhatsApp through Gupshup's API): ``GupshupProvider`` sends through
``POST /wa/api/v1/msg``, ``GupshupWebhook`` takes the inbound-message callbacks of a Gupshup
app (the "Gupshup format", version 2).

Sending: a form (``application/x-www-form-urlencoded``) with ``channel=whatsapp``,
``source`` (the app's registered number), ``src.name`` (the app's name), ``destination``
(the chat id: the user's number with its country code, no ``+``) and ``message``, a JSON
object: ``{"type": "text", "text": ...}``, or for a media URL (Gupshup fetches it)
``image`` (``originalUrl``, ``previewUrl``, ``caption``), ``video`` / ``file`` (``url``,
``caption``; ``filename``), ``audio`` (``url``; no caption), ``sticker`` (``url``). The API
key goes in the ``apikey`` header. Gupshup answers ``202 {"status": "submitted",
"messageId": ...}``; that id is the ``SendResult``. Delivery is asynchronous: a message
WhatsApp refuses later (outside the 24-hour window, a number not on WhatsApp) arrives as a
``message-event`` of type ``failed`` on the webhook, not as an error of the send.
``options``: ``media_type`` (``image|video|audio|file|sticker``, else guessed from the mime
type), ``disable_preview`` (bool, sent as ``disablePreview``).

A text is at most 4096 characters (WhatsApp's limit), a caption 1024: longer ones are
refused with ``PayloadTooLargeError`` before any call (the engine splits long texts by
``text_limit`` first). Bytes and paths cannot be sent: Gupshup takes media by URL only.

Errors (``{"status": "error", "message": ...}``):

===========================================  ================================================
HTTP 429                                     ``RateLimitedError``; ``retry_after`` from
                                             ``Retry-After``, else ``rate_limit_wait`` (1 s)
HTTP 401 / 403                               final ``SendError`` naming ``GUPSHUP_API_KEY``
HTTP 400 "Invalid Destination", "not opted   ``RecipientUnreachableError``
in", "not a valid whatsapp user"
HTTP 413, 400 "too long"                     ``PayloadTooLargeError``
HTTP 408, 425, 5xx, transport errors         retryable ``SendError``
any other 4xx                                final ``SendError``
===========================================  ================================================

Gupshup takes no idempotency key and has no lookup of sent messages by content, so this
adapter has neither ``send_keyed`` nor ``resolve_ambiguous``: a send lost in a crash follows
``outbox.on_ambiguous``.

Inbound media is a URL on Gupshup's file manager (``filemanager.gupshup.io``); the journal
keeps the URL without credential parameters (``botmesh.providers.media_refs``: any public
http(s) host). Downloads carry the ``apikey`` header only to ``gupshup.io`` hosts and the API
origin, never elsewhere.

Webhooks: Gupshup does not sign its callbacks. The gateway therefore checks a secret the
operator puts in the callback URL (``https://hooks.example.com/gupshup?token=<secret>``,
``GUPSHUP_WEBHOOK_SECRET``), compared in constant time. Only ``type: "message"`` events
become records; ``message-event`` (delivery statuses, the bot's own messages), ``user-event``,
``template-event``, ``billing-event`` and ``account-event`` give none.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any, Self, Unpack
from urllib.parse import urlsplit

from botmesh.providers.http import HttpAnswer, status_error
from botmesh.providers.media_kinds import chosen_kind
from botmesh.providers.meta import env_value
from botmesh.providers.rest import RestChannel, RestOptions
from botmesh.providers.webhooks import (
    BadSignature,
    MalformedWebhook,
    SignedWebhook,
    WebhookReply,
    WebhookRequest,
    same,
)
from botmesh.state.errors import (
    ConfigError,
    PayloadTooLargeError,
    ProviderError,
    RecipientUnreachableError,
    SendError,
    UnsupportedContentError,
)
from botmesh.state.messages import (
    DELIVERY_STATES,
    DeliveryState,
    DeliveryStatus,
    Inbound,
    Media,
    Outbound,
    SendResult,
)

__all__ = ["GupshupProvider", "GupshupWebhook"]

log = logging.getLogger("botmesh.providers.gupshup")

API_URL = "https://api.gupshup.io"
SEND_PATH = "/wa/api/v1/msg"
TEXT_LIMIT = 4096
CAPTION_LIMIT = 1024
#: Hosts the API key may be sent to for a media download (besides the API origin).
KEY_HOSTS = ("gupshup.io",)

_MEDIA_TYPES = ("image", "video", "audio", "file", "sticker")
_CAPTIONED = frozenset({"image", "video", "file"})
_UNREACHABLE = ("invalid destination", "not opted in", "not a valid whatsapp user")
_TOO_LARGE = ("too long", "exceeds")
#: Inbound message types whose ``payload`` carries a media URL.
_INBOUND_MEDIA = frozenset({"image", "video", "audio", "file", "sticker"})
_INTERACTIONS = frozenset({"button_reply", "list_reply", "quick_reply"})


def _mapped(answer: HttpAnswer, what: str, detail: str) -> SendError:
    """Gupshup's own answers (after the rate limit and the key): too large, unreachable,
    else by status."""
    low = detail.lower()
    if answer.status == 413 or (answer.status == 400 and any(s in low for s in _TOO_LARGE)):
        return PayloadTooLargeError(what)
    if answer.status == 400 and any(s in low for s in _UNREACHABLE):
        return RecipientUnreachableError(f"{what}; check the number, or stop writing to it")
    return status_error("gupshup", answer, detail)


class GupshupProvider(RestChannel):
    """Sends as one Gupshup WhatsApp app: its API key, registered number (``source``) and
    app name (``app_name``, the form's ``src.name``)."""

    name = "gupshup"
    #: It posts status webhooks (``botmesh.state.statuses``): its sends are named under
    #: their message ids when recorded sent.
    delivery_statuses = True
    media_channel = "gupshup"
    text_limit: int | None = TEXT_LIMIT
    default_url = API_URL
    credential_fix = "set GUPSHUP_API_KEY to the key of the account that owns the app"
    credential_hosts = KEY_HOSTS

    def __init__(
        self, api_key: str, source: str, app_name: str, **options: Unpack[RestOptions]
    ) -> None:
        for field, value in (("source", source), ("app_name", app_name)):
            if not value:
                raise ConfigError(f"gupshup.{field}", "is empty; copy it from the Gupshup app")
        if not source.isdigit():
            raise ConfigError(
                "gupshup.source",
                f"{source!r} is not a number with its country code and no '+' (917834811114)",
            )
        super().__init__(api_key, **options)
        self.source = source
        self.app_name = app_name

    def __repr__(self) -> str:
        return f"GupshupProvider(source={self.source!r}, app_name={self.app_name!r})"

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Self:
        """``GUPSHUP_API_KEY``, ``GUPSHUP_SOURCE``, ``GUPSHUP_APP_NAME``; optional
        ``GUPSHUP_API_URL``, ``GUPSHUP_MEDIA_REF_HOSTS`` and (with a local API URL)
        ``GUPSHUP_ALLOW_PRIVATE_MEDIA=1``."""
        key = env_value(env, "GUPSHUP_API_KEY", "copy the API key from your Gupshup account")
        source = env_value(
            env, "GUPSHUP_SOURCE", "set it to the app's registered number (917834811114)"
        )
        app = env_value(env, "GUPSHUP_APP_NAME", "set it to the Gupshup app's name")
        base, media = cls.api_env(env, "GUPSHUP", API_URL)
        return cls(key, source, app, base_url=base, **media)

    # -- sending --------------------------------------------------------------------------

    def _message(self, message: Outbound) -> dict[str, Any]:
        """The ``message`` field of the form."""
        text = message.text or ""
        media = message.media
        if media is None:
            if not text:
                raise UnsupportedContentError("gupshup: the message has neither text nor media")
            if len(text) > TEXT_LIMIT:
                raise PayloadTooLargeError(
                    f"gupshup: a text is at most {TEXT_LIMIT} characters, this one has {len(text)}"
                )
            return {"type": "text", "text": text}
        url = media.url
        if url is None or urlsplit(url).scheme not in ("http", "https"):
            raise UnsupportedContentError(
                "gupshup: media must be a public http(s) URL (Gupshup fetches it); bytes, "
                "paths and channel ids cannot be sent: host the file and pass its URL"
            )
        kind = chosen_kind(
            "gupshup",
            media,
            message.options,
            option="media_type",
            kinds=_MEDIA_TYPES,
            other="file",
            sticker="sticker",
        )
        item: dict[str, Any] = {"type": kind}
        if kind == "image":
            item.update(originalUrl=url, previewUrl=url)
        else:
            item["url"] = url
        if kind == "file":
            item["filename"] = media.name or urlsplit(url).path.rsplit("/", 1)[-1] or "file"
        if text:
            if kind not in _CAPTIONED:
                raise UnsupportedContentError(
                    f"gupshup: {kind} messages take no caption; send the text on its own"
                )
            if len(text) > CAPTION_LIMIT:
                raise PayloadTooLargeError(
                    f"gupshup: a caption is at most {CAPTION_LIMIT} characters, this one has "
                    f"{len(text)}: send the media and the text as two sends"
                )
            item["caption"] = text
        return item

    async def send(self, message: Outbound) -> SendResult:
        form = {
            "channel": "whatsapp",
            "source": self.source,
            "destination": message.chat_id.removeprefix("+"),
            "src.name": self.app_name,
            "message": json.dumps(self._message(message), ensure_ascii=False),
        }
        if "disable_preview" in message.options:
            form["disablePreview"] = "true" if message.options["disable_preview"] else "false"
        answer = await self.request(
            "POST",
            self.base_url + SEND_PATH,
            data=form,
            headers={"apikey": self._credential, "Accept": "application/json"},
        )
        body = answer.json()
        if not answer.ok:
            raise self._error(answer, body)
        mid = body.get("messageId") if isinstance(body, dict) else None
        if not isinstance(mid, str) or not mid or body.get("status") != "submitted":
            # Accepted but unreadable: sending again could duplicate it, so it is final.
            raise SendError(
                f"gupshup: HTTP {answer.status} without a submitted messageId; check "
                "GUPSHUP_API_URL",
                retryable=False,
            )
        log.debug("gupshup: submitted %s to %s", mid, message.chat_id)
        return SendResult(mid)

    def _error(self, answer: HttpAnswer, body: Any) -> SendError:
        """The error for a failed answer, by the table in this module's docstring."""
        detail = self.said(answer, body)
        what = f"gupshup: HTTP {answer.status}: {detail}"
        err = self.common_error(answer, what, detail) or _mapped(answer, what, detail)
        log.warning("%s", err)
        return err

    # -- media downloads ------------------------------------------------------------------

    async def media_url(self, media: Media) -> tuple[str, dict[str, str]]:
        """The media's URL; with the ``apikey`` header only for Gupshup's own hosts."""
        if media.url is None:
            raise ProviderError("gupshup: this media has no URL to download")
        headers = {"apikey": self._credential} if self.credentialed(media.url) else {}
        return media.url, headers


# -- webhooks ---------------------------------------------------------------------------------


def _number(value: Any) -> float | None:
    """A positive JSON number (not a bool), else ``None``."""
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return float(value)
    return None


class GupshupWebhook(SignedWebhook):
    """A Gupshup app's callback (JSON, version 2 "Gupshup format"), checked by the shared
    secret in its ``token`` query parameter.

    ``parse`` gives one ``Inbound`` per ``type: "message"`` event: ``id`` = the message id
    (the same on a retried callback), ``chat_id`` = ``sender.phone`` (what ``send`` takes as
    destination), ``text`` = the text, a caption, or a button's title (``kind=
    "interaction"``, the button's id in ``data["payload"]``); media as ``Media(provider=
    "gupshup", url, mime, name)``. ``data`` has ``app``, ``type`` and ``profile_name``.

    ``statuses`` reads ``message-event`` callbacks: ``sent``, ``delivered``, ``read`` and
    ``failed`` give one status (``enqueued`` and ``deleted`` none). ``message_id`` is the
    Gupshup id ``send`` returned (the event's ``gsId``; a ``failed`` event, and any without
    ``gsId``, carries it as ``id``), ``chat_id`` the ``destination`` (the number, as inbound
    ``sender.phone``), ``ts`` the inner ``payload.ts`` (seconds) or else the event's
    ``timestamp``; a ``failed`` one has ``payload.code`` and ``payload.reason``.
    """

    channel = "gupshup"
    #: The ``token`` of the callback URL set in Gupshup.
    SECRET_ENV = "GUPSHUP_WEBHOOK_SECRET"
    SECRET_HINT = (
        "set it to a random secret (openssl rand -hex 16) and put it in the app's callback "
        "URL as ?token=<secret>"
    )
    MIN_SECRET = 16

    def verify(self, request: WebhookRequest) -> None:
        given = request.query.get("token")
        if not given:
            raise BadSignature("gupshup: the callback URL carries no ?token=")
        if not same(given, self._secret):
            raise BadSignature(
                "gupshup: ?token= is wrong; the callback URL must carry GUPSHUP_WEBHOOK_SECRET"
            )

    def parse(self, request: WebhookRequest) -> list[Inbound]:
        event = self._event(request)
        if "object" in event or "entry" in event:
            raise MalformedWebhook(
                "gupshup: this is a Meta-format callback; set the app's callback format to "
                "the Gupshup format (version 2)"
            )
        if event["type"] != "message":
            return []  # statuses of our own messages, user, template, billing events
        payload = event.get("payload")
        if not isinstance(payload, dict):
            raise MalformedWebhook("gupshup: a message event without a payload")
        return [self._message(payload, event)]

    def _event(self, request: WebhookRequest) -> dict[str, Any]:
        """The callback's JSON object, with a ``type`` string."""
        try:
            event = json.loads(request.body)
        except ValueError:
            raise MalformedWebhook("gupshup: the body is not JSON") from None
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            raise MalformedWebhook("gupshup: not a Gupshup event (no type)")
        return event

    def statuses(self, request: WebhookRequest) -> list[DeliveryStatus]:
        event = self._event(request)
        if event["type"] != "message-event":
            return []
        item = event.get("payload")
        if not isinstance(item, dict) or not isinstance(item.get("type"), str):
            raise MalformedWebhook("gupshup: a message-event without a payload type")
        mid, dest = item.get("gsId") or item.get("id"), item.get("destination")
        if not (isinstance(mid, str) and mid and isinstance(dest, str) and dest):
            raise MalformedWebhook("gupshup: a message-event without id or destination")
        state = DELIVERY_STATES.get(item["type"])
        if state is None:
            return []  # enqueued (Gupshup handed it to WhatsApp), deleted
        inner = item.get("payload")
        detail: dict[str, Any] = inner if isinstance(inner, dict) else {}
        stamp, outer = detail.get("ts"), event.get("timestamp")
        ts = _number(stamp) or ((_number(outer) or 0) / 1000.0 or None)
        failed = state is DeliveryState.FAILED
        code, reason = detail.get("code"), detail.get("reason")
        return [
            DeliveryStatus(
                chat_id=dest,
                message_id=mid,
                status=state,
                channel=self.channel,
                ts=ts,
                code=str(code) if failed and code is not None else None,
                error=str(reason) if failed and reason else None,
            )
        ]

    def _message(self, msg: Mapping[str, Any], event: Mapping[str, Any]) -> Inbound:
        mid, kind = msg.get("id"), str(msg.get("type") or "")
        sender = msg.get("sender")
        phone = sender.get("phone") if isinstance(sender, dict) else None
        phone = phone or msg.get("source")
        if not isinstance(mid, str) or not mid or not isinstance(phone, str) or not phone:
            raise MalformedWebhook("gupshup: a message without id or sender")
        raw = msg.get("payload")
        part: dict[str, Any] = raw if isinstance(raw, dict) else {}
        data: dict[str, Any] = {"type": kind, "app": event.get("app")}
        if isinstance(sender, dict) and sender.get("name"):
            data["profile_name"] = sender["name"]
        text: str | None = None
        media: Media | None = None
        interaction = kind in _INTERACTIONS
        if kind == "text":
            text = part.get("text")
        elif kind in _INBOUND_MEDIA:
            url = part.get("url")
            if not isinstance(url, str) or not url:
                raise MalformedWebhook(f"gupshup: {kind} message {mid} has no url")
            media = Media(
                provider="gupshup",
                url=url,
                mime=part.get("contentType"),
                name=part.get("name") if kind == "file" else None,
            )
            text = part.get("caption")
        elif interaction:
            text = part.get("title") or part.get("text")
            data["payload"] = part.get("id") or part.get("postbackText") or part.get("reply")
        else:  # location, contact, …: what Gupshup sent, for the handler
            data[kind or "payload"] = part
        context = msg.get("context")
        if isinstance(context, dict) and context.get("gsId"):
            data["reply_to"] = context["gsId"]
        ts = event.get("timestamp")
        return Inbound(
            id=mid,
            chat_id=phone,
            sender=phone,
            channel=self.channel,
            ts=ts / 1000.0 if isinstance(ts, int | float) and not isinstance(ts, bool) else None,
            text=text if isinstance(text, str) else None,
            kind="interaction" if interaction else "message",
            media=media,
            data=data,
        )

    def reply(self, request: WebhookRequest, produced: list[Inbound]) -> WebhookReply:
        return WebhookReply(200, b"")

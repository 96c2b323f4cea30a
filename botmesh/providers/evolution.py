"""Evolution API (v2), a WhatsApp Web bridge built on Baileys: ``EvolutionProvider`` sends
through one instance, ``EvolutionWebhook`` verifies and parses the instance's webhook. What
the WhatsApp Web bridges share is in ``botmesh.providers.wa_bridges``.

Every call carries the ``apikey`` header (``EVOLUTION_API_KEY``: the instance's token, or
the global key) and names the instance in its path (``EVOLUTION_INSTANCE``).

Sending: a text is ``POST /message/sendText/{instance}`` ``{"number", "text"}``; media is
``POST /message/sendMedia/{instance}`` ``{"number", "mediatype", "mimetype", "media",
"caption"?, "fileName"?}`` with ``media`` the media's URL (Evolution fetches it) or its bytes
(``media.data`` or the file at ``media.path``) in base64; ``mediatype`` (``image``,
``video``, ``audio``, ``document``) follows the mime type; the text is the caption (audio
takes none). ``number`` is the chat id as the webhook gave it (a JID) or a phone number.
``options`` pass through into the body (``delay``, ``linkPreview``, ``quoted``,
``mentioned``…). Evolution answers 201 with the message, whose ``key.id`` is the result.

Errors (``{"status", "error", "response": {"message"}}``), before the common rules of
``wa_bridges``:

=======================================================  ======================================
400 whose message is ``{"exists": false, "jid", …}``     ``RecipientUnreachableError``: no
                                                         WhatsApp account has this number
400 saying ``Connection Closed``, ``Timed Out``,         retryable: the instance's session is
``Connection Terminated``, ``Stream Errored``            down or slow (Evolution answers a
                                                         failed send with 400)
404 (``The "x" instance does not exist``)                final, naming ``EVOLUTION_INSTANCE``
413                                                      ``PayloadTooLargeError``
a 2xx without ``key.id``                                 final: it may be out
=======================================================  ======================================

Edit, delete, typing: ``edit`` is ``POST /chat/updateMessage/{instance}`` ``{"number",
"key": {"id", "remoteJid", "fromMe": true}, "text"}`` (WhatsApp allows an edit within 15
minutes of the send; Evolution needs the message in its database), ``delete`` is ``DELETE
/chat/deleteMessageForEveryone/{instance}`` ``{"id", "remoteJid", "fromMe": true}`` (a revoke:
for everyone), ``typing`` is ``POST /chat/sendPresence/{instance}`` ``{"number", "presence":
"composing", "delay"}``, which answers only after ``delay`` ms. The message id is the
``key.id`` a send returned; ``remoteJid`` is the chat id, a number made a JID.

Evolution has no idempotency key, and no way to find a message by something the send set:
no ``send_keyed``, no ``resolve_ambiguous``.

Media download: ``POST /chat/getBase64FromMediaMessage/{instance}`` with the message's key
(the media reference journals only the key): Evolution finds the message in its database
(``DATABASE_SAVE_DATA_NEW_MESSAGE=true``) and downloads it through Baileys. When the webhook
inlined the bytes (``webhook.base64``), the live run uses them.

The webhook (``POST`` to ``https://<gateway>/evolution``, ``byEvents: false``, event
``MESSAGES_UPSERT``): ``{"event": "messages.upsert", "instance", "data": {"key", "pushName",
"message", "messageType", "messageTimestamp"}, "apikey", …}``. Evolution signs nothing, so
the gateway checks one of two things it can send: with ``EVOLUTION_WEBHOOK_SECRET``, the
``Authorization: Bearer`` JWT Evolution makes when the webhook's ``headers`` hold
``{"jwt_key": <secret>}`` (HS256, 10 minutes); else the body's ``apikey``, which Evolution
fills with the instance's token when ``AUTHENTICATION_EXPOSE_IN_FETCH_INSTANCES=true``, against
``EVOLUTION_API_KEY``.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, ClassVar, Self

from botmesh.providers.http import HttpAnswer
from botmesh.providers.wa_bridges import (
    BridgeProvider,
    BridgeWebhook,
    WaContent,
    b64_bytes,
    message_key,
    wa_inbound,
    wa_message,
    wa_status,
)
from botmesh.providers.webhooks import (
    BadSignature,
    MalformedWebhook,
    WebhookRequest,
    hmac_hex,
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
from botmesh.state.messages import DeliveryStatus, Inbound, Media, Outbound, SendResult

__all__ = ["EvolutionProvider", "EvolutionWebhook"]

log = logging.getLogger("botmesh.providers.evolution")

#: Texts of a 400 that Evolution gives for a session that is down or slow (Baileys' errors).
_TRANSIENT = ("connection closed", "timed out", "connection terminated", "stream errored")
#: Seconds a webhook JWT may be past its ``exp`` (the clocks of the two hosts).
JWT_LEEWAY = 30.0


def _messages(body: Any) -> list[Any]:
    """The ``response.message`` of an Evolution error, as a list."""
    response = body.get("response") if isinstance(body, dict) else None
    found = response.get("message") if isinstance(response, dict) else None
    return found if isinstance(found, list) else [] if found is None else [found]


class EvolutionProvider(BridgeProvider):
    """Sends through one Evolution instance with its token (or the global API key)."""

    name = "evolution"
    #: It posts status webhooks (``botmesh.state.statuses``): its sends are named under
    #: their message ids when recorded sent.
    delivery_statuses = True
    media_channel = "evolution"
    env_prefix: ClassVar[str] = "EVOLUTION"
    credential_env: ClassVar[str] = "EVOLUTION_API_KEY"
    session_env: ClassVar[str] = "EVOLUTION_INSTANCE"
    session_fix: ClassVar[str] = "the name of the Evolution instance to send through"
    #: How long ``typing`` shows "typing…" (ms): Evolution holds the call that long, then
    #: sends "paused". Evolution's documentation sets no least ``delay``; a second keeps
    #: the handler waiting little (WhatsApp clears the indicator with the reply anyway).
    typing_ms: ClassVar[int] = 1000

    def _headers(self) -> dict[str, str]:
        return {"apikey": self._credential}

    # -- sending --------------------------------------------------------------------------

    async def send(self, message: Outbound) -> SendResult:
        body: dict[str, Any] = {**message.options, "number": message.chat_id}
        media = message.media
        if media is None:
            if not message.text:
                raise UnsupportedContentError("evolution: the message has neither text nor media")
            body["text"] = message.text
            route = "sendText"
        else:
            body.update(await self._media_fields(media, message.text))
            route = "sendMedia"
        answer = await self.call("POST", f"/message/{route}/{self.session_path}", json_body=body)
        key = answer.get("key") if isinstance(answer, dict) else None
        mid = key.get("id") if isinstance(key, dict) else None
        if not isinstance(mid, str) or not mid:
            raise SendError(
                "evolution: the answer names no message key; it may be out", retryable=False
            )
        return SendResult(mid)

    # -- edit, delete, typing (botmesh.state.ports.Edits, Deletes, Typing) -----------------

    @staticmethod
    def _jid(chat_id: str) -> str:
        """The JID of a chat id: as it is when it is one, else a number's
        ``<digits>@s.whatsapp.net`` (as Evolution's ``createJid`` makes it)."""
        if "@" in chat_id:
            return chat_id
        return "".join(c for c in chat_id if c.isdigit()) + "@s.whatsapp.net"

    async def edit(self, message: Outbound, message_id: str) -> SendResult:
        """``POST /chat/updateMessage/{instance}`` ``{"number", "key", "text"}``: the text (or
        a media's caption) of a message this number sent. Evolution refuses a message it
        does not have stored (400 "Message not compatible"): final."""
        if not message.text:
            raise UnsupportedContentError("evolution: an edit needs a text")
        key = {"id": message_id, "remoteJid": self._jid(message.chat_id), "fromMe": True}
        body = {"number": message.chat_id, "key": key, "text": message.text}
        await self.call("POST", f"/chat/updateMessage/{self.session_path}", json_body=body)
        return SendResult(message_id)

    async def delete(self, chat_id: str, message_id: str) -> None:
        """``DELETE /chat/deleteMessageForEveryone/{instance}`` ``{"id", "remoteJid",
        "fromMe"}``: a revoke, for everyone. WhatsApp cannot tell a message already revoked
        from one still there, so deleting twice is a success."""
        body = {"id": message_id, "remoteJid": self._jid(chat_id), "fromMe": True}
        path = f"/chat/deleteMessageForEveryone/{self.session_path}"
        await self.call("DELETE", path, json_body=body)

    async def typing(self, chat_id: str) -> None:
        """``POST /chat/sendPresence/{instance}`` ``{"number", "presence": "composing",
        "delay"}``: Evolution shows "typing…" for ``typing_ms`` and answers after it."""
        body = {"number": chat_id, "presence": "composing", "delay": self.typing_ms}
        await self.call("POST", f"/chat/sendPresence/{self.session_path}", json_body=body)

    async def _media_fields(self, media: Media, caption: str | None) -> dict[str, Any]:
        found = await self.bridge_media(media, caption, urls=True)
        item: dict[str, Any] = {
            "mediatype": found.kind,
            "mimetype": found.mime,
            "media": found.url or found.base64,
        }
        if found.kind == "document":
            item["fileName"] = found.name
        if caption:
            item["caption"] = caption
        return item

    def _detail(self, answer: HttpAnswer, body: Any) -> str:
        found = _messages(body)
        if found:
            return "; ".join(
                json.dumps(m, sort_keys=True) if isinstance(m, dict) else str(m) for m in found
            )[:300]
        return super()._detail(answer, body)

    def _classify(self, answer: HttpAnswer, body: Any, detail: str) -> SendError | None:
        what = f"evolution: HTTP {answer.status}: {detail}"
        if answer.status == 400:
            if any(isinstance(m, dict) and m.get("exists") is False for m in _messages(body)):
                return RecipientUnreachableError(f"{what}: no WhatsApp account has this number")
            if any(t in detail.lower() for t in _TRANSIENT):
                return SendError(f"{what}: the instance's session is down", retryable=True)
        if answer.status == 404:
            return SendError(
                f"{what}; check EVOLUTION_INSTANCE (the instance must exist on this server)",
                retryable=False,
            )
        if answer.status == 413:
            return PayloadTooLargeError(f"{what}; send a smaller file or a link to it")
        return None

    # -- media download -------------------------------------------------------------------

    async def download_media(self, media: Media) -> bytes:
        """The bytes the webhook inlined, else Evolution's ``getBase64FromMediaMessage`` for
        the message's key."""
        if media.data is not None:
            return media.data
        key = media.extra.get("key")
        if not isinstance(key, Mapping) or not key.get("id"):
            raise ProviderError("evolution: this media has no message key to download it by")
        return await self.fetch_base64(
            "POST",
            f"/chat/getBase64FromMediaMessage/{self.session_path}",
            json_body={"message": {"key": dict(key)}, "convertToMp4": False},
        )


# -- webhooks ---------------------------------------------------------------------------------


def _b64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def jwt_problem(token: str, secret: str, now: float) -> str | None:
    """Why ``token`` is not a valid HS256 JWT of ``secret`` at ``now``; ``None`` when it is."""
    parts = token.split(".")
    if len(parts) != 3:
        return "not a JWT"
    try:
        header = json.loads(_b64url(parts[0]))
        payload = json.loads(_b64url(parts[1]))
        signature = _b64url(parts[2])
    except (ValueError, binascii.Error):
        return "not a JWT"
    if not isinstance(header, dict) or header.get("alg") != "HS256":
        return "not signed with HS256"
    want = hmac_hex(secret, f"{parts[0]}.{parts[1]}".encode())
    if not same(signature.hex(), want):
        return "its signature is not the secret's"
    exp = payload.get("exp") if isinstance(payload, dict) else None
    if not isinstance(exp, int | float) or exp + JWT_LEEWAY < now:
        return "it has expired (or has no exp)"
    return None


def _when(body: Mapping[str, Any]) -> float | None:
    """The body's ``date_time`` (ISO 8601) in seconds, or ``None``."""
    raw = body.get("date_time")
    try:
        return datetime.fromisoformat(raw).timestamp() if isinstance(raw, str) else None
    except ValueError:
        return None


def _media(content: WaContent, key: Mapping[str, Any], message: Any) -> Media | None:
    """The media of a message: its key (what the reference journals), and the bytes when
    the webhook inlined them (``message.base64``)."""
    if content.media_type is None:
        return None
    part = content.media
    inline = b64_bytes(message.get("base64")) if isinstance(message, dict) else None
    mime, name = part.get("mimetype"), part.get("fileName")
    return Media(
        provider="evolution",
        mime=mime if isinstance(mime, str) else None,
        name=name if isinstance(name, str) else None,
        data=inline,
        extra={"key": message_key(key)},
    )


class EvolutionWebhook(BridgeWebhook):
    """An instance's webhook (see the module docstring for what is checked). One record per
    ``messages.upsert`` message from someone else; other events give none. With
    ``instance`` set, events of other instances give none (their replies would go out from
    the wrong number).

    ``statuses`` reads ``messages.update`` (event ``MESSAGES_UPDATE``): for each update of a
    message this account sent (``fromMe``), ``message_id`` = ``keyId`` (the ``key.id``
    ``send`` returned; Evolution v1 calls it ``id``), ``chat_id`` = ``remoteJid``,
    ``status`` from Baileys' status name: ``SERVER_ACK`` sent, ``DELIVERY_ACK`` delivered,
    ``READ`` and ``PLAYED`` read, ``ERROR`` failed (with no code: Evolution passes none);
    ``PENDING`` and ``DELETED`` give none. ``ts`` is the body's ``date_time``."""

    channel = "evolution"

    def __init__(
        self,
        *,
        secret: str | None = None,
        api_key: str | None = None,
        instance: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not secret and not api_key:
            raise ConfigError(
                "EVOLUTION_WEBHOOK_SECRET",
                "is not set (nor EVOLUTION_API_KEY): set it to the jwt_key of the webhook's "
                "headers, so the gateway can tell Evolution's posts from others",
            )
        self._secret = secret or None
        self._api_key = api_key or None
        self.instance = instance or None
        self._clock = clock

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Self:
        """``EVOLUTION_WEBHOOK_SECRET`` (the webhook's ``jwt_key``), else ``EVOLUTION_API_KEY``
        (the instance token in the body); ``EVOLUTION_INSTANCE`` keeps that instance's
        events only."""
        return cls(
            secret=env.get("EVOLUTION_WEBHOOK_SECRET", "").strip(),
            api_key=env.get("EVOLUTION_API_KEY", "").strip(),
            instance=env.get("EVOLUTION_INSTANCE", "").strip(),
        )

    def verify(self, request: WebhookRequest) -> None:
        if self._secret is not None:
            scheme, _, token = request.headers.get("authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not token:
                raise BadSignature("evolution: no Authorization: Bearer <JWT> header")
            problem = jwt_problem(token.strip(), self._secret, self._clock())
            if problem is not None:
                raise BadSignature(
                    f"evolution: the webhook's JWT is refused: {problem}; check that "
                    "EVOLUTION_WEBHOOK_SECRET is the jwt_key of the webhook's headers"
                )
            return
        try:
            given = self.body(request).get("apikey")
        except MalformedWebhook:
            given = None
        if not isinstance(given, str) or self._api_key is None or not same(given, self._api_key):
            raise BadSignature(
                "evolution: the body's apikey is not EVOLUTION_API_KEY (Evolution puts the "
                "instance token there with AUTHENTICATION_EXPOSE_IN_FETCH_INSTANCES=true); "
                "or set EVOLUTION_WEBHOOK_SECRET and a jwt_key header"
            )

    def statuses(self, request: WebhookRequest) -> list[DeliveryStatus]:
        body = self.body(request)
        event = body.get("event")
        if not isinstance(event, str):
            raise MalformedWebhook("evolution: the body has no event")
        if event.lower().replace("_", ".") != "messages.update":
            return []
        if self.instance is not None and body.get("instance") != self.instance:
            return []
        data = body.get("data")
        out = []
        for item in data if isinstance(data, list) else [data]:
            if not isinstance(item, dict):
                raise MalformedWebhook("evolution: messages.update data is not an object")
            if item.get("fromMe") is not True:
                continue  # the status of someone else's message (our read receipts)
            mid = item.get("keyId") or item.get("id")
            found = wa_status(
                self.channel, item.get("remoteJid"), mid, item.get("status"), ts=_when(body)
            )
            if found is not None:
                out.append(found)
        return out

    def parse(self, request: WebhookRequest) -> list[Inbound]:
        body = self.body(request)
        event = body.get("event")
        if not isinstance(event, str):
            raise MalformedWebhook("evolution: the body has no event")
        if event.lower().replace("_", ".") != "messages.upsert":
            return []
        instance = body.get("instance")
        if self.instance is not None and instance != self.instance:
            log.info("evolution: an event of instance %r ignored (not %r)", instance, self.instance)
            return []
        data = body.get("data")
        items = data if isinstance(data, list) else [data]
        out = []
        for msg in items:
            if not isinstance(msg, dict):
                raise MalformedWebhook("evolution: messages.upsert data is not a message")
            found = wa_message(self.channel, msg)
            if found is None:
                continue
            key, content = found
            media = _media(content, key, msg.get("message"))
            extra = {"instance": instance} if isinstance(instance, str) else {}
            out.append(wa_inbound(self.channel, msg, key, content, media, **extra))
        return out

"""WPPConnect server, a WhatsApp Web bridge that drives WhatsApp Web in a browser (wa-js):
``WppConnectProvider`` sends through one session, ``WppConnectWebhook`` verifies and parses
the session's webhook. What the WhatsApp Web bridges share is in
``botmesh.providers.wa_bridges``.

Every call names the session in its path (``WPPCONNECT_SESSION``) and carries
``Authorization: Bearer <WPPCONNECT_TOKEN>``, the token ``POST
/api/{session}/{SECRET_KEY}/generate-token`` gave.

Sending: a text is ``POST /api/{session}/send-message`` ``{"phone", "isGroup", "isLid",
"message"}``; media is ``POST /api/{session}/send-file`` with ``"path": <url>`` (WPPConnect
fetches it), or its bytes (``media.data`` or the file at ``media.path``) to
``/send-file-base64`` as ``"base64": "data:<mime>;base64,…"``, with ``filename`` and the
text as ``caption``. ``phone`` is the chat id as the webhook gave it (``…@c.us``,
``…@g.us``, ``…@lid``; ``isGroup`` and ``isLid`` follow its domain) or a phone number.
``options`` go as the body's ``options`` (``quotedMsg``…). WPPConnect answers 201
``{"status": "success", "response": [message]}``; the message's ``id``
(``true_5511…@c.us_3EB0…``) is the result.

Errors (``{"status", "message", "error"?}``), before the common rules of ``wa_bridges``:

=============================================  =========================================
400 ``O número … não existe.``                 ``RecipientUnreachableError``: no WhatsApp
                                               account has this number
404 ``status: Disconnected``                   retryable: the session is not running now
500 ``Erro ao enviar a mensagem.``             retryable (as any 5xx)
401 ``status: error`` (``delete-message``        final: WPPConnect deleted nothing (the
when wa-js deleted nothing)                    token's 401 has no ``status``)
a 2xx that is not ``status: success`` or has   final: it may be out
no message id
=============================================  =========================================

Edit, delete, typing (the routes and bodies of wppconnect-server's ``routes/index.ts`` and
its message and device controllers): ``edit`` is ``POST /api/{session}/edit-message``
``{"id", "newText", "options"?}`` (wa-js' ``editMessage``: a text, or a media's caption,
within WhatsApp's 15 minutes), answered 201 ``{"status": "success", "response": message}``;
``delete`` is ``POST /api/{session}/delete-message`` ``{"phone", "isGroup", "isLid",
"messageId"}`` (a revoke, for everyone; a message already revoked is revoked again without
error), answered 200 ``{"status": "success", "response": {"message": "Message deleted"}}``;
``typing`` is ``POST /api/{session}/typing`` ``{"phone", "isGroup", "isLid", "value": true}``
(wa-js' ``markIsComposing``: "typing…" until WhatsApp clears it or the next message). The
message id is the ``id`` ``send`` returned. Their errors are the send's; a message
WPPConnect cannot find or edit (unknown, too old) is a 500 that says no more than a failed
send does (``Erro ao enviar a mensagem.``, ``Error on delete message``), so it is retried
as one, until the outbox gives up.

WPPConnect has no idempotency key and no lookup by anything the send set: no
``send_keyed``, no ``resolve_ambiguous``.

Media download: ``GET /api/{session}/get-media-by-message/{messageId}`` (``{"base64",
"mimetype"}``): the media reference journals the message id, and WPPConnect decrypts the
media again from WhatsApp while the session still has the message.

The webhook (the session's ``webhook`` URL, or ``WEBHOOK_URL``): ``POST`` of the wa-js message
with ``event`` and ``session`` (``{"event": "onmessage", "session", "id", "from", "author"?,
"type", "body", "caption"?, "mimetype"?, "filename"?, "t", "fromMe", "sender", …}``).
WPPConnect signs nothing and adds no header of ours, so the secret rides in the URL: point
the webhook at ``https://<gateway>/wppconnect?secret=<WPPCONNECT_WEBHOOK_SECRET>``. With
``WPPCONNECT_SESSION`` set, other sessions' events give no record.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any, ClassVar, Self
from urllib.parse import quote

from botmesh.providers.http import HttpAnswer
from botmesh.providers.meta import env_value
from botmesh.providers.wa_bridges import BridgeProvider, BridgeWebhook, wa_long
from botmesh.providers.webhooks import BadSignature, MalformedWebhook, WebhookRequest, same
from botmesh.state.errors import (
    ConfigError,
    ProviderError,
    RecipientUnreachableError,
    SendError,
    UnsupportedContentError,
)
from botmesh.state.messages import (
    DeliveryState,
    DeliveryStatus,
    Inbound,
    Media,
    Outbound,
    SendResult,
)

__all__ = ["WppConnectProvider", "WppConnectWebhook"]

log = logging.getLogger("botmesh.providers.wppconnect")

#: A chat id: ``5511…@c.us``, ``…@g.us``, ``…@lid``, or a bare number; never a list
#: (WPPConnect splits ``phone`` on ``,`` and ``;`` into several recipients).
_CHAT = re.compile(r"^\+?[0-9A-Za-z._-]{1,128}(@[a-z.]{1,32})?$")
#: A message id safe as a path segment (``false_5511…@c.us_3EB0…``).
_MESSAGE_ID = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_.:@-]{0,255}$")
_MEDIA_TYPES = frozenset({"image", "video", "audio", "ptt", "document", "sticker"})
#: wa-js message types that are no message from a user.
_SYSTEM = frozenset(
    {
        "e2e_notification",
        "notification",
        "notification_template",
        "gp2",
        "protocol",
        "revoked",
        "ciphertext",
        "call_log",
        "broadcast_notification",
    }
)


#: wa-js' ``AckType`` of a message that reached the user's side; 0 is the clock, and the
#: negative ones are the ways it failed (``_ACK_ERRORS``).
_ACKS = {
    1: DeliveryState.SENT,
    2: DeliveryState.DELIVERED,
    3: DeliveryState.READ,
    4: DeliveryState.READ,  # PLAYED
}
_ACK_ERRORS = {
    -1: "FAILED",
    -2: "EXPIRED",
    -3: "CONTENT_GONE",
    -4: "CONTENT_TOO_BIG",
    -5: "CONTENT_UNUPLOADABLE",
    -6: "INACTIVE",
    -7: "MD_DOWNGRADE",
}

#: What ``data`` keeps of a location or a contact card (a location's ``body`` is a thumbnail).
_KEPT = {"location": ("lat", "lng", "loc"), "vcard": ("body",), "multi_vcard": ("vcardList",)}


def _serialized(value: Any) -> str | None:
    """A wa-js id: a string, or ``{"_serialized": …}``."""
    if isinstance(value, Mapping):
        value = value.get("_serialized")
    return value if isinstance(value, str) and value else None


class WppConnectProvider(BridgeProvider):
    """Sends through one WPPConnect session with its bearer token."""

    name = "wppconnect"
    #: It posts status webhooks (``botmesh.state.statuses``): its sends are named under
    #: their message ids when recorded sent.
    delivery_statuses = True
    media_channel = "wppconnect"
    env_prefix: ClassVar[str] = "WPPCONNECT"
    credential_env: ClassVar[str] = "WPPCONNECT_TOKEN"
    session_env: ClassVar[str] = "WPPCONNECT_SESSION"
    session_fix: ClassVar[str] = "the name of the WPPConnect session to send through"

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._credential}"}

    # -- sending --------------------------------------------------------------------------

    @staticmethod
    def _chat(chat: str) -> dict[str, Any]:
        """``phone``, ``isGroup`` and ``isLid`` of a chat id (``RecipientUnreachableError``
        when it is neither a chat id nor a phone number)."""
        if not _CHAT.match(chat):
            raise RecipientUnreachableError(
                f"wppconnect: chat_id {chat!r} is neither a WhatsApp chat id nor a phone number"
            )
        return {"phone": chat, "isGroup": chat.endswith("@g.us"), "isLid": chat.endswith("@lid")}

    async def send(self, message: Outbound) -> SendResult:
        body = self._chat(message.chat_id)
        if message.options:
            body["options"] = dict(message.options)
        media = message.media
        if media is None:
            if not message.text:
                raise UnsupportedContentError("wppconnect: the message has neither text nor media")
            body["message"] = message.text
            route = "send-message"
        else:
            route = await self._media_fields(body, media, message.text)
            if message.text:
                body["caption"] = message.text
        answer = await self.call("POST", f"/api/{self.session_path}/{route}", json_body=body)
        sent = answer.get("response") if isinstance(answer, dict) else None
        first = sent[0] if isinstance(sent, list) and sent else None
        mid = _serialized(first.get("id")) if isinstance(first, dict) else None
        if not isinstance(answer, dict) or answer.get("status") != "success" or mid is None:
            raise SendError(
                "wppconnect: the answer is not a success with a message id; it may be out",
                retryable=False,
            )
        return SendResult(mid)

    # -- edit, delete, typing (botmesh.state.ports.Edits, Deletes, Typing) -----------------

    async def edit(self, message: Outbound, message_id: str) -> SendResult:
        """``POST /api/{session}/edit-message`` ``{"id", "newText", "options"?}``: the text
        (or a media's caption) of a message this session sent."""
        if not message.text:
            raise UnsupportedContentError("wppconnect: an edit needs a text")
        body: dict[str, Any] = {"id": message_id, "newText": message.text}
        if message.options:
            body["options"] = dict(message.options)
        path = f"/api/{self.session_path}/edit-message"
        answer = await self.call("POST", path, json_body=body)
        if not isinstance(answer, dict) or answer.get("status") != "success":
            raise SendError(
                "wppconnect: the edit's answer is not a success; it may be made", retryable=False
            )
        return SendResult(message_id)

    async def delete(self, chat_id: str, message_id: str) -> None:
        """``POST /api/{session}/delete-message`` ``{"phone", "isGroup", "isLid",
        "messageId"}``: a revoke, for everyone; a message revoked already is no error."""
        body = {**self._chat(chat_id), "messageId": message_id}
        await self.call("POST", f"/api/{self.session_path}/delete-message", json_body=body)

    async def typing(self, chat_id: str) -> None:
        """``POST /api/{session}/typing`` ``{"phone", "isGroup", "isLid", "value": true}``:
        "typing…" until WhatsApp clears it (or the next message)."""
        body = {**self._chat(chat_id), "value": True}
        await self.call("POST", f"/api/{self.session_path}/typing", json_body=body)

    async def _media_fields(self, body: dict[str, Any], media: Media, caption: str | None) -> str:
        """Fill ``body`` with ``media``; the route that sends it."""
        found = await self.bridge_media(media, caption, urls=True)
        body["filename"] = found.name
        if found.url is not None:
            body["path"] = found.url
            return "send-file"
        body["base64"] = f"data:{found.mime};base64,{found.base64}"
        return "send-file-base64"

    def _classify(self, answer: HttpAnswer, body: Any, detail: str) -> SendError | None:
        what = f"wppconnect: HTTP {answer.status}: {detail}"
        status = body.get("status") if isinstance(body, dict) else None
        if answer.status == 400 and status == "Connected":
            return RecipientUnreachableError(f"{what}: no WhatsApp account has this number")
        if answer.status == 401 and status == "error":
            # delete-message when wa-js deleted nothing: not the token (that 401 has no status)
            return SendError(f"{what}: WPPConnect deleted nothing", retryable=False)
        if answer.status == 404 and status == "Disconnected":
            return SendError(
                f"{what}: the session {self.session} is not running now (start it, or scan "
                "its QR code again)",
                retryable=True,
            )
        return None

    # -- media download -------------------------------------------------------------------

    async def download_media(self, media: Media) -> bytes:
        """``get-media-by-message`` for the media's message id."""
        if media.data is not None:
            return media.data
        mid = media.id or media.extra.get("message_id")
        if not isinstance(mid, str) or not _MESSAGE_ID.match(mid):
            raise ProviderError("wppconnect: this media has no message id to download it by")
        return await self.fetch_base64(
            "GET", f"/api/{self.session_path}/get-media-by-message/{quote(mid, safe='@')}"
        )


# -- webhooks ---------------------------------------------------------------------------------


def _content(msg: Mapping[str, Any], mid: str) -> tuple[str | None, str, Media | None, Any]:
    """The text, kind, media and payload of a wa-js message."""
    kind = str(msg.get("type") or "")
    caption = msg.get("caption")
    if kind in _MEDIA_TYPES:
        mime, name = msg.get("mimetype"), msg.get("filename")
        media = Media(
            provider="wppconnect",
            id=mid,
            mime=mime if isinstance(mime, str) else None,
            name=name if isinstance(name, str) and kind == "document" else None,
            extra={"message_id": mid},
        )
        return caption if isinstance(caption, str) else None, "message", media, None
    body = msg.get("body")
    text = body if isinstance(body, str) else None
    if kind == "buttons_response":
        return text, "interaction", None, msg.get("selectedButtonId")
    if kind == "template_button_reply":
        return text, "interaction", None, msg.get("selectedId")
    if kind == "list_response":
        reply = msg.get("listResponse")
        row = reply.get("singleSelectReply") if isinstance(reply, Mapping) else None
        rid = row.get("selectedRowId") if isinstance(row, Mapping) else None
        title = reply.get("title") if isinstance(reply, Mapping) else None
        return title if isinstance(title, str) else text, "interaction", None, rid
    return text if kind == "chat" else None, "message", None, None


class WppConnectWebhook(BridgeWebhook):
    """A session's webhook: the secret in the URL's ``secret`` parameter, compared in
    constant time. ``onmessage`` events from someone else give one record; every other
    event (acks, presence, revokes, calls) gives none.

    ``statuses`` reads ``onack`` events (the wa-js message with its new ``ack``) of the
    messages this account sent (``id.fromMe``): ``message_id`` = ``id._serialized`` (the
    id ``send`` returned), ``chat_id`` = ``id.remote`` (else ``to``), ``ts`` = ``t``;
    ``ack`` 1 sent, 2 delivered, 3 read, 4 (played) read, a negative one (wa-js'
    ``FAILED`` -1, ``EXPIRED`` -2, ``CONTENT_GONE`` -3…) failed with the number as the
    code and its name as the error; 0 (the clock: not yet sent) gives none."""

    channel = "wppconnect"

    def __init__(self, secret: str, *, session: str | None = None) -> None:
        if len(secret or "") < 16:
            raise ConfigError(
                "WPPCONNECT_WEBHOOK_SECRET",
                "is shorter than 16 characters: it is all that tells WPPConnect's posts "
                "from others' (e.g. openssl rand -hex 16)",
            )
        self._secret = secret
        self.session = session or None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Self:
        """``WPPCONNECT_WEBHOOK_SECRET`` (the ``secret`` of the webhook URL);
        ``WPPCONNECT_SESSION`` keeps that session's events only."""
        secret = env_value(
            env,
            "WPPCONNECT_WEBHOOK_SECRET",
            "set it to the secret the webhook URL carries (…/wppconnect?secret=<it>)",
        )
        return cls(secret, session=env.get("WPPCONNECT_SESSION", "").strip())

    def verify(self, request: WebhookRequest) -> None:
        given = request.query.get("secret")
        if not given:
            raise BadSignature("wppconnect: the webhook URL has no secret parameter")
        if not same(given, self._secret):
            raise BadSignature(
                "wppconnect: the URL's secret is wrong; check WPPCONNECT_WEBHOOK_SECRET"
            )

    def statuses(self, request: WebhookRequest) -> list[DeliveryStatus]:
        msg = self.body(request)
        if not isinstance(msg.get("event"), str):
            raise MalformedWebhook("wppconnect: the body has no event")
        if msg["event"] != "onack":
            return []
        if self.session is not None and msg.get("session") != self.session:
            return []
        key, ack = msg.get("id"), msg.get("ack")
        mid = _serialized(key)
        chat = _serialized(key.get("remote")) if isinstance(key, Mapping) else None
        chat = chat or _serialized(msg.get("to"))
        if mid is None or chat is None or not isinstance(ack, int) or isinstance(ack, bool):
            raise MalformedWebhook("wppconnect: onack without id, to or a numeric ack")
        mine = key.get("fromMe") if isinstance(key, Mapping) else msg.get("fromMe")
        if mine is not True or ack == 0:
            return []  # someone else's message, or ours still on the clock
        state = _ACKS.get(ack) if ack > 0 else DeliveryState.FAILED
        if state is None:
            return []
        failed = state is DeliveryState.FAILED
        return [
            DeliveryStatus(
                chat_id=chat,
                message_id=mid,
                status=state,
                channel=self.channel,
                ts=wa_long(msg.get("t")),
                code=str(ack) if failed else None,
                error=_ACK_ERRORS.get(ack, "ERROR") if failed else None,
            )
        ]

    def parse(self, request: WebhookRequest) -> list[Inbound]:
        msg = self.body(request)
        if not isinstance(msg.get("event"), str):
            raise MalformedWebhook("wppconnect: the body has no event")
        if msg["event"] != "onmessage" or msg.get("fromMe") is True:
            return []
        session = msg.get("session")
        if self.session is not None and session != self.session:
            log.info("wppconnect: an event of session %r ignored (not %r)", session, self.session)
            return []
        mid, chat = _serialized(msg.get("id")), _serialized(msg.get("from"))
        if mid is None or chat is None:
            raise MalformedWebhook("wppconnect: onmessage without id or from")
        kind = str(msg.get("type") or "")
        if kind in _SYSTEM or chat.endswith("@broadcast"):
            return []
        text, what, media, payload = _content(msg, mid)
        data: dict[str, Any] = {"type": kind}
        if isinstance(session, str):
            data["session"] = session
        if payload is not None:
            data["payload"] = payload
        if isinstance(msg.get("quotedMsgId"), str):
            data["reply_to"] = msg["quotedMsgId"]
        sender = msg.get("sender")
        name = (sender.get("pushname") if isinstance(sender, Mapping) else None) or msg.get(
            "notifyName"
        )
        if isinstance(name, str) and name:
            data["profile_name"] = name
        if kind in _KEPT:
            data[kind] = {k: msg[k] for k in _KEPT[kind] if k in msg}
        author = _serialized(msg.get("author"))
        return [
            Inbound(
                id=mid,
                chat_id=chat,
                sender=author or chat,
                channel=self.channel,
                ts=wa_long(msg.get("t")),
                text=text,
                kind="interaction" if what == "interaction" else "message",
                media=media,
                data=data,
            )
        ]

"""A fake of Evolution API v2, the routes the adapter uses.

- ``POST /message/sendText/{instance}`` (``{"number", "text", …}``) and
  ``POST /message/sendMedia/{instance}`` (``{"number", "mediatype", "mimetype", "media":
  url or base64, "caption"?, "fileName"?}``): 201 with the message as Evolution answers it
  (``{"key": {"remoteJid", "fromMe": true, "id"}, "message", "messageType",
  "messageTimestamp", "status": "PENDING", …}``).
- ``POST /chat/getBase64FromMediaMessage/{instance}`` (``{"message": {"key": {"id"}}}``): 201
  ``{"mediaType", "fileName", "mimetype", "base64", …}`` for a message whose media the fake
  holds (``media``), else 400 ``Message not found``.

Guards in Evolution's order: an unknown instance 404 ``The "x" instance does not exist``, then
the ``apikey`` header (the global key or the instance's token) 401. Errors have Evolution's
body ``{"status", "error", "response": {"message"}}``: a number without WhatsApp 400 with
``[{"jid", "exists": false, "number"}]``; a closed session (``connected = False``) 400
``Error: Connection Closed``, as Evolution wraps Baileys' errors; an empty text 400 ``Text is
required``; base64 without a file name for a document 400; media that is neither a URL nor
base64 400.

Edit, delete, presence: ``POST /chat/updateMessage/{instance}`` (``{"number", "key", "text"}``)
replaces the text of a message the fake sent, 400 ``Message not compatible`` for one it does
not hold (Evolution's answer when its database has no such text message);
``DELETE /chat/deleteMessageForEveryone/{instance}`` (``{"id", "remoteJid", "fromMe"}``)
removes it and answers 201 even when it is not there (a revoke is sent regardless);
``POST /chat/sendPresence/{instance}`` (``{"number", "presence", "delay"}``) records it
(``presences``) and answers 201 ``{"presence"}`` without waiting the delay.

Status webhooks (``BridgeFake``): ``messages.update`` events (``MESSAGES_UPDATE``), as
Evolution v2 posts them: ``{"event": "messages.update", "instance", "data": {"messageId",
"keyId", "remoteJid", "fromMe": true, "participant", "status", "instanceId"}, "date_time",
"sender", "server_url", "apikey"}``, with the instance's token as ``apikey``
(``AUTHENTICATION_EXPOSE_IN_FETCH_INSTANCES=true``) and, when ``webhook_jwt_key`` is set (the
webhook's ``headers`` hold ``jwt_key``), ``Authorization: Bearer <JWT of it>``.
``SERVER_ACK``, ``DELIVERY_ACK``, ``READ``; a number of ``fail_after_accept`` gets
``ERROR`` (Evolution passes no code, so the value is not posted).

``upsert`` writes the webhook body Evolution posts, and ``jwt_for`` the ``Authorization``
JWT it makes from a webhook's ``jwt_key`` header.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
import time
from typing import Any

from aiohttp import web

from tests.providers.fakes.wa_bridges import BridgeFake, Sent, digits


def error(status: int, message: Any) -> web.Response:
    """Evolution's error answer (its Express error handler)."""
    names = {400: "Bad Request", 401: "Unauthorized", 404: "Not Found"}
    return web.json_response(
        {
            "status": status,
            "error": names.get(status, "Internal Server Error"),
            "response": {"message": message},
        },
        status=status,
    )


def _base64(value: str) -> bytes | None:
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return None


class FakeEvolution(BridgeFake):
    """An Evolution server with one instance, ``instance``, whose token is ``token``;
    ``global_key`` works for every instance."""

    status_names = ("SERVER_ACK", "DELIVERY_ACK", "READ", "ERROR")

    def __init__(self, instance: str = "support-bot") -> None:
        super().__init__()
        self.instance = instance
        self.token = secrets.token_hex(16).upper()
        self.global_key = "global-" + secrets.token_hex(12)
        #: ``(jid, presence, delay)`` of every accepted ``sendPresence``.
        self.presences: list[tuple[str, str, int]] = []
        #: The webhook's ``jwt_key`` header: its status posts carry the JWT of it.
        self.webhook_jwt_key: str | None = None

    # -- the app --------------------------------------------------------------------------

    def routes(self, router: web.UrlDispatcher) -> None:
        router.add_post("/message/sendText/{instance}", self._guarded(self._text, posts=True))
        router.add_post(
            "/message/sendMedia/{instance}", self._guarded(self._media_send, posts=True)
        )
        router.add_post(
            "/chat/getBase64FromMediaMessage/{instance}", self._guarded(self._base64_of)
        )
        router.add_post("/chat/updateMessage/{instance}", self._guarded(self._update))
        router.add_delete(
            "/chat/deleteMessageForEveryone/{instance}", self._guarded(self._delete_for_all)
        )
        router.add_post("/chat/sendPresence/{instance}", self._guarded(self._presence))

    def _guarded(self, route: Any, *, posts: bool = False) -> Any:
        """``route`` behind Evolution's guards; ``posts``: an accepted send (201) gets its
        status webhooks."""

        async def handle(request: web.Request) -> web.StreamResponse:
            name = request.match_info["instance"]
            if name != self.instance:
                return error(404, [f'The "{name}" instance does not exist'])
            if request.headers.get("apikey") not in (self.token, self.global_key):
                return error(401, "Unauthorized")
            try:
                body = await request.json()
            except ValueError:
                return error(400, ["body is not JSON"])
            answer: web.Response = await route(body)
            if posts and answer.status == 201:
                return await self.answer_then_post(request, answer, self.sent[-1])
            return answer

        return handle

    def _recipient(self, number: Any) -> str | web.Response:
        if not isinstance(number, str) or not number:
            return error(400, ['"number" is required'])
        if not self.connected:
            return error(400, ["Error: Connection Closed"])
        if number.endswith("@g.us"):
            return number
        jid = f"{digits(number)}@s.whatsapp.net"
        if not self.exists(digits(number)):
            return error(400, [{"jid": jid, "exists": False, "number": number}])
        return jid

    def _answer(self, sent: Sent, message: dict[str, Any], kind: str) -> web.Response:
        self.sent.append(sent)
        return web.json_response(
            {
                "key": {"remoteJid": sent.chat, "fromMe": True, "id": sent.id},
                "pushName": "",
                "status": "PENDING",
                "message": message,
                "contextInfo": None,
                "messageType": kind,
                "messageTimestamp": int(time.time()),
                "instanceId": "a1b2c3d4-0000-4000-8000-000000000001",
                "source": "unknown",
            },
            status=201,
        )

    async def _text(self, body: dict[str, Any]) -> web.StreamResponse:
        chat = self._recipient(body.get("number"))
        if isinstance(chat, web.Response):
            return chat
        text = body.get("text")
        if not isinstance(text, str) or not text.strip():
            return error(400, ["Text is required"])
        sent = Sent(self.message_id(), chat, text=text, body=body)
        return self._answer(sent, {"conversation": text}, "conversation")

    async def _media_send(self, body: dict[str, Any]) -> web.StreamResponse:
        media, kind = body.get("media"), body.get("mediatype")
        if not isinstance(media, str) or kind not in ("image", "video", "audio", "document"):
            return error(400, ["mediatype and media are required"])
        is_url = media.startswith(("http://", "https://"))
        data = None if is_url else _base64(media)
        if not is_url and data is None:
            return error(400, ["Owned media must be a url or base64"])
        if data is not None and kind == "document" and not body.get("fileName"):
            return error(400, ["For base64 the file name must be informed."])
        chat = self._recipient(body.get("number"))
        if isinstance(chat, web.Response):
            return chat
        sent = Sent(
            self.message_id(),
            chat,
            caption=body.get("caption"),
            kind=kind,
            media=media if is_url else data,
            mime=body.get("mimetype"),
            name=body.get("fileName"),
            body=body,
        )
        part = {"mimetype": body.get("mimetype"), "caption": body.get("caption")}
        return self._answer(sent, {f"{kind}Message": part}, f"{kind}Message")

    async def _base64_of(self, body: dict[str, Any]) -> web.StreamResponse:
        message = body.get("message")
        key = message.get("key") if isinstance(message, dict) else None
        mid = key.get("id") if isinstance(key, dict) else None
        if mid not in self.media:
            return error(400, ["Message not found"])
        data, mime = self.media[mid]
        return web.json_response(
            {
                "mediaType": "imageMessage",
                "fileName": f"{mid}.bin",
                "caption": None,
                "size": {"fileLength": len(data)},
                "mimetype": mime,
                "base64": base64.b64encode(data).decode(),
                "buffer": None,
            },
            status=201,
        )

    def _sent(self, mid: Any, jid: Any) -> Sent | None:
        return next((m for m in self.sent if m.id == mid and m.chat == jid), None)

    async def _update(self, body: dict[str, Any]) -> web.StreamResponse:
        chat = self._recipient(body.get("number"))
        if isinstance(chat, web.Response):
            return chat
        key, text = body.get("key"), body.get("text")
        if not isinstance(key, dict) or not isinstance(text, str) or not text:
            return error(400, ['"key" and "text" are required'])
        found = self._sent(key.get("id"), key.get("remoteJid"))
        if found is None or found.kind not in (None, "image", "video"):
            return error(400, ["Message not compatible"])
        if found.kind is None:
            found.text = text
        else:
            found.caption = text
        edited = {
            "key": {"remoteJid": chat, "fromMe": True, "id": found.id},
            "type": "MESSAGE_EDIT",
            "editedMessage": {"conversation": text},
        }
        answer = {
            "key": {"remoteJid": chat, "fromMe": True, "id": self.message_id()},
            "message": {"protocolMessage": edited},
            "messageTimestamp": int(time.time()),
            "status": "PENDING",
        }
        return web.json_response(answer, status=200)

    async def _delete_for_all(self, body: dict[str, Any]) -> web.StreamResponse:
        mid, jid = body.get("id"), body.get("remoteJid")
        if not isinstance(mid, str) or not isinstance(jid, str) or not mid or not jid:
            return error(400, ['"id" and "remoteJid" are required'])
        if not self.connected:
            return error(400, ["Error: Connection Closed"])
        found = self._sent(mid, jid)
        if found is not None:
            self.sent.remove(found)
        target = {"remoteJid": jid, "fromMe": body.get("fromMe"), "id": mid}
        answer = {
            "key": {"remoteJid": jid, "fromMe": True, "id": self.message_id()},
            "message": {"protocolMessage": {"key": target, "type": "REVOKE"}},
            "messageTimestamp": int(time.time()),
            "status": "PENDING",
        }
        return web.json_response(answer, status=201)

    async def _presence(self, body: dict[str, Any]) -> web.StreamResponse:
        chat = self._recipient(body.get("number"))
        if isinstance(chat, web.Response):
            return chat
        presence, delay = body.get("presence"), body.get("delay")
        if presence not in ("unavailable", "available", "composing", "recording", "paused"):
            return error(400, ['"presence" is not a presence'])
        if not isinstance(delay, int):
            return error(400, ['"delay" is required'])
        self.presences.append((chat, presence, delay))
        return web.json_response({"presence": presence}, status=201)

    def status_post(
        self, sent: Sent, status: str, code: int | str | None
    ) -> tuple[dict[str, str], bytes]:
        """A ``messages.update`` event of ``sent`` with Baileys' status name ``status``."""
        data = {
            "messageId": "cm" + secrets.token_hex(10),
            "keyId": sent.id,
            "remoteJid": sent.chat,
            "fromMe": True,
            "participant": sent.chat,
            "status": status,
            "instanceId": "a1b2c3d4-0000-4000-8000-000000000001",
        }
        body = upsert(self.instance, data, apikey=self.token, event="messages.update")
        headers = {"Content-Type": "application/json"}
        if self.webhook_jwt_key is not None:
            headers["Authorization"] = f"Bearer {jwt_for(self.webhook_jwt_key)}"
        return headers, body


# -- webhook bodies -------------------------------------------------------------------------


def upsert(
    instance: str,
    data: dict[str, Any],
    *,
    apikey: str | None = None,
    event: str = "messages.upsert",
) -> bytes:
    """The webhook body Evolution posts for one event."""
    return json.dumps(
        {
            "event": event,
            "instance": instance,
            "data": data,
            "destination": "https://hooks.example.com/evolution",
            "date_time": "2026-01-01T00:00:00.000Z",
            "sender": "5511999990000@s.whatsapp.net",
            "server_url": "https://evolution.example.com",
            "apikey": apikey,
        }
    ).encode()


def received(mid: str, jid: str, message: dict[str, Any], **more: Any) -> dict[str, Any]:
    """A ``messages.upsert`` message as Evolution prepares it (``prepareMessage``)."""
    kind = next(iter(message))
    return {
        "key": {"remoteJid": jid, "fromMe": False, "id": mid},
        "pushName": "Ana",
        "status": "DELIVERY_ACK",
        "message": message,
        "contextInfo": None,
        "messageType": kind,
        "messageTimestamp": 1767225600,
        "instanceId": "a1b2c3d4-0000-4000-8000-000000000001",
        "source": "android",
        **more,
    }


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def jwt_for(secret: str, now: float | None = None, ttl: int = 600, alg: str = "HS256") -> str:
    """The JWT Evolution puts in ``Authorization: Bearer`` for a webhook whose headers hold
    ``jwt_key`` (``jsonwebtoken.sign`` with HS256, ten minutes)."""
    iat = int(time.time() if now is None else now)
    header = _b64url(json.dumps({"alg": alg, "typ": "JWT"}).encode())
    payload = _b64url(
        json.dumps({"iat": iat, "exp": iat + ttl, "app": "evolution", "action": "webhook"}).encode()
    )
    signature = hmac.new(secret.encode(), f"{header}.{payload}".encode(), hashlib.sha256).digest()
    return f"{header}.{payload}.{_b64url(signature)}"

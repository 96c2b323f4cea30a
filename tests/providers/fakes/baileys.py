"""A fake of the Baileys HTTP bridge (the API of ``fazer-ai/baileys-api``) and of WhatsApp's
media CDN behind it.

- ``POST /connections/{phone}/send-message``: ``x-api-key`` checked (401 ``{"error":
  "Unauthorized", "message": "Valid API key required"}``), a phone of another key 403, a
  phone that is not ``+digits`` or a body that is not ``{"jid", "messageContent"}`` with one
  of ``text`` / ``image`` / ``video`` / ``document`` / ``audio`` (canonical base64) 422 as
  Elysia validates, a connection that is down 404 ``Phone number not connected``. 200
  ``{"data": {"key": {"remoteJid", "fromMe": true, "id"}, "messageTimestamp"}}``. A
  ``chatwootMessageId`` seen before answers the first answer again (the bridge's
  idempotency); ``lose_next_answer`` makes the next send go out and answer 504, as a send
  whose answer was lost.
- ``GET /media/{messageId}``: the media the bridge saved when a message arrived (``media``),
  404 ``File not found`` otherwise.
- ``GET /v/…``: the CDN: media encrypted as WhatsApp does (``add_cdn_media``).
- ``PATCH /connections/{phone}/messages`` (``{"jid", "key": {"id", …}, "messageContent":
  {"text", "mentions"?}}``): an edit. The text (or an image's or video's caption) of a
  message the fake sent is replaced; every edit is kept in ``edits`` as ``(jid, id,
  text)``, also one of a message the fake does not hold: Baileys sends it as a protocol
  message and WhatsApp says nothing, so the bridge answers 200 ``{"data": {"key",
  "messageTimestamp"}}`` (the key of the protocol message) all the same.
- ``DELETE /connections/{phone}/messages`` (``{"jid", "key"}``): removes the message (its id
  into ``revoked``), 200 with no body, whether it was there or not.
- ``PATCH /connections/{phone}/presence`` (``{"type", "toJid"?}``): ``(toJid, type)`` into
  ``presences``, 200 with no body.

These three check the key and the phone as the send does; a connection that is down
answers 500 ``Phone number not connected`` (the error Elysia reports: only the send's route
turns it into a 404), a body Elysia's schema refuses 422.

Status webhooks (``BridgeFake``): ``messages.update`` events as the bridge forwards Baileys'
(``{"event": "messages.update", "data": [{"key": {"remoteJid", "fromMe": true, "id"},
"update": {"status"}}], "webhookVerifyToken"}``), the connection's ``webhook_verify_token``
in the body (the bridge signs nothing): status 2 (``SERVER_ACK``), 3 (``DELIVERY_ACK``), 4
(``READ``); a number of ``fail_after_accept`` gets 0 (``ERROR``) with the value as
``messageStubParameters`` (``463``: the account is restricted).

``upsert`` and the message builders write the webhook bodies the bridge posts, byte fields
as ``JSON.stringify`` writes a Node Buffer.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
import secrets
import time
from typing import Any

from aiohttp import web
from cryptography.hazmat.primitives import hashes, padding
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from tests.providers.fakes.wa_bridges import BridgeFake, Sent

_PHONE = re.compile(r"^\+\d{5,15}$")
_MEDIA_ID = re.compile(r"^[A-Z0-9]{1,64}$")
_KINDS = ("image", "video", "document", "audio")
#: Baileys' ``WAMessageStatus`` by name.
STATUSES = {"ERROR": 0, "PENDING": 1, "SERVER_ACK": 2, "DELIVERY_ACK": 3, "READ": 4, "PLAYED": 5}
_INFO = {
    "image": b"WhatsApp Image Keys",
    "video": b"WhatsApp Video Keys",
    "audio": b"WhatsApp Audio Keys",
    "document": b"WhatsApp Document Keys",
}


def encrypt(plain: bytes, media_key: bytes, kind: str) -> bytes:
    """``plain`` as WhatsApp's CDN holds it: AES-256-CBC with keys from HKDF-SHA256 of the
    media key, and the first 10 bytes of the HMAC-SHA256 of iv + ciphertext."""
    keys = HKDF(algorithm=hashes.SHA256(), length=112, salt=None, info=_INFO[kind]).derive(
        media_key
    )
    iv, cipher_key, mac_key = keys[:16], keys[16:48], keys[48:80]
    padder = padding.PKCS7(128).padder()
    encryptor = Cipher(algorithms.AES(cipher_key), modes.CBC(iv)).encryptor()
    body = encryptor.update(padder.update(plain) + padder.finalize()) + encryptor.finalize()
    return body + hmac.new(mac_key, iv + body, hashlib.sha256).digest()[:10]


def node_buffer(data: bytes) -> dict[str, Any]:
    """A Node ``Buffer`` as ``JSON.stringify`` writes it."""
    return {"type": "Buffer", "data": list(data)}


def _validation(message: str) -> web.Response:
    return web.json_response({"type": "validation", "on": "body", "message": message}, status=422)


def _base64(value: Any) -> bytes | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        data = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return None
    return data if base64.b64encode(data).decode() == value else None


class FakeBaileys(BridgeFake):
    """The bridge with one connection, ``phone``, owned by ``api_key``; its webhook's
    ``webhook_verify_token``."""

    status_names = ("SERVER_ACK", "DELIVERY_ACK", "READ", "ERROR")

    def __init__(self, phone: str = "+5511999990000", api_key: str = "") -> None:
        super().__init__()
        self.phone = phone
        self.api_key = api_key or "bk_" + secrets.token_hex(16)
        self.other_phones: set[str] = set()  # connections of another API key (403)
        self.cdn: dict[str, bytes] = {}
        self.cdn_downloads: list[str] = []
        self.idempotent: dict[str, dict[str, Any]] = {}
        self._lose_next = False
        self.webhook_verify_token = "verify-" + secrets.token_hex(6)
        #: ``(jid, message id, new text)`` of every edit.
        self.edits: list[tuple[str, str, str]] = []
        #: Ids of the messages deleted for everyone.
        self.revoked: set[str] = set()
        #: ``(toJid, type)`` of every presence update.
        self.presences: list[tuple[str | None, str]] = []

    def lose_next_answer(self) -> None:
        """The next send goes out, then answers 504 (a send timeout: the answer is lost)."""
        self._lose_next = True

    def add_cdn_media(self, base: str, data: bytes, mime: str, kind: str) -> dict[str, Any]:
        """Encrypt ``data`` onto the CDN under ``base``; the media part of a message as
        Baileys decodes it (byte fields as Node Buffers)."""
        media_key = secrets.token_bytes(32)
        blob = encrypt(data, media_key, kind)
        path = f"/v/t62.7118-24/{secrets.token_hex(8)}.enc"
        self.cdn[path] = blob
        query = "?ccb=11-4&oh=01_Q5Aa&oe=6A1B2C3D&_nc_sid=5e03e0"
        return {
            "url": f"{base}{path}{query}&mms3=true",
            "directPath": path + query,
            "mimetype": mime,
            "mediaKey": node_buffer(media_key),
            "fileSha256": node_buffer(hashlib.sha256(data).digest()),
            "fileEncSha256": node_buffer(hashlib.sha256(blob).digest()),
            "fileLength": {"low": len(data), "high": 0, "unsigned": True},
            "jpegThumbnail": base64.b64encode(b"THUMB").decode(),
            "mediaKeyTimestamp": {"low": 1767225600, "high": 0, "unsigned": False},
        }

    # -- the app --------------------------------------------------------------------------

    def routes(self, router: web.UrlDispatcher) -> None:
        router.add_post("/connections/{phone}/send-message", self._send)
        router.add_patch("/connections/{phone}/messages", self._edit)
        router.add_delete("/connections/{phone}/messages", self._delete)
        router.add_patch("/connections/{phone}/presence", self._presence)
        router.add_get("/media/{message_id}", self._media_file)
        router.add_get("/v/{path:.+}", self._cdn)

    def _auth(self, request: web.Request) -> web.Response | None:
        if request.headers.get("x-api-key") != self.api_key:
            return web.json_response(
                {"error": "Unauthorized", "message": "Valid API key required"}, status=401
            )
        return None

    async def _guarded(self, request: web.Request) -> dict[str, Any] | web.Response:
        """The API key, the phone of the path and a JSON object body, as the bridge checks
        them; the body, or the answer that refuses the call."""
        refused = self._auth(request)
        if refused is not None:
            return refused
        phone = request.match_info["phone"]
        if not _PHONE.match(phone):
            return web.json_response(
                {"type": "validation", "on": "params", "message": "phoneNumber"}, status=422
            )
        if phone in self.other_phones:
            return web.json_response(
                {"error": "Forbidden", "message": "Connection belongs to another API key"},
                status=403,
            )
        try:
            body = await request.json()
        except ValueError:
            return _validation("body is not JSON")
        return body if isinstance(body, dict) else _validation("Expected an object")

    def _keyed(self, request: web.Request, body: dict[str, Any]) -> web.Response | None:
        """An edit's or a delete's ``jid`` and ``key.id`` checked, then the connection."""
        jid, key = body.get("jid"), body.get("key")
        if (
            not isinstance(jid, str)
            or not isinstance(key, dict)
            or not isinstance(key.get("id"), str)
        ):
            return _validation("Expected jid and key.id")
        if request.match_info["phone"] != self.phone or not self.connected:
            return web.Response(status=500, text="Phone number not connected")
        return None

    async def _edit(self, request: web.Request) -> web.StreamResponse:
        body = await self._guarded(request)
        if isinstance(body, web.Response):
            return body
        content = body.get("messageContent")
        text = content.get("text") if isinstance(content, dict) else None
        if not isinstance(text, str):
            return _validation("messageContent.text: expected a string")
        refused = self._keyed(request, body)
        if refused is not None:
            return refused
        jid, mid = body["jid"], body["key"]["id"]
        self.edits.append((jid, mid, text))
        found = next((m for m in self.sent if m.id == mid and m.chat == jid), None)
        if found is not None and found.kind in (None, "image", "video"):
            if found.kind is None:
                found.text = text
            else:
                found.caption = text
        key = {"remoteJid": jid, "fromMe": True, "id": self.message_id()}
        return web.json_response({"data": {"key": key, "messageTimestamp": str(int(time.time()))}})

    async def _delete(self, request: web.Request) -> web.StreamResponse:
        body = await self._guarded(request)
        if isinstance(body, web.Response):
            return body
        refused = self._keyed(request, body)
        if refused is not None:
            return refused
        jid, mid = body["jid"], body["key"]["id"]
        self.sent = [m for m in self.sent if not (m.id == mid and m.chat == jid)]
        self.revoked.add(mid)
        return web.Response(status=200)

    async def _presence(self, request: web.Request) -> web.StreamResponse:
        body = await self._guarded(request)
        if isinstance(body, web.Response):
            return body
        kind, to = body.get("type"), body.get("toJid")
        if kind not in ("unavailable", "available", "composing", "recording", "paused"):
            return _validation("type: expected a presence")
        if to is not None and not isinstance(to, str):
            return _validation("toJid: expected a string")
        if request.match_info["phone"] != self.phone or not self.connected:
            return web.Response(status=500, text="Phone number not connected")
        self.presences.append((to, kind))
        return web.Response(status=200)

    async def _send(self, request: web.Request) -> web.StreamResponse:
        body = await self._guarded(request)
        if isinstance(body, web.Response):
            return body
        phone = request.match_info["phone"]
        jid, content = body.get("jid"), body.get("messageContent")
        if not isinstance(jid, str) or not isinstance(content, dict):
            return _validation("Expected jid and messageContent")
        sent = self._content(jid, content)
        if isinstance(sent, web.Response):
            return sent
        if phone != self.phone or not self.connected:
            return web.Response(status=404, text="Phone number not connected")
        key = body.get("chatwootMessageId")
        if key is not None and str(key) in self.idempotent:
            return web.json_response({"data": self.idempotent[str(key)]})
        sent.body = body
        self.sent.append(sent)
        result = {
            "key": {"remoteJid": jid, "fromMe": True, "id": sent.id},
            "messageTimestamp": str(int(time.time())),
        }
        if key is not None:
            self.idempotent[str(key)] = result
        if self._lose_next:
            self._lose_next = False
            lost = web.Response(status=504, text="Send timed out")
            return await self.answer_then_post(request, lost, sent)
        return await self.answer_then_post(request, web.json_response({"data": result}), sent)

    def _content(self, jid: str, content: dict[str, Any]) -> Sent | web.Response:
        if isinstance(content.get("text"), str):
            return Sent(self.message_id(), jid, text=content["text"])
        for kind in _KINDS:
            if kind in content:
                data = _base64(content[kind])
                if data is None:
                    return _validation(f"messageContent.{kind}: expected base64")
                return Sent(
                    self.message_id(),
                    jid,
                    caption=content.get("caption"),
                    kind=kind,
                    media=data,
                    mime=content.get("mimetype"),
                    name=content.get("fileName"),
                )
        return _validation("messageContent: expected one of the message types")

    async def _media_file(self, request: web.Request) -> web.StreamResponse:
        refused = self._auth(request)
        if refused is not None:
            return refused
        mid = request.match_info["message_id"]
        if not _MEDIA_ID.match(mid):
            return web.json_response({"type": "validation", "on": "params"}, status=422)
        if mid not in self.media:
            return web.Response(status=404, text="File not found")
        return web.Response(body=self.media[mid][0], content_type="application/octet-stream")

    async def _cdn(self, request: web.Request) -> web.StreamResponse:
        path = "/v/" + request.match_info["path"]
        self.cdn_downloads.append(path)
        if path not in self.cdn:
            return web.Response(status=404, text="Not Found")
        return web.Response(body=self.cdn[path], content_type="application/octet-stream")

    def status_post(
        self, sent: Sent, status: str, code: int | str | None
    ) -> tuple[dict[str, str], bytes]:
        """A ``messages.update`` event of ``sent`` with Baileys' status ``status``."""
        update: dict[str, Any] = {"status": STATUSES[status]}
        if status == "ERROR" and code is not None:
            update["messageStubParameters"] = [str(code)]
        key = {"remoteJid": sent.chat, "fromMe": True, "id": sent.id}
        body = {
            "event": "messages.update",
            "data": [{"key": key, "update": update}],
            "webhookVerifyToken": self.webhook_verify_token,
        }
        return {"Content-Type": "application/json"}, json.dumps(body).encode()


# -- webhook bodies -------------------------------------------------------------------------


def message(
    mid: str,
    jid: str,
    content: dict[str, Any],
    *,
    from_me: bool = False,
    participant: str | None = None,
    push_name: str = "Ana",
) -> dict[str, Any]:
    """A ``WAMessage`` as the bridge forwards it."""
    key: dict[str, Any] = {"remoteJid": jid, "fromMe": from_me, "id": mid}
    if participant is not None:
        key["participant"] = participant
    return {
        "key": key,
        "message": {
            **content,
            "messageContextInfo": {"deviceListMetadataVersion": 2},
        },
        "messageTimestamp": 1767225600,
        "pushName": push_name,
        "broadcast": False,
    }


def upsert(
    messages: list[dict[str, Any]],
    token: str,
    *,
    kind: str = "notify",
    inline: dict[str, bytes] | None = None,
    event: str = "messages.upsert",
) -> bytes:
    """The bridge's webhook body for ``messages``; ``inline``: the media it inlined
    (``includeMedia``), by message id."""
    body: dict[str, Any] = {
        "event": event,
        "data": {"messages": messages, "type": kind},
        "webhookVerifyToken": token,
    }
    if inline:
        body["extra"] = {"media": {k: base64.b64encode(v).decode() for k, v in inline.items()}}
    return json.dumps(body).encode()

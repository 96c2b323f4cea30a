"""A fake of Discord's REST API v10 (``/api/v10/channels/{id}/messages``) and of its CDN
(``/attachments/{channel}/{attachment}/{filename}``).

It answers as Discord does: it checks ``Authorization: Bot <token>`` (401 ``{"message":
"401: Unauthorized", "code": 0}``), the 2000-character content limit (400, code 50035 with the
nested ``errors`` tree), an embed description over 4096 (50035 naming
``embeds.0.description``), an empty message (50006), unknown channels (404, 10003), DM
channels of users who blocked the bot (403, 50007), channels without access or permission
(403, 50001 / 50013), uploads over ``max_upload`` (413, 40005). Every answer carries the
``X-RateLimit-*`` headers; ``rate_limit()`` makes the next calls answer 429 with
``retry_after`` in the body, ``Retry-After`` (whole seconds, as Discord rounds it up) and
``X-RateLimit-Scope``. ``fail_next(status)`` gives a 5xx (502: an HTML page, as Discord's
front does).

Edit, delete, typing: ``PATCH`` and ``DELETE /api/v10/channels/{id}/messages/{id}`` replace a
message's ``content`` (200 with the message) or remove it (204), 404 code 10008 ``Unknown
Message`` for a message that is not there; ``POST /api/v10/channels/{id}/typing`` records the
channel (``typing``) and answers 204. They check the token, the channel and the scripted
answers as a create does.

Nonces: a message with ``enforce_nonce: true`` whose nonce was used by the same bot within
``nonce_window`` seconds (of ``clock``) answers the first message (same id, not recorded
again). ``lose_next_answer()`` accepts the next message and drops the connection before the
answer (a send that went out but whose answer was lost); ``drop_next_request()`` drops the
connection before the message is made (a send that never went out).

Inbound attachments: ``add_attachment(channel, data, content_type, filename)`` stores a file a user
attached to an interaction and returns its CDN path (``/attachments/…``, with Discord's
``ex``/``is``/``hm`` signature parameters), served like the bot's own uploads.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import BodyPartReader, web

BOT_ID = "1100000000000000001"


@dataclass
class Attachment:
    id: str
    filename: str
    content_type: str
    data: bytes


@dataclass
class DiscordMessage:
    """One message the fake made."""

    id: str
    channel_id: str
    content: str
    nonce: str | None = None
    attachments: list[Attachment] = field(default_factory=list)
    payload: dict[str, Any] = field(default_factory=dict)


def _error(status: int, message: str, code: int, **extra: Any) -> web.Response:
    return web.json_response({"message": message, "code": code, **extra}, status=status)


def _too_long(limit: int) -> dict[str, Any]:
    return {
        "_errors": [
            {"code": "BASE_TYPE_MAX_LENGTH", "message": f"Must be {limit} or fewer in length."}
        ]
    }


class FakeDiscord:
    """The fake API. ``channels`` exist and accept the bot's messages; ``blocked_dms`` are DM
    channels whose user blocked the bot; ``no_access`` / ``no_permission`` exist but refuse."""

    def __init__(
        self,
        token: str,
        *,
        channels: tuple[str, ...] = ("2200000000000000001", "2200000000000000002"),
        nonce_window: float = 120.0,
        max_upload: int = 10 * 1024 * 1024,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.token = token
        self.channels = set(channels)
        self.blocked_dms: set[str] = set()
        self.no_access: set[str] = set()
        self.no_permission: set[str] = set()
        self.nonce_window = nonce_window
        self.max_upload = max_upload
        self.clock = clock
        self.messages: list[DiscordMessage] = []
        self.calls = 0
        self._nonces: dict[str, tuple[DiscordMessage, float]] = {}
        self._ids = itertools.count(1300000000000000001)
        #: Files users attached (``add_attachment``): attachment id → (channel id, file).
        self.uploads: dict[str, tuple[str, Attachment]] = {}
        self._injected: deque[web.Response] = deque()
        #: Channels the bot sent a typing indicator to, in order.
        self.typing: list[str] = []
        self._lose = 0
        self._drop = 0

    # -- scripting ------------------------------------------------------------------------

    def rate_limit(self, retry_after: float = 1.5, *, glob: bool = False, times: int = 1) -> None:
        for _ in range(times):
            headers = {
                "Retry-After": str(math.ceil(retry_after)),
                "X-RateLimit-Limit": "5",
                "X-RateLimit-Remaining": "0",
                "X-RateLimit-Reset-After": str(retry_after),
                "X-RateLimit-Bucket": "abcd1234",
                "X-RateLimit-Scope": "global" if glob else "user",
            }
            if glob:
                headers["X-RateLimit-Global"] = "true"
            body = {"message": "You are being rate limited.", "retry_after": retry_after}
            body["global"] = glob
            self._injected.append(web.json_response(body, status=429, headers=headers))

    def fail_next(self, status: int, message: str | None = None, code: int = 0) -> None:
        """The next call answers ``status`` (502: an HTML page; others ``{"message",
        "code"}``)."""
        if status == 502 and message is None:
            html = "<html><head><title>502 Bad Gateway</title></head><body>cloudflare</body></html>"
            self._injected.append(web.Response(status=502, text=html, content_type="text/html"))
        else:
            text = message or f"{status}: Internal Server Error"
            self._injected.append(_error(status, text, code))

    def lose_next_answer(self) -> None:
        self._lose += 1

    def drop_next_request(self) -> None:
        self._drop += 1

    def add_attachment(
        self, channel_id: str, data: bytes, content_type: str, filename: str
    ) -> tuple[str, str]:
        """Store a file a user attached (as an interaction's resolved attachment carries
        it); returns its attachment id and its CDN path, signed as Discord signs it."""
        att = Attachment(str(next(self._ids)), filename, content_type, data)
        self.uploads[att.id] = (channel_id, att)
        issued = int(time.time())
        sig = hashlib.sha256(f"{att.id}:{issued}".encode()).hexdigest()
        query = f"ex={issued + 86400:x}&is={issued:x}&hm={sig}"
        return att.id, f"/attachments/{channel_id}/{att.id}/{filename}?{query}"

    def in_channel(self, channel_id: str) -> list[DiscordMessage]:
        return [m for m in self.messages if m.channel_id == channel_id]

    # -- the app --------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.max_upload + 1024 * 1024)
        app.router.add_post("/api/v10/channels/{channel_id}/messages", self._create)
        app.router.add_get("/attachments/{channel_id}/{attachment_id}/{filename}", self._cdn)
        message = "/api/v10/channels/{channel_id}/messages/{message_id}"
        app.router.add_patch(message, self._edit)
        app.router.add_delete(message, self._delete)
        app.router.add_post("/api/v10/channels/{channel_id}/typing", self._typing)
        return app

    def _limit_headers(self) -> dict[str, str]:
        return {
            "X-RateLimit-Limit": "5",
            "X-RateLimit-Remaining": "4",
            "X-RateLimit-Reset": f"{time.time() + 5:.3f}",
            "X-RateLimit-Reset-After": "5.000",
            "X-RateLimit-Bucket": "abcd1234",
        }

    @staticmethod
    def _drop_connection(request: web.Request) -> web.Response:
        assert request.transport is not None
        request.transport.abort()
        return web.Response(status=500)

    async def _payload(self, request: web.Request) -> tuple[dict[str, Any], list[Attachment]]:
        if request.content_type != "multipart/form-data":
            body = await request.json()
            return (body if isinstance(body, dict) else {}), []
        payload: dict[str, Any] = {}
        files: list[Attachment] = []
        reader = await request.multipart()
        async for part in reader:
            if not isinstance(part, BodyPartReader):
                continue
            if part.name == "payload_json":
                payload = json.loads(await part.text())
            elif (part.name or "").startswith("files["):
                data = await part.read()
                ctype = part.headers.get("Content-Type", "application/octet-stream")
                files.append(Attachment("", part.filename or "file", ctype, bytes(data)))
        return payload, files

    async def _create(self, request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != f"Bot {self.token}":
            return _error(401, "401: Unauthorized", 0)
        self.calls += 1
        if self._drop:
            self._drop -= 1
            return self._drop_connection(request)
        if self._injected:
            return self._injected.popleft()
        if request.content_length and request.content_length > self.max_upload:
            return _error(413, "Request entity too large", 40005)
        channel_id = request.match_info["channel_id"]
        if channel_id in self.blocked_dms:
            return _error(403, "Cannot send messages to this user", 50007)
        if channel_id in self.no_access:
            return _error(403, "Missing Access", 50001)
        if channel_id in self.no_permission:
            return _error(403, "Missing Permissions", 50013)
        if channel_id not in self.channels:
            return _error(404, "Unknown Channel", 10003)
        payload, files = await self._payload(request)
        refused = self._validate(payload, files)
        if refused is not None:
            return refused
        nonce = payload.get("nonce")
        if nonce is not None and payload.get("enforce_nonce"):
            seen = self._nonces.get(str(nonce))
            if seen is not None and self.clock() - seen[1] <= self.nonce_window:
                return self._answer(request, seen[0])
        msg = DiscordMessage(
            str(next(self._ids)),
            channel_id,
            str(payload.get("content", "")),
            nonce=None if nonce is None else str(nonce),
            payload=payload,
        )
        for f in files:
            msg.attachments.append(
                Attachment(str(next(self._ids)), f.filename, f.content_type, f.data)
            )
        self.messages.append(msg)
        if nonce is not None:
            self._nonces[str(nonce)] = (msg, self.clock())
        if self._lose:
            self._lose -= 1
            return self._drop_connection(request)
        return self._answer(request, msg)

    def _validate(self, payload: dict[str, Any], files: list[Attachment]) -> web.Response | None:
        errors: dict[str, Any] = {}
        content = payload.get("content")
        if isinstance(content, str) and len(content) > 2000:
            errors["content"] = _too_long(2000)
        nonce = payload.get("nonce")
        if isinstance(nonce, str) and len(nonce) > 25:
            errors["nonce"] = _too_long(25)
        embeds = payload.get("embeds") or []
        for i, embed in enumerate(embeds):
            desc = embed.get("description") if isinstance(embed, dict) else None
            if isinstance(desc, str) and len(desc) > 4096:
                errors.setdefault("embeds", {})[str(i)] = {"description": _too_long(4096)}
        if errors:
            return _error(400, "Invalid Form Body", 50035, errors=errors)
        if not content and not embeds and not files and not payload.get("sticker_ids"):
            return _error(400, "Cannot send an empty message", 50006)
        return None

    def _answer(self, request: web.Request, msg: DiscordMessage) -> web.Response:
        base = f"{request.scheme}://{request.host}"
        body = {
            "id": msg.id,
            "type": 0,
            "channel_id": msg.channel_id,
            "content": msg.content,
            "author": {"id": BOT_ID, "username": "botmesh", "bot": True},
            "attachments": [
                {
                    "id": a.id,
                    "filename": a.filename,
                    "size": len(a.data),
                    "content_type": a.content_type,
                    "url": f"{base}/attachments/{msg.channel_id}/{a.id}/{a.filename}",
                }
                for a in msg.attachments
            ],
            "embeds": [],
            "timestamp": "2026-01-01T00:00:00.000000+00:00",
        }
        if msg.nonce is not None:
            body["nonce"] = msg.nonce
        return web.json_response(body, headers=self._limit_headers())

    async def _cdn(self, request: web.Request) -> web.Response:
        upload = self.uploads.get(request.match_info["attachment_id"])
        if upload is not None and upload[0] == request.match_info["channel_id"]:
            att = upload[1]
            return web.Response(body=att.data, content_type=att.content_type)
        for m in self.messages:
            for a in m.attachments:
                if a.id == request.match_info["attachment_id"]:
                    return web.Response(body=a.data, content_type=a.content_type)
        return web.Response(status=404, text="Not Found")

    # -- edit, delete, typing ----------------------------------------------------------------

    def _refusal(self, request: web.Request) -> web.Response | None:
        """What a call on a channel answers before its own work: the token, a scripted answer,
        the channel's access."""
        if request.headers.get("Authorization") != f"Bot {self.token}":
            return _error(401, "401: Unauthorized", 0)
        self.calls += 1
        if self._injected:
            return self._injected.popleft()
        channel_id = request.match_info["channel_id"]
        if channel_id in self.no_access:
            return _error(403, "Missing Access", 50001)
        if channel_id not in self.channels and channel_id not in self.blocked_dms:
            return _error(404, "Unknown Channel", 10003)
        return None

    def _found(self, request: web.Request) -> DiscordMessage | None:
        channel_id, message_id = request.match_info["channel_id"], request.match_info["message_id"]
        return next((m for m in self.in_channel(channel_id) if m.id == message_id), None)

    async def _edit(self, request: web.Request) -> web.Response:
        refused = self._refusal(request)
        if refused is not None:
            return refused
        msg = self._found(request)
        if msg is None:
            return _error(404, "Unknown Message", 10008)
        payload = await request.json()
        content = payload.get("content")
        if isinstance(content, str) and len(content) > 2000:
            return _error(400, "Invalid Form Body", 50035, errors={"content": _too_long(2000)})
        if isinstance(content, str):
            msg.content = content
        return self._answer(request, msg)

    async def _delete(self, request: web.Request) -> web.Response:
        refused = self._refusal(request)
        if refused is not None:
            return refused
        msg = self._found(request)
        if msg is None:
            return _error(404, "Unknown Message", 10008)
        self.messages.remove(msg)
        return web.Response(status=204, headers=self._limit_headers())

    async def _typing(self, request: web.Request) -> web.Response:
        refused = self._refusal(request)
        if refused is not None:
            return refused
        channel_id = request.match_info["channel_id"]
        if channel_id in self.blocked_dms:
            return _error(403, "Cannot send messages to this user", 50007)
        self.typing.append(channel_id)
        return web.Response(status=204, headers=self._limit_headers())

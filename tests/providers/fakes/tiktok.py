"""A fake of TikTok's Business Messaging API (API for Business v1.3), as the adapter uses it.

Every answer is TikTok's envelope ``{"code", "message", "request_id", "data"}``; an error is
an HTTP 200 with a non-zero ``code``, as TikTok answers: a missing or wrong ``Access-Token``
(40105 "Access token is incorrect or has been revoked."), another ``business_id`` (40001 "No
permission to operate business_id"), a bad parameter (40002: an unknown conversation, a
``recipient_type`` other than ``CONVERSATION``, a text over 6000 characters "text.body:
Length must be between 1 and 6000.", an unknown ``media_id``, an upload over 3 MB or not
JPG/PNG).

- ``POST /open_api/v1.3/business/message/send/``: ``data.message.message_id``; accepted
  messages are recorded (``sent``) and appended to the conversation.
- ``POST …/business/message/media/upload/`` (multipart ``business_id``, ``media_type``,
  ``file``): ``data.media_id``.
- ``GET …/business/message/content/list/?business_id&conversation_id``: the conversation's
  20 latest messages, TikTok's shape (``message_type``, ``image.media_id``…).
- ``POST …/business/message/media/download/``: ``data.download_url`` on this fake
  (``/cdn/<media_id>``), which serves the bytes only with the token in ``x-user`` (403
  otherwise).

``user_message(conversation, kind, data)`` puts a user's message (with media) in a
conversation, as if the user had sent it; ``fail_next(code, message, status=200,
retry_after=None)`` fails the next calls (``status=429`` with ``Retry-After`` for an HTTP
rate limit).
"""

from __future__ import annotations

import secrets
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

BASE = "/open_api/v1.3"


@dataclass
class Failure:
    code: int
    message: str
    status: int = 200
    retry_after: str | None = None


def _snowflake() -> str:
    return str(7_300_000_000_000_000_000 + secrets.randbelow(10**17))


@dataclass
class FakeTikTok:
    """The fake; ``app()`` is the aiohttp application to serve."""

    token: str = field(default_factory=lambda: "act." + secrets.token_hex(24))
    business_id: str = field(default_factory=lambda: "-000" + uuid.uuid4().hex)
    user_id: str = field(default_factory=lambda: "-000" + uuid.uuid4().hex)
    #: conversation id → its messages, oldest first.
    conversations: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    #: Messages the API accepted from the business: the send bodies plus ``message_id``.
    sent: list[dict[str, Any]] = field(default_factory=list)
    uploads: dict[str, tuple[bytes, str]] = field(default_factory=dict)
    received: dict[str, tuple[bytes, str]] = field(default_factory=dict)
    #: The ``x-user`` header of each CDN download.
    cdn_users: list[str | None] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    attempts: int = 0

    def conversation(self) -> str:
        """A new conversation a user started."""
        cid = f"0:1:{_snowflake()}:{_snowflake()}"
        self.conversations[cid] = []
        return cid

    def user_message(
        self, conversation: str, kind: str = "image", data: bytes = b""
    ) -> tuple[str, str]:
        """The user sends an image or video in ``conversation``: ``(message_id, media_id)``."""
        mid, media_id = _snowflake(), "v" + uuid.uuid4().hex
        self.received[media_id] = (data, "image/jpeg" if kind == "image" else "video/mp4")
        self.conversations[conversation].append(
            {
                "message_id": mid,
                "conversation_id": conversation,
                "timestamp": int(time.time() * 1000),
                "message_type": kind.upper(),
                kind: {"media_id": media_id},
                "from_user": {"role": "PERSONAL_ACCOUNT", "id": self.user_id},
                "to_user": {"role": "BUSINESS_ACCOUNT", "id": self.business_id},
            }
        )
        return mid, media_id

    def fail_next(
        self, code: int, message: str, *, status: int = 200, retry_after: str | None = None
    ) -> None:
        self.failures.append(Failure(code, message, status, retry_after))

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post(f"{BASE}/business/message/send/", self._send)
        app.router.add_post(f"{BASE}/business/message/media/upload/", self._upload)
        app.router.add_get(f"{BASE}/business/message/content/list/", self._list)
        app.router.add_post(f"{BASE}/business/message/media/download/", self._download)
        app.router.add_get("/cdn/{media_id}", self._cdn)
        return app

    # -- the envelope ---------------------------------------------------------------------

    @staticmethod
    def _answer(
        code: int, message: str, data: Any = None, *, status: int = 200, **headers: str
    ) -> web.Response:
        body = {
            "code": code,
            "message": message,
            "request_id": uuid.uuid4().hex,
            "data": data or {},
        }
        return web.json_response(body, status=status, headers=headers)

    def _refused(self, request: web.Request, business_id: Any) -> web.Response | None:
        """The error of a call before its own checks (token, business, scripted failure)."""
        self.attempts += 1
        if request.headers.get("Access-Token") != self.token:
            return self._answer(40105, "Access token is incorrect or has been revoked.")
        if self.failures:
            f = self.failures.pop(0)
            extra = {"Retry-After": f.retry_after} if f.retry_after else {}
            return self._answer(f.code, f.message, status=f.status, **extra)
        if business_id != self.business_id:
            return self._answer(40001, "No permission to operate business_id")
        return None

    # -- routes ---------------------------------------------------------------------------

    async def _send(self, request: web.Request) -> web.Response:
        body = await request.json()
        refused = self._refused(request, body.get("business_id"))
        if refused is not None:
            return refused
        if body.get("recipient_type") != "CONVERSATION":
            return self._answer(40002, "recipient_type: Must be one of: CONVERSATION.")
        conversation = self.conversations.get(str(body.get("recipient")))
        if conversation is None:
            return self._answer(40002, "recipient: conversation does not exist.")
        kind = body.get("message_type")
        if kind == "TEXT":
            text = (body.get("text") or {}).get("body")
            if not isinstance(text, str) or not 1 <= len(text) <= 6000:
                return self._answer(40002, "text.body: Length must be between 1 and 6000.")
        elif kind == "IMAGE":
            if (body.get("image") or {}).get("media_id") not in self.uploads:
                return self._answer(40002, "image.media_id: media does not exist.")
        else:
            return self._answer(40002, f"message_type: {kind} is not supported.")
        mid = _snowflake()
        record = {**body, "message_id": mid}
        self.sent.append(record)
        conversation.append(
            {
                "message_id": mid,
                "message_type": kind,
                "from_user": {"role": "BUSINESS_ACCOUNT", "id": self.business_id},
            }
        )
        return self._answer(0, "OK", {"message": {"message_id": mid}})

    async def _upload(self, request: web.Request) -> web.Response:
        form = await request.post()
        refused = self._refused(request, form.get("business_id"))
        if refused is not None:
            return refused
        file = form.get("file")
        if form.get("media_type") != "IMAGE" or not isinstance(file, web.FileField):
            return self._answer(40002, "media_type: Must be one of: IMAGE.")
        data = file.file.read()
        if file.content_type not in ("image/jpeg", "image/png"):
            return self._answer(40002, "file: only JPG and PNG are supported.")
        if len(data) > 3 * 1024 * 1024:
            return self._answer(40002, "file: size exceeds 3MB.")
        media_id = "m" + uuid.uuid4().hex
        self.uploads[media_id] = (data, file.content_type)
        return self._answer(0, "OK", {"media_id": media_id})

    async def _list(self, request: web.Request) -> web.Response:
        refused = self._refused(request, request.query.get("business_id"))
        if refused is not None:
            return refused
        messages = self.conversations.get(request.query.get("conversation_id", ""))
        if messages is None:
            return self._answer(40002, "conversation_id: conversation does not exist.")
        return self._answer(0, "OK", {"messages": list(reversed(messages[-20:]))})

    async def _download(self, request: web.Request) -> web.Response:
        body = await request.json()
        refused = self._refused(request, body.get("business_id"))
        if refused is not None:
            return refused
        for msg in self.conversations.get(str(body.get("conversation_id")), []):
            block = msg.get(str(body.get("media_type", "")).lower())
            if (
                msg["message_id"] == body.get("message_id")
                and isinstance(block, dict)
                and block.get("media_id") == body.get("media_id")
            ):
                url = f"{request.scheme}://{request.host}/cdn/{body['media_id']}"
                return self._answer(0, "OK", {"download_url": url})
        return self._answer(40002, "media_id: media does not exist.")

    async def _cdn(self, request: web.Request) -> web.StreamResponse:
        user = request.headers.get("x-user")
        self.cdn_users.append(user)
        if user != self.token:
            return web.Response(status=403, text="Forbidden")
        found = self.received.get(request.match_info["media_id"])
        if found is None:
            return web.Response(status=404)
        data, mime = found
        return web.Response(body=data, content_type=mime)

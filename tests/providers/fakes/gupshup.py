"""A fake of Gupshup's WhatsApp API, as the adapter uses it.

- ``POST /wa/api/v1/msg`` (form ``channel``, ``source``, ``destination``, ``message`` JSON,
  ``src.name``; header ``apikey``): ``202 {"status": "submitted", "messageId": <uuid>}``,
  recorded in ``messages``. It refuses, with Gupshup's ``{"status": "error", "message": ...}``
  body: a missing or wrong ``apikey`` (401 "Authentication Failed"), a missing field (400
  "Missing ..."), a ``source`` or app name that is not the app's (400), a ``message`` that is
  not JSON or of an unknown type (400 "Invalid Message"), a text over 4096 characters (400
  "Message text too long"), a destination that is not digits (400 "Invalid Destination"), a
  destination in ``not_opted_in`` (400 "User is not opted in").
- ``GET /fm/wamedia/<app>/<id>``: inbound media (``add_media``) served only with the
  ``apikey`` header (401 otherwise), as Gupshup's file manager serves it to the app.

``fail_next(status, message, retry_after=...)`` makes the next sends fail with that status
(429 with ``Retry-After`` when given; a 5xx with Gupshup's body).

Status callbacks: with ``webhook_url`` set (the app's callback URL; Gupshup signs nothing,
so it carries ``?token=<secret>``), an accepted message gets ``message-event`` callbacks
(version 2) posted there once the 202 is written: ``enqueued``, ``sent``, ``delivered``,
``read``. A destination in ``fail_after_accept`` gets ``enqueued`` then ``failed`` with
that code and its reason. ``status_copies``, ``posted``, ``post_status`` and ``settle()``
are as in the Graph fake.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.providers.fakes.status_posts import post_copies

TYPES = frozenset({"text", "image", "video", "audio", "file", "sticker"})

#: Reasons of ``failed`` message-events, by Gupshup's code.
FAILURES = {
    1002: "Number Does Not Exists On WhatsApp",
    1008: "User is not Opted in and Inactive",
    1026: "Message failed to send because more than 24 hours have passed since the customer "
    "last replied to this number",
}


@dataclass
class Failure:
    status: int
    message: str
    retry_after: str | None = None


@dataclass
class FakeGupshup:
    """The fake; ``app()`` is the aiohttp application to serve."""

    api_key: str = field(default_factory=lambda: secrets.token_hex(16))
    source: str = "917834811114"
    app_name: str = "DemoAPI"
    #: Every message accepted: the form's fields, ``message`` decoded, ``id`` the messageId.
    messages: list[dict[str, Any]] = field(default_factory=list)
    media: dict[str, tuple[bytes, str]] = field(default_factory=dict)
    #: The ``apikey`` header of each media download (``None``: none).
    media_keys: list[str | None] = field(default_factory=list)
    not_opted_in: set[str] = field(default_factory=set)
    failures: list[Failure] = field(default_factory=list)
    #: Every send request, accepted or not.
    attempts: int = 0
    #: Where message-events are posted (``None``: nowhere).
    webhook_url: str | None = None
    #: Destination → Gupshup code of a ``failed`` event after the message was accepted.
    fail_after_accept: dict[str, int] = field(default_factory=dict)
    #: How many times each message-event is posted.
    status_copies: int = 1
    #: ``(messageId, event type, HTTP status the callback URL answered)`` of every post.
    posted: list[tuple[str, str, int]] = field(default_factory=list)
    _posting: set[asyncio.Task[None]] = field(default_factory=set)

    def fail_next(self, status: int, message: str, *, retry_after: str | None = None) -> None:
        self.failures.append(Failure(status, message, retry_after))

    def add_media(self, data: bytes, mime: str) -> str:
        """Serve ``data``; its path on the fake (``/fm/wamedia/<app>/<id>``)."""
        mid = uuid.uuid4().hex
        self.media[mid] = (data, mime)
        return f"/fm/wamedia/{self.app_name}/{mid}"

    def texts(self, destination: str) -> list[str]:
        return [
            str(m["message"].get("text") or m["message"].get("caption") or "")
            for m in self.messages
            if m["destination"] == destination
        ]

    def event_body(
        self, message_id: str, destination: str, status: str, *, code: int | None = None
    ) -> dict[str, Any]:
        """A version-2 ``message-event`` as Gupshup posts it."""
        wamid = "gBEGkYiEB1VX" + message_id.replace("-", "")[:16]
        item: dict[str, Any] = {"id": wamid, "gsId": message_id, "type": status}
        if status == "enqueued":
            item = {"id": message_id, "type": status}
            inner: dict[str, Any] = {"whatsappMessageId": wamid, "type": "session"}
        elif status == "failed":
            item = {"id": message_id, "type": status}
            number = code or 1002
            inner = {"code": number, "reason": FAILURES.get(number, f"Error {number}")}
        else:
            inner = {"ts": int(time.time())}
        return {
            "app": self.app_name,
            "timestamp": int(time.time() * 1000),
            "version": 2,
            "type": "message-event",
            "payload": {**item, "destination": destination, "payload": inner},
        }

    async def post_status(
        self, message_id: str, recipient: str, status: str, *, code: int | None = None
    ) -> int:
        """Post one message-event (``status_copies`` times); the HTTP status of the last
        answer (0: the URL could not be reached)."""
        if self.webhook_url is None:
            raise RuntimeError("FakeGupshup.webhook_url is not set")
        body = self.event_body(message_id, recipient, status, code=code)
        return await post_copies(
            self.webhook_url,
            copies=self.status_copies,
            posted=self.posted,
            about=(message_id, status),
            json=body,
        )

    def sequence(self, destination: str) -> list[tuple[str, int | None]]:
        """The message-events an accepted message to ``destination`` gets, in order."""
        code = self.fail_after_accept.get(destination)
        if code is not None:
            return [("enqueued", None), ("failed", code)]
        return [("enqueued", None), ("sent", None), ("delivered", None), ("read", None)]

    async def _post_sequence(self, message_id: str, destination: str) -> None:
        for status, code in self.sequence(destination):
            await self.post_status(message_id, destination, status, code=code)

    async def settle(self) -> None:
        """Wait until every event sequence under way has been posted."""
        while self._posting:
            await asyncio.gather(*list(self._posting))

    async def _answer_then_post(self, request: web.Request, response: web.Response) -> web.Response:
        """Write an accepted send's 202, then start posting its message-events."""
        if response.status != 202 or self.webhook_url is None:
            return response
        await response.prepare(request)
        await response.write_eof()
        sent = self.messages[-1]
        task = asyncio.create_task(self._post_sequence(sent["id"], sent["destination"]))
        self._posting.add(task)
        task.add_done_callback(self._posting.discard)
        return response

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/wa/api/v1/msg", self._send)
        app.router.add_get("/fm/wamedia/{app}/{mid}", self._media)
        return app

    @staticmethod
    def _error(status: int, message: str, **headers: str) -> web.Response:
        return web.json_response(
            {"status": "error", "message": message}, status=status, headers=headers
        )

    async def _send(self, request: web.Request) -> web.Response:
        self.attempts += 1
        if request.headers.get("apikey") != self.api_key:
            return self._error(401, "Authentication Failed")
        form = await request.post()
        if self.failures:
            f = self.failures.pop(0)
            extra = {"Retry-After": f.retry_after} if f.retry_after else {}
            return self._error(f.status, f.message, **extra)
        fields = {k: str(form.get(k, "")) for k in ("channel", "source", "destination")}
        fields["src.name"] = str(form.get("src.name", ""))
        for name, value in (*fields.items(), ("message", str(form.get("message", "")))):
            if not value:
                return self._error(400, f"Missing {name}")
        if fields["channel"] != "whatsapp":
            return self._error(400, "Invalid Channel")
        if fields["source"] != self.source or fields["src.name"] != self.app_name:
            return self._error(400, "Invalid App Details")
        try:
            message = json.loads(str(form["message"]))
        except ValueError:
            return self._error(400, "Invalid Message")
        if not isinstance(message, dict) or message.get("type") not in TYPES:
            return self._error(400, "Invalid Message")
        if message["type"] == "text" and len(str(message.get("text", ""))) > 4096:
            return self._error(400, "Message text too long")
        if message["type"] != "text" and not (message.get("url") or message.get("originalUrl")):
            return self._error(400, "Invalid Message")
        dest = fields["destination"]
        if not dest.isdigit():
            return self._error(400, "Invalid Destination")
        if dest in self.not_opted_in:
            return self._error(400, "User is not opted in")
        mid = str(uuid.uuid4())
        self.messages.append({**fields, "message": message, "id": mid, "form": dict(form)})
        response = web.json_response({"status": "submitted", "messageId": mid}, status=202)
        return await self._answer_then_post(request, response)

    async def _media(self, request: web.Request) -> web.StreamResponse:
        key = request.headers.get("apikey")
        self.media_keys.append(key)
        if key != self.api_key:
            return web.Response(status=401, text="Unauthorized")
        found = self.media.get(request.match_info["mid"])
        if found is None:
            return web.Response(status=404)
        data, mime = found
        return web.Response(body=data, content_type=mime)

"""A fake of HighLevel's LeadConnector conversations API, as the adapter uses it.

- ``POST /conversations/messages`` (JSON ``type``, ``contactId``, ``message``,
  ``attachments``; headers ``Authorization: Bearer <token>`` and ``Version``): ``201
  {"conversationId", "messageId", "msg": "Message queued successfully."}``, recorded in
  ``messages`` (one conversation per contact). It refuses, with HighLevel's ``{"statusCode",
  "message", "error"}`` body: a missing or wrong token (401 "Invalid JWT"), no ``Version``
  header (400), a type it does not know or a message with neither text nor attachment (422,
  ``message`` a list as NestJS validation gives it), a contact it does not know (400
  "Contact not found"), a contact in ``dnd`` (400 "Cannot send message as DND is active for
  <type>.").
- ``GET /msgsndr/<location>/media/<id>``: attachments (``add_media``), public as
  HighLevel's storage serves them.

``fail_next(status, message, retry_after=...)`` makes the next sends fail with that status.
"""

from __future__ import annotations

import secrets
import uuid
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

TYPES = frozenset({"SMS", "WhatsApp", "Email", "FB", "IG", "GMB", "Live_Chat", "Custom"})
_REASONS = {400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 422: "Unprocessable Entity"}


@dataclass
class Failure:
    status: int
    message: str
    retry_after: str | None = None


def _id() -> str:
    """A HighLevel id: 20 alphanumerics."""
    return secrets.token_urlsafe(16).replace("-", "a").replace("_", "b")[:20]


@dataclass
class FakeHighLevel:
    """The fake; ``app()`` is the aiohttp application to serve."""

    token: str = field(default_factory=lambda: "pit-" + str(uuid.uuid4()))
    location_id: str = "ve9EPM428h8vShlRW1KT"
    contacts: set[str] = field(default_factory=lambda: {"cI08i1Bls3iTB9bKgFJh"})
    dnd: set[str] = field(default_factory=set)
    messages: list[dict[str, Any]] = field(default_factory=list)
    conversations: dict[str, str] = field(default_factory=dict)
    media: dict[str, tuple[bytes, str]] = field(default_factory=dict)
    failures: list[Failure] = field(default_factory=list)
    attempts: int = 0

    def fail_next(self, status: int, message: str, *, retry_after: str | None = None) -> None:
        self.failures.append(Failure(status, message, retry_after))

    def add_media(self, data: bytes, mime: str, ext: str = "jpg") -> str:
        """Serve ``data``; its path on the fake."""
        mid = uuid.uuid4().hex
        self.media[mid] = (data, mime)
        return f"/msgsndr/{self.location_id}/media/{mid}.{ext}"

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/conversations/messages", self._send)
        app.router.add_get("/msgsndr/{location}/media/{name}", self._media)
        return app

    @staticmethod
    def _error(status: int, message: str | list[str], **headers: str) -> web.Response:
        body: dict[str, Any] = {"statusCode": status, "message": message}
        if status in _REASONS:
            body["error"] = _REASONS[status]
        return web.json_response(body, status=status, headers=headers)

    async def _send(self, request: web.Request) -> web.Response:
        self.attempts += 1
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return self._error(401, "Invalid JWT")
        if not request.headers.get("Version"):
            return self._error(400, "Version header was not found")
        if self.failures:
            f = self.failures.pop(0)
            extra = {"Retry-After": f.retry_after} if f.retry_after else {}
            return self._error(f.status, f.message, **extra)
        try:
            body = await request.json()
        except ValueError:
            return self._error(400, "Unexpected token in JSON")
        problems = []
        if body.get("type") not in TYPES:
            problems.append(f"type must be one of the following values: {', '.join(sorted(TYPES))}")
        if not isinstance(body.get("contactId"), str):
            problems.append("contactId must be a string")
        attachments = body.get("attachments", [])
        if not isinstance(attachments, list) or not all(isinstance(a, str) for a in attachments):
            problems.append("attachments must be an array of strings")
        if not body.get("message") and not attachments:
            problems.append("message should not be empty")
        if problems:
            return self._error(422, problems)
        contact = body["contactId"]
        if contact not in self.contacts:
            return self._error(400, "Contact not found")
        if contact in self.dnd:
            return self._error(400, f"Cannot send message as DND is active for {body['type']}.")
        conversation = self.conversations.setdefault(contact, _id())
        mid = _id()
        self.messages.append({**body, "id": mid, "conversationId": conversation})
        return web.json_response(
            {
                "conversationId": conversation,
                "messageId": mid,
                "msg": "Message queued successfully.",
            },
            status=201,
        )

    async def _media(self, request: web.Request) -> web.StreamResponse:
        found = self.media.get(request.match_info["name"].rsplit(".", 1)[0])
        if found is None:
            return web.Response(status=404)
        data, mime = found
        return web.Response(body=data, content_type=mime)

"""A fake of WPPConnect server, the routes the adapter uses.

- ``POST /api/{session}/send-message`` (``{"phone", "isGroup", "isLid", "message",
  "options"?}``), ``/send-file`` (``"path"``: a URL WPPConnect fetches) and
  ``/send-file-base64`` (``"base64": "data:<mime>;base64,…"``): 201 ``{"status": "success",
  "response": [message], "mapper": "return"}``, the message's ``id`` ``true_<jid>_<hex>``.
- ``GET /api/{session}/get-media-by-message/{messageId}``: 200 ``{"base64", "mimetype"}`` for a
  message whose media the fake holds (``media``), else 400 ``Message not found``.

``verifyToken`` first: no ``Authorization`` 401 ``Token is not present…``, another token
401 ``Check that the Session and Token are correct``. Then ``statusConnection``: a session
that is not running (``connected = False``) 404 ``{"status": "Disconnected"}``; a number
without WhatsApp 400 ``{"status": "Connected", "message": "O número … não existe."}``. A
file that is neither a URL nor a data URI 500 ``Erro ao enviar a mensagem.``, as the
controller's catch answers.

Status webhooks (``BridgeFake``): ``onack`` events, the wa-js message with its new ``ack``
(``{"event": "onack", "session", "id": {"fromMe": true, "remote", "id", "_serialized"},
"ack", "from", "to", "t", "body", …}``), posted to ``webhook_url`` as it is: WPPConnect
signs nothing, the secret rides in the URL the session was given
(``…/wppconnect?secret=…``). ack 1 (``SENT``), 2 (``RECEIVED``), 3 (``READ``); a number of
``fail_after_accept`` gets its value as the ack (a negative one: ``-1`` is ``FAILED``).

Edit, delete, typing, behind the same guards: ``POST /api/{session}/edit-message`` (``{"id",
"newText", "options"?}``) replaces the text (or an image's or video's caption) of a message
the fake sent, 201 ``{"status": "success", "response": message}``; a message it does not
hold (or cannot edit: a document, audio) 500 ``Erro ao enviar a mensagem.`` with the empty
``error`` the controller's catch gives (wa-js' error does not cross puppeteer).
``POST /api/{session}/delete-message`` (``{"phone", "isGroup", "messageId"}``, the phone
through ``statusConnection``) removes it (``revoked`` keeps its id) and answers 200 ``{"status":
"success", "response": {"message": "Message deleted"}}``, again for one revoked already; an
id the fake never sent 500 ``Error on delete message``. ``POST /api/{session}/typing``
(``{"phone", "isGroup", "value"}``) records ``(chat, value)`` in ``typings``, 200
``{"status": "success"}``.

``onmessage`` writes the webhook body WPPConnect posts for a wa-js message.
"""

from __future__ import annotations

import base64
import binascii
import json
import secrets
import time
from typing import Any

from aiohttp import web

from tests.providers.fakes.wa_bridges import BridgeFake, Sent, digits

ME = "5511999990000@c.us"
#: wa-js' ``AckType`` by name.
ACKS = {"FAILED": -1, "CLOCK": 0, "SENT": 1, "RECEIVED": 2, "READ": 3, "PLAYED": 4}


def _status(status: int, state: str, message: str) -> web.Response:
    return web.json_response({"response": None, "status": state, "message": message}, status=status)


def _send_error(error: str | None) -> web.Response:
    """The messages controller's catch; ``None``: an error puppeteer brought back empty."""
    detail = {} if error is None else {"message": error}
    return web.json_response(
        {"status": "Error", "message": "Erro ao enviar a mensagem.", "error": detail},
        status=500,
    )


class FakeWppConnect(BridgeFake):
    """A WPPConnect server with one session, ``session``, and its bearer ``token``."""

    status_names = ("SENT", "RECEIVED", "READ", "FAILED")

    def __init__(self, session: str = "support") -> None:
        super().__init__()
        self.session = session
        self.token = "$2b$10$" + secrets.token_urlsafe(40).replace("-", "x")
        #: Ids of the messages revoked (deleted for everyone).
        self.revoked: set[str] = set()
        #: ``(chat, value)`` of every ``typing`` call.
        self.typings: list[tuple[str, bool]] = []

    # -- the app --------------------------------------------------------------------------

    def routes(self, router: web.UrlDispatcher) -> None:
        for route in ("send-message", "send-file", "send-file-base64"):
            router.add_post(f"/api/{{session}}/{route}", self._send)
        router.add_post("/api/{session}/edit-message", self._edit)
        router.add_post("/api/{session}/delete-message", self._delete)
        router.add_post("/api/{session}/typing", self._typing)
        router.add_get("/api/{session}/get-media-by-message/{message_id}", self._media_of)

    def _auth(self, request: web.Request) -> web.Response | None:
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        if scheme != "Bearer" or not token:
            return web.json_response(
                {"message": "Token is not present. Check your header and try again"}, status=401
            )
        if request.match_info["session"] != self.session or token != self.token:
            return web.json_response(
                {"error": "Check that the Session and Token are correct"}, status=401
            )
        return None

    def _chat(self, body: dict[str, Any]) -> str | web.Response:
        """``statusConnection``: the JID of ``phone``, or the error it answers."""
        if not self.connected:
            return _status(404, "Disconnected", "A sessão do WhatsApp não está ativa.")
        phone = body.get("phone")
        if not isinstance(phone, str) or not phone or "," in phone or ";" in phone:
            return _send_error("one phone per call in this fake")
        if body.get("isGroup"):
            return f"{phone.split('@', 1)[0]}@g.us"
        number = digits(phone)
        if not self.exists(number):
            return _status(400, "Connected", f"O número {number} não existe.")
        return f"{number}@{'lid' if body.get('isLid') else 'c.us'}"

    async def _send(self, request: web.Request) -> web.StreamResponse:
        refused = self._auth(request)
        if refused is not None:
            return refused
        try:
            body = await request.json()
        except ValueError:
            return _send_error("body is not JSON")
        chat = self._chat(body)
        if isinstance(chat, web.Response):
            return chat
        mid = f"true_{chat}_{self.message_id()}"
        route = request.path.rsplit("/", 1)[-1]
        sent = Sent(mid, chat, body=body)
        if route == "send-message":
            sent.text = body.get("message")
            result: dict[str, Any] = {"id": mid, "ack": 0, "body": sent.text, "type": "chat"}
        else:
            problem = self._file(sent, route, body)
            if problem is not None:
                return _send_error(problem)
            result = {"ack": 0, "id": mid, "sendMsgResult": {"messageSendResult": "OK"}}
        self.sent.append(sent)
        answer = {"status": "success", "response": [{**result, "from": ME, "to": chat}]}
        response = web.json_response({**answer, "mapper": "return"}, status=201)
        return await self.answer_then_post(request, response, sent)

    def _file(self, sent: Sent, route: str, body: dict[str, Any]) -> str | None:
        """Fill ``sent`` with the file of a send-file call; what is wrong, if anything."""
        sent.caption, sent.name = body.get("caption"), body.get("filename")
        if route == "send-file":
            path = body.get("path")
            if not isinstance(path, str) or not path.startswith(("http://", "https://")):
                return "ENOENT: no such file or directory"
            sent.media = path
            return None
        raw = body.get("base64")
        head, _, data = raw.partition(",") if isinstance(raw, str) else ("", "", "")
        if not (head.startswith("data:") and head.endswith(";base64")):
            return "Invalid base64 (expected a data URI)"
        try:
            sent.media = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            return "Invalid base64"
        sent.mime = head[5:].removesuffix(";base64")
        return None

    async def _guarded(self, request: web.Request) -> dict[str, Any] | web.Response:
        """``verifyToken``, then the JSON body (a 500 as the controller's catch gives)."""
        refused = self._auth(request)
        if refused is not None:
            return refused
        try:
            body = await request.json()
        except ValueError:
            return _send_error("body is not JSON")
        return body if isinstance(body, dict) else _send_error("body is not an object")

    async def _edit(self, request: web.Request) -> web.StreamResponse:
        body = await self._guarded(request)
        if isinstance(body, web.Response):
            return body
        if not self.connected:
            return _status(404, "Disconnected", "A sessão do WhatsApp não está ativa.")
        mid, text = body.get("id"), body.get("newText")
        found = next((m for m in self.sent if m.id == mid), None)
        if found is None or not isinstance(text, str) or found.kind not in (None, "image", "video"):
            return _send_error(None)
        if found.text is not None:
            found.text = text.strip()
        else:
            found.caption = text.strip()
        edited = {
            "id": found.id,
            "body": text.strip(),
            "type": "chat",
            "from": ME,
            "to": found.chat,
        }
        return web.json_response(
            {"status": "success", "response": edited, "mapper": "return"}, status=201
        )

    async def _delete(self, request: web.Request) -> web.StreamResponse:
        body = await self._guarded(request)
        if isinstance(body, web.Response):
            return body
        chat = self._chat(body)
        if isinstance(chat, web.Response):
            return chat
        mid = body.get("messageId")
        found = next((m for m in self.sent if m.id == mid and m.chat == chat), None)
        if found is None and mid not in self.revoked:
            return web.json_response(
                {"status": "error", "message": "Error on delete message", "error": {}}, status=500
            )
        if found is not None:
            self.sent.remove(found)
            self.revoked.add(found.id)
        return web.json_response({"status": "success", "response": {"message": "Message deleted"}})

    async def _typing(self, request: web.Request) -> web.StreamResponse:
        body = await self._guarded(request)
        if isinstance(body, web.Response):
            return body
        chat = self._chat(body)
        if isinstance(chat, web.Response):
            return chat
        self.typings.append((chat, body.get("value", True) is not False))
        return web.json_response({"status": "success"})

    async def _media_of(self, request: web.Request) -> web.StreamResponse:
        refused = self._auth(request)
        if refused is not None:
            return refused
        mid = request.match_info["message_id"]
        if mid not in self.media:
            return web.json_response(
                {"status": "error", "message": "Message not found"}, status=400
            )
        data, mime = self.media[mid]
        return web.json_response({"base64": base64.b64encode(data).decode(), "mimetype": mime})

    def status_post(
        self, sent: Sent, status: str, code: int | str | None
    ) -> tuple[dict[str, str], bytes]:
        """An ``onack`` event of ``sent``: ack ``code`` for a failure, else the ack named."""
        ack = int(code) if status == "FAILED" and code is not None else ACKS[status]
        body = {
            "event": "onack",
            "session": self.session,
            "id": {
                "fromMe": True,
                "remote": sent.chat,
                "id": sent.id.rsplit("_", 1)[-1],
                "_serialized": sent.id,
            },
            "body": sent.text or sent.caption or "",
            "type": "chat" if sent.text is not None else "image",
            "t": int(time.time()),
            "from": ME,
            "to": sent.chat,
            "self": "out",
            "ack": ack,
            "isNewMsg": True,
            "fromMe": True,
        }
        return {"Content-Type": "application/json"}, json.dumps(body).encode()


# -- webhook bodies -------------------------------------------------------------------------


def onmessage(mid: str, chat: str, kind: str, *, session: str = "support", **more: Any) -> bytes:
    """The webhook body WPPConnect posts for an incoming wa-js message."""
    return json.dumps(
        {
            "event": "onmessage",
            "session": session,
            "id": mid,
            "viewed": False,
            "body": "",
            "type": kind,
            "t": 1767225600,
            "notifyName": "Ana",
            "from": chat,
            "to": ME,
            "self": "in",
            "ack": 1,
            "isNewMsg": True,
            "star": False,
            "fromMe": False,
            "isGroupMsg": chat.endswith("@g.us"),
            "sender": {"id": chat, "pushname": "Ana", "isMe": False},
            "chatId": chat,
            "mediaData": {},
            **more,
        }
    ).encode()

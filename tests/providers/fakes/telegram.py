"""A fake of the Telegram Bot API: ``/bot<token>/<method>`` and ``/file/bot<token>/<path>``.

It answers as Telegram does: ``{"ok": true, "result": ...}`` or ``{"ok": false, "error_code":
N, "description": ..., "parameters": {...}}``. It checks the token (401 Unauthorized), the
text and caption limits (4096 / 1024: "message is too long", "message caption is too long"),
known chats ("chat not found"), blocked chats (403 "bot was blocked by the user" or another
reason), file ids ("wrong file identifier/HTTP URL specified"), the upload size (413), the
message a reply points to ("message to be replied not found"); it can be told to flood (429
with ``parameters.retry_after``), to fail (500 JSON, 502 an HTML page as Telegram's front
does), or to give any error once. Parameters come as JSON, a form or multipart, as the real
API takes them. Accepted messages are recorded (``messages``), with message ids counting up
per chat; uploaded files are stored and served by ``file_id`` through ``getFile``.

``editMessageText`` replaces a text message's text (400 "message to edit not found", "message
is not modified", "there is no text in the message to edit"), ``deleteMessage`` removes a
message (400 "message to delete not found"), ``sendChatAction`` records the action
(``actions``); all three check the chat as a send does.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from aiohttp import BodyPartReader, web

MEDIA_METHODS = {
    "sendPhoto": "photo",
    "sendDocument": "document",
    "sendVideo": "video",
    "sendAudio": "audio",
    "sendVoice": "voice",
}


@dataclass
class StoredFile:
    file_id: str
    file_unique_id: str
    data: bytes
    mime: str
    path: str


@dataclass
class SentMessage:
    """One message the fake accepted."""

    chat_id: str
    message_id: int
    method: str
    text: str | None = None
    caption: str | None = None
    #: The file_id of the media (uploaded, or as given); the URL for a media by URL.
    media: str | None = None
    options: dict[str, Any] = field(default_factory=dict)


def _fail(status: int, description: str, **parameters: Any) -> web.Response:
    body: dict[str, Any] = {"ok": False, "error_code": status, "description": description}
    if parameters:
        body["parameters"] = parameters
    return web.json_response(body, status=status)


class FakeTelegram:
    """The fake API. ``chats`` are the chats the bot may write to (others: "chat not found")."""

    def __init__(
        self,
        token: str,
        *,
        chats: tuple[str, ...] = ("1001", "1002"),
        max_upload: int = 50 * 1024 * 1024,
    ) -> None:
        self.token = token
        self.chats = set(chats)
        self.blocked: dict[str, str] = {}
        self.max_upload = max_upload
        self.messages: list[SentMessage] = []
        self.files: dict[str, StoredFile] = {}
        self.bad_urls: set[str] = set()
        self.html_urls: set[str] = set()
        self.calls: list[str] = []
        #: ``(chat_id, action)`` of every accepted ``sendChatAction``.
        self.actions: list[tuple[str, str]] = []
        self._next_id: dict[str, itertools.count[int]] = {}
        self._file_seq = itertools.count(1)
        self._injected: deque[web.Response] = deque()

    # -- scripting ------------------------------------------------------------------------

    def block(self, chat_id: str, reason: str = "bot was blocked by the user") -> None:
        """Writes to ``chat_id`` get 403 "Forbidden: <reason>"."""
        self.blocked[chat_id] = reason

    def flood(self, retry_after: int, times: int = 1) -> None:
        """The next ``times`` calls get 429 with ``parameters.retry_after``."""
        for _ in range(times):
            self._injected.append(
                _fail(
                    429,
                    f"Too Many Requests: retry after {retry_after}",
                    retry_after=retry_after,
                )
            )

    def fail_next(self, status: int, description: str | None = None, **parameters: Any) -> None:
        """The next call fails with ``status``: 502 answers an HTML page (Telegram's front),
        others the JSON error with ``description`` and ``parameters``."""
        if status == 502 and description is None:
            html = "<html><head><title>502 Bad Gateway</title></head><body>nginx</body></html>"
            self._injected.append(web.Response(status=502, text=html, content_type="text/html"))
        else:
            self._injected.append(
                _fail(status, description or "Internal Server Error", **parameters)
            )

    def add_file(self, data: bytes, mime: str = "application/octet-stream") -> str:
        """Store a file as if a user had sent it to the bot; its ``file_id``."""
        return self._store(data, mime).file_id

    def sent_to(self, chat_id: str) -> list[SentMessage]:
        return [m for m in self.messages if m.chat_id == chat_id]

    # -- the app --------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.max_upload + 1024 * 1024)
        app.router.add_route("*", "/bot{token}/{method}", self._method)
        app.router.add_get("/file/bot{token}/{path:.+}", self._file)
        return app

    def _store(self, data: bytes, mime: str) -> StoredFile:
        n = next(self._file_seq)
        kind = mime.split("/", 1)[0]
        ext = {"image": "jpg", "video": "mp4", "audio": "ogg"}.get(kind, "bin")
        f = StoredFile(f"FILE{n:04d}xyz", f"U{n:04d}", data, mime, f"{kind}s/file_{n}.{ext}")
        self.files[f.file_id] = f
        return f

    async def _params(self, request: web.Request) -> dict[str, Any]:
        params: dict[str, Any] = dict(request.query)
        if request.content_type == "application/json":
            body = await request.json()
            params.update(body)
        elif request.content_type == "multipart/form-data":
            reader = await request.multipart()
            async for part in reader:
                if not isinstance(part, BodyPartReader):
                    continue
                name = part.name or ""
                if part.filename is not None:
                    data = await part.read()
                    params[name] = ("upload", data, part.headers.get("Content-Type", ""))
                else:
                    params[name] = await part.text()
        elif request.body_exists:
            params.update(await request.post())
        return params

    async def _method(self, request: web.Request) -> web.Response:
        if request.match_info["token"] != self.token:
            return _fail(401, "Unauthorized")
        method = request.match_info["method"]
        self.calls.append(method)
        if self._injected:
            return self._injected.popleft()
        if request.content_length and request.content_length > self.max_upload:
            return _fail(413, "Request Entity Too Large")
        params = await self._params(request)
        if method == "getFile":
            f = self.files.get(str(params.get("file_id", "")))
            if f is None:
                return _fail(400, "Bad Request: invalid file_id")
            result = {
                "file_id": f.file_id,
                "file_unique_id": f.file_unique_id,
                "file_size": len(f.data),
                "file_path": f.path,
            }
            return web.json_response({"ok": True, "result": result})
        if method == "sendMessage" or method in MEDIA_METHODS:
            return self._send(method, params)
        if method in EDIT_METHODS:
            return EDIT_METHODS[method](self, params)
        return _fail(404, "Not Found")

    def _send(self, method: str, params: dict[str, Any]) -> web.Response:
        chat_id = str(params.get("chat_id", ""))
        if not chat_id:
            return _fail(400, "Bad Request: chat_id is empty")
        if chat_id in self.blocked:
            return _fail(403, f"Forbidden: {self.blocked[chat_id]}")
        if chat_id not in self.chats:
            return _fail(400, "Bad Request: chat not found")
        reply_to = params.get("reply_to_message_id")
        if reply_to is not None and not any(
            str(m.message_id) == str(reply_to) for m in self.sent_to(chat_id)
        ):
            return _fail(400, "Bad Request: message to be replied not found")
        text = params.get("text")
        caption = params.get("caption")
        media: str | None = None
        result: dict[str, Any] = {}
        if method == "sendMessage":
            if not text:
                return _fail(400, "Bad Request: message text is empty")
            if len(str(text)) > 4096:
                return _fail(400, "Bad Request: message is too long")
        else:
            if caption is not None and len(str(caption)) > 1024:
                return _fail(400, "Bad Request: message caption is too long")
            kind = MEDIA_METHODS[method]
            value = params.get(kind)
            if isinstance(value, tuple):
                _, data, mime = value
                f = self._store(data, mime or "application/octet-stream")
                media = f.file_id
            elif isinstance(value, str) and value.startswith(("http://", "https://")):
                if value in self.bad_urls:
                    return _fail(400, "Bad Request: failed to get HTTP URL content")
                if value in self.html_urls:
                    return _fail(400, "Bad Request: wrong type of the web page content")
                media = value
            elif isinstance(value, str) and value in self.files:
                media = value
            else:
                return _fail(400, "Bad Request: wrong file identifier/HTTP URL specified")
            result[kind] = {"file_id": media}
        counter = self._next_id.setdefault(chat_id, itertools.count(1))
        mid = next(counter)
        options = {
            k: v
            for k, v in params.items()
            if k not in ("chat_id", "text", "caption", *MEDIA_METHODS.values())
        }
        self.messages.append(
            SentMessage(
                chat_id, mid, method, text=text, caption=caption, media=media, options=options
            )
        )
        result.update({"message_id": mid, "chat": {"id": int(chat_id)}, "date": 1767225600})
        if text is not None:
            result["text"] = text
        return web.json_response({"ok": True, "result": result})

    async def _file(self, request: web.Request) -> web.Response:
        if request.match_info["token"] != self.token:
            return _fail(401, "Unauthorized")
        path = request.match_info["path"]
        for f in self.files.values():
            if f.path == path:
                return web.Response(body=f.data, content_type=f.mime)
        return _fail(404, "Not Found")


# -- edit, delete, chat actions ----------------------------------------------------------------


def _chat_problem(fake: FakeTelegram, params: dict[str, Any]) -> web.Response | None:
    chat_id = str(params.get("chat_id", ""))
    if not chat_id:
        return _fail(400, "Bad Request: chat_id is empty")
    if chat_id in fake.blocked:
        return _fail(403, f"Forbidden: {fake.blocked[chat_id]}")
    if chat_id not in fake.chats:
        return _fail(400, "Bad Request: chat not found")
    return None


def _find(fake: FakeTelegram, params: dict[str, Any]) -> SentMessage | None:
    chat_id, mid = str(params.get("chat_id", "")), str(params.get("message_id", ""))
    return next((m for m in fake.sent_to(chat_id) if str(m.message_id) == mid), None)


def _edit_text(fake: FakeTelegram, params: dict[str, Any]) -> web.Response:
    problem = _chat_problem(fake, params)
    if problem is not None:
        return problem
    found = _find(fake, params)
    if found is None:
        return _fail(400, "Bad Request: message to edit not found")
    text = params.get("text")
    if not text:
        return _fail(400, "Bad Request: message text is empty")
    if len(str(text)) > 4096:
        return _fail(400, "Bad Request: message is too long")
    if found.method != "sendMessage":
        return _fail(400, "Bad Request: there is no text in the message to edit")
    if found.text == text:
        return _fail(
            400,
            "Bad Request: message is not modified: specified new message content and reply "
            "markup are exactly the same as a current content and reply markup of the message",
        )
    found.text = str(text)
    result = {
        "message_id": found.message_id,
        "chat": {"id": int(found.chat_id)},
        "date": 1767225600,
        "edit_date": 1767225700,
        "text": found.text,
    }
    return web.json_response({"ok": True, "result": result})


def _delete(fake: FakeTelegram, params: dict[str, Any]) -> web.Response:
    problem = _chat_problem(fake, params)
    if problem is not None:
        return problem
    found = _find(fake, params)
    if found is None:
        return _fail(400, "Bad Request: message to delete not found")
    fake.messages.remove(found)
    return web.json_response({"ok": True, "result": True})


def _chat_action(fake: FakeTelegram, params: dict[str, Any]) -> web.Response:
    problem = _chat_problem(fake, params)
    if problem is not None:
        return problem
    action = params.get("action")
    if action not in ("typing", "upload_photo", "record_video", "upload_document"):
        return _fail(400, "Bad Request: wrong parameter action in request")
    fake.actions.append((str(params["chat_id"]), str(action)))
    return web.json_response({"ok": True, "result": True})


EDIT_METHODS = {
    "editMessageText": _edit_text,
    "deleteMessage": _delete,
    "sendChatAction": _chat_action,
}

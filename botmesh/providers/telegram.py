"""Telegram (Bot API, https://api.telegram.org): ``TelegramProvider`` sends, ``TelegramWebhook``
verifies and parses the updates Telegram posts to the gateway.

Sending. Text goes to ``sendMessage``; media to ``sendPhoto`` / ``sendVideo`` / ``sendVoice``
/ ``sendAudio`` / ``sendDocument`` chosen by its mime type (``image/*`` photo, ``video/*``
video, ``audio/ogg`` voice, other ``audio/*`` audio, anything else document), by ``file_id``
(``media.id``), by URL (Telegram fetches it) or uploaded (``media.data`` / ``media.path``,
multipart). The text of a media send is its caption.

A caption is limited to 1024 characters. A longer one is refused with
``PayloadTooLargeError`` rather than sent as the media followed by a second text message:
one send is one Telegram message, so a retry or a crash between the two calls can never send
the media twice, and the message id recorded for the send names the whole of it. Send the
media and the text as two sends when you need both. Without ``parse_mode`` the length is
checked here; with one, Telegram counts the text after its markup is parsed, so Telegram
decides and its "message caption is too long" maps to the same error.

The bot token is part of every API URL (``/bot<token>/<method>``). It is a secret of the
``HttpChannel``: every message and log line this module builds shows ``bot***``.

Errors (``{"ok": false, "error_code": N, "description": ..., "parameters": {...}}``):

- 429 → ``RateLimitedError`` with ``parameters.retry_after``;
- 403 "bot was blocked by the user" / "user is deactivated" / "bot was kicked" / "bot can't
  initiate conversation" / "bot is not a member", 400 "chat not found" and 400 "group chat
  was upgraded to a supergroup" (the new id is in the message) → ``RecipientUnreachableError``;
- 400 "message is too long" / "caption is too long" and 413 → ``PayloadTooLargeError``;
- 400 "wrong file identifier" / "wrong remote file identifier" / "wrong type of the web page
  content" / "failed to get HTTP URL content" / "message text is empty" / "can't parse
  entities" → ``UnsupportedContentError``;
- 401 → a final ``SendError``: the token is wrong or revoked;
- 5xx and transport errors → retryable; any other 4xx → final.

Edit, delete, typing: ``edit`` is ``editMessageText`` (the text of a text message: a media
message's caption is not edited), ``delete`` is ``deleteMessage`` (for everyone; Telegram
allows it within 48 hours of the send), ``typing`` is ``sendChatAction`` ``action=typing``.
The message id is the integer ``send`` returned, as a string. An edit to the same text
("message is not modified") and the delete of a message already gone ("message to delete not
found") succeed; "message to edit not found" and "message can't be edited/deleted" are final.

Telegram has no way to list the messages a bot sent, so this adapter has no
``resolve_ambiguous``: a send lost in a crash follows the ``outbox.on_ambiguous`` policy.
Nor does it take a key (``send_keyed``): the Bot API has no idempotency key.

Media download (``download_media``): ``getFile?file_id=`` gives ``file_path``, fetched from
``<base>/file/bot<token>/<file_path>``; downloads are allowed from the API host only.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Self
from urllib.parse import urlsplit

import aiohttp

from botmesh.providers.base import ChannelProvider, check_api_url
from botmesh.providers.http import HttpAnswer, retry_after_of, status_error
from botmesh.providers.webhooks import (
    BadSignature,
    MalformedWebhook,
    WebhookReply,
    WebhookRequest,
    same,
)
from botmesh.state.errors import (
    ConfigError,
    PayloadTooLargeError,
    ProviderError,
    RateLimitedError,
    RecipientUnreachableError,
    SendError,
    UnsupportedContentError,
)
from botmesh.state.messages import Inbound, Media, Outbound, SendResult
from botmesh.state.pacing import ChannelLimits, Rate

__all__ = ["TelegramProvider", "TelegramWebhook"]

log = logging.getLogger("botmesh.providers.telegram")

API_URL = "https://api.telegram.org"
TEXT_LIMIT = 4096
CAPTION_LIMIT = 1024
_TOKEN = re.compile(r"^\d+:[A-Za-z0-9_-]+$")
_SECRET_TOKEN = re.compile(r"^[A-Za-z0-9_-]{1,256}$")

_UNREACHABLE = (
    "bot was blocked by the user",
    "user is deactivated",
    "bot was kicked",
    "bot can't initiate conversation",
    "bot is not a member",
    "chat not found",
    "group chat was upgraded to a supergroup",
)
_TOO_LARGE = ("message is too long", "caption is too long", "request entity too large")
_UNSUPPORTED = (
    "wrong file identifier",
    "wrong remote file identifier",
    "wrong type of the web page content",
    "failed to get http url content",
    "message text is empty",
    "can't parse entities",
)


def _media_method(mime: str | None) -> tuple[str, str]:
    """The Bot API method and its file field for a media of type ``mime``."""
    m = (mime or "").lower().split(";", 1)[0].strip()
    if m.startswith("image/"):
        return "sendPhoto", "photo"
    if m.startswith("video/"):
        return "sendVideo", "video"
    if m == "audio/ogg":
        return "sendVoice", "voice"
    if m.startswith("audio/"):
        return "sendAudio", "audio"
    return "sendDocument", "document"


class TelegramProvider(ChannelProvider):
    """Sends through the Telegram Bot API with the bot token from @BotFather."""

    name = "telegram"
    media_channel = "telegram"
    text_limit: int | None = TEXT_LIMIT
    #: Telegram measures texts in UTF-16 code units (its entities' offsets and lengths are
    #: UTF-16); a part counted so never exceeds 4096 however the server counts (an emoji
    #: outside the BMP counts 2).
    text_limit_unit = "utf-16"
    #: The limits Telegram's Bot FAQ states: about 30 messages a second in all, one a
    #: second to one chat, 20 a minute to one group (docs/rate-limits.md).
    rate_limits = ChannelLimits(channel=Rate(30), chat=Rate(1), group=Rate(20, 60))

    def __init__(
        self,
        token: str,
        *,
        base_url: str = API_URL,
        timeout: float = 15,
        allow_private_media: bool = False,
        media_ref_hosts: Iterable[str] | None = None,
    ) -> None:
        if not _TOKEN.match(token or ""):
            raise ConfigError(
                "token",
                "not a Telegram bot token (<bot id>:<secret>, as @BotFather gives it); "
                "check TELEGRAM_BOT_TOKEN",
            )
        self.base_url = check_api_url(base_url, "base_url", API_URL)
        # The whole token and its secret half: either shown anywhere becomes ***.
        super().__init__(
            timeout=timeout,
            secrets=(token, token.split(":", 1)[1]),
            media_ref_hosts=media_ref_hosts,
            allow_private_media=allow_private_media,
        )
        self._token = token
        # Downloads go to the API host only (``/file/bot<token>/...``).
        self.media_hosts = (urlsplit(self.base_url).hostname or "",)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Self:
        """``TELEGRAM_BOT_TOKEN`` (required), ``TELEGRAM_API_URL`` (default the public API);
        ``TELEGRAM_ALLOW_PRIVATE_MEDIA=1`` is read only when the API URL is on 127.0.0.1
        (a local fake)."""
        token = env.get("TELEGRAM_BOT_TOKEN", "").strip()
        if not token:
            raise ConfigError(
                "TELEGRAM_BOT_TOKEN",
                "not set: set it to the bot token @BotFather gave you (<bot id>:<secret>)",
            )
        if not _TOKEN.match(token):
            raise ConfigError(
                "TELEGRAM_BOT_TOKEN",
                "not a bot token (<bot id>:<secret>, as @BotFather gives it); copy it again",
            )
        base, media = cls.api_env(env, "TELEGRAM", API_URL)
        return cls(token, base_url=base, **media)

    # -- calls ----------------------------------------------------------------------------

    def _url(self, method: str) -> str:
        return f"{self.base_url}/bot{self._token}/{method}"

    async def _call(
        self,
        method: str,
        *,
        json_body: Any = None,
        data: Any = None,
        params: Mapping[str, str] | None = None,
    ) -> Any:
        """Call ``method``; its ``result`` or the mapped error."""
        answer = await self.request(
            "POST" if params is None else "GET",
            self._url(method),
            json_body=json_body,
            data=data,
            params=params,
        )
        log.debug("telegram: %s -> HTTP %s", method, answer.status)
        body = answer.json()
        if answer.ok and isinstance(body, dict) and body.get("ok") is True:
            return body.get("result")
        raise self._error(method, answer, body)

    def _error(self, method: str, answer: HttpAnswer, body: Any) -> SendError:
        """The error for a failed call, by the table in this module's docstring."""
        code: int | None = None
        params: dict[str, Any] = {}
        if isinstance(body, dict):
            if isinstance(body.get("error_code"), int):
                code = body["error_code"]
            desc = str(body.get("description") or "")
            if isinstance(body.get("parameters"), dict):
                params = body["parameters"]
        else:
            desc = " ".join(answer.body[:120].decode("utf-8", "replace").split())
        status = code or answer.status
        what = self.redact(f"telegram: {method}: HTTP {status}: {desc or 'no description'}")
        low = desc.lower()
        if status == 429:
            wait = params.get("retry_after")
            retry = float(wait) if isinstance(wait, int | float) else None
            err: SendError = RateLimitedError(
                what, retry_after=retry if retry is not None else retry_after_of(answer.headers)
            )
        elif status == 401:
            err = SendError(
                f"telegram: {method}: HTTP 401 Unauthorized: the bot token is wrong or was "
                "revoked; set TELEGRAM_BOT_TOKEN to the token @BotFather shows",
                retryable=False,
            )
        elif status == 413 or (status == 400 and any(s in low for s in _TOO_LARGE)):
            err = PayloadTooLargeError(what)
        elif status in (400, 403) and any(s in low for s in _UNREACHABLE):
            new = params.get("migrate_to_chat_id")
            tail = f"; send to chat {new} instead" if new is not None else ""
            err = RecipientUnreachableError(what + tail)
        elif status == 400 and any(s in low for s in _UNSUPPORTED):
            err = UnsupportedContentError(what)
        else:
            err = status_error("telegram", answer, self.redact(f"{method}: {desc}"))
        log.debug("%s", str(err))
        return err

    # -- send -----------------------------------------------------------------------------

    def is_group(self, chat_id: str) -> bool:
        """Whether ``chat_id`` is a group, supergroup or channel (a negative id, or a
        channel's ``@username``), paced under the group limit; else a private chat."""
        return chat_id.startswith(("-", "@"))

    async def send(self, message: Outbound) -> SendResult:
        if message.media is None:
            if not message.text:
                raise UnsupportedContentError("telegram: nothing to send: no text and no media")
            payload = {**message.options, "chat_id": message.chat_id, "text": message.text}
            result = await self._call("sendMessage", json_body=payload)
        else:
            result = await self._send_media(message, message.media)
        mid = result.get("message_id") if isinstance(result, dict) else None
        if mid is None:
            # It may have gone out: a retry could duplicate it, so this is final.
            raise SendError("telegram: the answer has no message_id", retryable=False)
        return SendResult(str(mid))

    async def _send_media(self, message: Outbound, media: Media) -> Any:
        method, field = _media_method(media.mime)
        caption = message.text or ""
        if len(caption) > CAPTION_LIMIT and "parse_mode" not in message.options:
            raise PayloadTooLargeError(
                f"telegram: a caption is at most {CAPTION_LIMIT} characters, this one has "
                f"{len(caption)}: send the media and the text as two sends"
            )
        fields: dict[str, Any] = {**message.options, "chat_id": message.chat_id}
        if caption:
            fields["caption"] = caption
        # A file_id only means something to Telegram (and to this bot): another channel's
        # media id is never sent as one.
        file_id = media.id if media.provider in (None, "telegram") else None
        if file_id is not None or media.url is not None:
            fields[field] = file_id if file_id is not None else media.url
            return await self._call(method, json_body=fields)
        if media.id is not None and media.data is None and media.path is None:
            raise UnsupportedContentError(
                f"telegram: the media is a {media.provider} media id, which Telegram cannot "
                "fetch; send its bytes (load_media_of) or a URL instead"
            )
        data = media.data
        if data is None and media.path is not None:
            data = await asyncio.to_thread(Path(media.path).read_bytes)
        if data is None:
            raise UnsupportedContentError(
                "telegram: the media has no file_id, url, data or path to send"
            )
        form = aiohttp.FormData()
        for k, v in fields.items():
            form.add_field(k, v if isinstance(v, str) else json.dumps(v))
        filename = media.name or (Path(media.path).name if media.path else field)
        form.add_field(
            field,
            data,
            filename=filename,
            content_type=media.mime or "application/octet-stream",
        )
        return await self._call(method, data=form)

    # -- edit, delete, typing (botmesh.state.ports.Edits, Deletes, Typing) -----------------

    @staticmethod
    def _message_id(message_id: str) -> int:
        """The Bot API's integer id of ``message_id`` (as ``send`` returned it)."""
        if not message_id.isdigit():
            raise SendError(
                f"telegram: {message_id!r} is not a Telegram message id (an integer)",
                retryable=False,
            )
        return int(message_id)

    async def edit(self, message: Outbound, message_id: str) -> SendResult:
        """``editMessageText``: the text of a text message (a media message's caption is
        not edited here). Telegram's "message is not modified" (the same text again) is a
        success; "message to edit not found" and "message can't be edited" are final."""
        if not message.text:
            raise UnsupportedContentError("telegram: an edit needs a text")
        payload = {
            **message.options,
            "chat_id": message.chat_id,
            "message_id": self._message_id(message_id),
            "text": message.text,
        }
        try:
            await self._call("editMessageText", json_body=payload)
        except SendError as exc:
            if "message is not modified" not in str(exc).lower():
                raise
        return SendResult(message_id)

    async def delete(self, chat_id: str, message_id: str) -> None:
        """``deleteMessage`` (for everyone; within 48 hours of the send). "message to delete
        not found" (already deleted) is a success."""
        payload = {"chat_id": chat_id, "message_id": self._message_id(message_id)}
        try:
            await self._call("deleteMessage", json_body=payload)
        except SendError as exc:
            if "message to delete not found" not in str(exc).lower():
                raise

    async def typing(self, chat_id: str) -> None:
        """``sendChatAction`` with ``action=typing`` (shown for 5 seconds or until the
        bot's next message)."""
        await self._call("sendChatAction", json_body={"chat_id": chat_id, "action": "typing"})

    # -- media download -------------------------------------------------------------------

    async def media_url(self, media: Media) -> tuple[str, dict[str, str]]:
        """``getFile`` → ``<base>/file/bot<token>/<file_path>`` (no headers: the token is in
        the URL, which is why downloads are allowed from the API host only)."""
        if media.id is None:
            raise ProviderError("telegram: this media has no file_id to download")
        try:
            result = await self._call("getFile", params={"file_id": media.id})
        except SendError as exc:
            raise ProviderError(f"telegram: media download: {exc}") from None
        path = result.get("file_path") if isinstance(result, dict) else None
        if not isinstance(path, str) or not path or path.startswith("/") or ".." in path:
            raise ProviderError("telegram: getFile gave no usable file_path")
        return f"{self.base_url}/file/bot{self._token}/{path}", {}


# -- webhook --------------------------------------------------------------------------------

_MESSAGES = ("message", "edited_message", "channel_post", "edited_channel_post")


def _media_of(msg: Mapping[str, Any]) -> Media | None:
    """The media of a message: the largest photo size, or the document, video, voice, audio,
    video note or sticker; by ``file_id``."""
    found: tuple[Mapping[str, Any], str | None] | None = None
    photo = msg.get("photo")
    if isinstance(photo, list) and photo:
        sizes = [p for p in photo if isinstance(p, dict)]
        if sizes:
            big = max(
                sizes, key=lambda p: (p.get("width", 0) * p.get("height", 0), p.get("file_size", 0))
            )
            found = (big, "image/jpeg")
    for kind, default in (
        ("document", None),
        ("video", "video/mp4"),
        ("voice", "audio/ogg"),
        ("audio", "audio/mpeg"),
        ("video_note", "video/mp4"),
        ("sticker", None),
    ):
        if found is None and isinstance(msg.get(kind), dict):
            item = msg[kind]
            mime = item.get("mime_type") or default
            if kind == "sticker":
                mime = (
                    "application/x-tgsticker"
                    if item.get("is_animated")
                    else "video/webm"
                    if item.get("is_video")
                    else "image/webp"
                )
            found = (item, mime)
    if found is None:
        return None
    item, mime = found
    file_id = item.get("file_id")
    if not isinstance(file_id, str) or not file_id:
        raise MalformedWebhook("telegram: a media item has no file_id")
    extra = {"file_unique_id": item["file_unique_id"]} if "file_unique_id" in item else {}
    name = item.get("file_name")
    return Media(
        provider="telegram",
        id=file_id,
        mime=mime,
        name=name if isinstance(name, str) else None,
        extra=extra,
    )


def _id_of(value: Any, what: str) -> str:
    if isinstance(value, bool) or not isinstance(value, int | str) or value == "":
        raise MalformedWebhook(f"telegram: {what} is missing or not an id")
    return str(value)


class TelegramWebhook:
    """Telegram's webhook: the secret set with ``setWebhook(secret_token=...)`` comes back in
    ``X-Telegram-Bot-Api-Secret-Token``. No handshake. Telegram retries an update until it
    gets a 2xx; the record ids below are the same on every retry."""

    channel = "telegram"

    def __init__(self, secret_token: str) -> None:
        if not _SECRET_TOKEN.match(secret_token or ""):
            raise ConfigError(
                "secret_token",
                "1-256 characters of A-Z, a-z, 0-9, _ and -, the secret_token given to "
                "setWebhook; check TELEGRAM_WEBHOOK_SECRET",
            )
        self._secret = secret_token

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Self:
        secret = env.get("TELEGRAM_WEBHOOK_SECRET", "")
        if not secret:
            raise ConfigError(
                "TELEGRAM_WEBHOOK_SECRET",
                "not set: set it to the secret_token you pass to setWebhook",
            )
        if not _SECRET_TOKEN.match(secret):
            raise ConfigError(
                "TELEGRAM_WEBHOOK_SECRET",
                "Telegram accepts 1-256 characters of A-Z, a-z, 0-9, _ and - only",
            )
        return cls(secret)

    def handshake(self, request: WebhookRequest) -> WebhookReply | None:
        return None

    def verify(self, request: WebhookRequest) -> None:
        got = request.headers.get("x-telegram-bot-api-secret-token")
        if got is None:
            raise BadSignature("telegram: no X-Telegram-Bot-Api-Secret-Token header")
        if not same(got, self._secret):
            raise BadSignature("telegram: X-Telegram-Bot-Api-Secret-Token is wrong")

    def parse(self, request: WebhookRequest) -> list[Inbound]:
        try:
            update = json.loads(request.body)
        except ValueError:
            raise MalformedWebhook("telegram: the body is not JSON") from None
        if not isinstance(update, dict) or not isinstance(update.get("update_id"), int):
            raise MalformedWebhook("telegram: not an Update (no update_id)")
        for kind in _MESSAGES:
            if isinstance(update.get(kind), dict):
                return [self._message(kind, update[kind], update["update_id"])]
        if isinstance(update.get("callback_query"), dict):
            return [self._callback(update["callback_query"], update["update_id"])]
        return []  # my_chat_member, poll, chat_join_request…: nothing for a handler

    def _message(self, kind: str, msg: Mapping[str, Any], update_id: int) -> Inbound:
        chat = msg.get("chat")
        chat_id = _id_of(chat.get("id") if isinstance(chat, dict) else None, "chat.id")
        message_id = _id_of(msg.get("message_id"), "message_id")
        rid = f"tg:{chat_id}:{message_id}"
        ts = msg.get("date")
        if kind.startswith("edited_"):
            edit = _id_of(msg.get("edit_date"), "edit_date")
            rid += f":e{edit}"
            ts = msg.get("edit_date")
        who = msg.get("from") or msg.get("sender_chat")
        sender = str(who["id"]) if isinstance(who, dict) and "id" in who else None
        text = msg.get("text") if isinstance(msg.get("text"), str) else msg.get("caption")
        data: dict[str, Any] = {"update": kind, "update_id": update_id, "message_id": message_id}
        reply = msg.get("reply_to_message")
        if isinstance(reply, dict) and "message_id" in reply:
            data["reply_to_message_id"] = str(reply["message_id"])
        return Inbound(
            id=rid,
            chat_id=chat_id,
            channel="telegram",
            sender=sender,
            ts=float(ts) if isinstance(ts, int | float) else None,
            text=text if isinstance(text, str) else None,
            media=_media_of(msg),
            data=data,
        )

    def _callback(self, cb: Mapping[str, Any], update_id: int) -> Inbound:
        cid = _id_of(cb.get("id"), "callback_query.id")
        who = cb.get("from")
        sender = _id_of(who.get("id") if isinstance(who, dict) else None, "callback_query.from")
        msg = cb.get("message")
        chat = msg.get("chat") if isinstance(msg, dict) else None
        # A button under an inline-mode message has no chat: answer the user's private chat.
        chat_id = _id_of(chat["id"], "chat.id") if isinstance(chat, dict) else sender
        callback_data = cb.get("data")
        data: dict[str, Any] = {"callback_data": callback_data, "update_id": update_id}
        if isinstance(msg, dict) and "message_id" in msg:
            data["message_id"] = str(msg["message_id"])
        if "inline_message_id" in cb:
            data["inline_message_id"] = cb["inline_message_id"]
        return Inbound(
            id=f"tg:cb:{cid}",
            kind="interaction",
            chat_id=chat_id,
            channel="telegram",
            sender=sender,
            text=callback_data if isinstance(callback_data, str) else None,
            data=data,
        )

    def reply(self, request: WebhookRequest, produced: list[Inbound]) -> WebhookReply:
        return WebhookReply(200, b"")

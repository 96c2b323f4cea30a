"""TikTok Business Messaging (direct messages of a TikTok Business Account, API for Business
v1.3): ``TikTokProvider`` sends through ``POST /business/message/send/``, ``TikTokWebhook``
verifies and parses the ``DIRECT_MESSAGE`` webhooks.

Sending: JSON ``{"business_id", "recipient_type": "CONVERSATION", "recipient":
<conversation_id>, "message_type": "TEXT", "text": {"body"}}`` with the account's access
token in the ``Access-Token`` header. The chat id is the conversation id of the webhook
(TikTok conversations start with the user: a business only replies). An image goes as
``message_type: "IMAGE"`` with the ``media_id`` of ``POST /business/message/media/upload/``
(multipart, JPG or PNG, 3 MB at most): bytes, a file path or a URL (downloaded here, with the
usual URL checks, then uploaded). TikTok image messages take no caption: a send with an image
and a text is refused rather than split into two messages a retry could not deduplicate.
Other media types cannot be sent by the API. ``options``: ``reply_to`` (a message id to
quote: ``referenced_message_info``). The answer's ``data.message.message_id`` is the
``SendResult``. A text is at most 6000 characters.

TikTok answers errors with HTTP 200 and a non-zero ``code`` (``{"code", "message",
"request_id", "data"}``), mapped first match wins:

=========================================  =================================================
HTTP 429, code 40100 (too many requests)   ``RateLimitedError``; ``retry_after`` from
                                           ``Retry-After``, else ``rate_limit_wait`` (1 s;
                                           the messaging endpoints allow 10 calls a second)
codes 40102, 40104, 40105 (token expired,  final ``SendError`` naming ``TIKTOK_ACCESS_TOKEN``
missing, revoked), 40001 (no permission),  (the access token lives a day: refresh it and
HTTP 401 / 403                             restart, or mount it from a file)
code 40002 saying "length"                 ``PayloadTooLargeError``
codes 50000 and up, HTTP 408, 425, 5xx,    retryable ``SendError``
transport errors
any other code or 4xx                      final ``SendError``
=========================================  =================================================

TikTok takes no idempotency key, and its message list only holds a conversation's 20 latest
messages, so this adapter has neither ``send_keyed`` nor ``resolve_ambiguous``.

Inbound media: an image or a video is a ``media_id`` inside a message; what is journaled is
its coordinates (``conversation_id``, ``message_id``, ``type``; ``botmesh.providers.
media_refs``), never the id-bound download URL nor the token. A download asks
``POST /business/message/media/download/`` for a URL (valid a day) and fetches it with the
token in ``x-user``, sent only to TikTok hosts or the API origin. A replayed reference has no
``media_id``: it is found again in ``GET /business/message/content/list/``, which lists the
conversation's 20 latest messages, so a late replay cannot download it (``rehydrate-failed``).
A sticker or emoji is a URL on TikTok's CDN, downloaded without credentials.

Webhooks: ``TikTok-Signature: t=<unix seconds>,s=<hex>``, HMAC-SHA256 under the app secret
of ``<t>.<raw body>``; refused when older than ``tolerance`` (300 s). Only ``im_receive_msg``
events from the user become records; ``im_send_msg`` (the bot's own messages, also echoed),
read receipts, referral and comment events give none, and so does a message whose sender's
role is ``BUSINESS_ACCOUNT``.
"""

from __future__ import annotations

import json
import logging
import mimetypes
import time
from collections.abc import Callable, Mapping
from typing import Any, Self, Unpack
from urllib.parse import urlsplit

import aiohttp

from botmesh.providers.http import HttpAnswer, status_error
from botmesh.providers.meta import env_value, media_bytes
from botmesh.providers.rest import RestChannel, RestOptions
from botmesh.providers.webhooks import (
    BadSignature,
    MalformedWebhook,
    SignedWebhook,
    WebhookReply,
    WebhookRequest,
    hmac_hex,
    same,
)
from botmesh.state.errors import (
    ConfigError,
    PayloadTooLargeError,
    ProviderError,
    SendError,
    UnsupportedContentError,
)
from botmesh.state.messages import Inbound, Media, Outbound, SendResult

__all__ = ["TikTokProvider", "TikTokWebhook", "tiktok_signature"]

log = logging.getLogger("botmesh.providers.tiktok")

API_URL = "https://business-api.tiktok.com/open_api/v1.3"
TEXT_LIMIT = 6000
#: Largest image the upload takes (bytes).
IMAGE_MAX_BYTES = 3 * 1024 * 1024
IMAGE_MIMES = frozenset({"image/jpeg", "image/png"})
#: Hosts the access token may be sent to (``x-user``) for a media download.
TOKEN_HOSTS = (
    "tiktok.com",
    "tiktokv.com",
    "tiktokcdn.com",
    "tiktokcdn-us.com",
    "tiktokcdn-eu.com",
    "ibyteimg.com",
)

RATE_LIMITED = 40100
TOKEN_CODES = frozenset({40001, 40102, 40104, 40105})
PARAM_ERROR = 40002
#: Inbound media by message type: the block holding its ``media_id`` and a mime type.
_ID_MEDIA = {"image": "image/jpeg", "video": "video/mp4"}
_URL_MEDIA = {"sticker": "image/webp", "emoji": "image/png"}


class TikTokProvider(RestChannel):
    """Sends as one TikTok Business Account: its ``business_id`` (the ``open_id`` of the
    token exchange) and a short-term access token."""

    name = "tiktok"
    media_channel = "tiktok"
    text_limit: int | None = TEXT_LIMIT
    default_url = API_URL
    credential_fix = (
        "set TIKTOK_ACCESS_TOKEN to a fresh token of the Business Account (tokens last a day: "
        "refresh it with /tt_user/oauth2/refresh_token/)"
    )
    credential_hosts = TOKEN_HOSTS

    def __init__(self, access_token: str, business_id: str, **options: Unpack[RestOptions]) -> None:
        if not business_id:
            raise ConfigError("tiktok.business_id", "is empty; pass the account's open_id")
        super().__init__(access_token, **options)
        self.business_id = business_id

    def __repr__(self) -> str:
        return f"TikTokProvider(business_id={self.business_id!r})"

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Self:
        """``TIKTOK_ACCESS_TOKEN``, ``TIKTOK_BUSINESS_ID``; optional ``TIKTOK_API_URL``,
        ``TIKTOK_MEDIA_REF_HOSTS`` and (with a local API URL) ``TIKTOK_ALLOW_PRIVATE_MEDIA=1``."""
        token = env_value(
            env,
            "TIKTOK_ACCESS_TOKEN",
            "set it to the Business Account's access token (/tt_user/oauth2/token/)",
        )
        business = env_value(
            env,
            "TIKTOK_BUSINESS_ID",
            "set it to the open_id the token exchange returned for the Business Account",
        )
        base, media = cls.api_env(env, "TIKTOK", API_URL)
        return cls(token, business, base_url=base, **media)

    # -- calls ----------------------------------------------------------------------------

    async def call(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        data: Any = None,
        params: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """One API call: its ``data`` object, or the mapped error raised (the module's
        table), also for an HTTP 200 with a non-zero ``code``."""
        answer = await self.request(
            method,
            f"{self.base_url}/{path.lstrip('/')}",
            json_body=json_body,
            data=data,
            params=params,
            headers={"Access-Token": self._credential, "Accept": "application/json"},
        )
        body = answer.json()
        if answer.ok and isinstance(body, dict) and body.get("code") == 0:
            found = body.get("data")
            return found if isinstance(found, dict) else {}
        err = self._error(path, answer, body)
        log.warning("%s", err)
        raise err

    def _error(self, path: str, answer: HttpAnswer, body: Any) -> SendError:
        if not isinstance(body, dict) or not isinstance(body.get("code"), int):
            if answer.ok:
                return SendError(
                    f"tiktok: {path}: HTTP {answer.status} without a code; check TIKTOK_API_URL",
                    retryable=True,
                )
            text = " ".join(answer.body[:200].decode("utf-8", "replace").split())
            body = {"code": None, "message": text}
        code = body["code"]
        said = self.redact(str(body.get("message") or "no message"))
        request_id = body.get("request_id")
        trace = f" [request_id {request_id}]" if isinstance(request_id, str) and request_id else ""
        what = f"tiktok: {path}: HTTP {answer.status}, code {code}: {said}{trace}"
        if code == RATE_LIMITED:
            return self.rate_limited(what, answer)
        if code in TOKEN_CODES:
            return self.refused(f"{path}: code {code}: {said}")
        common = self.common_error(answer, what, f"{path}: code {code}: {said}")
        if common is not None:
            return common
        if code == PARAM_ERROR and "length" in said.lower():
            return PayloadTooLargeError(what)
        if isinstance(code, int) and code >= 50000:
            return SendError(what, retryable=True)
        if answer.ok:
            return SendError(what, retryable=False)
        return status_error("tiktok", answer, f"{path}: code {code}: {said}")

    # -- sending --------------------------------------------------------------------------

    async def send(self, message: Outbound) -> SendResult:
        body: dict[str, Any] = {
            "business_id": self.business_id,
            "recipient_type": "CONVERSATION",
            "recipient": message.chat_id,
        }
        text = message.text or ""
        if message.media is not None:
            if text:
                raise UnsupportedContentError(
                    "tiktok: image messages take no caption; send the text and the image as "
                    "two sends"
                )
            body.update(message_type="IMAGE", image={"media_id": await self.upload(message.media)})
        elif text:
            if len(text) > TEXT_LIMIT:
                raise PayloadTooLargeError(
                    f"tiktok: a text is at most {TEXT_LIMIT} characters, this one has {len(text)}"
                )
            body.update(message_type="TEXT", text={"body": text})
            reply_to = message.options.get("reply_to")
            if reply_to:
                body["referenced_message_info"] = {"referenced_message_id": str(reply_to)}
        else:
            raise UnsupportedContentError("tiktok: the message has neither text nor media")
        data = await self.call("POST", "business/message/send/", json_body=body)
        sent = data.get("message")
        mid = sent.get("message_id") if isinstance(sent, dict) else None
        if not isinstance(mid, str) or not mid:
            # Accepted but unreadable: sending again could duplicate it, so it is final.
            raise SendError("tiktok: the answer names no message_id", retryable=False)
        log.debug("tiktok: sent %s to %s", mid, message.chat_id)
        return SendResult(mid)

    async def upload(self, media: Media) -> str:
        """Upload ``media`` (bytes, a path, or a URL fetched here) as an image; its
        ``media_id`` (valid 30 days)."""
        if media.data is None and media.path is None:
            if media.url is None:
                raise UnsupportedContentError(
                    "tiktok: the media has no data, path or URL to upload (TikTok takes images "
                    "by upload only)"
                )
            data = await self.fetch_media(media.url)
            name = media.name or urlsplit(media.url).path.rsplit("/", 1)[-1] or "image"
        else:
            data, name = await media_bytes("tiktok", media)
        mime = (media.mime or mimetypes.guess_type(name)[0] or "").split(";", 1)[0].strip()
        if mime not in IMAGE_MIMES:
            raise UnsupportedContentError(
                f"tiktok: only JPG and PNG images can be sent, not {mime or 'an unknown type'}"
            )
        if len(data) > IMAGE_MAX_BYTES:
            raise PayloadTooLargeError(
                f"tiktok: an image is at most {IMAGE_MAX_BYTES} bytes, this one has {len(data)}"
            )
        form = aiohttp.FormData()
        form.add_field("business_id", self.business_id)
        form.add_field("media_type", "IMAGE")
        form.add_field("file", data, filename=name, content_type=mime)
        found = await self.call("POST", "business/message/media/upload/", data=form)
        media_id = found.get("media_id")
        if not isinstance(media_id, str) or not media_id:
            raise SendError("tiktok: the upload answered no media_id", retryable=True)
        return media_id

    # -- inbound media --------------------------------------------------------------------

    async def _media_id(self, conversation_id: str, message_id: str, kind: str) -> str:
        """The ``media_id`` of a message, found in the conversation's latest messages."""
        listed = await self.call(
            "GET",
            "business/message/content/list/",
            params={"business_id": self.business_id, "conversation_id": conversation_id},
        )
        for msg in listed.get("messages") or ():
            if isinstance(msg, dict) and str(msg.get("message_id")) == message_id:
                block = msg.get(kind)
                media_id = block.get("media_id") if isinstance(block, dict) else None
                if isinstance(media_id, str) and media_id:
                    return media_id
                break
        raise ProviderError(
            f"tiktok: message {message_id} is not among the conversation's latest messages "
            "(TikTok lists 20); its media cannot be downloaded again"
        )

    async def media_url(self, media: Media) -> tuple[str, dict[str, str]]:
        """A sticker's URL as it is; for an image or a video, the download URL TikTok gives
        for its coordinates, with the token in ``x-user``."""
        extra = media.extra
        conversation, message = extra.get("conversation_id"), extra.get("message_id")
        if not (isinstance(conversation, str) and isinstance(message, str)):
            return await super().media_url(media)
        kind = str(extra.get("type") or "image")
        if kind not in _ID_MEDIA:
            raise ProviderError(f"tiktok: a {kind} message has no media to download")
        try:
            media_id = media.id or await self._media_id(conversation, message, kind)
            found = await self.call(
                "POST",
                "business/message/media/download/",
                json_body={
                    "business_id": self.business_id,
                    "conversation_id": conversation,
                    "message_id": message,
                    "media_id": media_id,
                    "media_type": kind.upper(),
                },
            )
        except SendError as exc:
            raise ProviderError(f"tiktok: media download: {exc}") from None
        url = found.get("download_url")
        if not isinstance(url, str) or not url:
            raise ProviderError("tiktok: media download: the answer has no download_url")
        if not self.credentialed(url):
            raise ProviderError(
                f"tiktok: the download URL's host {urlsplit(url).hostname!r} is not a TikTok "
                "host; the access token is not sent there"
            )
        return url, {"x-user": self._credential}


# -- webhooks ---------------------------------------------------------------------------------


def tiktok_signature(secret: str, timestamp: str, body: bytes) -> str:
    """TikTok's ``s``: hex HMAC-SHA256 under the app secret of ``<timestamp>.<raw body>``."""
    return hmac_hex(secret, timestamp.encode() + b"." + body)


def _content(raw: Any) -> dict[str, Any]:
    """The event's ``content``: a JSON string (an object, leniently)."""
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, str):
        try:
            found = json.loads(raw)
        except ValueError:
            found = None
        if isinstance(found, dict):
            return found
    raise MalformedWebhook("tiktok: the event's content is not a JSON object")


def _event(body: bytes) -> dict[str, Any]:
    """The webhook's JSON envelope, which names its ``event``."""
    try:
        event = json.loads(body)
    except ValueError:
        raise MalformedWebhook("tiktok: the body is not JSON") from None
    if not isinstance(event, dict) or not isinstance(event.get("event"), str):
        raise MalformedWebhook("tiktok: not a TikTok webhook (no event)")
    return event


def _body(
    msg: dict[str, Any], kind: str, conversation: str, mid: str, data: dict[str, Any]
) -> tuple[Any, Media | None]:
    """A message's text and media, by its ``kind``; a part of another kind (a shared post,
    a template click) goes into ``data`` as TikTok sent it."""
    text: Any = None
    media: Media | None = None
    block = msg.get(kind)
    part: dict[str, Any] = block if isinstance(block, dict) else {}
    if kind == "text":
        text = part.get("body")
    elif kind in _ID_MEDIA:
        if not part.get("media_id"):
            raise MalformedWebhook(f"tiktok: {kind} message {mid} has no media_id")
        media = Media(
            provider="tiktok",
            id=str(part["media_id"]),
            mime=_ID_MEDIA[kind],
            extra={
                "conversation_id": conversation,
                "message_id": mid,
                "index": 0,
                "type": kind,
            },
        )
    elif kind in _URL_MEDIA and isinstance(part.get("url"), str):
        media = Media(provider="tiktok", url=part["url"], mime=_URL_MEDIA[kind])
    elif part:
        data[kind] = part  # share_post, template clicks…: what TikTok sent
    return text, media


def _timestamp(msg: dict[str, Any], event: dict[str, Any]) -> float | None:
    """When the message was sent: its ``timestamp`` (milliseconds), else the event's
    ``create_time`` (seconds, or milliseconds on some events)."""
    stamp = msg.get("timestamp")
    if isinstance(stamp, int | float) and not isinstance(stamp, bool):
        return stamp / 1000.0
    created = event.get("create_time")
    ts = float(created) if isinstance(created, int | float) else None
    if ts is not None and ts > 1e11:
        ts /= 1000.0
    return ts


class TikTokWebhook(SignedWebhook):
    """TikTok's ``DIRECT_MESSAGE`` webhooks, signed with the app secret.

    ``parse`` gives one ``Inbound`` per ``im_receive_msg``: ``id`` = ``message_id`` (the same
    on a retried webhook), ``chat_id`` = ``conversation_id`` (what ``send`` takes),
    ``sender`` = the user's id, ``text`` = ``text.body``; an image or a video as
    ``Media(provider="tiktok", id=<media_id>, extra={"conversation_id", "message_id",
    "index": 0, "type"})``, a sticker or an emoji by its CDN URL. ``data`` has ``type``,
    ``business_id`` (the envelope's ``user_openid``) and ``reply_to`` for a quoted message.
    """

    channel = "tiktok"
    #: The secret of the developer app the webhook belongs to.
    SECRET_ENV = "TIKTOK_APP_SECRET"
    SECRET_HINT = (
        "set it to the developer app's secret (My Apps > App Detail), which signs the webhooks"
    )
    SECRET_NAME = "app_secret"

    def __init__(
        self, app_secret: str, *, tolerance: float = 300.0, clock: Callable[[], float] = time.time
    ) -> None:
        super().__init__(app_secret, clock=clock)
        self.tolerance = tolerance

    def verify(self, request: WebhookRequest) -> None:
        header = request.headers.get("tiktok-signature", "")
        if not header:
            raise BadSignature("tiktok: no TikTok-Signature header")
        parts = dict(p.strip().partition("=")[::2] for p in header.split(","))
        stamp, sig = parts.get("t", ""), parts.get("s", "")
        try:
            at = float(stamp)
        except ValueError:
            raise BadSignature("tiktok: TikTok-Signature has no t=<timestamp>") from None
        if abs(self._clock() - at) > self.tolerance:
            raise BadSignature(
                f"tiktok: the signature is from {stamp}, more than {self.tolerance:.0f} s away "
                "(a replay, or this host's clock is off)"
            )
        if not same(sig.lower(), tiktok_signature(self._secret, stamp, request.body)):
            raise BadSignature(
                "tiktok: TikTok-Signature does not match the body; check TIKTOK_APP_SECRET"
            )

    def parse(self, request: WebhookRequest) -> list[Inbound]:
        event = _event(request.body)
        if event["event"] != "im_receive_msg":
            return []  # im_send_msg (ours), read receipts, referrals, comments
        msg = _content(event.get("content"))
        sender = msg.get("from_user")
        if isinstance(sender, dict) and sender.get("role") == "BUSINESS_ACCOUNT":
            return []  # a message of the business itself
        conversation, mid = msg.get("conversation_id"), msg.get("message_id")
        if not conversation or not mid:
            raise MalformedWebhook("tiktok: a message without conversation_id or message_id")
        conversation, mid = str(conversation), str(mid)
        kind = str(msg.get("type") or "").lower()
        data: dict[str, Any] = {"type": kind, "business_id": event.get("user_openid")}
        text, media = _body(msg, kind, conversation, mid, data)
        reference = msg.get("referenced_message_info") or msg.get("reply_source_payload")
        if isinstance(reference, dict):
            ref = reference.get("referenced_message_id") or reference.get("reply_source_msg_id")
            if ref:
                data["reply_to"] = str(ref)
        who = sender.get("id") if isinstance(sender, dict) else None
        return [
            Inbound(
                id=mid,
                chat_id=conversation,
                sender=str(who) if who else None,
                channel=self.channel,
                ts=_timestamp(msg, event),
                text=text if isinstance(text, str) else None,
                media=media,
                data=data,
            )
        ]

    def reply(self, request: WebhookRequest, produced: list[Inbound]) -> WebhookReply:
        return WebhookReply(200, b"")

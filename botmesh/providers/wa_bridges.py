"""What the three WhatsApp Web bridges share: Baileys (through its HTTP bridge,
``botmesh.providers.baileys``), Evolution API (``botmesh.providers.evolution``) and
WPPConnect server (``botmesh.providers.wppconnect``).

Each is a self-hosted HTTP service that holds one WhatsApp Web session (a linked device) and
sends for whoever calls it. The session lives in the bridge, not in botmesh: the adapters are
plain HTTP clients, any number of replicas may call one bridge at once, and they need no
leader (``provider_session`` stays ``"any"``; ``SessionHooks`` are for an adapter that opens
the WhatsApp Web socket itself). Run one bridge per number (or the bridge's own cluster).

Settings (``BridgeProvider.from_env``): ``<PREFIX>_API_URL`` is required (a bridge has no
public address to default to); it must be https, or http on the loopback (a bridge beside
the worker, a fake in tests): the credential never travels in clear. The credential and the
bridge's name of the session (a phone number, an instance, a session) come from one variable
each. ``<PREFIX>_MEDIA_REF_HOSTS`` and, with a loopback URL, ``<PREFIX>_ALLOW_PRIVATE_MEDIA``
as for every adapter.

Sending: WhatsApp Web takes texts of up to 65,536 characters (``WA_TEXT_LIMIT``). Media goes
as the bridge allows (see each module); its kind follows its mime type (``media_kind``).

Errors (``BridgeProvider.error``), the bridge's own cases first (each module's table), then:

- 401 and 403 → a final ``SendError`` naming the credential's variable (never its value);
- 429 → ``RateLimitedError`` with ``retry_after`` from ``Retry-After`` (seconds or a date);
  the bridges do not limit themselves, the proxy in front of them may;
- 408, 425, 5xx and transport errors → retryable; any other 4xx → final.

Inbound (the webhooks): Baileys and Evolution forward the message as Baileys decodes it
(``{key, message, messageTimestamp, pushName}``); ``wa_content`` reads its ``message`` part
for both: text, caption, media, button and list replies, and ``None`` for what is no user
message (protocol messages: revokes, edits, key distribution).
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import mimetypes
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Self, cast
from urllib.parse import quote, urlsplit

from botmesh.providers.base import ChannelProvider, check_api_url
from botmesh.providers.http import HttpAnswer, status_error
from botmesh.providers.media_kinds import kind_of_type
from botmesh.providers.meta import env_value, media_bytes
from botmesh.providers.webhooks import MalformedWebhook, WebhookReply, WebhookRequest
from botmesh.state.errors import ConfigError, ProviderError, SendError, UnsupportedContentError
from botmesh.state.messages import DeliveryState, DeliveryStatus, Inbound, Media

__all__ = [
    "WA_TEXT_LIMIT",
    "BridgeMedia",
    "BridgeProvider",
    "BridgeWebhook",
    "WaContent",
    "b64_bytes",
    "media_kind",
    "message_key",
    "wa_content",
    "wa_inbound",
    "wa_long",
    "wa_message",
]

log = logging.getLogger("botmesh.providers.wa_bridges")

#: The longest text WhatsApp Web takes in one message (characters).
WA_TEXT_LIMIT = 65536


def bridge_url(url: str, field: str, *, plain_http: bool = False) -> str:
    """``url`` (the bridge's API) without its trailing ``/``: https, or http on the
    loopback, or plain http anywhere with ``plain_http`` (``<PREFIX>_ALLOW_PLAIN_HTTP=1``:
    a bridge the operator runs on a private network, such as a compose or cluster service);
    else a ``ConfigError`` on ``field``."""
    parts = urlsplit(url)
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise ConfigError(
            field, f"{url!r} is not the http(s) URL of the bridge (https://host[:port][/path])"
        )
    try:
        return check_api_url(url, field, url, plain_http=plain_http)
    except ConfigError as exc:
        prefix = field.removesuffix("_API_URL")
        raise ConfigError(
            field,
            f"{exc.message}; a bridge you run on a private network (a compose or cluster "
            f"service) may be reached over http with {prefix}_ALLOW_PLAIN_HTTP=1",
        ) from None


#: The kinds a bridge sends a media as (none takes a sticker from us).
BridgeKind = Literal["image", "video", "audio", "document"]


def media_kind(mime: str | None) -> BridgeKind:
    """How WhatsApp shows a media of type ``mime``: ``image/*``, ``video/*`` and ``audio/*``
    as such, anything else as a document (``botmesh.providers.media_kinds``)."""
    return cast(BridgeKind, kind_of_type(mime, other="document"))


@dataclass(frozen=True, slots=True)
class BridgeMedia:
    """A media as a bridge takes it (``BridgeProvider.bridge_media``): its bytes in base64,
    or its URL."""

    kind: BridgeKind
    mime: str
    name: str
    base64: str | None = None
    url: str | None = None


class BridgeProvider(ChannelProvider):
    """A WhatsApp Web bridge's HTTP API: ``api_url``, a credential, and the bridge's name for
    the session (``session``). Subclasses set the class variables, ``_headers`` and ``send``,
    and may map the bridge's own errors in ``_classify`` and ``_detail``."""

    text_limit: int | None = WA_TEXT_LIMIT
    #: ``BAILEYS``, ``EVOLUTION``, ``WPPCONNECT``: the prefix of the settings.
    env_prefix: ClassVar[str] = ""
    #: The variable of the credential (named by errors that ask to fix it).
    credential_env: ClassVar[str] = ""
    #: The variable of the session's name, and what it is (for its ``ConfigError``).
    session_env: ClassVar[str] = ""
    session_fix: ClassVar[str] = ""
    #: Characters of the session's name left as they are in a URL path (``+`` of a number).
    session_safe: ClassVar[str] = ""

    def __init__(
        self,
        api_url: str,
        credential: str,
        session: str,
        *,
        timeout: float = 15.0,
        media_ref_hosts: Iterable[str] | None = None,
        allow_private_media: bool = False,
        media_max_bytes: int | None = None,
        media_view_once: bool = False,
        allow_plain_http: bool = False,
    ) -> None:
        if not credential:
            raise ConfigError(self.credential_env, f"is empty; {self.name} needs its credential")
        if not session:
            raise ConfigError(self.session_env, f"is empty; set it to {self.session_fix}")
        field = f"{self.env_prefix}_API_URL"
        self.api_url = bridge_url(api_url, field, plain_http=allow_plain_http)
        super().__init__(
            timeout=timeout,
            secrets=(credential,),
            media_ref_hosts=media_ref_hosts,
            allow_private_media=allow_private_media,
            media_max_bytes=media_max_bytes,
            media_view_once=media_view_once,
        )
        self._credential = credential
        self.session = session
        #: The session's name as a URL path segment.
        self.session_path = quote(session, safe=self.session_safe)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(api_url={self.api_url!r}, session={self.session!r})"

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Self:
        """``<PREFIX>_API_URL``, the credential and the session (the variables each module
        names), the channel's own (``env_options``); optional ``<PREFIX>_MEDIA_REF_HOSTS``
        and, with a local API URL, ``<PREFIX>_ALLOW_PRIVATE_MEDIA=1``."""
        field = f"{cls.env_prefix}_API_URL"
        url = env_value(env, field, "set it to the URL of your bridge (https://…)")
        plain = env.get(f"{cls.env_prefix}_ALLOW_PLAIN_HTTP", "").strip()
        if plain not in ("", "0", "1"):
            raise ConfigError(f"{cls.env_prefix}_ALLOW_PLAIN_HTTP", f"{plain!r} is not 1 or 0")
        plain_http = plain == "1"
        url = bridge_url(url, field, plain_http=plain_http)
        if plain_http and urlsplit(url).scheme == "http":
            log.warning(
                "%s: the bridge's credential travels in clear to %s (%s_ALLOW_PLAIN_HTTP=1): "
                "keep that network private",
                cls.name,
                urlsplit(url).hostname,
                cls.env_prefix,
            )
            media = cls.media_env(env, cls.env_prefix)
        else:
            url, media = cls.api_env(env, cls.env_prefix, url)
        credential = env_value(env, cls.credential_env, f"set it to the credential of {field}")
        session = env_value(env, cls.session_env, f"set it to {cls.session_fix}")
        options = cls.env_options(env)
        return cls(url, credential, session, **media, **options, allow_plain_http=plain_http)

    @classmethod
    def env_options(cls, env: Mapping[str, str]) -> dict[str, Any]:
        """The channel's own settings, as constructor keywords (none by default)."""
        return {}

    # -- calls ----------------------------------------------------------------------------

    def _headers(self) -> dict[str, str]:  # pragma: no cover - abstract
        raise NotImplementedError

    async def call(self, method: str, path: str, *, json_body: Any = None) -> Any:
        """One call to ``<api_url><path>`` with the credential: the answer's JSON (``None``
        when it is not JSON) on a 2xx, else the mapped error raised."""
        answer = await self.request(
            method, f"{self.api_url}{path}", json_body=json_body, headers=self._headers()
        )
        body = answer.json()
        if answer.ok:
            return body
        raise self.error(answer, body)

    def error(self, answer: HttpAnswer, body: Any) -> SendError:
        """The error of a failed answer: the bridge's own cases (``_classify``), then the
        rules of this module's docstring."""
        detail = self.redact(self._detail(answer, body) or f"HTTP {answer.status}")
        found = self._classify(answer, body, detail)
        if found is not None:
            return found
        if answer.status in (401, 403):
            return SendError(
                f"{self.name}: HTTP {answer.status}: the bridge refused the credential "
                f"({detail}); check {self.credential_env}",
                retryable=False,
            )
        return status_error(self.name, answer, detail)

    def _detail(self, answer: HttpAnswer, body: Any) -> str:
        """The bridge's error text (a JSON body's ``message``/``error``, else the body)."""
        if isinstance(body, dict):
            parts = [str(body[k]) for k in ("error", "message") if body.get(k)]
            if parts:
                return ": ".join(parts)[:300]
        return " ".join(answer.body[:200].decode("utf-8", "replace").split())

    def _classify(self, answer: HttpAnswer, body: Any, detail: str) -> SendError | None:
        """The bridge's own error cases; ``None``: the common rules decide."""
        return None

    async def bridge_media(self, media: Media, caption: str | None, *, urls: bool) -> BridgeMedia:
        """``media`` as a bridge takes it: its bytes (``data``, or the file at ``path``) in
        base64, or, when the bridge fetches URLs (``urls``), its http(s) ``url``; a file name
        and a mime type (given, else guessed from the name). ``UnsupportedContentError`` for
        anything else (a media id, another channel's media: load it first) and for a caption
        on audio, which WhatsApp does not show."""
        if media.data is not None or media.path is not None:
            data, name = await media_bytes(self.name, media)
            b64: str | None = base64.b64encode(data).decode("ascii")
            url = None
        elif urls and media.url is not None and urlsplit(media.url).scheme in ("http", "https"):
            b64, url = None, media.url
            name = media.name or urlsplit(url).path.rsplit("/", 1)[-1] or "file"
        else:
            what = "an http(s) URL or as bytes" if urls else "bytes only"
            raise UnsupportedContentError(
                f"{self.name}: the bridge takes media as {what} (Media.data, Media.path): a media "
                "id or another channel's media cannot be sent; load its bytes first"
            )
        mime = media.mime or mimetypes.guess_type(name)[0] or "application/octet-stream"
        kind = media_kind(mime)
        if caption and kind == "audio":
            raise UnsupportedContentError(
                f"{self.name}: audio takes no caption; send the text on its own"
            )
        return BridgeMedia(kind, mime, name, base64=b64, url=url)

    async def fetch_base64(self, method: str, path: str, *, json_body: Any = None) -> bytes:
        """A media download the bridge answers as JSON ``{"base64": ...}``: its bytes, or
        a ``ProviderError``."""
        try:
            body = await self.call(method, path, json_body=json_body)
        except SendError as exc:
            raise ProviderError(f"{self.name}: media download: {exc}") from None
        data = b64_bytes(body.get("base64") if isinstance(body, dict) else None)
        if data is None:
            raise ProviderError(f"{self.name}: media download: the answer has no base64 media")
        if len(data) > self.media_max_bytes:
            raise ProviderError(
                f"{self.name}: media is over media_max_bytes={self.media_max_bytes}"
            )
        return data


def b64_bytes(value: Any) -> bytes | None:
    """The bytes of a base64 text (a ``data:…;base64,`` prefix allowed), of a Node Buffer as
    ``JSON.stringify`` writes it (``{"type": "Buffer", "data": [ints] or base64}``) or of a
    ``Uint8Array`` (``{"0": n, "1": n, …}``); ``None`` when it is none of these."""
    try:
        if isinstance(value, str):
            text = value.split(",", 1)[1] if value.startswith("data:") else value
            return base64.b64decode(text, validate=True)
        if isinstance(value, Mapping) and value.get("type") == "Buffer":
            return b64_bytes(value.get("data"))
        if isinstance(value, Mapping) and value and all(k.isdigit() for k in value):
            return bytes(value[str(i)] for i in range(len(value)))
        if isinstance(value, list):
            return bytes(value)
    except (binascii.Error, ValueError, TypeError, KeyError):
        return None
    return None


def wa_long(value: Any) -> float | None:
    """A positive protobuf 64-bit number as a bridge's JSON gives it (a timestamp in
    seconds, a file length): a number, digits, or a Long (``{"low", "high", "unsigned"}``)."""
    if isinstance(value, Mapping) and isinstance(value.get("low"), int):
        high = value.get("high")
        value = (high if isinstance(high, int) else 0) * 2**32 + (value["low"] & 0xFFFFFFFF)
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return float(value)
    return None


# -- inbound: the Baileys message content ------------------------------------------------------

#: The content types that carry media, and the media type Baileys keys their decryption on.
WA_MEDIA = {
    "imageMessage": "image",
    "videoMessage": "video",
    "audioMessage": "audio",
    "documentMessage": "document",
    "stickerMessage": "sticker",
    "ptvMessage": "ptv",
}
#: Wrappers whose ``message`` holds the content.
_WRAPPERS = (
    "ephemeralMessage",
    "viewOnceMessage",
    "viewOnceMessageV2",
    "viewOnceMessageV2Extension",
    "documentWithCaptionMessage",
)
_VIEW_ONCE = frozenset({"viewOnceMessage", "viewOnceMessageV2", "viewOnceMessageV2Extension"})
#: Keys beside the content that are not content (Evolution adds ``base64`` and ``mediaUrl``).
_NOT_CONTENT = frozenset(
    {"messageContextInfo", "senderKeyDistributionMessage", "base64", "mediaUrl"}
)
#: Content that is no message from the user: revokes, edits, history and key notices.
_SYSTEM = frozenset({"protocolMessage", "keepInChatMessage", "pinInChatMessage"})


@dataclass(frozen=True, slots=True)
class WaContent:
    """What a Baileys ``message`` part holds, as an ``Inbound`` wants it."""

    #: The content's key (``conversation``, ``imageMessage``…).
    type: str
    text: str | None = None
    kind: Literal["message", "interaction"] = "message"
    #: The media type (``image``, ``video``, ``audio``, ``document``, ``sticker``, ``ptv``).
    media_type: str | None = None
    #: The media part (``url``, ``directPath``, ``mediaKey``, ``mimetype``…); empty without.
    media: Mapping[str, Any] = field(default_factory=dict)
    view_once: bool = False
    #: ``reply_to`` (the quoted message id), ``payload`` (a button's or row's id), and the
    #: part of a location, contact, reaction or poll.
    data: dict[str, Any] = field(default_factory=dict)


def _unwrap(message: Mapping[str, Any]) -> tuple[Mapping[str, Any], bool]:
    view_once = False
    for _ in range(4):  # wrappers nest (ephemeral around view-once around the content)
        for name in _WRAPPERS:
            inner = message.get(name)
            if isinstance(inner, Mapping) and isinstance(inner.get("message"), Mapping):
                view_once = view_once or name in _VIEW_ONCE
                message = inner["message"]
                break
        else:
            break
    return message, view_once


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def wa_content(message: Any) -> WaContent | None:
    """The content of a Baileys ``message`` part; ``None`` when it is no user message (a
    protocol message, key distribution only, no content at all)."""
    if not isinstance(message, Mapping):
        return None
    message, view_once = _unwrap(message)
    names = [k for k, v in message.items() if k not in _NOT_CONTENT and v is not None]
    if not names or names[0] in _SYSTEM:
        return None
    name = names[0]
    raw = message[name]
    part: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    data: dict[str, Any] = {}
    context = part.get("contextInfo")
    if isinstance(context, Mapping) and isinstance(context.get("stanzaId"), str):
        data["reply_to"] = context["stanzaId"]
    if name == "conversation":
        return WaContent(name, text=_text(raw), data=data, view_once=view_once)
    if name == "extendedTextMessage":
        return WaContent(name, text=_text(part.get("text")), data=data, view_once=view_once)
    if name in WA_MEDIA:
        return WaContent(
            name,
            text=_text(part.get("caption")),
            media_type=WA_MEDIA[name],
            media=part,
            view_once=view_once,
            data=data,
        )
    reply = _reply(name, part)
    if reply is not None:
        text, payload = reply
        return WaContent(name, text=text, kind="interaction", data={**data, "payload": payload})
    return WaContent(name, data={**data, name: dict(part)}, view_once=view_once)


def _reply(name: str, part: Mapping[str, Any]) -> tuple[str | None, Any] | None:
    """The text and payload of a button or list reply; ``None`` for other content."""
    if name == "buttonsResponseMessage":
        return _text(part.get("selectedDisplayText")), part.get("selectedButtonId")
    if name == "templateButtonReplyMessage":
        return _text(part.get("selectedDisplayText")), part.get("selectedId")
    if name == "listResponseMessage":
        row = part.get("singleSelectReply")
        rid = row.get("selectedRowId") if isinstance(row, Mapping) else None
        return _text(part.get("title")), rid
    if name == "interactiveResponseMessage":
        body, flow = part.get("body"), part.get("nativeFlowResponseMessage")
        text = _text(body.get("text")) if isinstance(body, Mapping) else None
        return text, flow.get("paramsJson") if isinstance(flow, Mapping) else None
    return None


def message_key(key: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of a message key that name the message (``remoteJid``, ``id``,
    ``fromMe``, ``participant``), as a media reference keeps them."""
    out = {k: key[k] for k in ("remoteJid", "id", "participant") if isinstance(key.get(k), str)}
    if isinstance(key.get("fromMe"), bool):
        out["fromMe"] = key["fromMe"]
    return {k: v for k, v in out.items() if v != ""}


def wa_message(channel: str, msg: Any) -> tuple[Mapping[str, Any], WaContent] | None:
    """The ``key`` and content of a Baileys ``WAMessage`` (``{key, message, …}``); ``None``
    when it is nothing to answer: sent by this account (``key.fromMe``), a status or
    broadcast, no user content. ``MalformedWebhook`` without ``key.remoteJid`` and ``key.id``."""
    key = msg.get("key") if isinstance(msg, Mapping) else None
    if not (
        isinstance(key, Mapping)
        and isinstance(key.get("remoteJid"), str)
        and isinstance(key.get("id"), str)
        and key["remoteJid"]
        and key["id"]
    ):
        raise MalformedWebhook(f"{channel}: a message without key.remoteJid and key.id")
    if key.get("fromMe") is True or key["remoteJid"].endswith("@broadcast"):
        return None
    content = wa_content(msg.get("message"))
    return None if content is None else (key, content)


def wa_inbound(
    channel: str,
    msg: Mapping[str, Any],
    key: Mapping[str, Any],
    content: WaContent,
    media: Media | None,
    **extra: Any,
) -> Inbound:
    """The ``Inbound`` of a Baileys ``WAMessage``: ``id`` the message id (a retried webhook
    has the same), ``chat_id`` the chat's JID (a person's or a group's), ``sender`` the
    participant in a group, ``data`` the content's type and details, ``profile_name``
    (``pushName``), ``jid_alt`` (the phone JID of a ``@lid`` chat) and ``extra``."""
    chat = str(key["remoteJid"])
    participant = key.get("participant")
    data: dict[str, Any] = {"type": content.type, **content.data, **extra}
    if isinstance(msg.get("pushName"), str) and msg["pushName"]:
        data["profile_name"] = msg["pushName"]
    if isinstance(key.get("remoteJidAlt"), str) and key["remoteJidAlt"]:
        data["jid_alt"] = key["remoteJidAlt"]
    if content.view_once:
        data["view_once"] = True
    return Inbound(
        id=str(key["id"]),
        chat_id=chat,
        sender=participant if isinstance(participant, str) and participant else chat,
        channel=channel,
        ts=wa_long(msg.get("messageTimestamp")),
        text=content.text,
        kind=content.kind,
        media=media,
        data=data,
    )


# -- statuses of our messages (Baileys' message status) -----------------------------------

#: Baileys' ``WAMessageStatus`` (``proto.WebMessageInfo.Status``), by number (Baileys'
#: JSON) and by name (Evolution's ``messages.update``): ``PENDING`` (1, not yet on
#: WhatsApp's servers) and ``DELETED`` (Evolution) give no status.
WA_STATUS: dict[int | str, DeliveryState] = {
    0: DeliveryState.FAILED,
    "ERROR": DeliveryState.FAILED,
    2: DeliveryState.SENT,
    "SERVER_ACK": DeliveryState.SENT,
    3: DeliveryState.DELIVERED,
    "DELIVERY_ACK": DeliveryState.DELIVERED,
    4: DeliveryState.READ,
    "READ": DeliveryState.READ,
    5: DeliveryState.READ,  # PLAYED: a voice note was listened to, so it was read
    "PLAYED": DeliveryState.READ,
}


def wa_status(
    channel: str,
    chat: Any,
    mid: Any,
    status: Any,
    *,
    ts: float | None = None,
    code: Any = None,
) -> DeliveryStatus | None:
    """The ``DeliveryStatus`` of one of our messages (``chat``'s JID, ``mid`` its key id)
    with Baileys' status ``status``; ``None`` when that status is no delivery state.
    ``MalformedWebhook`` without a chat or id."""
    if not (isinstance(chat, str) and chat and isinstance(mid, str) and mid):
        raise MalformedWebhook(f"{channel}: a message status without remoteJid or id")
    state = WA_STATUS.get(status) if isinstance(status, int | str) else None
    if state is None:
        return None
    failed = state is DeliveryState.FAILED
    return DeliveryStatus(
        chat_id=chat,
        message_id=mid,
        status=state,
        channel=channel,
        ts=ts,
        code=str(code) if failed and code is not None else None,
    )


# -- the webhook side -------------------------------------------------------------------------


class BridgeWebhook:
    """The part of a bridge's webhook the three share: no handshake, a bare 200, a JSON
    object body. Subclasses set ``channel`` and implement ``verify`` and ``parse``."""

    channel: str = ""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def handshake(self, request: WebhookRequest) -> WebhookReply | None:
        return None

    def reply(self, request: WebhookRequest, produced: list[Any]) -> WebhookReply:
        return WebhookReply(200, b"")

    def body(self, request: WebhookRequest) -> dict[str, Any]:
        """The JSON object of the body, or ``MalformedWebhook``."""
        try:
            body = json.loads(request.body)
        except ValueError:
            raise MalformedWebhook(f"{self.channel}: the body is not JSON") from None
        if not isinstance(body, dict):
            raise MalformedWebhook(f"{self.channel}: the body is not a JSON object")
        return body

"""Baileys (WhatsApp Web), through the HTTP bridge its users run around the library:
``BaileysProvider`` sends through the bridge, ``BaileysWebhook`` verifies and parses the
events the bridge posts. What the WhatsApp Web bridges share is in
``botmesh.providers.wa_bridges``.

The bridge. Baileys is a Node library, not a service; its users wrap it in an HTTP bridge.
botmesh speaks the API of ``fazer-ai/baileys-api`` (the bridge of the Chatwoot integration:
an API key per caller, a webhook per connection, idempotent sends, media kept for download).
The contract botmesh relies on, which another bridge can implement to be used here:

===========================================  ===================================================
``POST /connections/{phone}/send-message``   JSON ``{"jid", "messageContent",
                                             "chatwootMessageId"?}`` → 200 ``{"data": {"key":
                                             {"remoteJid", "fromMe", "id"}, "messageTimestamp"}}``;
                                             a second call with the same ``chatwootMessageId``
                                             within 10 minutes answers the first one's result
                                             (409 while it is still in flight)
``GET /media/{messageId}``                   the bytes of an inbound message's media (404 when
                                             the bridge no longer has them)
every call                                   header ``x-api-key: <BAILEYS_API_KEY>``; 401 without
                                             a valid key, 403 when the key does not own ``phone``
the webhook (bridge → gateway)               ``POST`` JSON ``{"event": "messages.upsert",
                                             "data": {"type": "notify", "messages": [WAMessage]},
                                             "extra": {"media": {id: base64}}?,
                                             "webhookVerifyToken"}``
``PATCH /connections/{phone}/messages``      ``{"jid", "key": {"id", "remoteJid", "fromMe"},
                                             "messageContent": {"text", "mentions"?}}`` → 200
                                             ``{"data": {"key", "messageTimestamp"}}``: an edit
``DELETE /connections/{phone}/messages``     ``{"jid", "key"}`` → 200: a delete for everyone
``PATCH /connections/{phone}/presence``      ``{"type": "composing", "toJid"}`` → 200
===========================================  ===================================================

``{phone}`` is ``BAILEYS_PHONE_NUMBER`` (``+`` and digits), the connection opened with
``POST /connections/{phone}`` and ``{"webhookUrl": "https://<gateway>/baileys",
"webhookVerifyToken": <BAILEYS_WEBHOOK_VERIFY_TOKEN>, "includeMedia": false}``.

Sending: ``jid`` is the chat id as the webhook gave it (``…@s.whatsapp.net``, ``…@g.us``,
``…@lid``), or a phone number (digits, ``+`` and spaces allowed) made into a user JID. A text
is ``{"text"}``; media is sent as its bytes (``media.data`` or the file at ``media.path``,
base64: the bridge takes nothing else) as ``image``, ``video``, ``audio`` or ``document``
by its mime type, the text as its caption (audio takes none). ``options`` go into
``messageContent`` (``mentions``, ``quotedMessage``, ``ptt``).

Edit, delete, typing (the bridge's ``controllers/connections`` and their OpenAPI
descriptions): ``edit`` replaces the text (or a caption) of a message this number sent,
within WhatsApp's 15 minutes; ``delete`` revokes it for everyone; ``typing`` shows
"typing…", which WhatsApp holds about 25 s. The message id is the ``key.id`` ``send``
returned, ``fromMe: true``. Baileys sends an edit or a revoke as a protocol message and
WhatsApp answers nothing about it: one of a message that does not exist, or too old, is
a 200 too, and changes nothing. The errors are the send's; a connection that is down is a
500 here (the send's route alone says 404), retried as one.

Idempotency (``send_keyed``): ``chatwootMessageId`` is the send's key (hashed): a resend of the
same send answers the message already made instead of making another, for 10 minutes (the
bridge keeps the answer in its Redis). ``resolve_ambiguous`` resends with the key within
``key_window`` (default 300 s, at most 540 s) of the first attempt; later the bridge may have
forgotten the key, so it cannot tell and the ``outbox.on_ambiguous`` policy applies.

Errors, before the common rules of ``wa_bridges``:

==================================================  =========================================
404 (``Phone number not connected``)                retryable: the bridge has no live session for
                                                    the number now (it reconnects it)
409 (``Message is already being processed``)        retryable: the same key is in flight
413                                                 ``PayloadTooLargeError``
a 2xx without ``key.id``                            retryable with a key (the resend is
                                                    deduplicated), else final (it may be out)
==================================================  =========================================

Media download (``download_media``): the bridge's ``GET /media/{key.id}`` first (it saved the
file when the message arrived); when it answers 404, WhatsApp's CDN: the media's ``url`` (or
``https://mmg.whatsapp.net`` + ``directPath``), on ``whatsapp.net`` only unless
``media_ref_hosts`` says otherwise, decrypted with the journaled ``mediaKey`` as Baileys does
(HKDF-SHA256, AES-256-CBC, the HMAC and the ``fileSha256`` checked). The CDN keeps media for
a few weeks; later, ``load_media_of`` reports the download failed.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import re
import time
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar, Self

from cryptography.hazmat.primitives import hashes, padding
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from botmesh.providers.http import HttpAnswer
from botmesh.providers.meta import env_value
from botmesh.providers.wa_bridges import (
    BridgeProvider,
    BridgeWebhook,
    WaContent,
    b64_bytes,
    media_kind,
    message_key,
    wa_inbound,
    wa_long,
    wa_message,
    wa_status,
)
from botmesh.providers.webhooks import BadSignature, MalformedWebhook, WebhookRequest, same
from botmesh.state.errors import (
    ConfigError,
    PayloadTooLargeError,
    ProviderError,
    RecipientUnreachableError,
    SendError,
    UnsupportedContentError,
)
from botmesh.state.messages import DeliveryStatus, Inbound, Media, Outbound, SendResult

__all__ = ["BaileysProvider", "BaileysWebhook", "decrypt_media", "key_id"]

log = logging.getLogger("botmesh.providers.baileys")

#: How long the bridge keeps a key's answer (its ``IDEMPOTENCY_TTL``), seconds.
KEY_TTL = 600.0
#: The longest ``key_window`` accepted: the TTL less a minute for the calls and the clocks.
KEY_WINDOW_MAX = 540.0
#: WhatsApp's media CDN (``mmg.whatsapp.net``…).
WHATSAPP_CDN = ("whatsapp.net",)
CDN_URL = "https://mmg.whatsapp.net"
_PHONE = re.compile(r"^\+\d{5,15}$")
#: A JID (``5511…@s.whatsapp.net``, ``…@g.us``, ``…@lid``): nothing a path or a list could hide.
_JID = re.compile(r"^[0-9A-Za-z._:-]{1,128}@[a-z.]{1,64}$")
#: The bridge's message ids (its ``/media/:messageId`` pattern).
_MEDIA_ID = re.compile(r"^[A-Z0-9]{1,64}$")
#: HKDF ``info`` per media type (Baileys' ``MEDIA_HKDF_KEY_MAPPING``).
_HKDF_INFO = {
    "image": b"WhatsApp Image Keys",
    "sticker": b"WhatsApp Image Keys",
    "video": b"WhatsApp Video Keys",
    "ptv": b"WhatsApp Video Keys",
    "gif": b"WhatsApp Video Keys",
    "audio": b"WhatsApp Audio Keys",
    "document": b"WhatsApp Document Keys",
}
_MAC_LEN = 10


def key_id(key: str) -> str:
    """The ``chatwootMessageId`` of a send key: ``botmesh-`` and 40 hex digits of its SHA-256,
    the same on every attempt and every process."""
    return "botmesh-" + hashlib.sha256(key.encode()).hexdigest()[:40]


def decrypt_media(blob: bytes, media_key: bytes, media_type: str) -> bytes:
    """A WhatsApp media file as the CDN serves it (AES-256-CBC ciphertext + 10 bytes of
    HMAC-SHA256), decrypted with its ``mediaKey``; ``ProviderError`` when it does not check."""
    info = _HKDF_INFO.get(media_type)
    if info is None:
        raise ProviderError(f"baileys: no decryption keys for media type {media_type!r}")
    keys = HKDF(algorithm=hashes.SHA256(), length=112, salt=None, info=info).derive(media_key)
    iv, cipher_key, mac_key = keys[:16], keys[16:48], keys[48:80]
    body, mac = blob[:-_MAC_LEN], blob[-_MAC_LEN:]
    if not body or len(body) % 16:
        raise ProviderError("baileys: the CDN's file is not an encrypted WhatsApp media")
    want = hmac.new(mac_key, iv + body, hashlib.sha256).digest()[:_MAC_LEN]
    if not hmac.compare_digest(mac, want):
        raise ProviderError("baileys: the CDN's file does not match its media key (HMAC)")
    decryptor = Cipher(algorithms.AES(cipher_key), modes.CBC(iv)).decryptor()
    unpadder = padding.PKCS7(128).unpadder()
    try:
        plain = unpadder.update(decryptor.update(body) + decryptor.finalize())
        return plain + unpadder.finalize()
    except ValueError:
        raise ProviderError("baileys: the decrypted media has a bad padding") from None


def _jid(chat_id: str) -> str:
    """The JID to send to: ``chat_id`` when it is one, a phone number made into one."""
    if "@" not in chat_id:
        digits = re.sub(r"[\s+()-]", "", chat_id)
        if digits.isdigit() and 5 <= len(digits) <= 15:
            return f"{digits}@s.whatsapp.net"
    if not _JID.match(chat_id):
        raise RecipientUnreachableError(
            f"baileys: chat_id {chat_id!r} is neither a WhatsApp JID nor a phone number"
        )
    return chat_id


class BaileysProvider(BridgeProvider):
    """Sends as one WhatsApp number connected to the bridge (``phone``, ``+`` and digits)
    with the bridge's API key. ``key_window`` is seconds (see the module docstring);
    ``media_view_once`` journals view-once media too (the reference's ``durableMedia:
    {viewOnce: true}``)."""

    name = "baileys"
    #: It posts status webhooks (``botmesh.state.statuses``): its sends are named under
    #: their message ids when recorded sent.
    delivery_statuses = True
    media_channel = "baileys"
    env_prefix: ClassVar[str] = "BAILEYS"
    credential_env: ClassVar[str] = "BAILEYS_API_KEY"
    session_env: ClassVar[str] = "BAILEYS_PHONE_NUMBER"
    session_fix: ClassVar[str] = "the connection's phone number on the bridge (+5511…)"
    session_safe: ClassVar[str] = "+"

    def __init__(
        self,
        api_url: str,
        api_key: str,
        phone: str,
        *,
        key_window: float = 300.0,
        timeout: float = 15.0,
        media_ref_hosts: Iterable[str] | None = None,
        allow_private_media: bool = False,
        media_max_bytes: int | None = None,
        media_view_once: bool = False,
        allow_plain_http: bool = False,
    ) -> None:
        if not _PHONE.match(phone or ""):
            raise ConfigError(
                "BAILEYS_PHONE_NUMBER",
                f"{phone!r} is not a connection's phone number: + and 5 to 15 digits, as in "
                "POST /connections/+5511…",
            )
        if not 0 < key_window <= KEY_WINDOW_MAX:
            raise ConfigError(
                "baileys.key_window",
                f"must be in (0, {KEY_WINDOW_MAX:.0f}] seconds, got {key_window}: the bridge "
                f"keeps a key for {KEY_TTL:.0f} s, so a later resend could duplicate",
            )
        super().__init__(
            api_url,
            api_key,
            phone,
            timeout=timeout,
            media_ref_hosts=media_ref_hosts,
            allow_private_media=allow_private_media,
            media_max_bytes=media_max_bytes,
            media_view_once=media_view_once,
            allow_plain_http=allow_plain_http,
        )
        self.key_window = key_window
        # CDN downloads: WhatsApp's hosts unless media_ref_hosts replaces them.
        self.media_hosts = WHATSAPP_CDN if self.media_ref_hosts is None else self.media_ref_hosts

    @classmethod
    def env_options(cls, env: Mapping[str, str]) -> dict[str, Any]:
        """``BAILEYS_MEDIA_VIEW_ONCE=1``: journal view-once media too."""
        flag = env.get("BAILEYS_MEDIA_VIEW_ONCE", "").strip()
        if flag not in ("", "0", "1"):
            raise ConfigError("BAILEYS_MEDIA_VIEW_ONCE", f"{flag!r} is not 1 or 0")
        return {"media_view_once": flag == "1"}

    def _headers(self) -> dict[str, str]:
        return {"x-api-key": self._credential}

    # -- sending --------------------------------------------------------------------------

    async def send(self, message: Outbound) -> SendResult:
        """Send without a key (no deduplication by the bridge)."""
        return await self._send(message, None)

    async def send_keyed(self, message: Outbound, key: str) -> SendResult:
        """Send with the key as ``chatwootMessageId``: a resend within the bridge's 10
        minutes answers the message already made."""
        return await self._send(message, key_id(key))

    async def resolve_ambiguous(
        self, message: Outbound, key: str, since: float
    ) -> SendResult | None:
        """Within ``key_window`` s of ``since``, the keyed resend's answer (the message made
        by the first attempt when it went out, else the only one); after it, raise."""
        age = time.time() - since
        if age > self.key_window:
            raise ProviderError(
                f"baileys: cannot tell whether the send went out: it was first tried {age:.0f} s "
                f"ago, beyond key_window={self.key_window:.0f} s, after which the bridge may no "
                "longer know its key; the outbox.on_ambiguous policy applies"
            )
        return await self._send(message, key_id(key))

    async def _send(self, message: Outbound, idempotency: str | None) -> SendResult:
        body: dict[str, Any] = {
            "jid": _jid(message.chat_id),
            "messageContent": await self._content(message),
        }
        if idempotency is not None:
            body["chatwootMessageId"] = idempotency
        path = f"/connections/{self.session_path}/send-message"
        answer = await self.call("POST", path, json_body=body)
        data = answer.get("data") if isinstance(answer, dict) else None
        key = data.get("key") if isinstance(data, dict) else None
        mid = key.get("id") if isinstance(key, dict) else None
        if isinstance(mid, str) and mid:
            return SendResult(mid)
        raise SendError(
            "baileys: the bridge answered without a message key"
            + ("; resending with the same key is safe" if idempotency else "; it may be out"),
            retryable=idempotency is not None,
        )

    async def _content(self, message: Outbound) -> dict[str, Any]:
        media = message.media
        if media is None:
            if not message.text:
                raise UnsupportedContentError("baileys: the message has neither text nor media")
            return {**message.options, "text": message.text}
        found = await self.bridge_media(media, message.text, urls=False)
        content: dict[str, Any] = {
            **message.options,
            found.kind: found.base64,
            "mimetype": found.mime,
        }
        if found.kind == "document":
            content["fileName"] = found.name
        if message.text:
            content["caption"] = message.text
        return content

    # -- edit, delete, typing (botmesh.state.ports.Edits, Deletes, Typing) -----------------

    def _key(self, chat_id: str, message_id: str) -> dict[str, Any]:
        """``jid`` and the message ``key`` of one of this number's messages."""
        jid = _jid(chat_id)
        return {"jid": jid, "key": {"id": message_id, "remoteJid": jid, "fromMe": True}}

    async def edit(self, message: Outbound, message_id: str) -> SendResult:
        """``PATCH /connections/{phone}/messages`` ``{"jid", "key", "messageContent":
        {"text", "mentions"?}}``: the text (or a caption) of a message this number sent."""
        if not message.text:
            raise UnsupportedContentError("baileys: an edit needs a text")
        content: dict[str, Any] = {"text": message.text}
        if "mentions" in message.options:
            content["mentions"] = message.options["mentions"]
        body = {**self._key(message.chat_id, message_id), "messageContent": content}
        await self.call("PATCH", f"/connections/{self.session_path}/messages", json_body=body)
        return SendResult(message_id)

    async def delete(self, chat_id: str, message_id: str) -> None:
        """``DELETE /connections/{phone}/messages`` ``{"jid", "key"}``: a revoke, for
        everyone; WhatsApp takes a second one without complaint."""
        body = self._key(chat_id, message_id)
        await self.call("DELETE", f"/connections/{self.session_path}/messages", json_body=body)

    async def typing(self, chat_id: str) -> None:
        """``PATCH /connections/{phone}/presence`` ``{"type": "composing", "toJid"}``."""
        body = {"type": "composing", "toJid": _jid(chat_id)}
        await self.call("PATCH", f"/connections/{self.session_path}/presence", json_body=body)

    def _classify(self, answer: HttpAnswer, body: Any, detail: str) -> SendError | None:
        what = f"baileys: HTTP {answer.status}: {detail}"
        if answer.status == 404:
            return SendError(
                f"{what}: the bridge has no live session for {self.session} now (it "
                "reconnects it; else connect it, and check BAILEYS_PHONE_NUMBER)",
                retryable=True,
            )
        if answer.status == 409:
            return SendError(f"{what}: the same send is in flight; retried", retryable=True)
        if answer.status == 413:
            return PayloadTooLargeError(f"{what}; send a smaller file")
        return None

    # -- media download -------------------------------------------------------------------

    async def download_media(self, media: Media) -> bytes:
        if media.data is not None:
            return media.data
        extra = media.extra
        key = extra.get("key")
        mid = key.get("id") if isinstance(key, Mapping) else None
        if isinstance(mid, str) and _MEDIA_ID.match(mid):
            answer = await self.request(
                "GET", f"{self.api_url}/media/{mid}", headers=self._headers()
            )
            if answer.ok:
                if len(answer.body) > self.media_max_bytes:
                    raise ProviderError(
                        f"baileys: media is over media_max_bytes={self.media_max_bytes}"
                    )
                return answer.body
            if answer.status != 404:
                raise ProviderError(f"baileys: media download: {self.error(answer, None)}")
            log.info("baileys: the bridge no longer has media %s; trying WhatsApp's CDN", mid)
        return await self._from_cdn(media)

    async def _from_cdn(self, media: Media) -> bytes:
        extra = media.extra
        media_key = b64_bytes(extra.get("mediaKey"))
        url = extra.get("url")
        if not isinstance(url, str) and isinstance(extra.get("directPath"), str):
            url = CDN_URL + extra["directPath"]
        if media_key is None or not isinstance(url, str):
            raise ProviderError(
                "baileys: the bridge no longer has this media, and it has no media key and "
                "CDN path to fetch it from WhatsApp; ask the sender to send it again"
            )
        kind = extra.get("type") or media_kind(media.mime)
        blob = await self.fetch_media(url)
        enc_sha = b64_bytes(extra.get("fileEncSha256"))
        if enc_sha is not None and hashlib.sha256(blob).digest() != enc_sha:
            raise ProviderError("baileys: the CDN's file does not match its fileEncSha256")
        plain = decrypt_media(blob, media_key, str(kind))
        sha = b64_bytes(extra.get("fileSha256"))
        if sha is not None and hashlib.sha256(plain).digest() != sha:
            raise ProviderError("baileys: the decrypted media does not match its fileSha256")
        return plain


# -- webhooks ---------------------------------------------------------------------------------


def _media(content: WaContent, key: Mapping[str, Any], inline: bytes | None) -> Media | None:
    """The media of a message: what Baileys needs to download it again (``extra``: the
    media part's CDN fields, the message key, the media type), and the bytes the bridge
    inlined, if any. Byte fields become base64."""
    if content.media_type is None:
        return None
    part = content.media
    extra: dict[str, Any] = {"key": message_key(key), "type": content.media_type}
    for name in ("url", "directPath", "mimetype"):
        if isinstance(part.get(name), str):
            extra[name] = part[name]
    for name in ("mediaKey", "fileSha256", "fileEncSha256"):
        raw = b64_bytes(part.get(name))
        if raw is not None:
            extra[name] = base64.b64encode(raw).decode("ascii")
    length = wa_long(part.get("fileLength"))
    if length is not None:
        extra["fileLength"] = int(length)
    if content.view_once:
        extra["view_once"] = True
    file_name = part.get("fileName")
    return Media(
        provider="baileys",
        mime=part.get("mimetype") if isinstance(part.get("mimetype"), str) else None,
        name=file_name if isinstance(file_name, str) else None,
        data=inline,
        extra=extra,
    )


class BaileysWebhook(BridgeWebhook):
    """The bridge's webhook: every post carries the connection's ``webhookVerifyToken`` in
    its body (the bridge signs nothing), compared in constant time. ``messages.upsert``
    events of type ``notify`` give one record per message from someone else; every other
    event (receipts, presence, connection updates, history) gives none.

    ``statuses`` reads ``messages.update`` (Baileys' ``{key, update}`` list): for each
    update of a message this account sent (``key.fromMe``) with an ``update.status``,
    ``message_id`` = ``key.id`` (what ``send`` returned), ``chat_id`` = ``key.remoteJid``,
    ``status`` from Baileys' number: 2 sent, 3 delivered, 4 (read) and 5 (played) read,
    0 failed with the code WhatsApp gave in ``update.messageStubParameters`` (``463``…);
    1 (pending) gives none, as do updates without a status (edits, reactions). A group's
    per-member receipts (``message-receipt.update``) give none. No time is given."""

    channel = "baileys"

    def __init__(self, verify_token: str) -> None:
        if len(verify_token or "") < 6:
            raise ConfigError(
                "BAILEYS_WEBHOOK_VERIFY_TOKEN",
                "is shorter than 6 characters (the bridge's minimum); give the connection's "
                "webhookVerifyToken",
            )
        self._token = verify_token

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Self:
        """``BAILEYS_WEBHOOK_VERIFY_TOKEN``: the ``webhookVerifyToken`` of the connection."""
        return cls(
            env_value(
                env,
                "BAILEYS_WEBHOOK_VERIFY_TOKEN",
                "set it to the webhookVerifyToken given to POST /connections/{phone}",
            )
        )

    def verify(self, request: WebhookRequest) -> None:
        try:
            given = self.body(request).get("webhookVerifyToken")
        except MalformedWebhook:
            given = None
        if not isinstance(given, str):
            raise BadSignature("baileys: the body has no webhookVerifyToken")
        if not same(given, self._token):
            raise BadSignature(
                "baileys: webhookVerifyToken is wrong; check BAILEYS_WEBHOOK_VERIFY_TOKEN"
            )

    def statuses(self, request: WebhookRequest) -> list[DeliveryStatus]:
        body = self.body(request)
        if not isinstance(body.get("event"), str):
            raise MalformedWebhook("baileys: the body has no event")
        if body["event"] != "messages.update":
            return []
        data = body.get("data")
        if not isinstance(data, list):
            raise MalformedWebhook("baileys: messages.update without a list of updates")
        out = []
        for item in data:
            key = item.get("key") if isinstance(item, dict) else None
            update = item.get("update") if isinstance(item, dict) else None
            if not isinstance(key, dict) or not isinstance(update, dict):
                raise MalformedWebhook("baileys: a message update without key and update")
            if key.get("fromMe") is not True or "status" not in update:
                continue
            stub = update.get("messageStubParameters")
            code = stub[0] if isinstance(stub, list) and stub else None
            found = wa_status(
                self.channel, key.get("remoteJid"), key.get("id"), update["status"], code=code
            )
            if found is not None:
                out.append(found)
        return out

    def parse(self, request: WebhookRequest) -> list[Inbound]:
        body = self.body(request)
        if not isinstance(body.get("event"), str):
            raise MalformedWebhook("baileys: the body has no event")
        data = body.get("data")
        if body["event"] != "messages.upsert":
            return []
        if not isinstance(data, dict) or not isinstance(data.get("messages"), list):
            raise MalformedWebhook("baileys: messages.upsert without a messages list")
        if data.get("type") != "notify":
            return []  # "append": history, and what this account sent from elsewhere
        extra = body.get("extra")
        inline = extra.get("media") if isinstance(extra, dict) else None
        out = []
        for msg in data["messages"]:
            found = wa_message(self.channel, msg)
            if found is None:
                continue
            key, content = found
            raw = inline.get(key["id"]) if isinstance(inline, dict) else None
            media = _media(content, key, b64_bytes(raw) if raw is not None else None)
            out.append(wa_inbound(self.channel, msg, key, content, media))
        return out

"""Discord (REST API v10, https://discord.com/api/v10): ``DiscordProvider`` sends as a bot,
``DiscordWebhook`` verifies and parses what Discord posts to an Interactions Endpoint URL.

Sending. ``POST /channels/{chat_id}/messages`` with ``Authorization: Bot <token>`` (never
logged: the token is a secret of the ``HttpChannel``). ``chat_id`` is a channel id (a DM
channel's too: an interaction's ``channel_id`` is one). ``options`` pass through into the
JSON payload (``embeds``, ``components``, ``allowed_mentions``, ``message_reference``…);
``content``, ``nonce`` and ``enforce_nonce`` are ours.

Media: a URL goes **in the content**, on its own line after the text: Discord unfurls an
image, GIF or video link into a preview for any file type, with no embed rules to meet;
it counts against the 2000-character limit. Bytes (``media.data``, or a file at
``media.path``) are uploaded as multipart: ``payload_json`` plus ``files[0]``.

Idempotency (``send_keyed``, ``botmesh.state.ports.KeyedSends``): the message carries
``nonce`` = the first 25 characters of the base32 SHA-256 of the key, with
``enforce_nonce: true``. Discord then returns the existing message instead of making a
new one when a message with the same nonce by the same author was created in "the past few
minutes" (Discord's words; the exact window is not documented).

Ambiguity (``resolve_ambiguous``, ``botmesh.state.ports.AmbiguityResolver``): within
``nonce_window`` seconds after ``since`` (the first attempt), the send is made again with the
same nonce: its answer is the original message when that one went out, or the only message
when it did not. After the window Discord may have forgotten the nonce and the resend could
duplicate, so it raises ``ProviderError("cannot tell…")`` and the ``outbox.on_ambiguous``
policy applies. The default, 60 s, stays well inside "a few minutes" even after the resend's
own timeout (15 s), and ``since`` is at or before the creation of the first message, so the
age Discord sees is never more than ours plus the call. Windows over 120 s are refused.

Errors (JSON ``{"code": N, "message": ...}``):

- 429 ``{"message", "retry_after": seconds, "global": bool}`` → ``RateLimitedError`` with
  the body's ``retry_after`` (more precise than the ``Retry-After`` header);
- 50007 cannot send messages to this user, 10003 unknown channel, 50001 missing access,
  50013 missing permissions → ``RecipientUnreachableError``;
- 40005 request entity too large, HTTP 413, and 50035 invalid form body whose errors name
  ``content`` with ``BASE_TYPE_MAX_LENGTH`` → ``PayloadTooLargeError``; other 50035 → a final
  ``SendError`` listing the fields;
- 50006 cannot send an empty message → ``UnsupportedContentError``;
- 401 → a final ``SendError``: the token is wrong; 5xx and transport errors → retryable;
  other 4xx → final.

Edit, delete, typing: ``edit`` is ``PATCH /channels/{chat_id}/messages/{message_id}``
(``content`` and the ``options``; no time limit for the bot's own messages), ``delete`` is
``DELETE`` on the same path (for everyone; a message already gone, 404 code 10008 Unknown
Message, is a success), ``typing`` is ``POST /channels/{chat_id}/typing``. Their errors map as
a send's; editing an unknown message (10008) is final.

Media download: the attachment URL, no auth header, from the Discord CDNs only
(``discordapp.com``, ``discordapp.net``; ``media_ref_hosts`` replaces the list).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import logging
import re
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Self

import aiohttp
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from botmesh.providers.base import ChannelProvider, check_api_url
from botmesh.providers.http import HttpAnswer, retry_after_of, status_error
from botmesh.providers.webhooks import BadSignature, MalformedWebhook, WebhookReply, WebhookRequest
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

__all__ = ["DiscordProvider", "DiscordWebhook", "nonce_of"]

log = logging.getLogger("botmesh.providers.discord")

API_URL = "https://discord.com/api/v10"
TEXT_LIMIT = 2000
#: Seconds after the first attempt during which a resend with the same nonce is safe.
NONCE_WINDOW = 60.0
#: The longest ``nonce_window`` accepted: Discord's own window is "a few minutes".
NONCE_WINDOW_MAX = 120.0
#: Discord's CDN hosts (attachments).
CDN_HOSTS = ("discordapp.com", "discordapp.net")
USER_AGENT = "DiscordBot (https://github.com/botmesh/botmesh, 0.1)"
#: Discord's epoch (2015-01-01) in milliseconds, for the time inside a snowflake.
DISCORD_EPOCH_MS = 1420070400000

_SNOWFLAKE = re.compile(r"^\d{1,20}$")
_UNREACHABLE = {50007, 10003, 50001, 50013}
#: Discord's code for a message that does not exist (or no longer does).
UNKNOWN_MESSAGE = 10008


def nonce_of(key: str) -> str:
    """The nonce of a send key: 25 characters (125 bits) of the base32 SHA-256 of the key,
    the same on every attempt and every process."""
    digest = hashlib.sha256(key.encode()).digest()
    return base64.b32encode(digest).decode().rstrip("=").lower()[:25]


def _form_errors(tree: Any, path: str = "") -> Iterator[tuple[str, str, str]]:
    """``(field path, code, message)`` of each error in a 50035 ``errors`` tree."""
    if not isinstance(tree, dict):
        return
    for key, value in tree.items():
        if key == "_errors" and isinstance(value, list):
            for e in value:
                if isinstance(e, dict):
                    yield path, str(e.get("code", "")), str(e.get("message", ""))
        else:
            yield from _form_errors(value, f"{path}.{key}" if path else str(key))


class DiscordProvider(ChannelProvider):
    """Sends as a Discord bot (the token from the Developer Portal, Bot page)."""

    name = "discord"
    media_channel = "discord"
    text_limit: int | None = TEXT_LIMIT
    #: Discord's global limit of a bot: 50 requests a second. Its per-channel limits are
    #: not published (the API says them in headers): not declared.
    rate_limits = ChannelLimits(channel=Rate(50))

    def __init__(
        self,
        bot_token: str,
        *,
        base_url: str = API_URL,
        nonce_window: float = NONCE_WINDOW,
        timeout: float = 15,
        allow_private_media: bool = False,
        media_ref_hosts: Iterable[str] | None = None,
    ) -> None:
        if not bot_token or any(c.isspace() for c in bot_token):
            raise ConfigError(
                "bot_token",
                "empty or has spaces: give the bot token from the Developer Portal (Bot page) "
                "without the 'Bot ' prefix; check DISCORD_BOT_TOKEN",
            )
        if not 0 < nonce_window <= NONCE_WINDOW_MAX:
            raise ConfigError(
                "nonce_window",
                f"must be in (0, {NONCE_WINDOW_MAX:.0f}] seconds, got {nonce_window}: Discord "
                "only deduplicates a nonce for a few minutes, so a later resend could duplicate",
            )
        self.base_url = check_api_url(base_url, "base_url", API_URL)
        self.nonce_window = nonce_window
        super().__init__(
            timeout=timeout,
            secrets=(bot_token,),
            media_ref_hosts=media_ref_hosts,
            allow_private_media=allow_private_media,
        )
        self._headers = {"Authorization": f"Bot {bot_token}", "User-Agent": USER_AGENT}
        # Attachment downloads: the CDN hosts unless media_ref_hosts replaces them.
        self.media_hosts = self.media_ref_hosts if self.media_ref_hosts is not None else CDN_HOSTS

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Self:
        """``DISCORD_BOT_TOKEN`` (required), ``DISCORD_API_URL`` (default the v10 API, path
        included); ``DISCORD_ALLOW_PRIVATE_MEDIA=1`` is read only when the API URL is on
        127.0.0.1 (a local fake)."""
        token = env.get("DISCORD_BOT_TOKEN", "").strip()
        if not token:
            raise ConfigError(
                "DISCORD_BOT_TOKEN",
                "not set: set it to the bot token from the Developer Portal (Bot page)",
            )
        if token.startswith("Bot "):
            raise ConfigError("DISCORD_BOT_TOKEN", "give the token without the 'Bot ' prefix")
        base, media = cls.api_env(env, "DISCORD", API_URL)
        return cls(token, base_url=base, **media)

    # -- send -----------------------------------------------------------------------------

    async def send(self, message: Outbound) -> SendResult:
        """Send without a nonce (no deduplication by Discord)."""
        return await self._create(message, None)

    async def send_keyed(self, message: Outbound, key: str) -> SendResult:
        """Send with the key's nonce and ``enforce_nonce``: a resend within Discord's window
        returns the message already made."""
        return await self._create(message, nonce_of(key))

    async def resolve_ambiguous(
        self, message: Outbound, key: str, since: float
    ) -> SendResult | None:
        """Within ``nonce_window`` s of ``since``, the resend's answer (the original message
        when it went out, the only one otherwise); after it, raise: cannot tell."""
        age = time.time() - since
        if age > self.nonce_window:
            raise ProviderError(
                f"discord: cannot tell whether the send went out: it was first tried {age:.0f} s "
                f"ago, beyond nonce_window={self.nonce_window:.0f} s, after which Discord may no "
                "longer deduplicate its nonce; the outbox.on_ambiguous policy applies"
            )
        return await self._create(message, nonce_of(key))

    async def _create(self, message: Outbound, nonce: str | None) -> SendResult:
        if not _SNOWFLAKE.match(message.chat_id):
            raise RecipientUnreachableError(
                f"discord: chat_id {message.chat_id!r} is not a channel id (a snowflake)"
            )
        payload: dict[str, Any] = dict(message.options)
        content = message.text or ""
        media = message.media
        if media is not None and media.data is None and media.path is None:
            if media.url is None:
                raise UnsupportedContentError(
                    "discord: the media has no url, data or path to send (Discord has no media ids)"
                )
            content = f"{content}\n{media.url}" if content else media.url
        if content:
            payload["content"] = content
        if nonce is not None:
            payload["nonce"] = nonce
            payload["enforce_nonce"] = True
        url = f"{self.base_url}/channels/{message.chat_id}/messages"
        if media is not None and (media.data is not None or media.path is not None):
            answer = await self._upload(url, payload, media)
        else:
            answer = await self.request("POST", url, json_body=payload, headers=self._headers)
        log.debug("discord: create message -> HTTP %s", answer.status)
        body = answer.json()
        if answer.ok and isinstance(body, dict) and body.get("id") is not None:
            return SendResult(str(body["id"]))
        if answer.ok:
            # It may have gone out: a retry could duplicate it, so this is final.
            raise SendError("discord: the answer has no message id", retryable=False)
        raise self._error(answer, body)

    async def _upload(self, url: str, payload: dict[str, Any], media: Media) -> HttpAnswer:
        data = media.data
        if data is None and media.path is not None:
            data = await asyncio.to_thread(Path(media.path).read_bytes)
        filename = media.name or (Path(media.path).name if media.path else "file")
        payload = {**payload, "attachments": [{"id": 0, "filename": filename}]}
        form = aiohttp.FormData()
        form.add_field("payload_json", json.dumps(payload), content_type="application/json")
        form.add_field(
            "files[0]",
            data or b"",
            filename=filename,
            content_type=media.mime or "application/octet-stream",
        )
        return await self.request("POST", url, data=form, headers=self._headers)

    # -- edit, delete, typing (botmesh.state.ports.Edits, Deletes, Typing) -----------------

    def _message_url(self, chat_id: str, message_id: str) -> str:
        for what, value in (("chat_id", chat_id), ("message id", message_id)):
            if not _SNOWFLAKE.match(value):
                raise SendError(
                    f"discord: {what} {value!r} is not a Discord id (a snowflake)",
                    retryable=False,
                )
        return f"{self.base_url}/channels/{chat_id}/messages/{message_id}"

    async def edit(self, message: Outbound, message_id: str) -> SendResult:
        """``PATCH /channels/{chat_id}/messages/{message_id}`` with ``content`` (and the
        ``options``, as on a send). An unknown message (10008) is a final error."""
        if not message.text:
            raise UnsupportedContentError("discord: an edit needs a text")
        url = self._message_url(message.chat_id, message_id)
        payload = {**message.options, "content": message.text}
        answer = await self.request("PATCH", url, json_body=payload, headers=self._headers)
        log.debug("discord: edit message -> HTTP %s", answer.status)
        if not answer.ok:
            raise self._error(answer, answer.json())
        return SendResult(message_id)

    async def delete(self, chat_id: str, message_id: str) -> None:
        """``DELETE /channels/{chat_id}/messages/{message_id}`` (for everyone). A message
        already gone (404, 10008 Unknown Message) is a success."""
        url = self._message_url(chat_id, message_id)
        answer = await self.request("DELETE", url, headers=self._headers)
        log.debug("discord: delete message -> HTTP %s", answer.status)
        body = answer.json()
        gone = (
            answer.status == 404 and isinstance(body, dict) and body.get("code") == UNKNOWN_MESSAGE
        )
        if not answer.ok and not gone:
            raise self._error(answer, body)

    async def typing(self, chat_id: str) -> None:
        """``POST /channels/{chat_id}/typing`` (shown for 10 seconds or until the bot's
        next message)."""
        if not _SNOWFLAKE.match(chat_id):
            raise RecipientUnreachableError(
                f"discord: chat_id {chat_id!r} is not a channel id (a snowflake)"
            )
        url = f"{self.base_url}/channels/{chat_id}/typing"
        answer = await self.request("POST", url, headers=self._headers)
        log.debug("discord: typing -> HTTP %s", answer.status)
        if not answer.ok:
            raise self._error(answer, answer.json())

    def _error(self, answer: HttpAnswer, body: Any) -> SendError:
        """The error for a failed call, by the table in this module's docstring."""
        code = body.get("code") if isinstance(body, dict) else None
        if isinstance(body, dict):
            text = str(body.get("message") or "")
        else:
            text = " ".join(answer.body[:120].decode("utf-8", "replace").split())
        what = self.redact(f"discord: HTTP {answer.status}: {text or 'no message'}")
        if code is not None:
            what += f" (code {code})"
        err: SendError
        if answer.status == 429:
            wait = body.get("retry_after") if isinstance(body, dict) else None
            scope = "global" if isinstance(body, dict) and body.get("global") else "route"
            err = RateLimitedError(
                f"{what} [{scope} limit]",
                retry_after=float(wait)
                if isinstance(wait, int | float)
                else retry_after_of(answer.headers),
            )
        elif answer.status == 401:
            err = SendError(
                "discord: HTTP 401 Unauthorized: the bot token is wrong or was reset; set "
                "DISCORD_BOT_TOKEN to the token on the Developer Portal's Bot page",
                retryable=False,
            )
        elif code in _UNREACHABLE:
            err = RecipientUnreachableError(what)
        elif code == 40005 or answer.status == 413:
            err = PayloadTooLargeError(what)
        elif code == 50035:
            fields = list(_form_errors(body.get("errors") if isinstance(body, dict) else None))
            listed = "; ".join(f"{p}: {c} {m}".strip() for p, c, m in fields)
            detail = self.redact(f"{what}: {listed or 'no field named'}")
            if any(p == "content" and c == "BASE_TYPE_MAX_LENGTH" for p, c, _ in fields):
                err = PayloadTooLargeError(detail)
            else:
                err = SendError(detail, retryable=False)
        elif code == 50006:
            err = UnsupportedContentError(what)
        else:
            err = status_error("discord", answer, self.redact(text))
        log.debug("%s", str(err))
        return err


# -- webhook (the Interactions Endpoint) ----------------------------------------------------

PING, APPLICATION_COMMAND, MESSAGE_COMPONENT, AUTOCOMPLETE, MODAL_SUBMIT = 1, 2, 3, 4, 5
_JSON = "application/json"


def _modal_fields(components: Any) -> dict[str, Any]:
    """``{custom_id: value}`` of a modal's text inputs (action rows or labels around them)."""
    found: dict[str, Any] = {}
    stack = list(components) if isinstance(components, list) else []
    while stack:
        c = stack.pop(0)
        if not isinstance(c, dict):
            continue
        if "custom_id" in c and ("value" in c or "values" in c):
            found[str(c["custom_id"])] = c.get("value", c.get("values"))
        for inner in ("components", "component"):
            sub = c.get(inner)
            if isinstance(sub, list):
                stack.extend(sub)
            elif isinstance(sub, dict):
                stack.append(sub)
    return found


def _attachment(data: Mapping[str, Any]) -> Media | None:
    """The first attachment a slash command's options resolved, as media by URL."""
    resolved = data.get("resolved")
    atts = resolved.get("attachments") if isinstance(resolved, dict) else None
    if not isinstance(atts, dict) or not atts:
        return None
    att = next(iter(atts.values()))
    if not isinstance(att, dict) or not isinstance(att.get("url"), str):
        return None
    extra = {k: att[k] for k in ("id", "size") if k in att}
    return Media(
        provider="discord",
        url=att["url"],
        mime=att.get("content_type") if isinstance(att.get("content_type"), str) else None,
        name=att.get("filename") if isinstance(att.get("filename"), str) else None,
        extra=extra,
    )


class DiscordWebhook:
    """Discord's Interactions Endpoint: requests signed with Ed25519 under the application's
    public key (``x-signature-ed25519`` over ``x-signature-timestamp`` + body).

    The interaction ``token`` (a credential that allows follow-up messages for 15 minutes)
    is never put in a record: the bot answers with an ordinary message to the channel
    (``chat_id``) through ``DiscordProvider``. So the webhook answers at once, and never with
    a deferred "thinking…" that only the token could end: a command or a modal gets an
    ephemeral acknowledgement only its user sees (``ack_text``; type 4, flag 64), a button
    or a select gets a bare acknowledgement (type 6).
    Autocomplete (type 4) produces nothing and is answered with no choices.
    Discord does not retry interactions; a replayed request has the same interaction id,
    so the gateway's and the inbox's deduplication drop it."""

    channel = "discord"

    def __init__(self, public_key_hex: str, *, ack_text: str = "Got it.") -> None:
        if not ack_text.strip() or len(ack_text) > 2000:
            raise ConfigError("ack_text", "must be 1 to 2000 characters")
        self.ack_text = ack_text
        try:
            raw = bytes.fromhex(public_key_hex)
            if len(raw) != 32:
                raise ValueError("not 32 bytes")
            self._key = Ed25519PublicKey.from_public_bytes(raw)
        except ValueError:
            raise ConfigError(
                "public_key_hex",
                "not an Ed25519 public key (64 hex characters): copy PUBLIC KEY from the "
                "Developer Portal's General Information page; check DISCORD_PUBLIC_KEY",
            ) from None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Self:
        key = env.get("DISCORD_PUBLIC_KEY", "").strip()
        if not key:
            raise ConfigError(
                "DISCORD_PUBLIC_KEY",
                "not set: set it to the application's PUBLIC KEY (Developer Portal, General "
                "Information)",
            )
        try:
            return cls(key)
        except ConfigError as exc:
            raise ConfigError("DISCORD_PUBLIC_KEY", exc.message) from None

    def verify(self, request: WebhookRequest) -> None:
        sig = request.headers.get("x-signature-ed25519")
        stamp = request.headers.get("x-signature-timestamp")
        if not sig or stamp is None:
            raise BadSignature("discord: no x-signature-ed25519 / x-signature-timestamp header")
        try:
            self._key.verify(bytes.fromhex(sig), stamp.encode() + request.body)
        except (ValueError, InvalidSignature):
            raise BadSignature("discord: the Ed25519 signature does not match") from None

    @staticmethod
    def _body(request: WebhookRequest) -> dict[str, Any]:
        try:
            body = json.loads(request.body)
        except ValueError:
            raise MalformedWebhook("discord: the body is not JSON") from None
        if (
            not isinstance(body, dict)
            or not isinstance(body.get("type"), int)
            or not isinstance(body.get("id"), str)
        ):
            raise MalformedWebhook("discord: not an interaction (no id or type)")
        return body

    def handshake(self, request: WebhookRequest) -> WebhookReply | None:
        """PING (type 1) → ``{"type": 1}``; called after ``verify``."""
        try:
            body = self._body(request)
        except MalformedWebhook:
            return None
        if body["type"] != PING:
            return None
        return WebhookReply(200, b'{"type":1}', _JSON)

    def parse(self, request: WebhookRequest) -> list[Inbound]:
        body = self._body(request)
        kind = body["type"]
        if kind not in (APPLICATION_COMMAND, MESSAGE_COMPONENT, MODAL_SUBMIT):
            return []  # PING (the handshake), autocomplete: nothing for a handler
        channel_id = body.get("channel_id")
        if not isinstance(channel_id, str):
            channel = body.get("channel")
            channel_id = channel.get("id") if isinstance(channel, dict) else None
        if not isinstance(channel_id, str) or not channel_id:
            raise MalformedWebhook("discord: the interaction has no channel_id")
        member = body.get("member")
        user = member.get("user") if isinstance(member, dict) else body.get("user")
        sender = str(user["id"]) if isinstance(user, dict) and "id" in user else None
        data: dict[str, Any] = body["data"] if isinstance(body.get("data"), dict) else {}
        record: dict[str, Any] = {"interaction_type": kind}
        for k in ("application_id", "guild_id"):
            if k in body:
                record[k] = body[k]
        media = None
        if kind == APPLICATION_COMMAND:
            text = data.get("name")
            record.update(name=text, options=data.get("options", []))
            record.update(command_id=data.get("id"), command_type=data.get("type"))
            media = _attachment(data)
        else:
            text = data.get("custom_id")
            record["custom_id"] = text
            if kind == MESSAGE_COMPONENT:
                record.update(component_type=data.get("component_type"))
                record.update(values=data.get("values", []))
                msg = body.get("message")
                if isinstance(msg, dict) and "id" in msg:
                    record["message_id"] = str(msg["id"])
            else:
                record["fields"] = _modal_fields(data.get("components"))
        # Never: body["token"] (a credential for follow-ups).
        iid = body["id"]
        ts = ((int(iid) >> 22) + DISCORD_EPOCH_MS) / 1000 if iid.isdigit() else None
        return [
            Inbound(
                id=f"dc:{iid}",
                kind="interaction",
                chat_id=channel_id,
                channel="discord",
                sender=sender,
                ts=ts,
                text=text if isinstance(text, str) else None,
                media=media,
                data=record,
            )
        ]

    def reply(self, request: WebhookRequest, produced: list[Inbound]) -> WebhookReply:
        try:
            kind = self._body(request)["type"]
        except MalformedWebhook:
            kind = None
        if kind == AUTOCOMPLETE:
            return WebhookReply(200, b'{"type":8,"data":{"choices":[]}}', _JSON)
        if kind == MESSAGE_COMPONENT:
            return WebhookReply(200, b'{"type":6}', _JSON)
        ack = {"type": 4, "data": {"content": self.ack_text, "flags": 64}}
        return WebhookReply(200, json.dumps(ack).encode(), _JSON)

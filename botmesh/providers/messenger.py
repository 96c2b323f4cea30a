"""Facebook Messenger: ``MessengerProvider`` sends through the Send API
(``POST /me/messages`` with a Page access token), ``MessengerWebhook`` verifies and parses
``page`` webhooks. Instagram uses the same API and webhook shape (``botmesh.providers.instagram``);
shared Graph rules (errors, signature, handshake) are in ``botmesh.providers.meta``.

Sending: ``{"recipient": {"id": <PSID>}, "messaging_type": "RESPONSE", "message": {"text":
...}}``; media as ``{"attachment": {"type": "image|video|audio|file", "payload": {"url":
..., "is_reusable": true}}}`` (by ``media.url``), ``{"attachment_id": ...}`` (by
``media.id``), or uploaded in the same call as multipart ``filedata`` (``media.data`` /
``media.path``). A Messenger message carries a text *or* one attachment: a send with both
is refused (``UnsupportedContentError``) rather than split into two messages, which a retry
could not deduplicate. ``options``: ``tag`` (a message tag such as ``HUMAN_AGENT``: sent
as ``messaging_type: MESSAGE_TAG``), ``messaging_type``.

Typing: ``{"recipient", "sender_action": "typing_on"}`` (``typing``). The Send API has no
way to edit or delete a message, so there is no ``edit`` nor ``delete``.

Inbound media is the attachment's CDN URL (``fbcdn.net``, ``fbsbx.com``,
``cdninstagram.com``); what is journaled of it is ruled by ``botmesh.providers.media_refs``.
"""

from __future__ import annotations

import json
import mimetypes
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar, Self

import aiohttp

from botmesh.providers.media_kinds import chosen_kind
from botmesh.providers.meta import (
    GRAPH_URL,
    GraphProvider,
    MetaWebhook,
    env_api,
    env_value,
    media_bytes,
    webhook_body,
)
from botmesh.providers.webhooks import MalformedWebhook, WebhookRequest
from botmesh.state.errors import SendError, UnsupportedContentError
from botmesh.state.messages import (
    DeliveryState,
    DeliveryStatus,
    Inbound,
    Media,
    Outbound,
    SendResult,
)
from botmesh.state.pacing import ChannelLimits, Rate

__all__ = ["MessengerProvider", "MessengerWebhook"]

_ATTACHMENT_TYPES = ("image", "video", "audio", "file")
#: The mime type an inbound attachment gets from its type (Meta gives no more).
_MIME_OF_TYPE = {
    "image": "image/*",
    "video": "video/*",
    "audio": "audio/*",
    "file": "application/octet-stream",
}


class MessengerProvider(GraphProvider):
    """Sends as one Facebook Page (its ``page_access_token``)."""

    name = "messenger"
    #: It posts status webhooks (``botmesh.state.statuses``): its sends are named under
    #: their message ids when recorded sent.
    delivery_statuses = True
    text_limit: int | None = 2000
    #: The Send API's limit per Page for text (300 calls a second; audio and video have a
    #: lower one, 10, left to the channel's 429s).
    rate_limits = ChannelLimits(channel=Rate(300))
    media_channel = "messenger"
    token_env: ClassVar[str] = "MESSENGER_PAGE_TOKEN"
    #: The environment prefix of ``from_env`` (``<PREFIX>_API_URL``…).
    env_prefix: ClassVar[str] = "MESSENGER"

    def __init__(
        self,
        page_access_token: str,
        *,
        api_url: str = GRAPH_URL,
        timeout: float = 15.0,
        media_ref_hosts: Iterable[str] | None = None,
        allow_private_media: bool = False,
        media_max_bytes: int | None = None,
    ) -> None:
        super().__init__(
            page_access_token,
            api_url=api_url,
            timeout=timeout,
            media_ref_hosts=media_ref_hosts,
            allow_private_media=allow_private_media,
            media_max_bytes=media_max_bytes,
        )

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Self:
        """``MESSENGER_PAGE_TOKEN`` (Instagram: ``INSTAGRAM_ACCESS_TOKEN``); optional
        ``<PREFIX>_API_URL``, ``<PREFIX>_MEDIA_REF_HOSTS`` (comma-separated, replaces the Meta
        CDN list) and (with a local API URL) ``<PREFIX>_ALLOW_PRIVATE_MEDIA=1``."""
        token = env_value(
            env, cls.token_env, "set it to the Page access token (pages_messaging permission)"
        )
        return cls(token, **env_api(env, cls.env_prefix))

    async def send(self, message: Outbound) -> SendResult:
        options = message.options
        if options.get("tag"):
            head: dict[str, Any] = {"messaging_type": "MESSAGE_TAG", "tag": str(options["tag"])}
        else:
            head = {"messaging_type": str(options.get("messaging_type") or "RESPONSE")}
        recipient = {"id": message.chat_id}
        media = message.media
        if media is not None and message.text:
            raise UnsupportedContentError(
                f"{self.name}: a message carries a text or an attachment, not both; send the "
                "text as its own message"
            )
        if media is None:
            if not message.text:
                raise UnsupportedContentError(
                    f"{self.name}: the message has neither text nor media"
                )
            body = {"recipient": recipient, **head, "message": {"text": message.text}}
            return self._result(await self.graph("POST", "me/messages", json_body=body))
        kind = chosen_kind(
            self.name,
            media,
            options,
            option="attachment_type",
            kinds=_ATTACHMENT_TYPES,
            other="file",
        )
        if media.id is not None:
            payload: dict[str, Any] = {"attachment_id": media.id}
        elif media.url is not None:
            payload = {"url": media.url, "is_reusable": True}
        else:
            return await self._upload_send(recipient, head, kind, media)
        body = {
            "recipient": recipient,
            **head,
            "message": {"attachment": {"type": kind, "payload": payload}},
        }
        return self._result(await self.graph("POST", "me/messages", json_body=body))

    async def _upload_send(
        self, recipient: dict[str, str], head: dict[str, Any], kind: str, media: Media
    ) -> SendResult:
        """Send bytes as an attachment uploaded in the same call (multipart ``filedata``)."""
        data, name = await media_bytes(self.name, media)
        mime = media.mime or mimetypes.guess_type(name)[0] or "application/octet-stream"
        form = aiohttp.FormData()
        form.add_field("recipient", json.dumps(recipient))
        for key, value in head.items():
            form.add_field(key, value)
        attachment = {"attachment": {"type": kind, "payload": {"is_reusable": True}}}
        form.add_field("message", json.dumps(attachment))
        form.add_field("filedata", data, filename=name, content_type=mime)
        return self._result(await self.graph("POST", "me/messages", data=form))

    async def typing(self, chat_id: str) -> None:
        """``{"recipient": {"id"}, "sender_action": "typing_on"}`` to ``me/messages``
        (``botmesh.state.ports.Typing``): shown for 20 seconds or until the next message."""
        body = {"recipient": {"id": chat_id}, "sender_action": "typing_on"}
        await self.graph("POST", "me/messages", json_body=body)

    def _result(self, answer: Mapping[str, Any]) -> SendResult:
        mid = answer.get("message_id")
        if not isinstance(mid, str) or not mid:
            raise SendError(f"{self.name}: the answer names no message_id", retryable=True)
        return SendResult(mid)


class MessengerWebhook(MetaWebhook):
    """``page`` webhooks (``messages``, ``messaging_postbacks``): one record per message or
    postback; echoes of our own sends, ``read``, ``delivery`` and other events give none.

    ``statuses`` reads the ``message_deliveries`` and ``message_reads`` (Instagram:
    ``messaging_seen``) events: a ``delivery`` gives one ``delivered`` status per mid of
    ``delivery.mids`` (the ``message_id`` ``send`` returned), ``chat_id`` the event's
    ``sender.id`` (the user's PSID / IGSID, as inbound messages have it). A ``read`` that
    names a message (``read.mid``, as Instagram sends it) gives one ``read`` status; a
    ``read`` with only a ``watermark`` (Messenger: "every message sent before this time was
    read") names no message and gives none, as does a ``delivery`` without ``mids``. The
    Messenger Platform reports no failure after the Send API accepted a message."""

    channel: str = "messenger"
    env_prefix: ClassVar[str] = "MESSENGER"
    #: The ``object`` of this channel's webhooks.
    object: ClassVar[str] = "page"

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Self:
        """``META_APP_SECRET`` and ``META_VERIFY_TOKEN`` (or ``<CHANNEL>_APP_SECRET`` /
        ``<CHANNEL>_VERIFY_TOKEN``)."""
        return cls(*cls.secrets_from_env(env))

    def parse(self, request: WebhookRequest) -> list[Inbound]:
        out: list[Inbound] = []
        for event in self._events(request):
            out.extend(self._event(event))
        return out

    def statuses(self, request: WebhookRequest) -> list[DeliveryStatus]:
        out: list[DeliveryStatus] = []
        for event in self._events(request):
            out.extend(self._status(event))
        return out

    def _events(self, request: WebhookRequest) -> list[dict[str, Any]]:
        """Every event of ``entry[].messaging[]``."""
        body = webhook_body(self.channel, request, self.object)
        out: list[dict[str, Any]] = []
        for entry in body["entry"]:
            if not isinstance(entry, dict):
                raise MalformedWebhook(f"{self.channel}: an entry is not an object")
            events = entry.get("messaging")
            if events is None:
                continue  # a "changes" entry (feed, comments): not a conversation
            if not isinstance(events, list):
                raise MalformedWebhook(f"{self.channel}: entry.messaging is not a list")
            for event in events:
                if not isinstance(event, dict):
                    raise MalformedWebhook(f"{self.channel}: a messaging event is not an object")
                out.append(event)
        return out

    def _status(self, event: Mapping[str, Any]) -> list[DeliveryStatus]:
        """The statuses of a ``delivery`` or ``read`` event (none for other events)."""
        delivery, read = event.get("delivery"), event.get("read")
        if delivery is None and read is None:
            return []
        sender = event.get("sender")
        user = sender.get("id") if isinstance(sender, dict) else None
        if not user or not isinstance(delivery or read, dict):
            raise MalformedWebhook(f"{self.channel}: a delivery or read event without sender")
        stamp = event.get("timestamp")
        if isinstance(delivery, dict):
            mids = delivery.get("mids") or []
            stamp = stamp or delivery.get("watermark")
            state = DeliveryState.DELIVERED
        else:
            assert isinstance(read, dict)
            mids = [read["mid"]] if read.get("mid") else []  # a watermark names no message
            stamp = stamp or read.get("watermark")
            state = DeliveryState.READ
        if not isinstance(mids, list) or not all(isinstance(m, str) and m for m in mids):
            raise MalformedWebhook(f"{self.channel}: delivery.mids is not a list of mids")
        ts = stamp / 1000.0 if isinstance(stamp, int | float) and stamp > 0 else None
        return [
            DeliveryStatus(
                chat_id=str(user), message_id=mid, status=state, channel=self.channel, ts=ts
            )
            for mid in mids
        ]

    def _event(self, event: Mapping[str, Any]) -> list[Inbound]:
        sender = (event.get("sender") or {}).get("id")
        stamp = event.get("timestamp")
        message, postback = event.get("message"), event.get("postback")
        if not isinstance(message, dict) and not isinstance(postback, dict):
            return []  # read, delivery, reaction, optin, referral…
        if not sender or not isinstance(stamp, int | float):
            raise MalformedWebhook(f"{self.channel}: a messaging event without sender or timestamp")
        common: dict[str, Any] = {
            "chat_id": str(sender),
            "sender": str(sender),
            "channel": self.channel,
            "ts": stamp / 1000.0,
        }
        if isinstance(postback, dict):
            mid = postback.get("mid") or f"pb:{sender}:{stamp}"
            data = {"payload": postback.get("payload")}
            if postback.get("referral"):
                data["referral"] = postback["referral"]
            return [
                Inbound(
                    id=str(mid), text=postback.get("title"), kind="interaction", data=data, **common
                )
            ]
        assert isinstance(message, dict)
        if message.get("is_echo") or message.get("is_deleted"):
            return []
        if not message.get("mid"):
            raise MalformedWebhook(f"{self.channel}: a message without mid")
        return self._message(message, common)

    def _message(self, message: Mapping[str, Any], common: dict[str, Any]) -> list[Inbound]:
        mid = str(message["mid"])
        data: dict[str, Any] = {}
        kind: Any = "message"
        if isinstance(message.get("quick_reply"), dict):
            kind, data["payload"] = "interaction", message["quick_reply"].get("payload")
        if isinstance(message.get("reply_to"), dict) and message["reply_to"].get("mid"):
            data["reply_to"] = message["reply_to"]["mid"]
        medias = [m for a in message.get("attachments") or () if (m := self._media(a))]
        text = message.get("text")
        if not medias:
            return [Inbound(id=mid, text=text, kind=kind, data=data, **common)]
        # One record per attachment (as WhatsApp sends them): the first keeps the mid and
        # the text, the others get "<mid>:<n>" (n from 2), stable on a redelivery.
        return [
            Inbound(
                id=mid if n == 1 else f"{mid}:{n}",
                text=text if n == 1 else None,
                kind=kind,
                data=data,
                media=media,
                **common,
            )
            for n, media in enumerate(medias, 1)
        ]

    def _media(self, attachment: Any) -> Media | None:
        if not isinstance(attachment, dict):
            raise MalformedWebhook(f"{self.channel}: an attachment is not an object")
        kind = str(attachment.get("type") or "")
        payload = attachment.get("payload")
        url = payload.get("url") if isinstance(payload, dict) else None
        if not isinstance(url, str) or not url:
            return None  # a fallback / template attachment without a file
        extra: dict[str, Any] = {"type": kind}
        assert isinstance(payload, dict)
        if payload.get("sticker_id"):
            extra["sticker_id"] = payload["sticker_id"]
        return Media(provider=self.channel, url=url, mime=_MIME_OF_TYPE.get(kind), extra=extra)

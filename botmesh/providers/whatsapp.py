"""WhatsApp Business Cloud API (the reference's "Meta Cloud"): ``WhatsAppProvider`` sends
through ``POST /{phone_number_id}/messages``, ``WhatsAppWebhook`` verifies and parses the
``whatsapp_business_account`` webhooks. Shared Graph rules (errors, signature, handshake)
are in ``botmesh.providers.meta``.

Sending: a text is ``{"type": "text", "text": {"body": ...}}`` (4096 characters at most);
media goes by ``id`` (``media.id``: an uploaded or received media id), by ``link``
(``media.url``) or, for bytes (``media.data`` / ``media.path``), uploaded first with
``POST /{phone_number_id}/media`` (multipart) and sent by the id it gives. The text of a
send with media is its caption (images, videos, documents; audio and stickers take none).
``options``: ``reply_to`` (a wamid to quote), ``preview_url`` (bool), ``media_type``
(``image|video|audio|document|sticker``, else guessed from the mime type), ``template``
(``{"name", "language", "components"}``: an approved message template, sent instead of the
text; what a ``Fallback.template`` sends outside the 24-hour window).

Inbound media is a media id: ``GET /{media_id}`` gives a short-lived URL on
``lookaside.fbsbx.com`` that is downloaded with the same Bearer token (added at download
time, never journaled). The download is checked against the ``sha256`` Graph gives.
"""

from __future__ import annotations

import hashlib
import logging
import mimetypes
import re
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
from botmesh.state.errors import ConfigError, ProviderError, SendError, UnsupportedContentError
from botmesh.state.messages import (
    DELIVERY_STATES,
    DeliveryState,
    DeliveryStatus,
    Inbound,
    Media,
    Outbound,
    SendResult,
)
from botmesh.state.pacing import ChannelLimits, Rate

__all__ = ["WhatsAppProvider", "WhatsAppWebhook"]

log = logging.getLogger("botmesh.providers.whatsapp")

_MEDIA_TYPES = ("image", "video", "audio", "document", "sticker")
_CAPTIONED = frozenset({"image", "video", "document"})
#: A Graph object id: what may go into a URL path (a tampered journal cannot steer the call).
_GRAPH_ID = re.compile(r"[A-Za-z0-9_.-]{1,256}")


def _template(value: object) -> dict[str, Any]:
    """``options["template"]``: a message template approved in WhatsApp Manager, the only
    message that may open a conversation outside the 24-hour window (``name``,
    ``language`` as a code or ``{"code": ...}``, optional ``components``)."""
    if not isinstance(value, Mapping):
        raise UnsupportedContentError("whatsapp: options['template'] must be a mapping")
    name, language = value.get("name"), value.get("language")
    if not isinstance(name, str) or not name:
        raise UnsupportedContentError("whatsapp: the template has no name")
    if isinstance(language, str) and language:
        language = {"code": language}
    if not (isinstance(language, Mapping) and isinstance(language.get("code"), str)):
        raise UnsupportedContentError(
            f"whatsapp: template {name!r} needs a language code (for example 'en_US')"
        )
    template: dict[str, Any] = {"name": name, "language": dict(language)}
    components = value.get("components")
    if components:
        if not isinstance(components, list):
            raise UnsupportedContentError(f"whatsapp: template {name!r}: components must be a list")
        template["components"] = components
    return template


def _graph_id(value: str, what: str) -> str:
    if not _GRAPH_ID.fullmatch(value) or value in (".", ".."):
        raise ProviderError(f"whatsapp: {what} {value!r} is not a Graph id")
    return value


class WhatsAppProvider(GraphProvider):
    """Sends as one WhatsApp business phone number (``phone_number_id``) with a system-user
    or temporary ``access_token``."""

    name = "whatsapp"
    #: It posts status webhooks (``botmesh.state.statuses``): its sends are named under
    #: their message ids when recorded sent.
    delivery_statuses = True
    text_limit: int | None = 4096
    #: Cloud API's default throughput of a business phone number: 80 messages a second
    #: (Meta raises it to 1,000 for some numbers: set ``outbox.rate_limits.channel``). No
    #: chat limit by default (docs/rate-limits.md says why).
    rate_limits = ChannelLimits(channel=Rate(80))
    media_channel = "whatsapp"
    token_env: ClassVar[str] = "WHATSAPP_ACCESS_TOKEN"

    def __init__(
        self,
        access_token: str,
        phone_number_id: str,
        *,
        api_url: str = GRAPH_URL,
        timeout: float = 15.0,
        media_ref_hosts: Iterable[str] | None = None,
        allow_private_media: bool = False,
        media_max_bytes: int | None = None,
    ) -> None:
        if not phone_number_id or not phone_number_id.isdigit():
            raise ConfigError(
                "whatsapp.phone_number_id",
                f"{phone_number_id!r} is not a phone number id (digits, from WhatsApp > API "
                "Setup); it is not the phone number itself",
            )
        super().__init__(
            access_token,
            api_url=api_url,
            timeout=timeout,
            media_ref_hosts=media_ref_hosts,
            allow_private_media=allow_private_media,
            media_max_bytes=media_max_bytes,
        )
        self.phone_number_id = phone_number_id

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Self:
        """``WHATSAPP_ACCESS_TOKEN``, ``WHATSAPP_PHONE_NUMBER_ID``; optional
        ``WHATSAPP_API_URL``, ``WHATSAPP_MEDIA_REF_HOSTS`` and (with a local API URL)
        ``WHATSAPP_ALLOW_PRIVATE_MEDIA=1``."""
        token = env_value(
            env, "WHATSAPP_ACCESS_TOKEN", "set it to a system-user access token of the app"
        )
        number = env_value(
            env, "WHATSAPP_PHONE_NUMBER_ID", "set it to the sending number's id (API Setup)"
        )
        return cls(token, number, **env_api(env, "WHATSAPP"))

    # -- sending --------------------------------------------------------------------------

    async def send(self, message: Outbound) -> SendResult:
        body: dict[str, Any] = {
            "messaging_product": "whatsapp",
            "recipient_type": "individual",
            "to": message.chat_id,
        }
        options = message.options
        if options.get("template") is not None:
            body.update(type="template", template=_template(options["template"]))
        elif message.media is not None:
            kind = chosen_kind(
                "whatsapp",
                message.media,
                options,
                option="media_type",
                kinds=_MEDIA_TYPES,
                other="document",
                sticker="sticker",
            )
            item = await self._media_item(message.media)
            if message.text:
                if kind not in _CAPTIONED:
                    raise UnsupportedContentError(
                        f"whatsapp: {kind} messages take no caption; send the text on its own"
                    )
                item["caption"] = message.text
            if kind == "document" and message.media.name:
                item["filename"] = message.media.name
            body.update(type=kind, **{kind: item})
        elif message.text:
            text: dict[str, Any] = {"body": message.text}
            if "preview_url" in options:
                text["preview_url"] = bool(options["preview_url"])
            body.update(type="text", text=text)
        else:
            raise UnsupportedContentError("whatsapp: the message has neither text nor media")
        if options.get("reply_to"):
            body["context"] = {"message_id": str(options["reply_to"])}
        answer = await self.graph("POST", f"{self.phone_number_id}/messages", json_body=body)
        messages = answer.get("messages")
        if not (isinstance(messages, list) and messages and isinstance(messages[0], dict)):
            raise SendError("whatsapp: the answer names no message id", retryable=True)
        return SendResult(str(messages[0].get("id")))

    async def _media_item(self, media: Media) -> dict[str, Any]:
        if media.id is not None:
            return {"id": media.id}
        if media.url is not None:
            return {"link": media.url}
        return {"id": await self.upload(media)}

    async def upload(self, media: Media) -> str:
        """Upload ``media``'s bytes (``data``, or the file at ``path``); its media id."""
        data, name = await media_bytes("whatsapp", media)
        mime = media.mime or mimetypes.guess_type(name)[0]
        if not mime:
            raise UnsupportedContentError(
                f"whatsapp: the media {name!r} has no mime type; set Media.mime"
            )
        form = aiohttp.FormData()
        form.add_field("messaging_product", "whatsapp")
        form.add_field("type", mime)
        form.add_field("file", data, filename=name, content_type=mime)
        answer = await self.graph("POST", f"{self.phone_number_id}/media", data=form)
        if not answer.get("id"):
            raise SendError("whatsapp: the media upload answered no id", retryable=True)
        return str(answer["id"])

    # -- inbound media ----------------------------------------------------------------------

    async def media_info(self, media_id: str) -> dict[str, Any]:
        """``GET /{media_id}``: ``url`` (valid about 5 minutes), ``mime_type``, ``sha256``,
        ``file_size``."""
        info = await self.graph(
            "GET",
            _graph_id(media_id, "media id"),
            params={"phone_number_id": self.phone_number_id},
        )
        if not isinstance(info.get("url"), str):
            raise ProviderError(f"whatsapp: media {media_id} has no download URL")
        return info

    async def media_url(self, media: Media) -> tuple[str, dict[str, str]]:
        if media.id is None:
            return await super().media_url(media)
        url = str((await self.media_info(media.id))["url"])
        self.check_download_host(url)
        return url, self._auth()

    async def download_media(self, media: Media) -> bytes:
        if media.data is not None or media.id is None:
            return await super().download_media(media)
        info = await self.media_info(media.id)
        url = str(info["url"])
        self.check_download_host(url)
        body = await self.fetch_media(url, headers=self._auth())
        want = info.get("sha256")
        if isinstance(want, str) and want and hashlib.sha256(body).hexdigest() != want.lower():
            raise ProviderError(
                f"whatsapp: media {media.id} does not match its sha256; download it again"
            )
        return body


# -- webhooks ---------------------------------------------------------------------------------


class WhatsAppWebhook(MetaWebhook):
    """``whatsapp_business_account`` webhooks: ``parse`` gives one record per user message
    (statuses and errors give none); ``statuses`` gives one ``DeliveryStatus`` per item of
    ``value.statuses[]`` (``sent``, ``delivered``, ``read``, ``failed``; others, such as
    ``deleted`` or ``warning``, give none): ``message_id`` is the status's ``id`` (the wamid
    ``send`` returned), ``chat_id`` its ``recipient_id`` (the wa_id, which is what inbound
    messages of that user carry as ``from``), ``ts`` its ``timestamp``, and on ``failed``
    the first ``errors[]`` item's ``code`` and ``title``."""

    channel: str = "whatsapp"
    env_prefix: ClassVar[str] = "WHATSAPP"

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Self:
        """``META_APP_SECRET`` and ``META_VERIFY_TOKEN`` (or ``WHATSAPP_APP_SECRET`` /
        ``WHATSAPP_VERIFY_TOKEN``)."""
        return cls(*cls.secrets_from_env(env))

    def parse(self, request: WebhookRequest) -> list[Inbound]:
        out: list[Inbound] = []
        for value in self._values(request):
            out.extend(self._messages(value))
        return out

    def statuses(self, request: WebhookRequest) -> list[DeliveryStatus]:
        out: list[DeliveryStatus] = []
        for value in self._values(request):
            items = value.get("statuses")
            if items is None:
                continue
            if not isinstance(items, list):
                raise MalformedWebhook("whatsapp: value.statuses is not a list")
            out.extend(found for item in items if (found := _status(item)) is not None)
        return out

    def _values(self, request: WebhookRequest) -> list[dict[str, Any]]:
        """The ``value`` of every ``entry[].changes[]``."""
        body = webhook_body(self.channel, request, "whatsapp_business_account")
        values: list[dict[str, Any]] = []
        for entry in body["entry"]:
            changes = entry.get("changes") if isinstance(entry, dict) else None
            if not isinstance(changes, list):
                raise MalformedWebhook("whatsapp: an entry has no changes list")
            for change in changes:
                value = change.get("value") if isinstance(change, dict) else None
                if not isinstance(value, dict):
                    raise MalformedWebhook("whatsapp: a change has no value object")
                values.append(value)
        return values

    def _messages(self, value: Mapping[str, Any]) -> list[Inbound]:
        names = {
            str(c.get("wa_id")): str((c.get("profile") or {}).get("name") or "")
            for c in value.get("contacts") or ()
            if isinstance(c, dict)
        }
        number = (value.get("metadata") or {}).get("phone_number_id")
        out = []
        for msg in value.get("messages") or ():
            if not isinstance(msg, dict) or not msg.get("id") or not msg.get("from"):
                raise MalformedWebhook("whatsapp: a message without id or from")
            if msg.get("type") == "system":
                continue  # "user changed number": not a message to answer
            extra: dict[str, Any] = {}
            if names.get(str(msg["from"])):
                extra["profile_name"] = names[str(msg["from"])]
            if number:
                extra["phone_number_id"] = str(number)
            out.append(_inbound(msg, extra))
        return out


def _inbound(msg: Mapping[str, Any], extra: Mapping[str, Any]) -> Inbound:
    """One user message of ``value.messages[]``."""
    kind = str(msg.get("type") or "")
    text: str | None = None
    media: Media | None = None
    interaction = False
    data: dict[str, Any] = {"type": kind, **extra}
    raw = msg.get(kind)
    part: dict[str, Any] = raw if isinstance(raw, dict) else {}
    if kind == "text":
        text = str(part.get("body") or "")
    elif kind in _MEDIA_TYPES:
        if not part.get("id"):
            raise MalformedWebhook(f"whatsapp: {kind} message {msg['id']} has no media id")
        media = Media(
            provider="whatsapp",
            id=str(part["id"]),
            mime=part.get("mime_type"),
            name=part.get("filename") if kind == "document" else None,
        )
        text = part.get("caption")
    elif kind == "button":  # a quick-reply button of a template
        text, interaction = part.get("text"), True
        data["payload"] = part.get("payload")
    elif kind == "interactive":
        reply_kind = str(part.get("type") or "")
        found = part.get(reply_kind)
        reply: dict[str, Any] = found if isinstance(found, dict) else {}
        text, interaction = reply.get("title") or reply.get("body"), True
        data.update(interactive=reply_kind, payload=reply.get("id"))
        if "response_json" in reply:  # a WhatsApp Flow's answer
            data["response_json"] = reply["response_json"]
    elif kind in ("location", "contacts", "reaction", "order"):
        data[kind] = msg.get(kind)
    context = msg.get("context")
    if isinstance(context, dict) and context.get("id"):
        data["reply_to"] = context["id"]
    try:
        ts = int(msg.get("timestamp") or 0) or None
    except (TypeError, ValueError):
        raise MalformedWebhook(f"whatsapp: message {msg['id']} has a bad timestamp") from None
    return Inbound(
        id=str(msg["id"]),
        chat_id=str(msg["from"]),
        sender=str(msg["from"]),
        channel="whatsapp",
        ts=ts,
        text=text,
        kind="interaction" if interaction else "message",
        media=media,
        data=data,
    )


def _status(item: Any) -> DeliveryStatus | None:
    """One item of ``value.statuses[]``; ``None`` for a status that is not a delivery
    state (``deleted``, ``warning``…)."""
    if not isinstance(item, dict):
        raise MalformedWebhook("whatsapp: a status is not an object")
    wamid, kind, recipient = item.get("id"), item.get("status"), item.get("recipient_id")
    if not (isinstance(wamid, str) and wamid and isinstance(kind, str) and recipient):
        raise MalformedWebhook("whatsapp: a status without id, status or recipient_id")
    state = DELIVERY_STATES.get(kind)
    if state is None:
        return None
    try:
        ts = float(item.get("timestamp") or 0) or None
    except (TypeError, ValueError):
        raise MalformedWebhook(f"whatsapp: status of {wamid} has a bad timestamp") from None
    code = error = None
    errors = item.get("errors")
    if state is DeliveryState.FAILED and isinstance(errors, list) and errors:
        first = errors[0] if isinstance(errors[0], dict) else {}
        code = str(first["code"]) if first.get("code") is not None else None
        error = str(first.get("title") or first.get("message") or "") or None
    return DeliveryStatus(
        chat_id=str(recipient),
        message_id=wamid,
        status=state,
        channel="whatsapp",
        ts=ts,
        code=code,
        error=error,
    )

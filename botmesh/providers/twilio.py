"""Twilio Programmable Messaging (SMS, MMS and Twilio's WhatsApp): ``TwilioProvider`` sends
through the Messages API, ``TwilioWebhook`` verifies and parses Twilio's incoming-message
webhooks.

Sending: ``POST /2010-04-01/Accounts/{sid}/Messages.json`` (form ``To``, ``From``, ``Body``,
``MediaUrl``) with HTTP basic auth (account SID, auth token). The ``SendResult`` is the
message ``sid`` (``SM…``). With ``from_="whatsapp:+1…"`` every ``To`` gets the ``whatsapp:``
prefix unless the chat id already has it.

Error mapping (Twilio answers ``{"code", "message", "more_info", "status"}``):

=====================================  =====================================================
429, or code 20429                     ``RateLimitedError``; ``retry_after`` from
                                       ``Retry-After``, else ``rate_limit_wait`` (default 1 s:
                                       Twilio sends no hint; the outbox backoff grows it)
21211 invalid To, 21610 replied STOP,  ``RecipientUnreachableError``
21614 not a mobile number,
21612 cannot route
21617 body over 1600 characters,      ``PayloadTooLargeError``
21623 more than 10 media,
63034 media over 5 MB
21620 invalid media URL,               ``UnsupportedContentError``
63005 / 63021 channel refused content
63016 WhatsApp outside the 24 h        ``OutsideSessionWindowError`` (send a template)
window
20003 (HTTP 401)                       final ``SendError``: the credentials are wrong
5xx, 408, transport errors             retryable ``SendError``
any other 4xx                          final ``SendError`` with Twilio's code and message
=====================================  =====================================================

Lost outcomes (``resolve_ambiguous``): Twilio has no idempotency key, but it lists what was
sent. The adapter lists the messages to the chat from our number sent since the day the
send was first attempted and takes one with the same body and media count created at or
after ``since`` minus ``clock_skew`` (default 120 s, for the clocks of this host and
Twilio's) as the send. Assumptions, stated plainly:

- Two identical bodies sent to one number inside that window are taken for one another: a
  lost send may be reported as sent when only an earlier identical one went out. If Twilio
  ever echoes a caller-chosen field on the message resource (an idempotency token, or
  ``StatusCallback`` URL parameters in the listing), put ``key`` in it at send time and
  match on it instead of the body.
- ``DateSent>`` filters on ``date_sent``, which Twilio fills once the message leaves its
  queue; a message still queued when the resolver runs (a long queue) is missed and the
  send is reported as not sent. The lease (60 s by default) usually outlasts the queue.
- Trial accounts prefix bodies (``Sent from your Twilio trial account - ``); that prefix is
  ignored when comparing.

Media: inbound media URLs are ``https://api.twilio.com/…/Media/ME…``; they need basic auth,
which ``download_media`` adds only for the API origin (``base_url``) and ``twilio.com``
hosts, and only on the first request: Twilio redirects to a signed CDN URL, fetched without
credentials.
"""

from __future__ import annotations

import base64
import email.utils
import hashlib
import hmac
import logging
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Self
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from botmesh.providers.base import ChannelProvider
from botmesh.providers.http import HttpAnswer, host_allowed, status_error
from botmesh.providers.webhooks import (
    BadSignature,
    MalformedWebhook,
    SignedWebhook,
    WebhookReply,
    WebhookRequest,
    same,
)
from botmesh.state.errors import (
    ConfigError,
    OutsideSessionWindowError,
    PayloadTooLargeError,
    ProviderError,
    RateLimitedError,
    RecipientUnreachableError,
    SendError,
    UnsupportedContentError,
)
from botmesh.state.messages import (
    DeliveryState,
    DeliveryStatus,
    Inbound,
    Media,
    Outbound,
    SendResult,
)

__all__ = ["TwilioProvider", "TwilioWebhook", "twilio_signature"]

log = logging.getLogger("botmesh.providers")

API_VERSION = "2010-04-01"
DEFAULT_BASE_URL = "https://api.twilio.com"
TEXT_LIMIT = 1600
WHATSAPP = "whatsapp:"
TRIAL_PREFIX = "Sent from your Twilio trial account - "
#: Pages of 50 messages ``resolve_ambiguous`` reads before it gives up (cannot tell).
MAX_PAGES = 20

_UNREACHABLE = {
    21211: "the 'To' number is not a valid phone number",
    21610: "the recipient replied STOP and unsubscribed",
    21612: "Twilio cannot route to this number",
    21614: "the 'To' number is not a mobile number",
}
_TOO_LARGE = {
    21617: "the body is over 1600 characters",
    21623: "more than 10 media files",
    63034: "the media is over 5 MB",
}
_UNSUPPORTED = {
    21620: "the media URL is invalid (it needs http:// or https://)",
    63005: "the channel did not accept this content",
    63021: "the channel refused this content or media type",
}
_SESSION = {63016: "outside WhatsApp's 24 h customer-service window: send a template"}
#: Codes of a status callback's ``undelivered`` / ``failed`` (``ErrorCode``) whose recipient
#: cannot be reached.
_UNDELIVERABLE = {
    30003: "the handset is unreachable",
    30005: "the number is unknown or no longer exists",
    30006: "a landline, or a carrier that takes no messages",
    63024: "not a valid recipient on the channel",
}


class TwilioProvider(ChannelProvider):
    """Twilio Messaging. ``base_url`` points at the API (a fake in tests); ``clock_skew``
    and ``rate_limit_wait`` are seconds (see the module docstring)."""

    name = "twilio"
    #: It posts status webhooks (``botmesh.state.statuses``): its sends are named under
    #: their message ids when recorded sent.
    delivery_statuses = True
    media_channel = "twilio"
    text_limit: int | None = TEXT_LIMIT

    def delivery_error(self, status: DeliveryStatus) -> SendError:
        """Our error for an ``undelivered``/``failed`` status callback
        (``botmesh.state.statuses``), by its ``ErrorCode`` as the send's answer maps it:
        63016 outside WhatsApp's window, 30003/30005/30006 unreachable…"""
        code = int(status.code) if status.code and status.code.isdigit() else None
        what = (
            f"twilio: the message {status.message_id} was accepted, then not delivered "
            f"(code {status.code})"
        )
        if code in _SESSION:
            return OutsideSessionWindowError(f"{what}: {_SESSION[code]}")
        if code in _UNDELIVERABLE or code in _UNREACHABLE:
            why = _UNDELIVERABLE.get(code) or _UNREACHABLE[code]
            return RecipientUnreachableError(f"{what}: {why}")
        return SendError(what, retryable=False)

    def __init__(
        self,
        account_sid: str,
        auth_token: str,
        from_: str,
        *,
        base_url: str = DEFAULT_BASE_URL,
        timeout: float = 15.0,
        media_ref_hosts: tuple[str, ...] | None = None,
        allow_private_media: bool = False,
        media_max_bytes: int | None = None,
        clock_skew: float = 120.0,
        rate_limit_wait: float = 1.0,
    ) -> None:
        for field, value in (
            ("account_sid", account_sid),
            ("auth_token", auth_token),
            ("from_", from_),
        ):
            if not value:
                raise ConfigError(f"twilio.{field}", "is empty; pass the value from the console")
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError("twilio.base_url", f"{base_url!r} is not an http(s) URL")
        super().__init__(
            timeout=timeout,
            secrets=(auth_token, _basic(account_sid, auth_token).removeprefix("Basic ")),
            media_ref_hosts=media_ref_hosts,
            allow_private_media=allow_private_media,
            media_max_bytes=media_max_bytes,
        )
        self.account_sid = account_sid
        self._auth_token = auth_token
        self.from_ = from_
        self.base_url = base_url.rstrip("/")
        self.clock_skew = clock_skew
        self.rate_limit_wait = rate_limit_wait

    def __repr__(self) -> str:
        return f"TwilioProvider(account_sid={self.account_sid!r}, from_={self.from_!r})"

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Self:
        """``TWILIO_ACCOUNT_SID``, ``TWILIO_AUTH_TOKEN``, ``TWILIO_FROM`` (``+1…``, or
        ``whatsapp:+1…`` for Twilio's WhatsApp), optional
        ``TWILIO_API_URL`` and, for a ``http://127.0.0.1…`` API URL,
        ``TWILIO_ALLOW_PRIVATE_MEDIA=1``."""
        values = {}
        for var in ("TWILIO_ACCOUNT_SID", "TWILIO_AUTH_TOKEN", "TWILIO_FROM"):
            value = env.get(var, "").strip()
            if not value:
                raise ConfigError(
                    var, "is not set; copy it from the Twilio console (Account Info / numbers)"
                )
            values[var] = value
        base_url, media = cls.api_env(env, "TWILIO", DEFAULT_BASE_URL)
        return cls(
            values["TWILIO_ACCOUNT_SID"],
            values["TWILIO_AUTH_TOKEN"],
            values["TWILIO_FROM"],
            base_url=base_url,
            **media,
        )

    # -- sending --------------------------------------------------------------------------

    @property
    def _auth(self) -> dict[str, str]:
        # Headers, not ``aiohttp.BasicAuth``: aiohttp 3.14 deprecates it.
        return {"Authorization": _basic(self.account_sid, self._auth_token)}

    def _messages_url(self) -> str:
        return f"{self.base_url}/{API_VERSION}/Accounts/{self.account_sid}/Messages.json"

    def to_of(self, chat_id: str) -> str:
        """The ``To`` for ``chat_id``: prefixed ``whatsapp:`` when sending from WhatsApp."""
        if self.from_.startswith(WHATSAPP) and not chat_id.startswith(WHATSAPP):
            return WHATSAPP + chat_id
        return chat_id

    def _form(self, message: Outbound) -> dict[str, str]:
        form = {"To": self.to_of(message.chat_id), "From": self.from_}
        if message.text:
            form["Body"] = message.text
        media = message.media
        if media is not None:
            if media.url is None or urlsplit(media.url).scheme not in ("http", "https"):
                raise UnsupportedContentError(
                    "twilio: media must be a public http(s) URL (Twilio fetches it); "
                    "bytes, paths and channel ids cannot be sent: host the file and pass its URL"
                )
            form["MediaUrl"] = media.url
        if "Body" not in form and "MediaUrl" not in form:
            raise UnsupportedContentError("twilio: a message needs a text or a media URL")
        return form

    async def send(self, message: Outbound) -> SendResult:
        answer = await self.request(
            "POST", self._messages_url(), data=self._form(message), headers=self._auth
        )
        if not answer.ok:
            raise self._error(answer)
        body = answer.json()
        sid = body.get("sid") if isinstance(body, dict) else None
        if not isinstance(sid, str) or not sid:
            # Accepted but unreadable: sending again could duplicate it, so it is final.
            raise SendError(
                f"twilio: HTTP {answer.status} without a message sid; check TWILIO_API_URL",
                retryable=False,
            )
        log.debug("twilio: sent %s to %s", sid, message.chat_id)
        return SendResult(sid)

    def _error(self, answer: HttpAnswer) -> SendError:
        body = answer.json()
        body = body if isinstance(body, dict) else {}
        code = body.get("code") if isinstance(body.get("code"), int) else None
        text = str(body.get("message") or answer.body[:200].decode("utf-8", "replace"))
        detail = self.redact(f"code {code}: {text}" if code is not None else text)
        what = f"twilio: HTTP {answer.status}: {detail}"
        if answer.status == 429 or code == 20429:
            return RateLimitedError(
                what, retry_after=_retry_after(answer.headers, self.rate_limit_wait)
            )
        if code is not None:
            for table, kind in (
                (_UNREACHABLE, RecipientUnreachableError),
                (_TOO_LARGE, PayloadTooLargeError),
                (_UNSUPPORTED, UnsupportedContentError),
                (_SESSION, OutsideSessionWindowError),
            ):
                if code in table:
                    return kind(f"{what} ({table[code]})")
        if code == 20003 or answer.status == 401:
            return SendError(
                f"twilio: HTTP {answer.status}: the credentials are wrong (code {code}); check "
                "TWILIO_ACCOUNT_SID and TWILIO_AUTH_TOKEN",
                retryable=False,
            )
        return status_error("twilio", answer, detail)

    # -- lost outcomes (botmesh.state.ports.AmbiguityResolver) ------------------------------------

    async def resolve_ambiguous(
        self, message: Outbound, key: str, since: float
    ) -> SendResult | None:
        """The message Twilio sent for ``message`` at or after ``since`` (minus
        ``clock_skew``), found by body and media count in Twilio's listing; ``None`` when
        the listing has none. ``key`` is not used (see the module docstring). Raises
        ``ProviderError`` when the listing fails or is longer than ``MAX_PAGES`` pages."""
        del key
        start = since - self.clock_skew
        day = datetime.fromtimestamp(start, UTC).strftime("%Y-%m-%d")
        params = {
            "To": self.to_of(message.chat_id),
            "From": self.from_,
            "DateSent>": day,
            "PageSize": "50",
        }
        want_body = message.text or ""
        want_media = 1 if message.media is not None else 0
        url: str | None = self._messages_url()
        found: list[tuple[float, str]] = []
        for _ in range(MAX_PAGES):
            if url is None:
                break
            answer = await self.request("GET", url, params=params, headers=self._auth)
            if not answer.ok:
                raise ProviderError(f"cannot list sent messages: {self._error(answer)}")
            page = answer.json()
            if not isinstance(page, dict) or not isinstance(page.get("messages"), list):
                raise ProviderError("twilio: the message listing is not Twilio's page shape")
            for item in page["messages"]:
                hit = _match(item, want_body, want_media, start)
                if hit is not None:
                    found.append(hit)
            nxt = page.get("next_page_uri")
            if nxt and not (isinstance(nxt, str) and nxt.startswith("/")):
                # Only a path on the API: the credentials go nowhere else.
                raise ProviderError(f"twilio: next_page_uri {nxt!r} is not a path on the API")
            url, params = (f"{self.base_url}{nxt}", {}) if nxt else (None, params)
        else:
            if url is not None:
                raise ProviderError(
                    f"twilio: over {MAX_PAGES} pages of messages to {message.chat_id}; "
                    "cannot tell whether the send went out"
                )
        if not found:
            return None
        return SendResult(min(found)[1])

    # -- media downloads ------------------------------------------------------------------

    def _credentialed(self, url: str) -> bool:
        parts, api = urlsplit(url), urlsplit(self.base_url)
        if (parts.scheme, parts.netloc) == (api.scheme, api.netloc):
            return True
        return parts.scheme == "https" and host_allowed(parts.hostname or "", ["twilio.com"])

    async def media_url(self, media: Media) -> tuple[str, dict[str, str]]:
        if media.url is None:
            raise ProviderError("twilio: this media has no URL to download")
        if not self._credentialed(media.url):
            raise ProviderError(
                "twilio: media URL is neither on the API origin nor a twilio.com host; "
                "its credentials are not sent there"
            )
        return media.url, self._auth

    async def download_media(self, media: Media) -> bytes:
        """The media's bytes: the first request carries basic auth; a redirect (Twilio
        sends one to a signed CDN URL) is followed without it."""
        if media.data is not None:
            return media.data
        url, headers = await self.media_url(media)
        return await self.fetch_media(url, headers=headers, first_hop_only=True)


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def _retry_after(headers: Mapping[str, str], fallback: float) -> float:
    raw = headers.get("Retry-After") or headers.get("retry-after")
    if raw:
        try:
            return max(0.0, float(raw))
        except ValueError:
            try:
                return max(0.0, email.utils.parsedate_to_datetime(raw).timestamp() - time.time())
            except (TypeError, ValueError):
                pass
    return fallback


def _match(item: Any, body: str, media: int, start: float) -> tuple[float, str] | None:
    """``(created, sid)`` when ``item`` (a listed message) is the send we look for."""
    if not isinstance(item, dict) or not isinstance(item.get("sid"), str):
        return None
    got = item.get("body") or ""
    if got != body and got.removeprefix(TRIAL_PREFIX) != body:
        return None
    try:
        if int(item.get("num_media") or 0) != media:
            return None
        created = email.utils.parsedate_to_datetime(str(item.get("date_created"))).timestamp()
    except (TypeError, ValueError):
        return None
    return (created, item["sid"]) if created >= start else None


# -- webhooks -----------------------------------------------------------------------------


def twilio_signature(auth_token: str, url: str, params: list[tuple[str, str]]) -> str:
    """Twilio's ``X-Twilio-Signature``: base64 of HMAC-SHA1(auth token, the URL followed by
    each form parameter's name and value, sorted by name then value)."""
    payload = url + "".join(k + v for k, v in sorted(params))
    digest = hmac.new(auth_token.encode(), payload.encode(), hashlib.sha1).digest()
    return base64.b64encode(digest).decode()


def _url_variants(url: str) -> list[str]:
    """``url`` as given, and with its default port dropped or added (Twilio's own
    validators accept both, since proxies disagree on it)."""
    parts = urlsplit(url)
    default = {"https": 443, "http": 80}.get(parts.scheme)
    host = parts.hostname or ""
    variants = [url]
    if default is not None and host:
        netloc = parts.netloc.rsplit("@", 1)[-1]
        if parts.port is None:
            variants.append(urlunsplit(parts._replace(netloc=f"{netloc}:{default}")))
        elif parts.port == default:
            variants.append(urlunsplit(parts._replace(netloc=netloc.rsplit(":", 1)[0])))
    return variants


#: ``MessageStatus`` values of a status callback that are a delivery state.
_STATES = {
    "sent": DeliveryState.SENT,
    "delivered": DeliveryState.DELIVERED,
    "read": DeliveryState.READ,
    "undelivered": DeliveryState.FAILED,
    "failed": DeliveryState.FAILED,
}


class TwilioWebhook(SignedWebhook):
    """Twilio's incoming-message webhook (``application/x-www-form-urlencoded``).

    ``parse`` gives one ``Inbound`` per message: ``id`` = ``MessageSid``, ``chat_id`` =
    ``From`` (keeping ``whatsapp:``, so a reply goes back on WhatsApp), ``text`` = ``Body``.
    The first media is ``media`` (``Media(provider="twilio", url, mime)``); further media
    (MMS carries up to 10) are in ``data["more_media"]`` as ``{"url", "mime"}`` dicts.
    ``data`` also has ``to``, and ``profile_name`` / ``wa_id`` when Twilio sends them.
    Status callbacks (``MessageStatus`` without ``Body``) give no record.

    ``statuses`` reads those status callbacks (the ``StatusCallback`` URL of a send, or
    the messaging service's): ``message_id`` = ``MessageSid`` (the ``sid`` ``send``
    returned), ``chat_id`` = ``To`` as Twilio writes it (``whatsapp:+1…`` keeps its prefix,
    as inbound chat ids have it), ``status`` from ``MessageStatus``: ``sent``,
    ``delivered``, ``read`` (WhatsApp), ``undelivered`` and ``failed`` both ``failed`` with
    ``ErrorCode`` (and ``ErrorMessage`` when Twilio adds one); ``queued``, ``accepted``,
    ``scheduled``, ``sending`` and ``canceled`` give none. A callback says no time: ``ts``
    is ``None``.
    """

    channel = "twilio"
    SECRET_ENV = "TWILIO_AUTH_TOKEN"
    SECRET_HINT = "copy the auth token from the Twilio console"
    SECRET_NAME = "auth_token"

    def _params(self, request: WebhookRequest) -> list[tuple[str, str]]:
        if request.body:
            try:
                return parse_qsl(request.body.decode(), keep_blank_values=True, strict_parsing=True)
            except (UnicodeDecodeError, ValueError):
                return list(request.form.items())
        return list(request.form.items())

    def verify(self, request: WebhookRequest) -> None:
        given = request.headers.get("x-twilio-signature", "")
        if not given:
            raise BadSignature("twilio: no X-Twilio-Signature header")
        params = self._params(request)
        for url in _url_variants(request.url):
            if same(twilio_signature(self._secret, url, params), given):
                return
        raise BadSignature(
            "twilio: X-Twilio-Signature does not match; check TWILIO_AUTH_TOKEN and that the "
            "gateway's public URL is exactly the one configured in Twilio"
        )

    def parse(self, request: WebhookRequest) -> list[Inbound]:
        form = dict(self._params(request))
        sid = form.get("MessageSid") or form.get("SmsMessageSid")
        if not sid:
            raise MalformedWebhook("twilio: the webhook has no MessageSid")
        if "MessageStatus" in form and "Body" not in form:
            return []  # a status callback, not a message
        sender = form.get("From")
        if not sender:
            raise MalformedWebhook(f"twilio: message {sid} has no From")
        media: list[Media] = []
        try:
            count = int(form.get("NumMedia") or 0)
        except ValueError:
            raise MalformedWebhook(f"twilio: NumMedia is not a number in {sid}") from None
        for i in range(count):
            url = form.get(f"MediaUrl{i}")
            if url:
                media.append(
                    Media(provider="twilio", url=url, mime=form.get(f"MediaContentType{i}"))
                )
        data: dict[str, Any] = {"to": form.get("To", "")}
        for field, key in (("ProfileName", "profile_name"), ("WaId", "wa_id")):
            if form.get(field):
                data[key] = form[field]
        if len(media) > 1:
            data["more_media"] = [{"url": m.url, "mime": m.mime} for m in media[1:]]
        return [
            Inbound(
                id=sid,
                chat_id=sender,
                channel=self.channel,
                sender=sender,
                ts=self._clock(),
                text=form.get("Body") or None,
                media=media[0] if media else None,
                data=data,
            )
        ]

    def statuses(self, request: WebhookRequest) -> list[DeliveryStatus]:
        form = dict(self._params(request))
        status = form.get("MessageStatus")
        if status is None or "Body" in form:
            return []  # an incoming message, not a status callback
        sid = form.get("MessageSid") or form.get("SmsSid")
        if not sid or not form.get("To"):
            raise MalformedWebhook("twilio: a status callback without MessageSid or To")
        state = _STATES.get(status)
        if state is None:
            return []  # queued, accepted, scheduled, sending, canceled: no news yet
        failed = state is DeliveryState.FAILED
        return [
            DeliveryStatus(
                chat_id=form["To"],
                message_id=sid,
                status=state,
                channel=self.channel,
                code=(form.get("ErrorCode") or None) if failed else None,
                error=(form.get("ErrorMessage") or None) if failed else None,
            )
        ]

    def reply(self, request: WebhookRequest, produced: list[Inbound]) -> WebhookReply:
        return WebhookReply(
            200,
            b'<?xml version="1.0" encoding="UTF-8"?><Response></Response>',
            "text/xml",
        )

"""What the three Meta channels share (WhatsApp Cloud API, Messenger, Instagram): Graph API
calls, the mapping of Graph errors to ours, the ``X-Hub-Signature-256`` check and the
``hub.challenge`` handshake of their webhooks, and the settings they read from the
environment.

Graph API: ``https://graph.facebook.com/v21.0`` (``<CHANNEL>_API_URL`` overrides it), the
access token in an ``Authorization: Bearer`` header (never in a URL, never in a message or a
log line). An error answer is ``{"error": {"message", "type", "code", "error_subcode",
"fbtrace_id", "error_data", "is_transient"}}``; ``graph_error`` maps it, first match wins:

====================================================  =============================================
Graph answer                                          our error
====================================================  =============================================
code 190 (invalid or expired access token)            final ``SendError`` naming the variable to fix
code 4 / subcode 2018109 (attachment too large)       ``PayloadTooLargeError``
HTTP 429; codes 4, 17, 32, 613 (call limits), 80007   ``RateLimitedError``; ``retry_after`` from
(WABA limit), 130429 (throughput), 131056 (pair       ``Retry-After``, else the
rate limit)                                           ``X-Business-Use-Case-Usage`` header's
                                                      ``estimated_time_to_regain_access`` (minutes),
                                                      else ``RATE_LIMIT_WAIT`` (60 s; 6 s for the
                                                      pair limit: one message per 6 s to one user)
131047 (24 h since the user's last message); code     ``OutsideSessionWindowError``
10 with subcode 2018278 / 2534022 or "outside of
allowed window"; code 551 saying the same
131026 (undeliverable), 131030 (not in the allowed    ``RecipientUnreachableError``
list), 100 / 2018001 and 100 / 2534014 ("No
matching user found"), 551 (not available)
131051 (unsupported message type), 131053 (media      ``UnsupportedContentError``
upload error)
HTTP 413, 131052 (media download error), code 100   ``PayloadTooLargeError``
with a length limit ("must be at most 4096
characters", "less than or equal to 2000")
codes 1, 2 (unknown / temporary), 1200 (temporary     retryable ``SendError``
send failure), 131000, 131016 (service
unavailable), ``is_transient``, HTTP 408, 425, 5xx
any other 4xx                                         final ``SendError``
====================================================  =============================================
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlsplit

from botmesh.providers.base import ChannelProvider
from botmesh.providers.http import HttpAnswer, retry_after_of, status_error
from botmesh.providers.webhooks import (
    BadSignature,
    MalformedWebhook,
    WebhookReply,
    WebhookRequest,
    hmac_hex,
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
from botmesh.state.messages import DeliveryStatus, Inbound, Media

__all__ = [
    "GRAPH_URL",
    "META_MEDIA_HOSTS",
    "RATE_LIMIT_WAIT",
    "GraphError",
    "GraphProvider",
    "MetaWebhook",
    "graph_error",
    "media_bytes",
    "webhook_body",
]

log = logging.getLogger("botmesh.providers.meta")

#: The Graph API every Meta channel calls.
GRAPH_URL = "https://graph.facebook.com/v21.0"
#: Hosts Meta serves media from (WhatsApp downloads go to ``lookaside.fbsbx.com``).
META_MEDIA_HOSTS = ("fbsbx.com", "fbcdn.net", "facebook.com", "cdninstagram.com", "whatsapp.net")

#: Seconds to wait after a rate limit that came without ``Retry-After``, by Graph code.
RATE_LIMIT_WAIT: Mapping[int, float] = {
    4: 60.0,  # application request limit
    17: 60.0,  # user request limit
    32: 60.0,  # page request limit
    613: 60.0,  # "Calls to this api have exceeded the rate limit"
    80007: 60.0,  # WhatsApp Business Account rate limit
    130429: 60.0,  # Cloud API message throughput reached
    131056: 6.0,  # pair rate limit: about one message every 6 s to one user
}
#: Seconds to wait after an HTTP 429 that named no known code.
DEFAULT_RATE_LIMIT_WAIT = 60.0
_RETRYABLE = frozenset({1, 2, 1200, 131000, 131016})
_OUTSIDE_WINDOW_SUBCODES = frozenset({2018278, 2534022})
_NO_MATCHING_USER = frozenset({2018001, 2534014})
_UNREACHABLE = frozenset({131026, 131030})
_UNSUPPORTED = frozenset({131051, 131053})
_ATTACHMENT_TOO_LARGE = 2018109
_TOO_LONG = re.compile(r"must be (at most|less than or equal to) \d+", re.IGNORECASE)
_WINDOW = "outside of allowed window"


@dataclass(frozen=True, slots=True)
class GraphError:
    """The fields of a Graph API error body (``{"error": {...}}``)."""

    status: int
    code: int | None = None
    subcode: int | None = None
    message: str = ""
    type: str = ""
    fbtrace_id: str = ""
    details: str = ""
    is_transient: bool = False

    @classmethod
    def of(cls, answer: HttpAnswer, redact: Callable[[str], str] = str) -> GraphError:
        """The error of ``answer``; ``redact`` cleans the texts Graph sent (it may quote a
        malformed token back)."""
        body = answer.json()
        err = body.get("error") if isinstance(body, dict) else None
        if not isinstance(err, dict):
            text = redact(answer.body[:200].decode("utf-8", "replace").strip())
            return cls(answer.status, message=text or f"HTTP {answer.status}")
        data = err.get("error_data")
        details = data.get("details") if isinstance(data, dict) else data
        return cls(
            answer.status,
            code=_int(err.get("code")),
            subcode=_int(err.get("error_subcode")),
            message=redact(str(err.get("message") or "")),
            type=str(err.get("type") or ""),
            fbtrace_id=str(err.get("fbtrace_id") or ""),
            details=redact(str(details)) if details else "",
            is_transient=err.get("is_transient") is True,
        )

    def describe(self) -> str:
        code = "" if self.code is None else f"Graph error {self.code}"
        if self.subcode is not None:
            code += f"/{self.subcode}"
        text = self.message
        if self.details and self.details not in text:
            text = f"{text} ({self.details})" if text else self.details
        trace = f" [fbtrace_id {self.fbtrace_id}]" if self.fbtrace_id else ""
        return f"{code}: {text}{trace}" if code else f"{text}{trace}"


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _usage_wait(headers: Mapping[str, str]) -> float | None:
    """``estimated_time_to_regain_access`` (minutes) of ``X-Business-Use-Case-Usage``, in s."""
    raw = next((v for k, v in headers.items() if k.lower() == "x-business-use-case-usage"), None)
    try:
        usage = json.loads(raw) if raw else None
    except ValueError:
        return None
    if not isinstance(usage, dict):
        return None
    minutes = [
        m
        for entries in usage.values()
        if isinstance(entries, list)
        for e in entries
        if isinstance(e, dict)
        and isinstance(m := e.get("estimated_time_to_regain_access"), int | float)
    ]
    return max(minutes) * 60.0 if minutes and max(minutes) > 0 else None


def graph_error(
    channel: str,
    answer: HttpAnswer,
    *,
    token_env: str = "",
    redact: Callable[[str], str] = str,
) -> SendError:
    """Our error for a failed Graph answer (the table in this module's docstring). The
    message says what the channel said (through ``redact``) and what to do."""
    e = GraphError.of(answer, redact)
    what = f"{channel}: HTTP {answer.status}: {e.describe()}"
    code, sub = e.code, e.subcode
    if code == 190:
        fix = f"set {token_env} to a valid token" if token_env else "renew the access token"
        return SendError(
            f"{channel}: the access token is invalid or expired ({e.describe()}); {fix}",
            retryable=False,
        )
    if code == 4 and sub == _ATTACHMENT_TOO_LARGE:
        return PayloadTooLargeError(f"{what}; send a smaller file or a link to it")
    if answer.status == 429 or code in RATE_LIMIT_WAIT:
        wait = _usage_wait(answer.headers)
        if wait is None:
            wait = RATE_LIMIT_WAIT.get(code or 0, DEFAULT_RATE_LIMIT_WAIT)
        return RateLimitedError(what, retry_after=retry_after_of(answer.headers, wait))
    if (
        code == 131047
        or (code == 10 and (sub in _OUTSIDE_WINDOW_SUBCODES or _WINDOW in e.message.lower()))
        or (code == 551 and _WINDOW in e.message.lower())
    ):
        return OutsideSessionWindowError(
            f"{what}; the user must write first (or send an approved template / a message tag)"
        )
    if code in _UNREACHABLE or code == 551 or (code == 100 and sub in _NO_MATCHING_USER):
        return RecipientUnreachableError(f"{what}; check the recipient id, or stop writing to it")
    if code in _UNSUPPORTED:
        return UnsupportedContentError(f"{what}; send another type or format of content")
    too_long = code == 100 and _TOO_LONG.search(f"{e.message} {e.details}")
    if answer.status == 413 or code == 131052 or too_long:
        return PayloadTooLargeError(f"{what}; shorten the text or the file")
    if code in _RETRYABLE or e.is_transient:
        return SendError(what, retryable=True)
    return status_error(channel, answer, e.describe())


# -- the provider side ------------------------------------------------------------------------


class GraphProvider(ChannelProvider):
    """A channel adapter talking to the Graph API with one access token."""

    #: The environment variable holding the token (named by errors that ask to fix it).
    token_env: ClassVar[str] = ""

    def delivery_error(self, status: DeliveryStatus) -> SendError:
        """Our error for a ``failed`` status webhook (``botmesh.state.statuses``): the one
        the send's answer gives for the same code (131047 outside the 24-hour window, 131026
        undeliverable…), so a send's ``Fallback`` acts on it as on a refusal in the answer."""
        code = _int(status.code)
        what = (
            f"{self.name}: the message {status.message_id} was accepted, then failed: "
            f"code {status.code} {status.error or ''}".rstrip()
        )
        if code == 131047:
            return OutsideSessionWindowError(
                f"{what}; the user must write first (or send an approved template)"
            )
        if code in _UNREACHABLE:
            return RecipientUnreachableError(f"{what}; check the recipient, or stop writing")
        if code in _UNSUPPORTED:
            return UnsupportedContentError(f"{what}; send another type or format of content")
        return SendError(what, retryable=False)

    def __init__(
        self,
        access_token: str,
        *,
        api_url: str = GRAPH_URL,
        timeout: float = 15.0,
        media_ref_hosts: Iterable[str] | None = None,
        allow_private_media: bool = False,
        media_max_bytes: int | None = None,
    ) -> None:
        if not access_token:
            raise ConfigError(f"{self.name}.access_token", "is empty; pass the channel's token")
        super().__init__(
            timeout=timeout,
            secrets=(access_token,),
            media_ref_hosts=media_ref_hosts,
            allow_private_media=allow_private_media,
            media_max_bytes=media_max_bytes,
        )
        self._token = access_token
        self.api_url = api_url.rstrip("/")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(api_url={self.api_url!r})"

    def _auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._token}"}

    async def graph(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        data: Any = None,
        params: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """One Graph call: the answer's JSON object, or the mapped error raised."""
        answer = await self.request(
            method,
            f"{self.api_url}/{path.lstrip('/')}",
            json_body=json_body,
            data=data,
            params=params,
            headers=self._auth(),
        )
        body = answer.json()
        if answer.ok and isinstance(body, dict) and "error" not in body:
            return body
        if answer.ok:
            raise SendError(
                self.redact(f"{self.name}: {method} {path}: HTTP {answer.status} without a result"),
                retryable=True,
            )
        err = graph_error(self.name, answer, token_env=self.token_env, redact=self.redact)
        log.warning("%s: %s %s failed: %s", self.name, method, path, err)
        raise err

    def check_download_host(self, url: str) -> None:
        """Refuse to send the token anywhere but Meta's media hosts (or the API's own host,
        for a local fake)."""
        host = (urlsplit(url).hostname or "").lower()
        api_host = (urlsplit(self.api_url).hostname or "").lower()
        allowed = (*META_MEDIA_HOSTS, *(self.media_ref_hosts or ()))
        if host != api_host and not any(host == a or host.endswith("." + a) for a in allowed):
            raise ProviderError(
                f"{self.name}: the media URL's host {host!r} is not a Meta media host "
                f"({', '.join(META_MEDIA_HOSTS)}); the access token is not sent there"
            )


async def media_bytes(channel: str, media: Media) -> tuple[bytes, str]:
    """The bytes of ``media`` (``data``, or the file at ``path``, read off the event loop)
    and a file name for them."""
    path = Path(media.path) if media.path is not None else None
    name = media.name or (path.name if path is not None else "file")
    if media.data is not None:
        return media.data, name
    if path is None:
        raise UnsupportedContentError(f"{channel}: the media has no id, url, data or path")
    try:
        return await asyncio.to_thread(path.read_bytes), name
    except OSError as exc:
        raise UnsupportedContentError(
            f"{channel}: cannot read media file {media.path!r}: {exc.strerror}"
        ) from None


# -- settings from the environment -------------------------------------------------------------


def env_value(env: Mapping[str, str], name: str, fix: str) -> str:
    """``env[name]``, stripped; a ``ConfigError`` naming it and ``fix`` when missing."""
    value = env.get(name, "").strip()
    if not value:
        raise ConfigError(name, f"is not set; {fix}")
    return value


def env_api(env: Mapping[str, str], prefix: str) -> dict[str, Any]:
    """The constructor keywords a channel reads from the environment: ``api_url`` from
    ``<PREFIX>_API_URL`` (default ``GRAPH_URL``), and the media settings of
    ``ChannelProvider.media_env`` (``<PREFIX>_MEDIA_REF_HOSTS``,
    ``<PREFIX>_ALLOW_PRIVATE_MEDIA``), the latter only with a local ``http://127.0.0.1`` API
    URL (a fake, in tests)."""
    url, media = ChannelProvider.api_env(env, prefix, GRAPH_URL)
    return {"api_url": url, **media}


# -- the webhook side -------------------------------------------------------------------------


class MetaWebhook:
    """The webhook rules the three Meta channels share: the ``hub.challenge`` handshake and
    the ``X-Hub-Signature-256`` check. Subclasses set ``channel`` and implement ``parse``."""

    channel: str = ""
    #: The prefix of the per-channel environment overrides (``WHATSAPP`` → ``WHATSAPP_APP_SECRET``).
    env_prefix: ClassVar[str] = ""

    def __init__(self, app_secret: str, verify_token: str) -> None:
        if not app_secret:
            raise ConfigError(f"{self.channel}.app_secret", "is empty; pass the Meta app secret")
        if not verify_token:
            raise ConfigError(
                f"{self.channel}.verify_token", "is empty; pass the webhook's verify token"
            )
        self._secret = app_secret
        self._verify_token = verify_token

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    @classmethod
    def secrets_from_env(cls, env: Mapping[str, str]) -> tuple[str, str]:
        """The app secret and verify token: ``<PREFIX>_APP_SECRET`` / ``<PREFIX>_VERIFY_TOKEN``,
        else the shared ``META_APP_SECRET`` / ``META_VERIFY_TOKEN``."""
        found: list[str] = []
        for what, fix in (
            ("APP_SECRET", "the app secret (App settings > Basic) signs every webhook"),
            ("VERIFY_TOKEN", "the token you typed in the webhook's setup (hub.verify_token)"),
        ):
            own = f"{cls.env_prefix}_{what}"
            value = env.get(own, "").strip() or env.get(f"META_{what}", "").strip()
            if not value:
                raise ConfigError(f"META_{what}", f"is not set (nor {own}); set it to {fix}")
            found.append(value)
        return found[0], found[1]

    def handshake(self, request: WebhookRequest) -> WebhookReply | None:
        """``GET ?hub.mode=subscribe&hub.verify_token=T&hub.challenge=C``: 200 with ``C`` when
        ``T`` is ours, else 403. ``None`` for anything else."""
        if request.method.upper() != "GET" or "hub.mode" not in request.query:
            return None
        token = request.query.get("hub.verify_token", "")
        challenge = request.query.get("hub.challenge", "")
        if (
            request.query.get("hub.mode") == "subscribe"
            and challenge
            and same(token, self._verify_token)
        ):
            return WebhookReply(200, challenge.encode())
        log.warning("%s: webhook verification refused (wrong hub.verify_token)", self.channel)
        return WebhookReply(403, b"verify token mismatch")

    def verify(self, request: WebhookRequest) -> None:
        """``x-hub-signature-256: sha256=<hex HMAC-SHA256(app secret, raw body)>``."""
        header = request.headers.get("x-hub-signature-256", "")
        if not header:
            raise BadSignature(f"{self.channel}: no X-Hub-Signature-256 header")
        scheme, _, sig = header.partition("=")
        if scheme != "sha256" or not same(sig.lower(), hmac_hex(self._secret, request.body)):
            raise BadSignature(
                f"{self.channel}: X-Hub-Signature-256 does not match the body; check that "
                "the app secret is the one of the app that sends these webhooks"
            )

    def reply(self, request: WebhookRequest, produced: list[Inbound]) -> WebhookReply:
        return WebhookReply(200, b"EVENT_RECEIVED")


def webhook_body(channel: str, request: WebhookRequest, expected: str) -> dict[str, Any]:
    """The JSON body of a Meta webhook whose ``object`` is ``expected``; else
    ``MalformedWebhook``."""
    try:
        body = json.loads(request.body)
    except ValueError as exc:
        raise MalformedWebhook(f"{channel}: the body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise MalformedWebhook(f"{channel}: the body is not a JSON object")
    if body.get("object") != expected:
        raise MalformedWebhook(
            f"{channel}: object is {body.get('object')!r}, expected {expected!r}; is this "
            "webhook subscribed for another product?"
        )
    if not isinstance(body.get("entry"), list):
        raise MalformedWebhook(f"{channel}: no entry list in the body")
    return body

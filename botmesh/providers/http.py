"""The HTTP client every channel adapter uses: one ``aiohttp`` session per adapter (connection
reuse), a timeout on every call, credentials kept out of every message, one status mapping.

Why aiohttp: it is the one mature asyncio client *and* server, and the webhook gateway and
the worker's probes are built on its server; so one library serves both ends.

Error mapping (``status_error``), the rule every adapter starts from:

- 429 → ``RateLimitedError`` with ``retry_after`` from ``Retry-After`` (seconds or an HTTP
  date) or the body's own field, which the adapter passes;
- 408, 425, 5xx and transport errors (refused, reset, timeout) → a retryable ``SendError``;
- other 4xx → a final ``SendError`` (``retryable=False``), unless the adapter maps the
  channel's error code to one of the reference's final errors first.

Media downloads go through ``check_media_url`` and a resolver that refuses private,
loopback, link-local and reserved addresses (unless ``allow_private_media``), so a tampered
journal cannot make the bot fetch an internal address, not even through DNS or a redirect.
"""

from __future__ import annotations

import asyncio
import datetime
import email.utils
import ipaddress
import json
import logging
import math
import socket
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlsplit

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from botmesh.state.errors import ProviderError, RateLimitedError, SendError

__all__ = [
    "HttpAnswer",
    "HttpChannel",
    "MediaUrlRefused",
    "check_media_url",
    "host_allowed",
    "retry_after_of",
    "status_error",
]

log = logging.getLogger("botmesh.providers")

#: Largest media download, by default (bytes).
MEDIA_MAX_BYTES = 64 * 1024 * 1024


class MediaUrlRefused(ProviderError):
    """A media URL failed the download check (scheme, host, address)."""


@dataclass(frozen=True, slots=True)
class HttpAnswer:
    """A channel API's answer. ``HttpChannel.request`` gives case-insensitive ``headers``."""

    status: int
    headers: Mapping[str, str]
    body: bytes = b""
    _json: Any = field(default=None, repr=False)

    def json(self) -> Any:
        """The body as JSON; ``None`` when it is not JSON."""
        if self._json is not None:
            return self._json
        try:
            return json.loads(self.body or b"null")
        except ValueError:
            return None

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


def _header(headers: Mapping[str, str], name: str) -> str | None:
    """``headers[name]``, whatever the case of the name."""
    found = headers.get(name)
    if found is None:
        low = name.lower()
        found = next((v for k, v in headers.items() if k.lower() == low), None)
    return found


def retry_after_of(headers: Mapping[str, str], fallback: float | None = None) -> float:
    """Seconds to wait from a ``Retry-After`` header (seconds or HTTP date, any case of
    the name); else ``fallback``; else 1. A header that is neither (or not finite) is
    ignored."""
    raw = (_header(headers, "Retry-After") or "").strip()
    if raw:
        try:
            seconds = float(raw)
        except ValueError:
            try:
                when = email.utils.parsedate_to_datetime(raw)
            except (TypeError, ValueError, IndexError, OverflowError):
                when = None
            if when is not None:
                if when.tzinfo is None:  # "-0000": UTC by RFC 5322
                    when = when.replace(tzinfo=datetime.UTC)
                return max(0.0, when.timestamp() - time.time())
        else:
            if math.isfinite(seconds):
                return max(0.0, seconds)
    return fallback if fallback is not None else 1.0


def status_error(
    channel: str,
    answer: HttpAnswer,
    detail: str,
    *,
    retry_after: float | None = None,
) -> SendError:
    """The error for a failed answer, by the rule in this module's docstring. ``detail`` is
    the channel's own error text (already free of credentials)."""
    what = f"{channel}: HTTP {answer.status}: {detail}"
    if answer.status == 429:
        return RateLimitedError(what, retry_after=retry_after_of(answer.headers, retry_after))
    if answer.status in (408, 425) or answer.status >= 500:
        return SendError(what, retryable=True)
    return SendError(what, retryable=False)


def host_allowed(host: str, allowed: Iterable[str]) -> bool:
    """``host`` is one of ``allowed`` or a subdomain of one (``cdn.fbcdn.net`` under
    ``fbcdn.net``)."""
    host = host.lower().rstrip(".")
    for entry in allowed:
        a = entry.lower().lstrip(".").rstrip(".")
        if host == a or host.endswith("." + a):
            return True
    return False


def _private(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return not ip.is_global or ip.is_multicast


def check_media_url(
    url: str,
    *,
    hosts: Iterable[str] | None,
    allow_private: bool = False,
    schemes: Iterable[str] = ("https",),
) -> str:
    """``url`` when it may be downloaded: its scheme in ``schemes``, its host under one of
    ``hosts`` (``None``: any host), and, unless ``allow_private``, not a literal private,
    loopback, link-local or reserved address (names are checked when they resolve).
    Raises ``MediaUrlRefused`` naming what failed."""
    hosts = None if hosts is None else tuple(hosts)
    schemes = tuple(schemes)
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
    except ValueError as exc:
        raise MediaUrlRefused(f"media URL is not a URL: {exc}") from None
    if parts.scheme not in schemes:
        raise MediaUrlRefused(
            f"media URL scheme {parts.scheme!r} is not allowed (allowed: {', '.join(schemes)})"
        )
    if not host:
        raise MediaUrlRefused("media URL has no host")
    if parts.username or parts.password:
        raise MediaUrlRefused("media URL carries credentials; they are added at download time")
    if hosts is not None and not host_allowed(host, hosts):
        raise MediaUrlRefused(
            f"media host {host!r} is not an allowed media host ({', '.join(hosts)}); set "
            "media_ref_hosts to change the list"
        )
    if not allow_private:
        try:
            literal = _private(host.strip("[]"))
        except ValueError:
            literal = False  # a name: the resolver checks what it resolves to
        if literal:
            raise MediaUrlRefused(f"media host {host!r} is a private or loopback address")
    return url


def _same_origin(current: URL, url: str) -> bool:
    try:
        return URL(url).origin() == current.origin()
    except ValueError:
        return False


class _PublicOnlyResolver(AbstractResolver):
    """Resolves names and refuses any that lead to a private address."""

    def __init__(self) -> None:
        self._inner = aiohttp.ThreadedResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        found = await self._inner.resolve(host, port, family)
        bad = [r["host"] for r in found if _private(r["host"])]
        if bad:
            raise MediaUrlRefused(f"media host {host!r} resolves to a private address")
        return found

    async def close(self) -> None:
        await self._inner.close()


class HttpChannel:
    """The HTTP part of a channel adapter.

    ``secrets`` are strings never to show (a token, an API key): every error message this
    class builds has them replaced by ``***``; adapters pass their own messages through
    ``redact`` too. ``timeout`` bounds each call (seconds). ``media_hosts`` (``None``: any)
    and ``allow_private_media`` rule media downloads.
    """

    name: str = "http"
    text_limit: int | None = None

    def __init__(
        self,
        *,
        timeout: float = 15.0,
        secrets: Iterable[str] = (),
        media_hosts: Iterable[str] | None = None,
        allow_private_media: bool = False,
        media_max_bytes: int = MEDIA_MAX_BYTES,
        connections: int = 64,
    ) -> None:
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
        self.timeout = timeout
        self._secrets = sorted({s for s in secrets if s}, key=len, reverse=True)
        self.media_hosts = None if media_hosts is None else tuple(media_hosts)
        self.allow_private_media = allow_private_media
        self.media_max_bytes = media_max_bytes
        self._connections = connections
        self._session: aiohttp.ClientSession | None = None
        self._media: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- sessions -------------------------------------------------------------------------

    def _client(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or self._session.closed or self._loop is not loop:
            self._loop = loop
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout),
                connector=aiohttp.TCPConnector(limit=self._connections),
                raise_for_status=False,
            )
            self._media = None
        return self._session

    def _media_client(self) -> aiohttp.ClientSession:
        self._client()
        if self._media is None or self._media.closed:
            resolver = None if self.allow_private_media else _PublicOnlyResolver()
            self._media = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=max(self.timeout, 60.0)),
                connector=aiohttp.TCPConnector(limit=8, resolver=resolver),
            )
        return self._media

    async def close(self) -> None:
        """Close the connections (idempotent)."""
        for s in (self._session, self._media):
            if s is not None and not s.closed:
                await s.close()
        self._session = self._media = None

    # -- calls ----------------------------------------------------------------------------

    def redact(self, text: str) -> str:
        """``text`` with every secret replaced by ``***``, as it is and percent-encoded (as
        it appears in a URL an error message quotes)."""
        for s in self._secrets:
            for form in dict.fromkeys((s, quote(s, safe=""), quote(s), quote(s, safe=":"))):
                text = text.replace(form, "***")
        return text

    async def request(
        self,
        method: str,
        url: str,
        *,
        json_body: Any = None,
        data: Any = None,
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> HttpAnswer:
        """One call. Transport errors (refused, reset, timeout) become a retryable
        ``SendError`` with the URL's secrets redacted; any HTTP status is returned."""
        try:
            async with self._client().request(
                method,
                url,
                json=json_body,
                data=data,
                params=params,
                headers=headers,
                allow_redirects=False,
            ) as resp:
                body = await resp.read()
                return HttpAnswer(resp.status, CIMultiDictProxy(CIMultiDict(resp.headers)), body)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            what = type(exc).__name__
            raise SendError(
                self.redact(f"{self.name}: {method} {url} failed: {what}: {exc}"), retryable=True
            ) from None

    async def fetch_media(
        self,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        first_hop_only: bool = False,
    ) -> bytes:
        """Download ``url`` after ``check_media_url``; redirects are followed only to URLs
        that pass the same check, and ``headers`` (credentials) only go along to the same
        origin (scheme, host, port), or with ``first_hop_only`` to no redirect at all.
        Raises ``MediaUrlRefused`` or ``ProviderError``."""
        session = self._media_client()
        for _ in range(5):
            check_media_url(
                url,
                hosts=self.media_hosts,
                allow_private=self.allow_private_media,
                schemes=("https", "http") if self.allow_private_media else ("https",),
            )
            try:
                async with session.get(url, headers=headers, allow_redirects=False) as resp:
                    if resp.status in (301, 302, 303, 307, 308) and "Location" in resp.headers:
                        url = str(resp.url.join(URL(resp.headers["Location"])))
                        if headers and (first_hop_only or not _same_origin(resp.url, url)):
                            headers = None
                        continue
                    if resp.status != 200:
                        raise ProviderError(
                            self.redact(f"{self.name}: media download: HTTP {resp.status}")
                        )
                    if (resp.content_length or 0) > self.media_max_bytes:
                        raise ProviderError(
                            f"{self.name}: media is {resp.content_length} bytes, over "
                            f"media_max_bytes={self.media_max_bytes}"
                        )
                    body = bytearray()
                    async for chunk in resp.content.iter_chunked(64 * 1024):
                        body += chunk
                        if len(body) > self.media_max_bytes:
                            raise ProviderError(
                                f"{self.name}: media is over media_max_bytes={self.media_max_bytes}"
                            )
                    return bytes(body)
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                cause = exc.__cause__ if isinstance(exc.__cause__, MediaUrlRefused) else None
                if cause is not None:
                    raise cause from None
                raise ProviderError(
                    self.redact(f"{self.name}: media download failed: {type(exc).__name__}: {exc}")
                ) from None
        raise ProviderError(f"{self.name}: media download: too many redirects")

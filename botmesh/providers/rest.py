"""``RestChannel``: what the adapters of plain REST messaging APIs with one credential share
(Gupshup's API key, HighLevel's location token, TikTok's access token): the API origin,
the wait after a rate limit that came without ``Retry-After``, the channel's own error text,
the two errors every such API maps the same way, and where the credential may travel for a
media download.

An adapter subclasses it, sets ``name``, ``text_limit``, ``media_channel``, ``default_url``,
``credential_fix`` (what to do when the credential is refused: the variable to set) and,
when its media downloads need the credential, ``credential_hosts``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar, TypedDict
from urllib.parse import urlsplit

from botmesh.providers.base import ChannelProvider, check_api_url
from botmesh.providers.http import HttpAnswer, host_allowed, retry_after_of
from botmesh.state.errors import ConfigError, RateLimitedError, SendError

__all__ = ["RestChannel", "RestOptions"]


class RestOptions(TypedDict, total=False):
    """The keywords every ``RestChannel`` takes besides its credentials."""

    base_url: str
    timeout: float
    media_ref_hosts: Iterable[str] | None
    allow_private_media: bool
    media_max_bytes: int | None
    #: Seconds to wait after a rate limit without ``Retry-After``.
    rate_limit_wait: float


class RestChannel(ChannelProvider):
    """A channel adapter on a REST API with one ``credential`` (kept out of every message).
    ``base_url`` is the API origin (https, or http on the loopback for a local fake)."""

    #: The public API.
    default_url: ClassVar[str] = ""
    #: What the operator does when the credential is refused (names the variable).
    credential_fix: ClassVar[str] = ""
    #: Hosts (and their subdomains) the credential may go to for a media download, over
    #: https; the API origin always may.
    credential_hosts: ClassVar[tuple[str, ...]] = ()
    #: ``rate_limit_wait``'s default (seconds).
    default_rate_limit_wait: ClassVar[float] = 1.0

    def __init__(
        self,
        credential: str,
        *,
        base_url: str = "",
        timeout: float = 15.0,
        media_ref_hosts: Iterable[str] | None = None,
        allow_private_media: bool = False,
        media_max_bytes: int | None = None,
        rate_limit_wait: float | None = None,
    ) -> None:
        if not credential:
            raise ConfigError(f"{self.name}.credential", f"is empty; {self.credential_fix}")
        super().__init__(
            timeout=timeout,
            secrets=(credential,),
            media_ref_hosts=media_ref_hosts,
            allow_private_media=allow_private_media,
            media_max_bytes=media_max_bytes,
        )
        self._credential = credential
        url = base_url or self.default_url
        self.base_url = check_api_url(url, f"{self.name}.base_url", self.default_url)
        self.rate_limit_wait = (
            self.default_rate_limit_wait if rate_limit_wait is None else rate_limit_wait
        )

    # -- errors ---------------------------------------------------------------------------

    def said(self, answer: HttpAnswer, body: Any, key: str = "message") -> str:
        """The channel's own error text, redacted: ``body[key]`` (a string, or a list of
        them, as validation errors come), else the start of the raw body."""
        text = body.get(key) if isinstance(body, dict) else None
        if isinstance(text, list):
            text = "; ".join(str(t) for t in text)
        if not isinstance(text, str) or not text:
            text = " ".join(answer.body[:200].decode("utf-8", "replace").split())
        return self.redact(text or "no message")

    def rate_limited(self, what: str, answer: HttpAnswer) -> RateLimitedError:
        """A rate limit: ``Retry-After`` when the channel sent one, else ``rate_limit_wait``."""
        return RateLimitedError(
            what, retry_after=retry_after_of(answer.headers, self.rate_limit_wait)
        )

    def refused(self, why: str) -> SendError:
        """The credential was refused: final, saying which setting to fix, never its value."""
        return SendError(
            f"{self.name}: the credentials were refused ({why}); {self.credential_fix}",
            retryable=False,
        )

    def common_error(self, answer: HttpAnswer, what: str, detail: str) -> SendError | None:
        """HTTP 429 → ``rate_limited``; 401 and 403 → ``refused``; else ``None``."""
        if answer.status == 429:
            return self.rate_limited(what, answer)
        if answer.status in (401, 403):
            return self.refused(f"HTTP {answer.status}: {detail}")
        return None

    # -- media downloads ------------------------------------------------------------------

    def credentialed(self, url: str) -> bool:
        """``url`` may receive the credential: the API origin, or https on
        ``credential_hosts``."""
        parts, api = urlsplit(url), urlsplit(self.base_url)
        if (parts.scheme, parts.netloc) == (api.scheme, api.netloc):
            return True
        return parts.scheme == "https" and host_allowed(parts.hostname or "", self.credential_hosts)

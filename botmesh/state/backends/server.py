"""What the journals on a server (postgres, redis) share: URLs with their passwords kept
out of every message, and the error a failed call raises."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

from botmesh.state.errors import ConfigError, JournalUnavailableError

__all__ = ["options_of", "redact", "unavailable"]

Opts = TypeVar("Opts")


def redact(url: str) -> str:
    """``url`` with its password replaced by ``***`` (for logs and errors)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def unavailable(
    what: str, where: str, exc: BaseException, url: str | None, check: str
) -> JournalUnavailableError:
    """The error of a failed call to the journal ``where`` (a redacted description), with
    the driver's message scrubbed of the password in ``url``. ``check`` names the server."""
    detail = str(exc)
    password = urlsplit(url).password if url is not None else None
    if password:
        detail = detail.replace(password, "***")
    return JournalUnavailableError(
        f"{what} the journal {where} failed: {type(exc).__name__}: {detail}. "
        f"Operator action: check that {check} is up and reachable, and the credentials"
    )


def options_of(make: Callable[..., Opts], url: str, given: dict[str, Any]) -> Opts:
    """``make(**given)``, a refusal re-raised naming the (redacted) URL."""
    try:
        return make(**given)
    except ConfigError as exc:
        raise ConfigError("journal", f"{redact(url)!r}: {exc}") from None

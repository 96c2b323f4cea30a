"""What the journals on a server (postgres, redis) share: reached by URL or through a
connection the caller passes (``ServerKv``), their URLs read one way (``ServerUrl``), and
their passwords kept out of every message (``redact``, ``unavailable``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar
from urllib.parse import SplitResult, parse_qsl, urlencode, urlsplit, urlunsplit

from botmesh.state.backends.database import DatabaseKv
from botmesh.state.errors import ConfigError, JournalUnavailableError

__all__ = ["ServerKv", "ServerUrl", "options_of", "redact", "unavailable"]

Opts = TypeVar("Opts")
Kv = TypeVar("Kv", bound="ServerKv")


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


class ServerKv(DatabaseKv):
    """A journal on a server: given a URL, it makes its connection and closes it; given a
    connection (a pool, a client), that is the caller's, never closed here."""

    #: Replicas on several hosts share it (the runtime adds a per-boot suffix to the
    #: default instance id).
    shared = True
    #: The server, as messages name it (``PostgreSQL``).
    server: ClassVar[str]
    #: What the URL and a connection passed in are called (``dsn``, ``pool``).
    url_name: ClassVar[str]
    connection: ClassVar[str]
    #: What the operator checks is up when a call fails (``the server``).
    up: ClassVar[str]

    def __init__(self, url: str | None, connection: object | None) -> None:
        if (url is None) == (connection is None):
            raise ConfigError(
                "journal",
                f"give the {self.server} journal a {self.url_name} or a {self.connection} (one)",
            )
        #: The driver's URL (our options taken out), when the journal connects itself.
        self._url = url
        #: The journal made its connection, so it closes it.
        self._own = connection is None

    def _at(self) -> str:
        """Where the journal is, for ``repr``: its URL, password redacted, or the caller's
        connection."""
        return redact(self._url) if self._url is not None else f"a {self.connection} you own"

    @property
    def where(self) -> str:
        """The server (password redacted) and the journal's place on it, for messages."""
        return repr(self)

    def _error(self, what: str, exc: BaseException) -> JournalUnavailableError:
        return unavailable(what, self.where, exc, self._url, self.up)


@dataclass(frozen=True, slots=True)
class ServerUrl(Generic[Opts, Kv]):
    """How a server journal's URL reads: one of ``schemes`` with a host; our options in its
    query, each read from its text by ``readers`` (a ``ValueError`` says what is wrong), the
    rest left to the driver. ``check``, ``kv`` and ``open`` are the module's ``check_url``,
    ``from_url`` and ``open_url``."""

    schemes: tuple[str, ...]
    #: The server and a URL to show in a refusal.
    server: str
    example: str
    readers: Mapping[str, Callable[[str], object]]
    #: The options made of what ``readers`` read (``ConfigError`` for a bad one).
    options: Callable[..., Opts]
    #: The journal (not opened yet) on the driver's URL, with those options.
    journal: Callable[[SplitResult, Opts], Kv]

    def split(self, url: str) -> tuple[SplitResult, Opts]:
        """The driver's URL (our options taken out) and our options; ``ConfigError`` for a
        bad URL or option, the password redacted."""
        parts = urlsplit(url)
        if parts.scheme not in self.schemes or not parts.netloc:
            raise ConfigError(
                "journal",
                f"{redact(url)!r} is not a {self.server} journal URL; write {self.example}",
            )
        ours: dict[str, Any] = {}
        theirs: list[tuple[str, str]] = []
        for name, raw in parse_qsl(parts.query, keep_blank_values=True):
            read = self.readers.get(name)
            if read is None:
                theirs.append((name, raw))  # the driver's own (sslmode, socket_timeout…)
                continue
            try:
                ours[name] = read(raw)
            except ValueError as exc:
                raise ConfigError(f"journal ({name})", str(exc)) from None
        return parts._replace(query=urlencode(theirs)), options_of(self.options, url, ours)

    def check(self, url: str) -> None:
        """Refuse a bad URL (``ConfigError``, password redacted)."""
        self.split(url)

    def kv(self, url: str) -> Kv:
        """The journal ``url`` names, not opened yet."""
        return self.journal(*self.split(url))

    async def open(self, url: str) -> Kv:
        """The journal ``url`` names, opened: the opener ``botmesh.state.backends`` calls."""
        kv = self.kv(url)
        await kv.open()
        return kv

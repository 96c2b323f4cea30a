"""Who may act in the console: the operators' tokens, the sessions a login opens, and the
CSRF token bound to each session.

A token is given in a file (``--token-file``), one per line, or in
``BOTMESH_CONSOLE_TOKEN`` (or ``BOTMESH_CONSOLE_TOKEN_FILE``): ``NAME:TOKEN`` names the
operator who holds it (the first ``:`` ends the name), a bare ``TOKEN`` (no ``:`` in it)
is named ``operator-<first 8 hex digits of its SHA-256>``. The name is what the console
logs as who did what; the token itself is never logged, shown or kept (only its
SHA-256). A token must have at least ``MIN_TOKEN`` (16) characters.

An action (a POST) is let through with ``Authorization: Bearer <token>`` (a script; no
CSRF token: a browser never adds that header by itself), or with the session cookie a
login set **and** the session's CSRF token in the form (``csrf``). Everything here is
pure: ``botmesh.console.server`` applies it to requests.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "MIN_TOKEN",
    "SESSION_COOKIE",
    "SESSION_TTL",
    "Session",
    "Sessions",
    "Tokens",
    "csrf_ok",
]

#: The fewest characters a token may have.
MIN_TOKEN = 16
#: The cookie that carries a session id (HttpOnly, SameSite=Strict).
SESSION_COOKIE = "botmesh_console_session"
#: Seconds a session lasts after its login.
SESSION_TTL = 12 * 3600.0

_MAKE = "python -c 'import secrets; print(secrets.token_urlsafe(24))'"


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


@dataclass(frozen=True, slots=True)
class Tokens:
    """The operators' tokens: name -> SHA-256 of the token."""

    by_name: dict[str, bytes] = field(default_factory=dict)

    @property
    def any(self) -> bool:
        return bool(self.by_name)

    @classmethod
    def parse(cls, text: str, where: str) -> Tokens:
        """Tokens from ``text`` (one per line, ``NAME:TOKEN`` or ``TOKEN``; blank lines and
        ``#`` comments skipped); ``ValueError`` naming ``where`` and the fix."""
        found: dict[str, bytes] = {}
        for n, raw in enumerate(text.splitlines(), 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            name, sep, token = line.partition(":")
            if not sep:
                name, token = "", line
            name = name.strip()
            token = token.strip()
            if len(token) < MIN_TOKEN:
                raise ValueError(
                    f"{where}, line {n}: a token must have at least {MIN_TOKEN} characters "
                    f"(make one with {_MAKE})"
                )
            name = name or f"operator-{hashlib.sha256(token.encode()).hexdigest()[:8]}"
            if name in found:
                raise ValueError(f"{where}, line {n}: the name {name!r} is given twice")
            found[name] = _digest(token)
        if not found:
            raise ValueError(
                f"{where} holds no token: put one per line, NAME:TOKEN or TOKEN (make one "
                f"with {_MAKE})"
            )
        return cls(found)

    @classmethod
    def from_file(cls, path: str | Path) -> Tokens:
        where = f"--token-file {str(path)!r}"
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ValueError(f"{where}: cannot read it ({exc.strerror or exc})") from None
        return cls.parse(text, where)

    def who(self, token: str | None) -> str | None:
        """The name of the operator holding ``token``, or ``None`` (compared in constant
        time with every token)."""
        if not token:
            return None
        given = _digest(token)
        found = None
        for name, digest in self.by_name.items():
            if hmac.compare_digest(given, digest):
                found = name
        return found


@dataclass(frozen=True, slots=True)
class Session:
    """A login: who, the CSRF token its forms carry, and when it ends."""

    id: str
    who: str
    csrf: str
    until: float


class Sessions:
    """The sessions of this console process (in memory: a restart logs everyone out)."""

    def __init__(self, ttl: float = SESSION_TTL) -> None:
        self._ttl = ttl
        self._open: dict[str, Session] = {}

    def open(self, who: str, now: float | None = None) -> Session:
        now = time.time() if now is None else now
        for sid in [s.id for s in self._open.values() if s.until <= now]:
            del self._open[sid]
        session = Session(
            secrets.token_urlsafe(32), who, secrets.token_urlsafe(32), now + self._ttl
        )
        self._open[session.id] = session
        return session

    def get(self, sid: str | None, now: float | None = None) -> Session | None:
        if not sid:
            return None
        session = self._open.get(sid)
        if session is None:
            return None
        if session.until <= (time.time() if now is None else now):
            del self._open[sid]
            return None
        return session

    def close(self, sid: str | None) -> None:
        if sid:
            self._open.pop(sid, None)


def csrf_ok(session: Session | None, sent: str | None) -> bool:
    """The form's CSRF token is the session's (compared in constant time)."""
    if session is None or not sent:
        return False
    return hmac.compare_digest(session.csrf.encode(), sent.encode())

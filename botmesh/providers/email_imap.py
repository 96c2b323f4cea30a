"""The sent folder of the bot's mailbox, read over IMAP (the stdlib's ``imaplib``, run in a
thread): how ``EmailImapProvider`` (``botmesh.providers.email``) tells whether a send whose
outcome was lost in a crash went out.

Every keyed send carries a ``Message-ID`` derived from its key, so its copy in the sent
folder can be found again: ``UID SEARCH SINCE <day before the attempt> UNDELETED HEADER
Message-ID "<id>"`` in the folder (``Sent`` by default) and in each ``also`` folder, in
order. Three answers:

- a copy without the ``\\Draft`` flag: the mail went out (``"sent"``);
- only copies flagged ``\\Draft``: they were filed by ``append`` mode before the SMTP
  send, which was never confirmed (``"draft"``: cannot tell);
- no copy (``None``): not sent, provided something files every mail the bot sends (below).

Who files the copy decides what "no copy" means:

- ``append=False`` (default): the mail server does it. Gmail, Outlook / Microsoft 365,
  iCloud and Fastmail put what their SMTP submission accepted in Sent, a moment after it;
  many relays and transactional services (Postfix, Amazon SES, SendGrid, Mailgun) do not.
  With a relay that does not, have it BCC every mail to a mailbox and point the URL at that
  mailbox's folder (Postfix ``sender_bcc_maps``, say). A copy may lag the send (a BCC is a
  delivery): ``grace`` (default 30 s) is how long after the attempt a missing copy is
  looked for again before it counts as "not sent".
- ``append=True``: the adapter files it. Before the SMTP send it ``APPEND``s the mail to
  the folder flagged ``\\Draft \\Seen`` (once per Message-ID: a resend reuses the copy),
  and once SMTP accepted the mail it clears ``\\Draft``. A crash between the two leaves a
  draft copy: "cannot tell", so the ``outbox.on_ambiguous`` policy applies; no copy means
  the SMTP send was never started. A copy that the server refused at SMTP is flagged
  ``\\Deleted`` (and expunged where the server has UIDPLUS). Each send then costs two IMAP
  sessions more, and if the server also files its own copy, Sent holds two.

Anything else (the server unreachable, the login refused, a folder missing, a command
refused) raises ``ProviderError`` with what the operator should fix. The password (and its
forms) never reaches a message or a log line. Plain ``imap://`` without STARTTLS is
accepted on the loopback only (a local server, tests): elsewhere the password would travel
in clear.
"""

from __future__ import annotations

import asyncio
import base64
import imaplib
import logging
import re
import ssl as ssl_module
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from datetime import UTC, datetime, timedelta
from typing import Literal, TypeVar
from urllib.parse import parse_qs, quote, unquote, urlsplit

from botmesh.state.durations import parse_duration
from botmesh.state.errors import ConfigError, ProviderError

__all__ = ["Found", "ImapSentFolder", "imap_date"]

log = logging.getLogger("botmesh.providers")

#: What ``ImapSentFolder.lookup`` found: a sent copy, only a draft copy, or nothing (``None``).
Found = Literal["sent", "draft"]
Security = Literal["imaps", "starttls", "plain"]

_LOOPBACK = ("127.0.0.1", "localhost", "::1")
_TRUE = ("1", "true", "yes", "on")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_T = TypeVar("_T")


def _quoted(text: str) -> str:
    """``text`` as an IMAP quoted string."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def imap_date(when: float) -> str:
    """The IMAP date (``5-Dec-2026``) of the UTC day before ``when``: ``SINCE`` compares
    internal dates by day in the server's zone, so a day earlier never misses a copy."""
    day = datetime.fromtimestamp(when, UTC) - timedelta(days=1)
    return f"{day.day}-{_MONTHS[day.month - 1]}-{day.year}"


def _check_server(host: str, security: str) -> None:
    """``ConfigError`` unless ``host`` is given and ``security`` is known and safe for it
    (plain IMAP only on the loopback)."""
    if not host:
        raise ConfigError("email.imap.host", "is empty; give the IMAP server's host name")
    if security not in ("imaps", "starttls", "plain"):
        raise ConfigError(
            "email.imap.security", f"{security!r} is not 'imaps', 'starttls' or 'plain'"
        )
    if security == "plain" and host not in _LOOPBACK:
        raise ConfigError(
            "EMAIL_IMAP_URL",
            f"plain imap:// to {host} would send the password in clear; use imaps:// "
            "(port 993) or imap://…?starttls=1 (plain IMAP is only accepted on 127.0.0.1)",
        )


def _check_login(username: str, password: str) -> None:
    """``ConfigError`` unless both are given and IMAP ``LOGIN`` can carry them."""
    if not username or not password:
        raise ConfigError(
            "EMAIL_IMAP_URL", "needs the mailbox's user and password: imaps://user:pass@host"
        )
    for what, value in (("user", username), ("password", password)):
        if not value.isascii() or any(c in value for c in "\r\n\0"):
            raise ConfigError(
                "EMAIL_IMAP_URL",
                f"the {what} has a non-ASCII or control character, which IMAP LOGIN cannot "
                "carry; use an app password of ASCII characters",
            )


def _check_folders(folders: Iterable[str]) -> None:
    """``ConfigError`` for a folder name that is empty or not ASCII."""
    for name in folders:
        if not name or not name.isascii() or any(c in name for c in "\r\n\0"):
            raise ConfigError(
                "EMAIL_IMAP_URL",
                f"folder {name!r} is empty or not ASCII; give the name the server lists "
                "(a non-ASCII name in its modified UTF-7 form, as `LIST` shows it)",
            )


def _secret_forms(username: str, password: str) -> list[str]:
    """The password as it may appear in a message or a log line (plain, quoted, in an
    AUTHENTICATE exchange), longest first so redaction replaces the longest match."""
    return sorted(
        {
            password,
            base64.b64encode(password.encode()).decode(),
            base64.b64encode(f"\0{username}\0{password}".encode()).decode(),
            _quoted(password),
        },
        key=len,
        reverse=True,
    )


class ImapSentFolder:
    """Where sent mail is looked up (see the module docstring). ``security``: ``"imaps"``
    (TLS from the first byte, port 993), ``"starttls"`` (port 143, upgraded before the
    login) or ``"plain"`` (loopback only). ``folder`` is searched first, then each of
    ``also``. ``tls_context`` replaces the default (system CAs); ``timeout`` is seconds per
    connection and command."""

    def __init__(
        self,
        host: str,
        port: int | None = None,
        *,
        username: str,
        password: str,
        folder: str = "Sent",
        also: Iterable[str] = (),
        security: Security = "imaps",
        append: bool = False,
        grace: float = 30.0,
        timeout: float = 30.0,
        tls_context: ssl_module.SSLContext | None = None,
    ) -> None:
        _check_server(host, security)
        _check_login(username, password)
        folders = (folder, *also)
        _check_folders(folders)
        if timeout <= 0:
            raise ConfigError("email.imap.timeout", f"must be > 0 seconds, got {timeout}")
        if grace < 0:
            raise ConfigError("email.imap.grace", f"must be >= 0 seconds, got {grace}")
        self.host = host
        self.port = port or (993 if security == "imaps" else 143)
        self.username = username
        self._password = password
        self.folders = tuple(dict.fromkeys(folders))
        self.security = security
        self.append = append
        self.grace = grace
        self.timeout = timeout
        self.tls_context = tls_context
        self._secrets = _secret_forms(username, password)

    @property
    def folder(self) -> str:
        """The folder ``append`` files copies in (the first one searched)."""
        return self.folders[0]

    @property
    def secrets(self) -> tuple[str, ...]:
        """The password and its encoded forms, for the adapter's redaction."""
        return tuple(self._secrets)

    def __repr__(self) -> str:
        return (
            f"ImapSentFolder(host={self.host!r}, port={self.port}, username={self.username!r}, "
            f"password=***, folders={self.folders!r}, security={self.security!r}, "
            f"append={self.append})"
        )

    @classmethod
    def from_url(cls, url: str, field: str = "EMAIL_IMAP_URL") -> ImapSentFolder:
        """``imaps://user:pass@host:993/Sent`` (or ``imap://…?starttls=1``; user, password
        and folder percent-encoded; no path: ``Sent``). Query: ``also`` (another folder to
        search, repeatable or comma-separated), ``append=1``, ``grace`` (a duration, ``30s``
        by default), ``timeout`` (``30s``)."""
        parts = urlsplit(url.strip())
        shown = _shown(url.strip())
        if parts.scheme not in ("imap", "imaps"):
            raise ConfigError(field, f"{shown}: the scheme must be imaps:// or imap://")
        try:
            port = parts.port
        except ValueError:
            raise ConfigError(field, f"{shown}: the port is not a number") from None
        if not parts.hostname:
            raise ConfigError(field, f"{shown}: no host")
        query = parse_qs(parts.query)
        known = {"starttls", "also", "append", "grace", "timeout"}
        unknown = sorted(set(query) - known)
        if unknown:
            raise ConfigError(
                field, f"{shown}: unknown option {unknown[0]!r}; known: {', '.join(sorted(known))}"
            )
        last = {k: v[-1] for k, v in query.items()}
        starttls = last.get("starttls", "").lower() in _TRUE
        if parts.scheme == "imaps" and starttls:
            raise ConfigError(field, f"{shown}: imaps:// is TLS already; drop starttls=1")
        security: Security = (
            "imaps" if parts.scheme == "imaps" else "starttls" if starttls else "plain"
        )
        also = [f.strip() for v in query.get("also", []) for f in v.split(",") if f.strip()]
        try:
            return cls(
                parts.hostname,
                port,
                username=unquote(parts.username or ""),
                password=unquote(parts.password or ""),
                folder=unquote(parts.path.lstrip("/")) or "Sent",
                also=also,
                security=security,
                append=last.get("append", "").lower() in _TRUE,
                grace=parse_duration(last.get("grace", "30s"), f"{field} grace"),
                timeout=parse_duration(last.get("timeout", "30s"), f"{field} timeout") or 30.0,
            )
        except ConfigError as exc:
            raise ConfigError(field, f"{shown}: {exc.message}") from None

    # -- the three uses -----------------------------------------------------------------

    async def lookup(self, message_id: str, since: float) -> Found | None:
        """Whether the mail ``message_id`` (first attempted at ``since``, epoch seconds) has
        a copy: ``"sent"``, ``"draft"`` (see the module docstring) or ``None``. Raises
        ``ProviderError`` when it cannot tell."""
        return await self._run(lambda: self._lookup(message_id, since))

    async def file_draft(self, raw: bytes, message_id: str, when: float) -> None:
        """``append`` mode, before the SMTP send: file ``raw`` flagged ``\\Draft \\Seen``
        unless a copy of ``message_id`` is there already. Raises ``ProviderError``."""
        await self._run(lambda: self._file_draft(raw, message_id, when))

    async def settle(self, message_id: str, since: float, *, sent: bool) -> None:
        """``append`` mode, after the SMTP send: clear ``\\Draft`` from the copy (``sent``),
        or flag it ``\\Deleted`` (the server refused the mail). Raises ``ProviderError``."""
        await self._run(lambda: self._settle(message_id, since, sent))

    # -- in the thread ------------------------------------------------------------------

    async def _run(self, work: Callable[[], _T]) -> _T:
        return await asyncio.to_thread(work)

    def _lookup(self, message_id: str, since: float) -> Found | None:
        drafts = False
        with self._session() as imap:
            for folder in self.folders:
                self._select(imap, folder, readonly=True)
                if not self._search(imap, message_id, since):
                    continue
                if self._search(imap, message_id, since, "UNDRAFT"):
                    log.debug("email: %s has a sent copy in %s", message_id, folder)
                    return "sent"
                drafts = True
        return "draft" if drafts else None

    def _file_draft(self, raw: bytes, message_id: str, when: float) -> None:
        with self._session() as imap:
            self._select(imap, self.folder, readonly=True)
            if self._search(imap, message_id, when):
                log.debug("email: %s already has a copy in %s", message_id, self.folder)
                return
            typ, data = imap.append(
                _quoted(self.folder), r"(\Draft \Seen)", imaplib.Time2Internaldate(when), raw
            )
            if typ != "OK":
                raise self._refused("APPEND", self.folder, data)
            log.debug("email: filed a draft copy of %s in %s", message_id, self.folder)

    def _settle(self, message_id: str, since: float, sent: bool) -> None:
        with self._session() as imap:
            self._select(imap, self.folder, readonly=False)
            uids = self._search(imap, message_id, since, "DRAFT")
            if not uids:
                return
            uid_set = ",".join(uids)
            change = ("-FLAGS.SILENT", r"(\Draft)") if sent else ("+FLAGS.SILENT", r"(\Deleted)")
            typ, data = imap.uid("STORE", uid_set, *change)
            if typ != "OK":
                raise self._refused("STORE", self.folder, data)
            if not sent and "UIDPLUS" in imap.capabilities:
                imap.uid("EXPUNGE", uid_set)

    # -- IMAP ---------------------------------------------------------------------------

    @contextmanager
    def _session(self) -> Iterator[imaplib.IMAP4]:
        """A logged-in connection, logged out after use; every failure a ``ProviderError``."""
        where = f"email: IMAP {self.host}:{self.port}"
        context = self.tls_context or ssl_module.create_default_context()
        imap: imaplib.IMAP4 | None = None
        try:
            if self.security == "imaps":
                imap = imaplib.IMAP4_SSL(
                    self.host, self.port, ssl_context=context, timeout=self.timeout
                )
            else:
                imap = imaplib.IMAP4(self.host, self.port, timeout=self.timeout)
            if self.security == "starttls":
                imap.starttls(context)
            try:
                imap.login(_quoted(self.username), self._password)
            except imaplib.IMAP4.abort:
                raise
            except imaplib.IMAP4.error as exc:
                raise ProviderError(
                    self.redact(
                        f"{where}: the login of {self.username!r} was refused ({exc}); check the "
                        "user and password in EMAIL_IMAP_URL"
                    )
                ) from None
            yield imap
        except ProviderError:
            raise
        except ssl_module.SSLCertVerificationError as exc:
            raise ProviderError(
                f"{where}: the server's TLS certificate was refused: {exc.verify_message}"
            ) from None
        except (imaplib.IMAP4.error, OSError) as exc:
            raise ProviderError(
                self.redact(
                    f"{where}: {type(exc).__name__}: {exc}; check that the server is up and "
                    "answers IMAP at the host and port of EMAIL_IMAP_URL"
                )
            ) from None
        finally:
            if imap is not None:
                with suppress(imaplib.IMAP4.error, OSError):
                    imap.logout()

    def _select(self, imap: imaplib.IMAP4, folder: str, *, readonly: bool) -> None:
        typ, data = imap.select(_quoted(folder), readonly=readonly)
        if typ == "OK":
            return
        sent = self._sent_folders(imap)
        hint = (
            f"the server marks {', '.join(repr(f) for f in sent)} as sent mail"
            if sent
            else "check the folder's name in your mail client"
        )
        raise ProviderError(
            self.redact(
                f"email: IMAP {self.host}: cannot open folder {folder!r} "
                f"({_text(data)}); {hint}: put it in EMAIL_IMAP_URL's path"
            )
        )

    def _sent_folders(self, imap: imaplib.IMAP4) -> list[str]:
        """The folders the server marks ``\\Sent`` (RFC 6154), for the error's hint."""
        try:
            typ, data = imap.list()
        except (imaplib.IMAP4.error, OSError):
            return []
        found: list[str] = []
        for line in data if typ == "OK" else []:
            text = line.decode("utf-8", "replace") if isinstance(line, bytes) else ""
            match = re.match(r'\(([^)]*)\)\s+(?:"[^"]*"|NIL)\s+(.+)$', text)
            if match and "\\sent" in match.group(1).lower().split():
                found.append(match.group(2).strip().strip('"'))
        return found

    def _search(self, imap: imaplib.IMAP4, message_id: str, since: float, *flags: str) -> list[str]:
        typ, data = imap.uid(
            "SEARCH",
            "SINCE",
            imap_date(since),
            "UNDELETED",
            *flags,
            "HEADER",
            "Message-ID",
            _quoted(message_id),
        )
        if typ != "OK":
            raise self._refused("SEARCH", self.folder, data)
        return [uid for chunk in data if chunk for uid in chunk.decode().split()]

    def _refused(self, command: str, folder: str, data: Sequence[object]) -> ProviderError:
        return ProviderError(
            self.redact(f"email: IMAP {self.host}: {command} in {folder!r} refused: {_text(data)}")
        )

    def redact(self, text: str) -> str:
        """``text`` with the password (as is, percent-encoded, quoted, base64) as ``***``."""
        for s in self._secrets:
            for form in dict.fromkeys((s, quote(s, safe=""))):
                text = text.replace(form, "***")
        return text


def _text(data: Sequence[object]) -> str:
    parts = [d.decode("utf-8", "replace") if isinstance(d, bytes) else str(d) for d in data]
    return " ".join(p for p in parts if p and p != "None") or "no reason given"


def _shown(url: str) -> str:
    """``url`` with its password replaced by ``***``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rsplit("@", 1)[-1]
    return parts._replace(netloc=f"{parts.username or ''}:***@{host}").geturl()

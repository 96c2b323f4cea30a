"""Email: ``EmailProvider`` sends over SMTP (the stdlib's ``smtplib``, run in a thread), and
``EmailWebhook`` takes inbound mail that a relay forwards as a signed raw message.

Sending. ``chat_id`` is the recipient's address. ``send_keyed(message, key)`` gives the mail
a ``Message-ID`` derived from the key (``<sha256(key)[:32 hex]@domain>``): a resend after a
crash carries the same Message-ID, so mail clients, the recipient's server and our own
inbound dedupe can recognise the copy (SMTP itself has no idempotency). ``options``:
``subject`` (else the provider's ``subject``), ``reply_to`` (a Message-ID, with or without
``<>``: it sets ``In-Reply-To`` and ends ``References``; pass the inbound's ``id`` to thread
a reply) and ``references`` (earlier Message-IDs, a list or a string). The text goes as
``text/plain``. Media: inline bytes (``data``) or a file (``path``) become an attachment
with the media's ``name`` and ``mime`` (guessed from the name when absent); a media
``url`` is not fetched (the adapter never downloads on the sender's behalf): the URL is
appended to the body on its own line. A media ``id`` is refused (UnsupportedContentError).
The ``SendResult`` is the Message-ID (with its ``<>``).

One connection per send (connect, optional STARTTLS, optional AUTH, MAIL, RCPT, DATA,
QUIT); a failure after DATA was accepted (the QUIT) is ignored, since the mail is queued.

Errors:

==========================================  ================================================
connection refused / reset / timeout,       retryable ``SendError``
server disconnected, any 4xx (421, 450,
451, 452 among them)
552, or the enhanced status 5.3.4 or 5.2.3  ``PayloadTooLargeError``
550, 551, 553 for the recipient             ``RecipientUnreachableError`` (a 5.7.x policy
                                            refusal of the content stays a final
                                            ``SendError``)
550 / 553 for the sender (MAIL FROM)        final ``SendError``: check ``EMAIL_FROM``
535 (AUTH refused)                          final ``SendError``: the credentials are wrong
530 (AUTH required), missing STARTTLS or    final ``SendError`` naming the setting to fix
AUTH support, a TLS certificate refused
any other 5xx                               final ``SendError``
==========================================  ================================================

The password (and its base64 forms, as AUTH PLAIN and LOGIN send it) is redacted from
every message and log line.

Lost outcomes. SMTP cannot be asked whether a message went through (there is no listing of
what a relay accepted), so ``EmailProvider`` has no ``resolve_ambiguous``: a lost outcome
falls to the ``outbox.on_ambiguous`` policy; with ``"resend"`` the copy carries the same
Message-ID. ``EmailImapProvider`` (what ``from_env`` builds when ``EMAIL_IMAP_URL`` is set)
asks the mailbox instead: it looks the send's Message-ID up in the sent folder over IMAP
(``botmesh.providers.email_imap``): a sent copy → the send is recorded ``sent`` and not
made again; no copy → ``None`` (the engine sends it once); the server unreachable, the login
refused, the folder missing or only a draft copy → it raises and the policy applies. "No
copy" means "not sent" only when every mail the bot sends is filed there: by the server
(Gmail, Microsoft 365, iCloud, Fastmail do), by a BCC the relay adds, or by the adapter
itself (``append=1``: a draft copy before the SMTP send, marked sent after it).

Inbound mail: no IMAP poller is built.
A relay (Postfix with a pipe script, a mail service's inbound webhook) posts the raw RFC 5322
message (``content-type: message/rfc822``) with ``x-botmesh-signature: sha256=<hex
HMAC-SHA256(secret, body)>``; ``EmailWebhook`` checks it and parses the message.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import email.policy
import email.utils
import hashlib
import logging
import mimetypes
import re
import smtplib
import ssl as ssl_module
import time
from collections.abc import Mapping
from email.message import EmailMessage
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from botmesh.providers.base import ChannelProvider
from botmesh.providers.email_imap import ImapSentFolder
from botmesh.providers.webhooks import (
    BadSignature,
    MalformedWebhook,
    SignedWebhook,
    WebhookReply,
    WebhookRequest,
    hmac_hex,
    same,
)
from botmesh.state.errors import (
    ConfigError,
    PayloadTooLargeError,
    ProviderError,
    RecipientUnreachableError,
    SendError,
    UnsupportedContentError,
)
from botmesh.state.messages import Inbound, Media, Outbound, SendResult

__all__ = ["EmailImapProvider", "EmailProvider", "EmailWebhook", "ImapSentFolder", "message_id_for"]

log = logging.getLogger("botmesh.providers")

_ENHANCED = re.compile(r"\b([245])\.(\d{1,3})\.(\d{1,3})\b")
_TRUE = ("1", "true", "yes", "on")


def message_id_for(key: str, domain: str) -> str:
    """The Message-ID of the send ``key``: ``<`` 32 hex digits of sha256(key) ``@domain>``."""
    return f"<{hashlib.sha256(key.encode()).hexdigest()[:32]}@{domain}>"


def _angle(message_id: str) -> str:
    mid = message_id.strip()
    return mid if mid.startswith("<") else f"<{mid}>"


def _address(value: str) -> str | None:
    """The bare address in ``value``, or ``None`` when it is not one."""
    if "\r" in value or "\n" in value:
        return None
    addr = email.utils.parseaddr(value)[1]
    return addr if "@" in addr and not addr.startswith("@") and not addr.endswith("@") else None


class EmailProvider(ChannelProvider):
    """SMTP out. ``starttls`` upgrades a plain connection (port 587); ``ssl`` speaks TLS
    from the start (port 465); ``tls_context`` replaces the default (system CAs).
    ``domain`` (default: the sender's) ends every Message-ID. ``timeout`` is seconds per
    SMTP command."""

    name = "email"
    media_channel = "email"
    text_limit: int | None = None

    def __init__(
        self,
        host: str,
        port: int,
        from_addr: str,
        *,
        username: str | None = None,
        password: str | None = None,
        starttls: bool = False,
        ssl: bool = False,
        domain: str | None = None,
        subject: str = "Message",
        timeout: float = 30.0,
        tls_context: ssl_module.SSLContext | None = None,
    ) -> None:
        if not host:
            raise ConfigError("email.host", "is empty; give the SMTP server's host name")
        if starttls and ssl:
            raise ConfigError(
                "email.starttls", "starttls and ssl exclude each other: 587 uses starttls, 465 ssl"
            )
        sender = _address(from_addr)
        if sender is None:
            raise ConfigError("email.from_addr", f"{from_addr!r} is not an email address")
        if password and username is None:
            raise ConfigError("email.username", "a password was given without a user name")
        secrets: list[str] = []
        if password:
            secrets += [
                password,
                base64.b64encode(password.encode()).decode(),
                base64.b64encode(f"\0{username}\0{password}".encode()).decode(),
            ]
        super().__init__(timeout=timeout, secrets=secrets)
        self.host = host
        self.port = port
        self.from_addr = from_addr
        self.envelope_from = sender
        self.username = username
        self._password = password
        self.starttls = starttls
        self.ssl = ssl
        self.domain = domain or sender.rsplit("@", 1)[1]
        self.subject = subject
        self.tls_context = tls_context

    def __repr__(self) -> str:
        return (
            f"EmailProvider(host={self.host!r}, port={self.port}, from_addr={self.from_addr!r}, "
            f"username={self.username!r}, password={'***' if self._password else None})"
        )

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> EmailProvider:
        """``EMAIL_SMTP_URL`` (``smtp://user:pass@host:587?starttls=1``, or ``smtps://`` for
        TLS from the start; user and password percent-encoded) and ``EMAIL_FROM``; optional
        ``EMAIL_DOMAIN`` (of the Message-IDs) and ``EMAIL_SUBJECT``. The SMTP URL plays the
        part other channels' ``<CHANNEL>_API_URL`` plays (tests point it at a local server).
        With ``EMAIL_IMAP_URL`` (``imaps://user:pass@host:993/Sent``, see
        ``ImapSentFolder.from_url``) it is an ``EmailImapProvider``, which resolves
        ambiguous sends from the sent folder."""
        raw = env.get("EMAIL_SMTP_URL", "").strip()
        if not raw:
            raise ConfigError(
                "EMAIL_SMTP_URL",
                "is not set; set it to smtp://user:password@host:587?starttls=1 (or smtps://…:465)",
            )
        parts = urlsplit(raw)
        shown = _shown(raw)
        if parts.scheme not in ("smtp", "smtps"):
            raise ConfigError("EMAIL_SMTP_URL", f"{shown}: the scheme must be smtp:// or smtps://")
        try:
            port = parts.port
        except ValueError:
            raise ConfigError("EMAIL_SMTP_URL", f"{shown}: the port is not a number") from None
        if not parts.hostname:
            raise ConfigError("EMAIL_SMTP_URL", f"{shown}: no host")
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        starttls = query.get("starttls", "").lower() in _TRUE
        ssl = parts.scheme == "smtps"
        sender = env.get("EMAIL_FROM", "").strip()
        if not sender:
            raise ConfigError("EMAIL_FROM", "is not set; set it to the sender, bot@example.com")
        imap_url = env.get("EMAIL_IMAP_URL", "").strip()
        sent_folder = ImapSentFolder.from_url(imap_url) if imap_url else None
        host, port = parts.hostname, port or (465 if ssl else 587 if starttls else 25)
        options: dict[str, Any] = {
            "username": unquote(parts.username) if parts.username else None,
            "password": unquote(parts.password) if parts.password else None,
            "starttls": starttls,
            "ssl": ssl,
            "domain": env.get("EMAIL_DOMAIN", "").strip() or None,
            "subject": env.get("EMAIL_SUBJECT", "").strip() or "Message",
        }
        try:
            if sent_folder is not None:
                return EmailImapProvider(host, port, sender, sent_folder=sent_folder, **options)
            return cls(host, port, sender, **options)
        except ConfigError as exc:
            field = {"email.from_addr": "EMAIL_FROM"}.get(exc.field, "EMAIL_SMTP_URL")
            raise ConfigError(field, exc.message) from None

    # -- building ------------------------------------------------------------------------

    async def build(self, message: Outbound, message_id: str) -> EmailMessage:
        """The mail for ``message`` (public for tests and previews)."""
        rcpt = _address(message.chat_id)
        if rcpt is None:
            raise RecipientUnreachableError(
                f"email: chat id {message.chat_id!r} is not an email address"
            )
        opts = message.options
        mail = EmailMessage(policy=email.policy.SMTP)
        try:
            mail["From"] = self.from_addr
            mail["To"] = message.chat_id
            mail["Subject"] = str(opts.get("subject") or self.subject)
            mail["Date"] = email.utils.formatdate(usegmt=True)
            mail["Message-ID"] = message_id
            reply_to = opts.get("reply_to")
            refs = opts.get("references") or []
            refs = [refs] if isinstance(refs, str) else [str(r) for r in refs]
            if reply_to:
                mail["In-Reply-To"] = _angle(str(reply_to))
                refs.append(str(reply_to))
            if refs:
                mail["References"] = " ".join(_angle(r) for r in refs)
        except ValueError as exc:  # a header value with a line break, say
            raise UnsupportedContentError(f"email: bad header value: {exc}") from None
        body = message.text or ""
        media = message.media
        attached = media is not None and (media.data is not None or media.path is not None)
        if media is not None and not attached and media.url is not None:
            body = f"{body}\n\n{media.url}" if body else media.url
        mail.set_content(body)
        if media is not None and attached:
            await self._attach(mail, media)
        elif media is not None and media.url is None:
            raise UnsupportedContentError(
                "email: media needs bytes, a file path or a URL; a channel media id cannot be "
                "attached"
            )
        return mail

    async def _attach(self, mail: EmailMessage, media: Media) -> None:
        data = media.data
        name = media.name
        if data is None and media.path is not None:
            path = Path(media.path)
            try:
                data = await asyncio.to_thread(path.read_bytes)
            except OSError as exc:
                raise UnsupportedContentError(
                    f"email: cannot read the attachment {media.path!r}: {exc.strerror}"
                ) from None
            name = name or path.name
        assert data is not None
        mime = media.mime or (mimetypes.guess_type(name)[0] if name else None)
        maintype, _, subtype = (mime or "application/octet-stream").partition("/")
        if not subtype:
            maintype, subtype = "application", "octet-stream"
        if not name:
            name = "attachment" + (mimetypes.guess_extension(f"{maintype}/{subtype}") or "")
        mail.add_attachment(data, maintype=maintype, subtype=subtype, filename=name)

    # -- sending -------------------------------------------------------------------------

    async def send(self, message: Outbound) -> SendResult:
        """As ``send_keyed`` with a fresh Message-ID (a resend is not recognisable)."""
        return await self._send(message, email.utils.make_msgid(domain=self.domain))

    async def send_keyed(self, message: Outbound, key: str) -> SendResult:
        return await self._send(message, message_id_for(key, self.domain))

    async def _send(self, message: Outbound, message_id: str) -> SendResult:
        mail = await self.build(message, message_id)
        rcpt = _address(message.chat_id) or message.chat_id
        try:
            await asyncio.to_thread(self._deliver, mail, rcpt)
        except (smtplib.SMTPException, OSError) as exc:
            raise self._failed(exc, rcpt, message_id) from None
        log.debug("email: sent %s to %s", message_id, rcpt)
        return SendResult(message_id)

    def _failed(self, exc: BaseException, rcpt: str, message_id: str) -> SendError:
        """The ``SendError`` of a failed SMTP session (logged)."""
        error = self._error(exc, rcpt)
        log.debug("email: send %s to %s failed: %s", message_id, rcpt, error)
        return error

    def _deliver(self, mail: EmailMessage, rcpt: str) -> None:
        context = self.tls_context or ssl_module.create_default_context()
        smtp: smtplib.SMTP
        if self.ssl:
            smtp = smtplib.SMTP_SSL(self.host, self.port, timeout=self.timeout, context=context)
        else:
            smtp = smtplib.SMTP(self.host, self.port, timeout=self.timeout)
        try:
            if self.starttls:
                smtp.starttls(context=context)
            if self.username is not None:
                smtp.login(self.username, self._password or "")
            smtp.send_message(mail, from_addr=self.envelope_from, to_addrs=[rcpt])
            # The mail was accepted; a failed goodbye changes nothing.
            with contextlib.suppress(smtplib.SMTPException, OSError):
                smtp.quit()
        finally:
            smtp.close()

    def _error(self, exc: BaseException, rcpt: str) -> SendError:
        where = f"email: {self.host}:{self.port}"
        if isinstance(exc, smtplib.SMTPRecipientsRefused):
            code, text = next(iter(exc.recipients.values()), (-1, b""))
            return self._by_code(code, text, "RCPT", rcpt)
        if isinstance(exc, smtplib.SMTPAuthenticationError):
            said = _text_of(exc.smtp_error)
            return SendError(
                self.redact(
                    f"{where}: the credentials are wrong (SMTP {exc.smtp_code} {said} for user "
                    f"{self.username!r}); check the user and password in EMAIL_SMTP_URL"
                ),
                retryable=False,
            )
        if isinstance(exc, smtplib.SMTPSenderRefused):
            return self._by_code(exc.smtp_code, exc.smtp_error, "MAIL", rcpt)
        if isinstance(exc, smtplib.SMTPDataError):
            return self._by_code(exc.smtp_code, exc.smtp_error, "DATA", rcpt)
        if isinstance(exc, smtplib.SMTPResponseException):
            return self._by_code(exc.smtp_code, exc.smtp_error, "SMTP", rcpt)
        if isinstance(exc, smtplib.SMTPNotSupportedError) or (
            isinstance(exc, smtplib.SMTPException) and "authentication method" in str(exc)
        ):
            return SendError(
                self.redact(
                    f"{where}: {exc}; the server lacks that extension: check starttls / smtps "
                    "and the user in EMAIL_SMTP_URL"
                ),
                retryable=False,
            )
        if isinstance(exc, ssl_module.SSLCertVerificationError):
            return SendError(
                f"{where}: the server's TLS certificate was refused: {exc.verify_message}",
                retryable=False,
            )
        return SendError(
            self.redact(f"{where}: {type(exc).__name__}: {exc} (retried)"), retryable=True
        )

    def _by_code(self, code: int, raw: bytes | str, stage: str, rcpt: str) -> SendError:
        text = _text_of(raw)
        what = self.redact(f"email: SMTP {code} at {stage} for {rcpt}: {text}")
        enhanced = _ENHANCED.search(text)
        status = enhanced.group(0) if enhanced else ""
        if code == 552 or status in ("5.3.4", "5.2.3"):
            return PayloadTooLargeError(f"{what} (the message is too large)")
        if 400 <= code < 500 or code < 0:
            return SendError(what, retryable=True)
        if code == 530:
            return SendError(
                f"{what} (the server requires authentication: put user:password in EMAIL_SMTP_URL)",
                retryable=False,
            )
        if code == 535:
            return SendError(f"{what} (the credentials are wrong)", retryable=False)
        if code in (550, 551, 553) and stage == "MAIL":
            return SendError(
                f"{what} (the sender {self.envelope_from} is refused; check EMAIL_FROM)",
                retryable=False,
            )
        if code in (550, 551, 553) and not status.startswith("5.7."):
            return RecipientUnreachableError(f"{what} (no such mailbox)")
        return SendError(what, retryable=False)


class EmailImapProvider(EmailProvider):
    """``EmailProvider`` that can tell whether a send lost in a crash went out
    (``botmesh.state.ports.AmbiguityResolver``): it looks the send's Message-ID up in the
    mailbox's sent folder over IMAP (``sent_folder``, ``botmesh.providers.email_imap``).
    With ``sent_folder.append`` it files every mail there itself, as a draft before the SMTP
    send and as sent after it. Other keywords are ``EmailProvider``'s."""

    def __init__(
        self, host: str, port: int, from_addr: str, *, sent_folder: ImapSentFolder, **kwargs: Any
    ) -> None:
        super().__init__(host, port, from_addr, **kwargs)
        self.sent_folder = sent_folder
        # HttpChannel.redact covers the IMAP password too (the SMTP one is there already).
        self._secrets = sorted({*self._secrets, *sent_folder.secrets}, key=len, reverse=True)

    def __repr__(self) -> str:
        return f"{super().__repr__()[:-1]}, sent_folder={self.sent_folder!r})".replace(
            "EmailProvider(", "EmailImapProvider(", 1
        )

    async def resolve_ambiguous(
        self, message: Outbound, key: str, since: float
    ) -> SendResult | None:
        """The send ``key``'s result when its Message-ID has a sent copy; ``None`` when no
        folder has one (looked for again ``grace`` after ``since`` when the server files the
        copies); raises ``ProviderError`` when it cannot tell: IMAP down, login refused,
        folder missing, or only a draft copy (``append`` mode, the process stopped between
        filing it and the SMTP send's answer)."""
        del message
        mid = message_id_for(key, self.domain)
        folder = self.sent_folder
        found = await folder.lookup(mid, since)
        wait = since + folder.grace - time.time()
        if found is None and not folder.append and wait > 0:
            log.info(
                "email: no copy of %s in the sent folder yet; looking again in %.1f s", mid, wait
            )
            await asyncio.sleep(wait)
            found = await folder.lookup(mid, since)
        if found == "sent":
            return SendResult(mid)
        if found == "draft":
            raise ProviderError(
                f"email: cannot tell whether {mid} went out: its copy in {folder.folder!r} is "
                "still a draft (filed before the SMTP send, whose answer was never recorded); "
                "the outbox.on_ambiguous policy applies"
            )
        log.info("email: %s has no copy in %s: it was not sent", mid, ", ".join(folder.folders))
        return None

    async def _send(self, message: Outbound, message_id: str) -> SendResult:
        folder = self.sent_folder
        if not folder.append:
            return await super()._send(message, message_id)
        mail = await self.build(message, message_id)
        rcpt = _address(message.chat_id) or message.chat_id
        when = time.time()
        try:
            await folder.file_draft(mail.as_bytes(), message_id, when)
        except ProviderError as exc:
            raise SendError(
                self.redact(f"{exc} (filing the copy before sending; nothing was sent; retried)"),
                retryable=True,
            ) from None
        try:
            await asyncio.to_thread(self._deliver, mail, rcpt)
        except (smtplib.SMTPException, OSError) as exc:
            error = self._failed(exc, rcpt, message_id)
            if isinstance(exc, smtplib.SMTPResponseException | smtplib.SMTPRecipientsRefused):
                # The server said no: the mail is not queued, so its copy goes.
                await self._settle(message_id, when, sent=False)
            raise error from None
        log.debug("email: sent %s to %s", message_id, rcpt)
        await self._settle(message_id, when, sent=True)
        return SendResult(message_id)

    async def _settle(self, message_id: str, when: float, *, sent: bool) -> None:
        """Mark the copy sent (or deleted); a failure is logged, never raised: the SMTP
        outcome is known, and a copy left as a draft only makes a later lookup "cannot
        tell"."""
        try:
            await self.sent_folder.settle(message_id, when, sent=sent)
        except ProviderError as exc:
            log.warning(
                "email: %s: could not mark its copy %s: %s",
                message_id,
                "sent" if sent else "deleted",
                self.redact(str(exc)),
            )


def _text_of(raw: bytes | str) -> str:
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)


def _shown(url: str) -> str:
    """``url`` with its password replaced by ``***``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rsplit("@", 1)[-1]
    return parts._replace(netloc=f"{user}:***@{host}").geturl()


# -- inbound -------------------------------------------------------------------------------


class _Text(HTMLParser):
    """Visible text of an HTML body (script and style dropped, blocks on their own lines)."""

    BLOCKS = frozenset({"br", "p", "div", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.out: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("script", "style"):
            self._skip += 1
        elif tag in self.BLOCKS:
            self.out.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("script", "style") and self._skip:
            self._skip -= 1
        elif tag in self.BLOCKS:
            self.out.append("\n")

    def handle_data(self, data: str) -> None:
        if not self._skip:
            self.out.append(data)


def html_to_text(html: str) -> str:
    parser = _Text()
    parser.feed(html)
    parser.close()
    lines = (" ".join(line.split()) for line in "".join(parser.out).splitlines())
    return "\n".join(line for line in lines if line)


class EmailWebhook(SignedWebhook):
    """Inbound mail posted by a relay (see the module docstring).

    ``parse`` gives one ``Inbound``: ``id`` = the Message-ID without ``<>`` (a relay that
    posts the same mail twice gives the same id), ``chat_id`` = ``sender`` = the From
    address in lower case, ``text`` = the ``text/plain`` body (else the ``text/html`` body
    as plain text), ``ts`` = the ``Date`` header (else the arrival time). The first
    attachment is ``media``: ``Media(provider="email", name, mime, data=<bytes>,
    extra={"message_id", "index": 0, "sha256"})``: the bytes travel in the live record, the
    journal keeps the reference. Further attachments are listed, without their bytes, in
    ``data["more_attachments"]`` (``index``, ``name``, ``mime``, ``size``, ``sha256``).
    ``data`` also has ``subject``, ``to``, ``from_name``, ``in_reply_to``, ``references``.
    Automatic mail (``Auto-Submitted`` other than ``no``: bounces, vacation replies) gives
    no record, so a bot never answers a robot in a loop.
    """

    channel = "email"
    SECRET_ENV = "EMAIL_WEBHOOK_SECRET"
    SECRET_HINT = "set it to the secret the mail relay signs its posts with"

    def verify(self, request: WebhookRequest) -> None:
        given = request.headers.get("x-botmesh-signature", "")
        if not given.startswith("sha256="):
            raise BadSignature("email: no x-botmesh-signature: sha256=<hex> header")
        if not same(given.removeprefix("sha256=").lower(), hmac_hex(self._secret, request.body)):
            raise BadSignature(
                "email: x-botmesh-signature does not match the body; check EMAIL_WEBHOOK_SECRET "
                "and that the relay signs the raw message"
            )

    def parse(self, request: WebhookRequest) -> list[Inbound]:
        mail = email.message_from_bytes(request.body, policy=email.policy.default)
        assert isinstance(mail, EmailMessage)
        mid = str(mail.get("Message-ID") or "").strip().strip("<>").strip()
        if not mid:
            raise MalformedWebhook("email: the message has no Message-ID")
        name, addr = email.utils.parseaddr(str(mail.get("From") or ""))
        if "@" not in addr:
            raise MalformedWebhook(f"email: message {mid} has no From address")
        if str(mail.get("Auto-Submitted") or "no").strip().lower() != "no":
            return []
        data: dict[str, Any] = {
            "subject": str(mail.get("Subject") or ""),
            "to": [
                a for _, a in email.utils.getaddresses([str(v) for v in mail.get_all("To", [])])
            ],
        }
        if name:
            data["from_name"] = name
        for header, key in (("In-Reply-To", "in_reply_to"), ("References", "references")):
            if mail.get(header):
                data[key] = str(mail[header])
        media, more = _attachments(mail, mid)
        if more:
            data["more_attachments"] = more
        return [
            Inbound(
                id=mid,
                chat_id=addr.lower(),
                channel=self.channel,
                sender=addr.lower(),
                ts=_date(mail) or self._clock(),
                text=_text(mail),
                media=media,
                data=data,
            )
        ]

    def reply(self, request: WebhookRequest, produced: list[Inbound]) -> WebhookReply:
        return WebhookReply(200, b"", "text/plain")


def _date(mail: EmailMessage) -> float | None:
    try:
        when = email.utils.parsedate_to_datetime(str(mail.get("Date") or ""))
    except (TypeError, ValueError):
        return None
    return when.timestamp()


def _text(mail: EmailMessage) -> str | None:
    part = mail.get_body(preferencelist=("plain", "html"))
    if part is None:
        return None
    content = part.get_content()
    if not isinstance(content, str):
        return None
    content = content.replace("\r\n", "\n")
    text = html_to_text(content) if part.get_content_subtype() == "html" else content
    return text.strip() or None


def _attachments(mail: EmailMessage, mid: str) -> tuple[Media | None, list[dict[str, Any]]]:
    first: Media | None = None
    more: list[dict[str, Any]] = []
    for index, part in enumerate(mail.iter_attachments()):
        payload = part.get_payload(decode=True)
        data = payload if isinstance(payload, bytes) else b""
        digest = hashlib.sha256(data).hexdigest()
        name = part.get_filename()
        mime = part.get_content_type()
        if first is None:
            first = Media(
                provider="email",
                name=name,
                mime=mime,
                data=data,
                extra={"message_id": mid, "index": index, "sha256": digest},
            )
        else:
            more.append(
                {"index": index, "name": name, "mime": mime, "size": len(data), "sha256": digest}
            )
    return first, more

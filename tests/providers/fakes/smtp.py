"""A local SMTP server (aiosmtpd) for the email adapter's tests.

It listens on 127.0.0.1 on an ephemeral port, in its own thread, and records every message
it accepted (``messages``). It behaves like a relay:

- AUTH PLAIN / LOGIN (offered without TLS, since it is local) checks ``username`` /
  ``password`` when they are set: a wrong pair gets ``535 5.7.8``, and MAIL without AUTH
  gets ``530 5.7.0 Authentication required``; ``echo_auth`` makes the 535 repeat the
  credentials it got (as a careless server might), to test redaction;
- ``script(rcpt, reply)`` answers RCPT TO for that address with ``reply`` (``550 5.1.1 no
  such user``, ``421 4.3.2 busy``, ``451 4.3.0``, ``452 4.2.2``…); ``script(rcpt, reply,
  at="DATA")`` answers the DATA of a message to it (``552 5.3.4 Message too big``);
- ``data_size_limit`` refuses larger messages with aiosmtpd's own ``552 Error: Too much
  mail data`` (and advertises ``SIZE``).

- ``on_message`` is called with each accepted message (``Received``): a test files it in
  a fake IMAP folder there, as Gmail or Microsoft 365 put what their submission accepted
  in Sent;

- ``tls="starttls"`` offers (and requires) STARTTLS, ``tls="implicit"`` speaks TLS from the
  first byte (as port 465 does), both with ``tls_context``; ``self_signed(dir)`` makes a
  certificate for 127.0.0.1 and the contexts of both ends.

Use it as a context manager: ``with FakeSmtp(...) as smtp: smtp.port``.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import email
import email.policy
import ipaddress
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from email.message import EmailMessage
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, AuthResult, Envelope, LoginPassword, Session
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

PRESETS = {
    "no-such-user": "550 5.1.1 <{rcpt}>: Recipient address rejected: User unknown",
    "too-big": "552 5.3.4 Message too big for system",
    "busy": "421 4.3.2 Service not available, closing transmission channel",
    "try-later": "451 4.3.0 Temporary local problem, please try later",
    "full": "452 4.2.2 Mailbox full",
}


@dataclass(frozen=True)
class Received:
    """One accepted message."""

    mail_from: str
    rcpt_tos: tuple[str, ...]
    content: bytes
    login: str | None
    #: The connection was encrypted (STARTTLS or implicit TLS).
    tls: bool = False

    @property
    def message(self) -> EmailMessage:
        parsed = email.message_from_bytes(self.content, policy=email.policy.default)
        assert isinstance(parsed, EmailMessage)
        return parsed


class _Ephemeral(Controller):
    """aiosmtpd's Controller on port 0: the real port is read once the server listens."""

    def _trigger_server(self) -> None:
        assert isinstance(self.server, asyncio.Server)
        self.port = int(self.server.sockets[0].getsockname()[1])
        super()._trigger_server()  # type: ignore[no-untyped-call]


class FakeSmtp:
    def __init__(
        self,
        *,
        username: str | None = None,
        password: str | None = None,
        data_size_limit: int = 32 * 1024 * 1024,
        tls: Literal["starttls", "implicit"] | None = None,
        tls_context: ssl.SSLContext | None = None,
        echo_auth: bool = False,
        on_message: Callable[[Received], None] | None = None,
    ) -> None:
        self.username = username
        self.on_message = on_message
        self.echo_auth = echo_auth
        self.password = password
        self.messages: list[Received] = []
        self.auth_failures = 0
        self._rcpt: dict[str, str] = {}
        self._data: dict[str, str] = {}
        if tls is not None and tls_context is None:
            raise ValueError("tls needs a tls_context (see self_signed)")
        kwargs: dict[str, Any] = {}
        if tls == "starttls":
            kwargs.update(tls_context=tls_context, require_starttls=True)
        elif tls == "implicit":
            kwargs.update(ssl_context=tls_context)
        self._controller = _Ephemeral(
            self,
            hostname="127.0.0.1",
            port=0,
            authenticator=self._authenticate,
            auth_require_tls=False,
            data_size_limit=data_size_limit,
            **kwargs,
        )

    # -- scripting ------------------------------------------------------------------------

    def script(self, rcpt: str, reply: str, *, at: Literal["RCPT", "DATA"] = "RCPT") -> None:
        """Answer ``rcpt`` with ``reply`` (an SMTP line, or a name in ``PRESETS``)."""
        line = PRESETS.get(reply, reply).format(rcpt=rcpt)
        (self._rcpt if at == "RCPT" else self._data)[rcpt.lower()] = line

    # -- lifecycle ------------------------------------------------------------------------

    @property
    def port(self) -> int:
        return int(self._controller.port)

    def __enter__(self) -> FakeSmtp:
        self._controller.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._controller.stop()

    # -- aiosmtpd hooks -------------------------------------------------------------------

    def _authenticate(
        self, server: SMTP, session: Session, envelope: Envelope, mechanism: str, data: Any
    ) -> AuthResult:
        ok = (
            isinstance(data, LoginPassword)
            and self.username is not None
            and data.login.decode() == self.username
            and data.password.decode() == (self.password or "")
        )
        if not ok:
            self.auth_failures += 1
        if ok:
            return AuthResult(success=True, auth_data=data)
        message = "535 5.7.8 Authentication credentials invalid"
        if self.echo_auth and isinstance(data, LoginPassword):
            # A careless server that repeats what it got (the test of the adapter's redaction).
            blob = base64.b64encode(b"\0" + data.login + b"\0" + data.password).decode()
            message += f" ({blob} / {data.password.decode()})"
        return AuthResult(success=False, handled=False, message=message)

    async def handle_MAIL(
        self,
        server: SMTP,
        session: Session,
        envelope: Envelope,
        address: str,
        mail_options: list[str],
    ) -> str:
        if self.password is not None and not session.authenticated:
            return "530 5.7.0 Authentication required"
        envelope.mail_from = address
        envelope.mail_options.extend(mail_options)
        return "250 OK"

    async def handle_RCPT(
        self,
        server: SMTP,
        session: Session,
        envelope: Envelope,
        address: str,
        rcpt_options: list[str],
    ) -> str:
        scripted = self._rcpt.get(address.lower())
        if scripted is not None:
            return scripted
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        for rcpt in envelope.rcpt_tos:
            scripted = self._data.get(rcpt.lower())
            if scripted is not None:
                return scripted
        content = envelope.original_content or envelope.content or b""
        assert isinstance(content, bytes)
        auth = session.auth_data
        login = auth.login.decode() if isinstance(auth, LoginPassword) else None
        received = Received(
            str(envelope.mail_from),
            tuple(envelope.rcpt_tos),
            content,
            login,
            tls=server.transport is not None
            and server.transport.get_extra_info("ssl_object") is not None,
        )
        self.messages.append(received)
        if self.on_message is not None:
            self.on_message(received)
        return "250 2.0.0 Message accepted for delivery"


def self_signed(directory: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A certificate for 127.0.0.1 in ``directory``: (the server's context, a client
    context that trusts it)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    certfile, keyfile = directory / "smtp-cert.pem", directory / "smtp-key.pem"
    certfile.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    keyfile.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(certfile, keyfile)
    client = ssl.create_default_context(cafile=str(certfile))
    return server, client

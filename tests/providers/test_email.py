"""``botmesh.providers.email`` against a local SMTP server (``tests/providers/fakes/smtp.py``,
aiosmtpd), and its webhook on real MIME built with ``email.message.EmailMessage``."""

from __future__ import annotations

import base64
import hashlib
import logging
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from email.message import EmailMessage
from pathlib import Path
from typing import Literal

import pytest

from botmesh.providers.email import EmailProvider, EmailWebhook, html_to_text, message_id_for
from botmesh.providers.webhooks import BadSignature, MalformedWebhook, WebhookRequest, hmac_hex
from botmesh.state.errors import (
    ConfigError,
    PayloadTooLargeError,
    RecipientUnreachableError,
    SendError,
    UnsupportedContentError,
)
from botmesh.state.messages import Media, Outbound
from botmesh.state.ports import AmbiguityResolver, KeyedSends, Provider
from tests.providers.fakes.smtp import FakeSmtp, self_signed

PASSWORD = "s3cr3t-Pa55word!"
USER = "bot"
SENDER = "Bot <bot@example.com>"
RCPT = "ana@example.org"


@pytest.fixture
def smtp() -> Iterator[FakeSmtp]:
    with FakeSmtp(username=USER, password=PASSWORD) as server:
        yield server


@pytest.fixture
async def provider(smtp: FakeSmtp) -> AsyncIterator[EmailProvider]:
    p = EmailProvider("127.0.0.1", smtp.port, SENDER, username=USER, password=PASSWORD, timeout=5.0)
    yield p
    await p.close()


def forbidden() -> list[str]:
    return [
        PASSWORD,
        base64.b64encode(PASSWORD.encode()).decode(),
        base64.b64encode(f"\0{USER}\0{PASSWORD}".encode()).decode(),
    ]


# -- sending ------------------------------------------------------------------------------


async def test_send_keyed_delivers_a_plain_text_mail(
    smtp: FakeSmtp, provider: EmailProvider
) -> None:
    assert isinstance(provider, Provider) and isinstance(provider, KeyedSends)
    assert not isinstance(provider, AmbiguityResolver)  # SMTP cannot be asked (IMAP: see
    # tests/providers/test_email_imap.py)
    assert (provider.name, provider.media_channel, provider.text_limit) == ("email", "email", None)
    result = await provider.send_keyed(Outbound(RCPT, "Hello Ana", options={"subject": "Hi"}), "k1")
    [got] = smtp.messages
    mail = got.message
    assert (got.mail_from, got.rcpt_tos, got.login) == ("bot@example.com", (RCPT,), USER)
    assert result.message_id == mail["Message-ID"] == message_id_for("k1", "example.com")
    assert (mail["From"], mail["To"], mail["Subject"]) == (SENDER, RCPT, "Hi")
    assert mail.get_content_type() == "text/plain"
    assert mail.get_content().strip() == "Hello Ana"


async def test_message_id_is_stable_per_key_and_differs_between_keys(
    smtp: FakeSmtp, provider: EmailProvider
) -> None:
    a1 = await provider.send_keyed(Outbound(RCPT, "one"), "order:7")
    a2 = await provider.send_keyed(Outbound(RCPT, "one"), "order:7")  # a resend after a crash
    b = await provider.send_keyed(Outbound(RCPT, "one"), "order:7#2")
    plain = await provider.send(Outbound(RCPT, "one"))
    assert a1 == a2 != b
    assert plain.message_id not in (a1.message_id, b.message_id)
    ids = [m.message["Message-ID"] for m in smtp.messages]
    assert ids == [a1.message_id, a1.message_id, b.message_id, plain.message_id]
    digest = hashlib.sha256(b"order:7").hexdigest()[:32]
    assert a1.message_id == f"<{digest}@example.com>"
    other = EmailProvider("127.0.0.1", smtp.port, "x@example.com", domain="mail.example.net")
    assert message_id_for("order:7", other.domain) == f"<{digest}@mail.example.net>"


async def test_reply_to_threads_the_mail(smtp: FakeSmtp, provider: EmailProvider) -> None:
    options = {"reply_to": "abc@their.example", "references": ["<root@their.example>"]}
    await provider.send_keyed(Outbound(RCPT, "re", options=options), "k")
    mail = smtp.messages[0].message
    assert mail["In-Reply-To"] == "<abc@their.example>"
    assert mail["References"] == "<root@their.example> <abc@their.example>"


async def test_an_attachment_arrives_intact(smtp: FakeSmtp, provider: EmailProvider) -> None:
    data = bytes(range(256)) * 300
    media = Media(data=data, mime="application/pdf", name="report.pdf")
    await provider.send_keyed(Outbound(RCPT, "the report", media), "k")
    mail = smtp.messages[0].message
    [part] = list(mail.iter_attachments())
    assert (part.get_filename(), part.get_content_type()) == ("report.pdf", "application/pdf")
    assert part.get_payload(decode=True) == data
    body = mail.get_body(preferencelist=("plain",))
    assert body is not None and body.get_content().strip() == "the report"


async def test_a_file_path_is_attached_with_its_name(
    smtp: FakeSmtp, provider: EmailProvider, tmp_path: Path
) -> None:
    path = tmp_path / "photo.png"
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 100)
    media = Media(path=str(path), url="https://example.com/photo.png")
    await provider.send_keyed(Outbound(RCPT, "pic", media), "k")
    mail = smtp.messages[0].message
    body = mail.get_body(preferencelist=("plain",))
    assert body is not None and body.get_content().strip() == "pic"  # attached, not linked
    [part] = list(mail.iter_attachments())
    assert (part.get_filename(), part.get_content_type()) == ("photo.png", "image/png")
    assert part.get_payload(decode=True) == path.read_bytes()


async def test_a_missing_file_is_unsupported(provider: EmailProvider, tmp_path: Path) -> None:
    with pytest.raises(UnsupportedContentError, match="cannot read"):
        await provider.send_keyed(Outbound(RCPT, "x", Media(path=str(tmp_path / "no"))), "k")


async def test_a_url_media_goes_in_the_body(smtp: FakeSmtp, provider: EmailProvider) -> None:
    await provider.send_keyed(Outbound(RCPT, "look", Media(url="https://example.com/a.jpg")), "k")
    mail = smtp.messages[0].message
    assert list(mail.iter_attachments()) == []
    assert mail.get_content().replace("\r\n", "\n").strip() == "look\n\nhttps://example.com/a.jpg"


async def test_a_channel_media_id_is_unsupported(smtp: FakeSmtp, provider: EmailProvider) -> None:
    with pytest.raises(UnsupportedContentError):
        await provider.send_keyed(Outbound(RCPT, "x", Media(id="AgAD123")), "k")
    assert smtp.messages == []


@pytest.mark.parametrize("chat_id", ["not-an-address", "a@b.example\r\nBcc: x@y.example"])
async def test_a_chat_id_that_is_not_an_address_is_unreachable(
    smtp: FakeSmtp, provider: EmailProvider, chat_id: str
) -> None:
    with pytest.raises(RecipientUnreachableError):
        await provider.send_keyed(Outbound(chat_id, "x"), "k")
    assert smtp.messages == []


# -- error mapping, each against the server ------------------------------------------------


@pytest.mark.parametrize(
    "reply",
    [
        "no-such-user",
        "551 5.1.6 User not local; please try <x@elsewhere.example>",
        "553 5.1.3 Bad recipient address syntax",
    ],
)
async def test_no_such_mailbox_is_unreachable(
    smtp: FakeSmtp, provider: EmailProvider, reply: str
) -> None:
    smtp.script(RCPT, reply)
    with pytest.raises(RecipientUnreachableError) as info:
        await provider.send_keyed(Outbound(RCPT, "x"), "k")
    assert info.value.retryable is False and RCPT in str(info.value)
    assert smtp.messages == []


@pytest.mark.parametrize("reply", ["too-big", "554 5.3.4 Message too big for system"])
async def test_too_big_at_data_is_payload_too_large(
    smtp: FakeSmtp, provider: EmailProvider, reply: str
) -> None:
    smtp.script(RCPT, reply, at="DATA")
    with pytest.raises(PayloadTooLargeError):
        await provider.send_keyed(Outbound(RCPT, "x"), "k")


async def test_the_servers_size_limit_is_payload_too_large() -> None:
    with FakeSmtp(data_size_limit=2000) as small:
        p = EmailProvider("127.0.0.1", small.port, SENDER, timeout=5.0)
        with pytest.raises(PayloadTooLargeError, match="552"):
            await p.send_keyed(Outbound(RCPT, "x", Media(data=b"y" * 5000, name="y.bin")), "k")
        await p.send_keyed(Outbound(RCPT, "small"), "k2")
        assert len(small.messages) == 1


@pytest.mark.parametrize("reply", ["busy", "try-later", "full", "450 4.2.1 Mailbox busy"])
async def test_temporary_replies_are_retryable(
    smtp: FakeSmtp, provider: EmailProvider, reply: str
) -> None:
    smtp.script(RCPT, reply)
    with pytest.raises(SendError) as info:
        await provider.send_keyed(Outbound(RCPT, "x"), "k")
    assert type(info.value) is SendError and info.value.retryable


async def test_a_policy_refusal_of_the_content_is_final_not_unreachable(
    smtp: FakeSmtp, provider: EmailProvider
) -> None:
    smtp.script(RCPT, "550 5.7.1 Message rejected as spam", at="DATA")
    with pytest.raises(SendError) as info:
        await provider.send_keyed(Outbound(RCPT, "x"), "k")
    assert type(info.value) is SendError and info.value.retryable is False


async def test_other_5xx_is_final(smtp: FakeSmtp, provider: EmailProvider) -> None:
    smtp.script(RCPT, "554 5.6.0 Transaction failed", at="DATA")
    with pytest.raises(SendError, match="554") as info:
        await provider.send_keyed(Outbound(RCPT, "x"), "k")
    assert type(info.value) is SendError and info.value.retryable is False


@pytest.mark.parametrize("echo", [False, True])
async def test_a_wrong_password_is_final_and_never_shown(
    caplog: pytest.LogCaptureFixture, echo: bool
) -> None:
    caplog.set_level(logging.DEBUG, logger="botmesh.providers")
    wrong = "Wr0ng-" + PASSWORD
    with FakeSmtp(username=USER, password=PASSWORD, echo_auth=echo) as smtp:
        p = EmailProvider("127.0.0.1", smtp.port, SENDER, username=USER, password=wrong)
        with pytest.raises(SendError, match="credentials are wrong") as info:
            await p.send_keyed(Outbound(RCPT, "x"), "k")
        assert smtp.auth_failures >= 1 and smtp.messages == []  # smtplib: PLAIN, then LOGIN
    assert info.value.retryable is False and "535" in str(info.value)
    lines = [str(info.value), repr(p)] + [r.getMessage() for r in caplog.records]
    assert any("failed" in line for line in lines[2:])  # the adapter's log is captured
    encoded = base64.b64encode(f"\0{USER}\0{wrong}".encode()).decode()
    for secret in (wrong, encoded, base64.b64encode(wrong.encode()).decode()):
        assert all(secret not in line for line in lines)


async def test_no_auth_against_a_server_that_wants_it_is_final(smtp: FakeSmtp) -> None:
    p = EmailProvider("127.0.0.1", smtp.port, SENDER)
    with pytest.raises(SendError, match="530") as info:
        await p.send_keyed(Outbound(RCPT, "x"), "k")
    assert info.value.retryable is False and "EMAIL_SMTP_URL" in str(info.value)


async def test_starttls_on_a_server_without_it_is_final(smtp: FakeSmtp) -> None:
    p = EmailProvider("127.0.0.1", smtp.port, SENDER, starttls=True)
    with pytest.raises(SendError, match="STARTTLS") as info:
        await p.send_keyed(Outbound(RCPT, "x"), "k")
    assert info.value.retryable is False


@pytest.mark.parametrize("mode", ["starttls", "implicit"])
async def test_tls_delivers_with_auth(
    tmp_path: Path, mode: Literal["starttls", "implicit"]
) -> None:
    server_ctx, client_ctx = self_signed(tmp_path)
    with FakeSmtp(username=USER, password=PASSWORD, tls=mode, tls_context=server_ctx) as server:
        p = EmailProvider(
            "127.0.0.1",
            server.port,
            SENDER,
            username=USER,
            password=PASSWORD,
            starttls=mode == "starttls",
            ssl=mode == "implicit",
            tls_context=client_ctx,
            timeout=5.0,
        )
        await p.send_keyed(Outbound(RCPT, "over TLS"), "k")
        [got] = server.messages
    assert got.tls and got.login == USER


async def test_an_untrusted_certificate_is_final(tmp_path: Path) -> None:
    server_ctx, _ = self_signed(tmp_path)
    with FakeSmtp(tls="starttls", tls_context=server_ctx) as server:
        p = EmailProvider("127.0.0.1", server.port, SENDER, starttls=True, timeout=5.0)
        with pytest.raises(SendError, match="certificate") as info:
            await p.send_keyed(Outbound(RCPT, "x"), "k")
        assert server.messages == []
    assert info.value.retryable is False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_connection_refused_is_retryable() -> None:
    p = EmailProvider("127.0.0.1", free_port(), SENDER, username=USER, password=PASSWORD)
    with pytest.raises(SendError) as info:
        await p.send_keyed(Outbound(RCPT, "x"), "k")
    assert type(info.value) is SendError and info.value.retryable
    assert all(s not in str(info.value) for s in forbidden())


async def test_a_reset_connection_is_retryable() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()

        def hang_up() -> None:
            conn, _ = listener.accept()
            conn.close()

        t = threading.Thread(target=hang_up)
        t.start()
        p = EmailProvider("127.0.0.1", listener.getsockname()[1], SENDER, timeout=5.0)
        with pytest.raises(SendError) as info:
            await p.send_keyed(Outbound(RCPT, "x"), "k")
        t.join()
    assert info.value.retryable


async def test_a_silent_server_times_out_retryably() -> None:
    with socket.socket() as listener:  # accepts (the kernel does) but never says hello
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        p = EmailProvider("127.0.0.1", listener.getsockname()[1], SENDER, timeout=0.2)
        with pytest.raises(SendError, match=r"(?i)timeout|timed out") as info:
            await p.send_keyed(Outbound(RCPT, "x"), "k")
    assert info.value.retryable


async def test_no_error_or_log_line_carries_the_password(
    smtp: FakeSmtp, provider: EmailProvider, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="botmesh.providers")
    seen = [repr(provider)]
    for reply in ("no-such-user", "busy", "try-later"):
        smtp.script(RCPT, reply)
        with pytest.raises(SendError) as info:
            await provider.send_keyed(Outbound(RCPT, "x"), "k")
        seen.append(str(info.value))
    await provider.send_keyed(Outbound("ok@example.org", "fine"), "k")
    seen += [r.getMessage() for r in caplog.records]
    assert any("sent" in line for line in seen)
    for secret in forbidden():
        assert all(secret not in line for line in seen)


# -- from_env ----------------------------------------------------------------------------------


def test_from_env_parses_the_smtp_url() -> None:
    p = EmailProvider.from_env(
        {
            "EMAIL_SMTP_URL": "smtp://bot%40example.com:p%40ss%3Aword@mail.example.com?starttls=1",
            "EMAIL_FROM": "bot@example.com",
            "EMAIL_DOMAIN": "ids.example.com",
        }
    )
    assert (p.host, p.port, p.username, p.starttls, p.ssl) == (
        "mail.example.com",
        587,
        "bot@example.com",
        True,
        False,
    )
    assert p.domain == "ids.example.com"
    assert "p@ss:word" not in repr(p)
    s = EmailProvider.from_env({"EMAIL_SMTP_URL": "smtps://h:2465", "EMAIL_FROM": "a@b.example"})
    assert (s.port, s.ssl, s.username) == (2465, True, None)
    assert (
        EmailProvider.from_env({"EMAIL_SMTP_URL": "smtps://h", "EMAIL_FROM": "a@b.c"}).port == 465
    )


@pytest.mark.parametrize(
    ("env", "field"),
    [
        ({"EMAIL_FROM": "a@b.example"}, "EMAIL_SMTP_URL"),
        ({"EMAIL_SMTP_URL": "smtp://h"}, "EMAIL_FROM"),
        ({"EMAIL_SMTP_URL": "http://u:hunter22@h", "EMAIL_FROM": "a@b.example"}, "EMAIL_SMTP_URL"),
        (
            {"EMAIL_SMTP_URL": "smtp://u:hunter22@h:x", "EMAIL_FROM": "a@b.example"},
            "EMAIL_SMTP_URL",
        ),
        ({"EMAIL_SMTP_URL": "smtp://u:hunter22@h", "EMAIL_FROM": "nobody"}, "EMAIL_FROM"),
    ],
)
def test_from_env_names_the_bad_variable_without_the_password(
    env: dict[str, str], field: str
) -> None:
    with pytest.raises(ConfigError) as info:
        EmailProvider.from_env(env)
    assert info.value.field == field
    assert "hunter22" not in str(info.value)


def test_webhook_from_env() -> None:
    assert isinstance(EmailWebhook.from_env({"EMAIL_WEBHOOK_SECRET": "x"}), EmailWebhook)
    with pytest.raises(ConfigError, match="EMAIL_WEBHOOK_SECRET"):
        EmailWebhook.from_env({})


# -- the webhook -------------------------------------------------------------------------------

SECRET = "relay-secret"


def signed(raw: bytes, secret: str = SECRET, signature: str | None = None) -> WebhookRequest:
    headers = {"content-type": "message/rfc822"}
    headers["x-botmesh-signature"] = signature or "sha256=" + hmac_hex(secret, raw)
    return WebhookRequest("POST", "/email", "https://gw.example.com/email", headers, {}, raw)


def inbound_mail(**headers: str) -> EmailMessage:
    mail = EmailMessage()
    mail["From"] = "Ana Lima <Ana.Lima@Example.ORG>"
    mail["To"] = "bot@example.com"
    mail["Subject"] = "Invoice"
    mail["Date"] = "Thu, 03 Dec 2026 15:08:40 +0000"
    mail["Message-ID"] = "<CAF1234.5678@mail.example.org>"
    mail["In-Reply-To"] = "<abc@example.com>"
    for name, value in headers.items():
        mail[name.replace("_", "-")] = value
    mail.set_content("Here is the invoice.\n")
    mail.add_alternative("<p>Here is the <b>invoice</b>.</p>", subtype="html")
    return mail


def test_signature_good_and_bad() -> None:
    raw = bytes(inbound_mail())
    hook = EmailWebhook(SECRET)
    hook.verify(signed(raw))
    hook.verify(signed(raw, signature="sha256=" + hmac_hex(SECRET, raw).upper()))
    for bad in (
        signed(raw, secret="other"),
        signed(raw + b" ", signature="sha256=" + hmac_hex(SECRET, raw)),
        signed(raw, signature=hmac_hex(SECRET, raw)),  # no sha256= prefix
    ):
        with pytest.raises(BadSignature):
            hook.verify(bad)
    unsigned = WebhookRequest("POST", "/email", "u", {}, {}, raw)
    with pytest.raises(BadSignature):
        hook.verify(unsigned)


def test_parse_text_with_attachments() -> None:
    mail = inbound_mail()
    pdf = b"%PDF-1.7\n" + bytes(range(256)) * 10
    mail.add_attachment(pdf, maintype="application", subtype="pdf", filename="inv.pdf")
    mail.add_attachment(b"a,b\n1,2\n", maintype="text", subtype="csv", filename="rows.csv")
    [inbound] = EmailWebhook(SECRET).parse(signed(bytes(mail)))
    assert inbound.id == "CAF1234.5678@mail.example.org"
    assert (inbound.chat_id, inbound.sender, inbound.channel) == (
        "ana.lima@example.org",
        "ana.lima@example.org",
        "email",
    )
    assert inbound.text == "Here is the invoice."
    assert inbound.ts == 1796310520.0
    assert inbound.media == Media(
        provider="email",
        name="inv.pdf",
        mime="application/pdf",
        data=pdf,
        extra={
            "message_id": inbound.id,
            "index": 0,
            "sha256": hashlib.sha256(pdf).hexdigest(),
        },
    )
    [more] = inbound.data["more_attachments"]
    assert (more["index"], more["name"], more["mime"], more["size"]) == (
        1,
        "rows.csv",
        "text/csv",
        8,
    )
    assert inbound.data["subject"] == "Invoice" and inbound.data["from_name"] == "Ana Lima"
    assert inbound.data["to"] == ["bot@example.com"]
    assert inbound.data["in_reply_to"] == "<abc@example.com>"


def test_parse_html_only_mail_as_text() -> None:
    mail = EmailMessage()
    mail["From"] = "x@example.org"
    mail["Message-ID"] = "<h1@example.org>"
    mail.set_content(
        "<html><style>p{}</style><body><p>Hello&nbsp;there</p><div>line 2</div></body></html>",
        subtype="html",
    )
    [inbound] = EmailWebhook(SECRET, clock=lambda: 42.0).parse(signed(bytes(mail)))
    assert inbound.text == "Hello there\nline 2"
    assert inbound.ts == 42.0 and inbound.media is None
    assert html_to_text("<script>x()</script>a<br>b") == "a\nb"


def test_no_message_id_is_malformed() -> None:
    mail = inbound_mail()
    del mail["Message-ID"]
    with pytest.raises(MalformedWebhook, match="Message-ID"):
        EmailWebhook(SECRET).parse(signed(bytes(mail)))
    with pytest.raises(MalformedWebhook):
        EmailWebhook(SECRET).parse(signed(b"not a mail at all"))


def test_automatic_mail_gives_no_record() -> None:
    mail = inbound_mail(Auto_Submitted="auto-replied")
    assert EmailWebhook(SECRET).parse(signed(bytes(mail))) == []
    assert len(EmailWebhook(SECRET).parse(signed(bytes(inbound_mail(Auto_Submitted="no"))))) == 1


def test_reply_is_a_bare_200() -> None:
    reply = EmailWebhook(SECRET).reply(signed(b""), [])
    assert (reply.status, reply.body) == (200, b"")


async def test_a_sent_mail_parses_back_to_its_message_id_and_bytes(
    smtp: FakeSmtp, provider: EmailProvider
) -> None:
    data = b"\x00\x01binary\xff" * 50
    sent = await provider.send_keyed(
        Outbound(RCPT, "round trip", Media(data=data, name="d.bin")), "rt"
    )
    [inbound] = EmailWebhook(SECRET).parse(signed(smtp.messages[0].content))
    assert f"<{inbound.id}>" == sent.message_id
    assert inbound.chat_id == "bot@example.com" and inbound.text == "round trip"
    assert inbound.media is not None and inbound.media.data == data
    assert inbound.media.extra["sha256"] == hashlib.sha256(data).hexdigest()

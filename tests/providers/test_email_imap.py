"""``EmailImapProvider``: an ambiguous email send resolved by its copy in the sent folder,
against a local IMAP server (``tests/providers/fakes/imap.py``) and the local SMTP server
(``tests/providers/fakes/smtp.py``), through the engine's real recovery path (a journal
that dies at a named write, then a new runtime on it, as
``tests/invariants/test_ambiguity_resolved_by_the_channel.py`` does).

Two ways a copy lands in Sent: the mail server files what its SMTP accepted (the SMTP
fake's ``on_message`` files it in the IMAP fake, as Gmail or Microsoft 365 do), or the
adapter files it itself (``append``)."""

from __future__ import annotations

import asyncio
import base64
import imaplib
import logging
import re
import socket
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import pytest

from botmesh import AmbiguousEvent, Bot
from botmesh.journal import MemoryKv, Write
from botmesh.providers.channels import provider_from_env
from botmesh.providers.email import EmailImapProvider, EmailProvider, message_id_for
from botmesh.providers.email_imap import ImapSentFolder, imap_date
from botmesh.state.errors import ConfigError, ProviderError, SendError
from botmesh.state.messages import Outbound
from botmesh.state.ports import AmbiguityResolver, KeyedSends
from botmesh.testing import ManualClock, SimulatedCrash, crashable
from tests.kit import make_app, policy
from tests.providers.fakes.imap import FakeImap
from tests.providers.fakes.smtp import FakeSmtp, Received, self_signed

PASSWORD = 'imap-Pa55"word\\!'
SMTP_PASSWORD = "smtp-s3cr3t"
USER = "bot@example.com"
SENDER = "Bot <bot@example.com>"
RCPT = "ana@example.org"

Policy = Literal["skip", "resend"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def forbidden(password: str = PASSWORD) -> list[str]:
    return [
        password,
        base64.b64encode(password.encode()).decode(),
        base64.b64encode(f"\0{USER}\0{password}".encode()).decode(),
    ]


@pytest.fixture
def imap() -> Iterator[FakeImap]:
    with FakeImap(username=USER, password=PASSWORD, folders=("INBOX", "Sent", "Archive")) as s:
        yield s


@pytest.fixture
def smtp() -> Iterator[FakeSmtp]:
    with FakeSmtp(username="bot", password=SMTP_PASSWORD) as server:
        yield server


def files_into(imap: FakeImap, folder: str = "Sent") -> Any:
    """An SMTP ``on_message`` that files what was accepted, as Gmail's submission does."""

    def file(received: Received) -> None:
        imap.file(folder, received.content)

    return file


def folder_of(imap: FakeImap | int, **options: Any) -> ImapSentFolder:
    port = imap if isinstance(imap, int) else imap.port
    options.setdefault("grace", 0.0)
    options.setdefault("timeout", 5.0)
    options.setdefault("security", "plain")
    return ImapSentFolder("127.0.0.1", port, username=USER, password=PASSWORD, **options)


def provider_of(smtp: FakeSmtp, folder: ImapSentFolder) -> EmailImapProvider:
    return EmailImapProvider(
        "127.0.0.1",
        smtp.port,
        SENDER,
        username="bot",
        password=SMTP_PASSWORD,
        timeout=5.0,
        sent_folder=folder,
    )


def _bot(on_ambiguous: Policy, events: list[AmbiguousEvent]) -> Bot:
    bot = Bot("bot", durability=policy(outbox={"on_ambiguous": on_ambiguous}))
    bot.on(AmbiguousEvent, events.append)
    return bot


async def crash_and_recover(
    provider: EmailImapProvider,
    crash: tuple[Literal["before", "after"], str],
    on_ambiguous: Policy,
    *,
    between: Any = None,
) -> tuple[Any, list[AmbiguousEvent]]:
    """Send "hello" under key ``k`` on a journal that dies at ``crash``; run ``between``;
    start a new runtime on the journal (it resolves the ambiguous send); that runtime and
    the ambiguity events it fired."""
    shared, clock = MemoryKv(), ManualClock()
    a = crashable(shared)
    (a.crash_before if crash[0] == "before" else a.crash_after)(crash[1])
    first = await make_app(provider, kv=a, clock=clock)
    with pytest.raises(SimulatedCrash):
        await first.runtime.send(RCPT, "hello", idempotency_key="k")
    if between is not None:
        between()
    events: list[AmbiguousEvent] = []
    again = await make_app(provider, kv=shared, clock=clock, bot=_bot(on_ambiguous, events))
    return again, events


MID = message_id_for("k", "example.com")


# -- the fake answers imaplib as a real server does ---------------------------------------


def test_the_fake_speaks_imap4rev1_to_imaplib(imap: FakeImap) -> None:
    data: Any  # imaplib's answers: lists of bytes (typeshed's union is wider)
    client = imaplib.IMAP4("127.0.0.1", imap.port, timeout=5)
    assert "IMAP4REV1" in client.capabilities and client.PROTOCOL_VERSION == "IMAP4REV1"
    with pytest.raises(imaplib.IMAP4.error, match="AUTHENTICATIONFAILED"):
        client.login(USER, "wrong")
    assert client.login(f'"{USER}"', PASSWORD)[0] == "OK"
    assert client.state == "AUTH"
    typ, data = client.list()
    assert typ == "OK" and b'(\\HasNoChildren \\Sent) "/" "Sent"' in data
    typ, data = client.select('"Nope"', readonly=True)
    assert typ == "NO" and b"NONEXISTENT" in data[0]
    old = datetime.now(UTC) - timedelta(days=10)
    imap.file("Sent", b"Message-ID: <old@x>\r\n\r\nold\r\n", when=old)
    typ, data = client.append(
        '"Sent"',
        r"(\Draft \Seen)",
        imaplib.Time2Internaldate(time.time()),
        b"Message-ID: <n@x>\n\nx",
    )
    assert typ == "OK" and data[0].startswith(b"[APPENDUID 1001 2]")
    assert imap.messages("Sent")[1].raw == b"Message-ID: <n@x>\r\n\r\nx"  # the literal, in CRLF
    typ, data = client.append('"Gone"', None, None, b"x")
    assert typ == "NO" and b"TRYCREATE" in data[0]
    typ, data = client.select('"Sent"', readonly=True)
    assert (typ, data) == ("OK", [b"2"]) and client.state == "SELECTED"
    assert client.uid("SEARCH", "ALL") == ("OK", [b"1 2"])
    assert client.search(None, "HEADER", "Message-ID", '"<N@X>"') == ("OK", [b"2"])
    since = imap_date(time.time())
    assert client.uid("SEARCH", "SINCE", since, "HEADER", "Message-ID", '"<old@x>"') == (
        "OK",
        [b""],
    )
    assert client.uid("SEARCH", "UNDRAFT", "UNDELETED") == ("OK", [b"1"])
    assert client.uid("STORE", "2", "-FLAGS", r"(\Draft)")[0] == "NO"  # EXAMINE: read-only
    assert client.select('"Sent"')[0] == "OK"
    typ, data = client.uid("STORE", "2", "-FLAGS", r"(\Draft)")
    assert typ == "OK" and data == [b"2 (UID 2 FLAGS (\\Seen))"]
    assert client.uid("SEARCH", "DRAFT") == ("OK", [b""])
    client.uid("STORE", "1", "+FLAGS.SILENT", r"(\Deleted)")
    typ, data = client.uid("EXPUNGE", "1")
    assert typ == "OK" and [m.uid for m in imap.messages("Sent")] == [2]
    with pytest.raises(imaplib.IMAP4.error, match="BAD"):
        client.uid("SEARCH", "X-GM-RAW", '"x"')
    assert client.logout()[0] == "BYE"
    assert "LOGIN" in imap.commands and not any(PASSWORD in c for c in imap.commands)


@pytest.mark.parametrize("mode", ["starttls", "implicit"])
def test_the_fake_speaks_tls_as_imaplib_expects(
    tmp_path: Path, mode: Literal["starttls", "implicit"]
) -> None:
    server_ctx, client_ctx = self_signed(tmp_path)
    with FakeImap(username=USER, password=PASSWORD, tls=mode, tls_context=server_ctx) as s:
        if mode == "implicit":
            client: imaplib.IMAP4 = imaplib.IMAP4_SSL(
                "127.0.0.1", s.port, ssl_context=client_ctx, timeout=5
            )
        else:
            client = imaplib.IMAP4("127.0.0.1", s.port, timeout=5)
            assert "LOGINDISABLED" in client.capabilities
            client.starttls(client_ctx)
            assert "LOGINDISABLED" not in client.capabilities
        assert client.login(f'"{USER}"', PASSWORD)[0] == "OK"
        client.logout()


# -- configuration ------------------------------------------------------------------------


def test_the_url_is_read_like_the_smtp_one() -> None:
    f = ImapSentFolder.from_url(
        "imaps://bot%40example.com:p%40ss%3Aw@mail.example.com/Sent%20Items"
        "?also=%5BGmail%5D%2FSent%20Mail,INBOX.Sent&grace=45s"
    )
    assert (f.host, f.port, f.username, f.security, f.append, f.grace) == (
        "mail.example.com",
        993,
        "bot@example.com",
        "imaps",
        False,
        45.0,
    )
    assert f.folders == ("Sent Items", "[Gmail]/Sent Mail", "INBOX.Sent")
    assert "p@ss:w" not in repr(f)
    s = ImapSentFolder.from_url("imap://u:p@mail.example.com?starttls=1&append=1")
    assert (s.port, s.security, s.append, s.folder, s.grace) == (143, "starttls", True, "Sent", 30)
    local = ImapSentFolder.from_url("imap://u:p@127.0.0.1:1143/Sent")
    assert (local.security, local.port) == ("plain", 1143)


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("imap://u:hunter22@mail.example.com/Sent", "in clear"),
        ("imaps://u:hunter22@h/Sent?starttls=1", "TLS already"),
        ("https://u:hunter22@h/Sent", "scheme"),
        ("imaps://u:hunter22@h:x/Sent", "port"),
        ("imaps://h/Sent", "user and password"),
        ("imaps://u:hunter22@h/Sent?apend=1", "unknown option"),
        ("imaps://u:hunter22@h/Sent?grace=5", "duration"),
        ("imaps://u:hunter22@h/Envoy%C3%A9s", "UTF-7"),
    ],
)
def test_a_bad_url_names_the_variable_and_hides_the_password(url: str, why: str) -> None:
    with pytest.raises(ConfigError, match=why) as info:
        EmailProvider.from_env(
            {"EMAIL_SMTP_URL": "smtp://h", "EMAIL_FROM": "a@b.example", "EMAIL_IMAP_URL": url}
        )
    assert info.value.field == "EMAIL_IMAP_URL" and "hunter22" not in str(info.value)


def test_without_imap_the_provider_stays_as_it_was() -> None:
    env = {"EMAIL_SMTP_URL": "smtp://h", "EMAIL_FROM": "a@b.example"}
    plain = provider_from_env("email", env)
    assert type(plain) is EmailProvider and not isinstance(plain, AmbiguityResolver)
    imap_url = "imaps://u:hunter22@imap.example.com/Sent"
    asking = provider_from_env("email", {**env, "EMAIL_IMAP_URL": imap_url})
    assert isinstance(asking, EmailImapProvider)
    assert isinstance(asking, AmbiguityResolver) and isinstance(asking, KeyedSends)
    assert asking.sent_folder.folders == ("Sent",) and "hunter22" not in repr(asking)


# -- resolve_ambiguous, asked directly ----------------------------------------------------


async def test_a_filed_copy_is_sent_none_is_not_and_the_search_is_by_header_and_day(
    smtp: FakeSmtp, imap: FakeImap
) -> None:
    p = provider_of(smtp, folder_of(imap))
    since = time.time()
    assert await p.resolve_ambiguous(Outbound(RCPT, "x"), "k", since) is None
    imap.file("Sent", f"Message-ID: {MID}\r\nSubject: x\r\n\r\nx\r\n".encode())
    found = await p.resolve_ambiguous(Outbound(RCPT, "x"), "k", since)
    assert found is not None and found.message_id == MID
    searches = [c for c in imap.commands if "SEARCH" in c]
    assert searches and all(
        f"SINCE {imap_date(since)} UNDELETED" in c and f'HEADER Message-ID "{MID}"' in c
        for c in searches
    )
    assert not any("SELECT" in c or "STORE" in c for c in imap.commands)  # EXAMINE: read-only


async def test_the_other_folders_are_searched_only_when_configured(
    smtp: FakeSmtp, imap: FakeImap
) -> None:
    imap.file("Archive", f"Message-ID: {MID}\r\n\r\nx\r\n".encode())
    only_sent = provider_of(smtp, folder_of(imap))
    assert await only_sent.resolve_ambiguous(Outbound(RCPT, "x"), "k", time.time()) is None
    assert not any("Archive" in c for c in imap.commands)
    both = provider_of(smtp, folder_of(imap, also=["Archive"]))
    found = await both.resolve_ambiguous(Outbound(RCPT, "x"), "k", time.time())
    assert found is not None and found.message_id == MID


async def test_a_copy_that_is_only_a_draft_cannot_tell(smtp: FakeSmtp, imap: FakeImap) -> None:
    imap.file("Sent", f"Message-ID: {MID}\r\n\r\nx\r\n".encode(), flags=("\\Draft", "\\Seen"))
    p = provider_of(smtp, folder_of(imap, append=True))
    with pytest.raises(ProviderError, match=r"cannot tell.*draft"):
        await p.resolve_ambiguous(Outbound(RCPT, "x"), "k", time.time())


async def test_a_copy_filed_late_is_found_within_the_grace(smtp: FakeSmtp, imap: FakeImap) -> None:
    p = provider_of(smtp, folder_of(imap, grace=3.0))
    asked = asyncio.create_task(p.resolve_ambiguous(Outbound(RCPT, "x"), "k", time.time()))
    while not any(f'"{MID}"' in c for c in imap.commands):  # the first look found nothing
        assert not asked.done(), asked
        await asyncio.sleep(0.01)
    imap.file("Sent", f"Message-ID: {MID}\r\n\r\nx\r\n".encode())  # the relay filed it now
    found = await asked  # the second look, once the grace after the attempt ran out
    assert found is not None and found.message_id == MID
    assert sum(f'"{MID}"' in c and "UNDRAFT" not in c for c in imap.commands) == 2


# -- through the engine: a send that went out is found ------------------------------------


@pytest.mark.parametrize("on_ambiguous", ["skip", "resend"])
async def test_a_mail_the_server_filed_is_recorded_sent_and_not_sent_again(
    imap: FakeImap, on_ambiguous: Policy
) -> None:
    with FakeSmtp(username="bot", password=SMTP_PASSWORD, on_message=files_into(imap)) as smtp:
        p = provider_of(smtp, folder_of(imap))
        again, events = await crash_and_recover(p, ("before", Write.OUTBOX_MARK_SENT), on_ambiguous)
        rec = await again.ops.outbox.get("k")
        assert rec is not None and rec.state == "sent" and rec.message_id == MID
        assert len(smtp.messages) == 1  # asked, never sent again
    m = again.ops.metrics()
    assert (m["outboxResolvedSent"], m["outboxResolvedUnsent"], m["outboxAmbiguous"]) == (1, 0, 0)
    assert events == []


@pytest.mark.parametrize("on_ambiguous", ["skip", "resend"])
async def test_append_mode_files_the_copy_and_finds_it(
    smtp: FakeSmtp, imap: FakeImap, on_ambiguous: Policy
) -> None:
    p = provider_of(smtp, folder_of(imap, append=True))
    again, events = await crash_and_recover(p, ("before", Write.OUTBOX_MARK_SENT), on_ambiguous)
    rec = await again.ops.outbox.get("k")
    assert rec is not None and rec.state == "sent" and rec.message_id == MID
    assert len(smtp.messages) == 1
    [copy] = imap.with_message_id("Sent", MID)
    assert copy.flags == {"\\Seen"}  # filed as a draft, marked sent once SMTP accepted it
    assert copy.header("To") == [RCPT]
    assert again.ops.metrics()["outboxResolvedSent"] == 1 and events == []


# -- through the engine: a send that never went out is sent once ---------------------------


@pytest.mark.parametrize("append", [False, True])
@pytest.mark.parametrize("on_ambiguous", ["skip", "resend"])
async def test_a_mail_that_never_left_is_sent_exactly_once(
    imap: FakeImap, on_ambiguous: Policy, append: bool
) -> None:
    with FakeSmtp(
        username="bot", password=SMTP_PASSWORD, on_message=None if append else files_into(imap)
    ) as smtp:
        p = provider_of(smtp, folder_of(imap, append=append))
        # journaled in flight, then the process died before the provider was called
        again, events = await crash_and_recover(p, ("after", Write.OUTBOX_JOURNAL), on_ambiguous)
        rec = await again.ops.outbox.get("k")
        assert rec is not None and rec.state == "sent" and rec.message_id == MID
        assert [r.message["Message-ID"] for r in smtp.messages] == [MID]  # "skip" would lose it
    m = again.ops.metrics()
    assert (m["outboxResolvedSent"], m["outboxResolvedUnsent"], m["outboxAmbiguous"]) == (0, 1, 0)
    assert events == []
    assert len(imap.with_message_id("Sent", MID)) == 1


# -- through the engine: IMAP cannot tell, the policy applies -----------------------------


@pytest.mark.parametrize("on_ambiguous", ["skip", "resend"])
async def test_imap_unreachable_falls_back_to_the_policy_and_says_why(
    smtp: FakeSmtp, on_ambiguous: Policy, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="botmesh")
    port = free_port()  # nothing listens there
    p = provider_of(smtp, folder_of(port))
    again, events = await crash_and_recover(p, ("before", Write.OUTBOX_MARK_SENT), on_ambiguous)
    rec = await again.ops.outbox.get("k")
    resent = on_ambiguous == "resend"
    assert rec is not None and rec.ambiguous
    assert rec.state == ("sent" if resent else "unknown")
    assert [r.message["Message-ID"] for r in smtp.messages] == [MID] * (2 if resent else 1)
    assert events == [AmbiguousEvent("k", RCPT, resent=resent)]
    m = again.ops.metrics()
    assert (m["outboxResolvedSent"], m["outboxResolvedUnsent"], m["outboxAmbiguous"]) == (0, 0, 1)
    [why] = [r.getMessage() for r in caplog.records if "cannot tell" in r.getMessage()]
    assert f"IMAP 127.0.0.1:{port}" in why and "EMAIL_IMAP_URL" in why
    lines = [r.getMessage() for r in caplog.records] + [repr(p)]
    for secret in forbidden() + forbidden(SMTP_PASSWORD):
        assert all(secret not in line for line in lines)


@pytest.mark.parametrize(
    ("breakage", "said"),
    [
        ("login", "login of 'bot@example.com' was refused"),
        ("folder", "cannot open folder 'Sent Items'.*'Sent' as sent mail"),
        ("search", "SEARCH in 'Sent Items' refused"),
        ("hang-up", "EMAIL_IMAP_URL"),
    ],
)
async def test_when_imap_refuses_the_policy_decides_and_the_reason_is_logged(
    smtp: FakeSmtp, breakage: str, said: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="botmesh")
    with FakeImap(
        username=USER,
        password="the-real-one" if breakage == "login" else PASSWORD,
        folders=("INBOX", "Sent") if breakage == "folder" else ("INBOX", "Sent Items"),
        sent="Sent" if breakage == "folder" else "Sent Items",
        echo_auth=True,
    ) as imap:
        if breakage == "search":
            imap.script("SEARCH", "NO [UNAVAILABLE] Search backend down")
        if breakage == "hang-up":
            imap.script("EXAMINE", "BYE")
        p = provider_of(smtp, folder_of(imap, folder="Sent Items"))
        again, events = await crash_and_recover(p, ("before", Write.OUTBOX_MARK_SENT), "skip")
    rec = await again.ops.outbox.get("k")
    assert rec is not None and rec.state == "unknown" and len(smtp.messages) == 1
    assert events == [AmbiguousEvent("k", RCPT, resent=False)]
    lines = [r.getMessage() for r in caplog.records]
    assert any("cannot tell" in line for line in lines)
    assert any(re.search(said, line) for line in lines), lines
    for secret in forbidden():
        assert all(secret not in line for line in lines)


async def test_direct_errors_never_carry_the_password(imap: FakeImap, smtp: FakeSmtp) -> None:
    wrong = ImapSentFolder(
        "127.0.0.1",
        imap.port,
        username=USER,
        password=PASSWORD + "x",
        security="plain",
        timeout=5,
        grace=0,
    )
    p = provider_of(smtp, wrong)
    imap.echo_auth = True
    with pytest.raises(ProviderError) as info:
        await p.resolve_ambiguous(Outbound(RCPT, "x"), "k", time.time())
    assert "AUTHENTICATIONFAILED" in str(info.value) and imap.auth_failures == 1
    for secret in forbidden(PASSWORD + "x"):
        assert secret not in str(info.value) and secret not in repr(p)


# -- append mode at send time ---------------------------------------------------------------


async def test_append_mode_files_one_copy_per_message_id(smtp: FakeSmtp, imap: FakeImap) -> None:
    p = provider_of(smtp, folder_of(imap, append=True))
    await p.send_keyed(Outbound(RCPT, "one"), "k")
    await p.send_keyed(Outbound(RCPT, "one"), "k")  # a resend: the copy is reused
    assert len(smtp.messages) == 2
    [copy] = imap.with_message_id("Sent", MID)
    assert "\\Draft" not in copy.flags
    appends = [c for c in imap.commands if " APPEND " in c]
    assert len(appends) == 1 and "(\\Draft \\Seen)" in appends[0]


async def test_append_mode_drops_the_copy_of_a_mail_the_server_refused(
    smtp: FakeSmtp, imap: FakeImap
) -> None:
    p = provider_of(smtp, folder_of(imap, append=True))
    smtp.script(RCPT, "no-such-user")
    with pytest.raises(SendError, match="550"):
        await p.send_keyed(Outbound(RCPT, "x"), "k")
    assert imap.with_message_id("Sent", MID) == []  # flagged \Deleted, expunged (UIDPLUS)
    assert any("UID EXPUNGE" in c for c in imap.commands)


async def test_append_mode_without_imap_sends_nothing(smtp: FakeSmtp) -> None:
    p = provider_of(smtp, folder_of(free_port(), append=True))
    with pytest.raises(SendError, match="nothing was sent") as info:
        await p.send_keyed(Outbound(RCPT, "x"), "k")
    assert info.value.retryable and smtp.messages == []
    assert all(s not in str(info.value) for s in forbidden())


async def test_append_mode_over_imaps_and_starttls(smtp: FakeSmtp, tmp_path: Path) -> None:
    server_ctx, client_ctx = self_signed(tmp_path)
    modes: list[tuple[Literal["implicit", "starttls"], str]] = [
        ("implicit", "imaps"),
        ("starttls", "starttls"),
    ]
    for mode, security in modes:
        with FakeImap(username=USER, password=PASSWORD, tls=mode, tls_context=server_ctx) as imap:
            folder = folder_of(imap, append=True, security=security, tls_context=client_ctx)
            p = provider_of(smtp, folder)
            await p.send_keyed(Outbound(RCPT, "x"), f"k-{mode}")
            mid = message_id_for(f"k-{mode}", "example.com")
            assert len(imap.with_message_id("Sent", mid)) == 1
            found = await p.resolve_ambiguous(Outbound(RCPT, "x"), f"k-{mode}", time.time())
            assert found is not None and found.message_id == mid


async def test_an_untrusted_imap_certificate_cannot_tell(smtp: FakeSmtp, tmp_path: Path) -> None:
    server_ctx, _ = self_signed(tmp_path)
    with FakeImap(username=USER, password=PASSWORD, tls="implicit", tls_context=server_ctx) as s:
        p = provider_of(smtp, folder_of(s, security="imaps"))
        with pytest.raises(ProviderError, match="certificate"):
            await p.resolve_ambiguous(Outbound(RCPT, "x"), "k", time.time())


# -- a real process killed while the SMTP server holds its answer --------------------------


async def _child(journal: str, mode: str) -> None:
    """``python -m tests.providers.test_email_imap JOURNAL send|recover``: the worker's email
    adapter from the environment, on a file journal. ``send`` sends "hello" under key ``k``
    (the test kills it while the SMTP server holds its answer); ``recover`` starts on the
    same journal, lets it settle and prints a JSON summary."""
    import json
    import os

    from tests.backends import BACKENDS

    kv = await BACKENDS["file"].open(Path(journal))
    provider = provider_from_env("email", os.environ)
    bot = Bot("mail", durability={"poll": 0, "outbox": {"on_ambiguous": "skip"}})
    async with bot.bind(provider, kv, instance_id="k1") as app:
        d = app.durability
        assert d is not None
        if mode == "send":
            print("SENDING", flush=True)
            await app.send(RCPT, "hello", idempotency_key="k")
        await d.drain()
        records = await d.outbox.list()
        summary = {
            "metrics": d.metrics(),
            "outbox": {r.key: [r.state, r.message_id] for r in records},
        }
    await kv.close()
    print(json.dumps(summary), flush=True)


@pytest.mark.crash
def test_sigkill_after_the_server_accepted_the_mail(imap: FakeImap, tmp_path: Path) -> None:
    import json
    import threading
    from urllib.parse import quote

    from tests.kill import Child, python

    accepted, release = threading.Event(), threading.Event()

    def file_then_hold(received: Received) -> None:
        imap.file("Sent", received.content)  # queued and filed; the client never hears 250
        accepted.set()
        release.wait(60)

    with FakeSmtp(username="bot", password=SMTP_PASSWORD, on_message=file_then_hold) as smtp:
        env = {
            "EMAIL_SMTP_URL": f"smtp://bot:{SMTP_PASSWORD}@127.0.0.1:{smtp.port}",
            "EMAIL_FROM": SENDER,
            "EMAIL_IMAP_URL": f"imap://{quote(USER, safe='')}:{quote(PASSWORD, safe='')}"
            f"@127.0.0.1:{imap.port}/Sent?grace=0s&timeout=5s",
        }
        journal = str(tmp_path / "journal")
        argv = python("-m", "tests.providers.test_email_imap", journal)
        try:
            with Child([*argv, "send"], env=env) as child:
                child.wait_for("SENDING")
                assert accepted.wait(60), child.tail()
                child.kill()
        finally:
            release.set()
        with Child([*argv, "recover"], env=env) as child:
            lines = child.finish()
        assert len(smtp.messages) == 1, "resent after the kill"
    summary = json.loads(lines[-1])
    assert summary["outbox"] == {"k": ["sent", MID]}
    m = summary["metrics"]
    assert (m["outboxResolvedSent"], m["outboxResolvedUnsent"], m["outboxAmbiguous"]) == (1, 0, 0)
    assert not any(PASSWORD in line or SMTP_PASSWORD in line for line in lines)


if __name__ == "__main__":
    import sys

    asyncio.run(_child(*sys.argv[1:3]))

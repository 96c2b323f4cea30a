"""A local IMAP4rev1 server (asyncio TCP, in its own thread) for the email adapter's tests.

It speaks the protocol ``imaplib`` speaks, byte for byte (RFC 3501), for the commands the
adapter uses and the answers it must survive:

- the greeting, ``CAPABILITY`` (``IMAP4rev1 UIDPLUS``; with ``tls="starttls"`` also
  ``STARTTLS`` and, until it ran, ``LOGINDISABLED``), ``STARTTLS``, ``NOOP``, ``LOGOUT``;
- ``LOGIN`` (quoted strings or atoms): a wrong pair gets ``NO [AUTHENTICATIONFAILED]``;
  ``echo_auth`` repeats the credentials in that answer (a careless server, for redaction);
- ``SELECT`` / ``EXAMINE`` (a folder that does not exist gets ``NO [NONEXISTENT]``),
  ``LIST`` (the folders, the sent one marked ``\\Sent`` as RFC 6154 does);
- ``SEARCH`` and ``UID SEARCH`` with ``ALL``, ``SINCE``, ``BEFORE``, ``HEADER``, ``DRAFT``,
  ``UNDRAFT``, ``DELETED``, ``UNDELETED``, ``SEEN``, ``UNSEEN`` (ANDed; other keys get
  ``BAD``); ``HEADER`` matches a substring of the header's value, case-insensitively;
- ``APPEND`` with flags, date-time and a synchronizing literal (``+ Ready`` before the
  bytes): ``OK [APPENDUID v uid]``, or ``NO [TRYCREATE]`` for a missing folder;
- ``UID STORE`` (``FLAGS``, ``+FLAGS``, ``-FLAGS``, with or without ``.SILENT``),
  ``UID EXPUNGE`` and ``EXPUNGE``.

``script(command, line)`` answers the next ``command`` (``"SEARCH"``, ``"APPEND"``,
``"SELECT"``…) with ``line`` (``"NO [UNAVAILABLE] try later"``, or ``"BYE"`` to hang up).
``file(folder, raw, flags=…)`` puts a message in a folder, as a server that files what
its SMTP accepted does. ``tls="implicit"`` speaks TLS from the first byte (port 993).

Use it as a context manager: ``with FakeImap(username=…, password=…) as imap: imap.port``.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import ssl
import threading
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from email.parser import BytesHeaderParser
from email.policy import default as default_policy
from types import TracebackType
from typing import Literal

_MONTHS = {
    m: i
    for i, m in enumerate(
        ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"], 1
    )
}
_TOKEN = re.compile(rb'\s*(?:(\()|(\))|"((?:\\.|[^"\\])*)"|([^\s()"]+))')
_LITERAL = re.compile(rb"\{(\d+)(\+?)\}$")


@dataclass
class Stored:
    """One message in a folder."""

    uid: int
    raw: bytes
    flags: set[str]
    internal: datetime

    def header(self, name: str) -> list[str]:
        parsed = BytesHeaderParser(policy=default_policy).parsebytes(self.raw)
        return [str(v) for v in parsed.get_all(name, [])]


@dataclass
class Folder:
    uidvalidity: int
    messages: list[Stored] = field(default_factory=list)
    uidnext: int = 1
    special: str | None = None


class _Literal(bytes):
    """A literal's bytes, told apart from an atom."""


Token = bytes | list["Token"]


def _parse(parts: list[bytes | _Literal]) -> list[Token]:
    """The tokens of a command (text with its literals), parentheses as nested lists."""
    stack: list[list[Token]] = [[]]
    for part in parts:
        if isinstance(part, _Literal):
            stack[-1].append(part)
            continue
        pos = 0
        while pos < len(part):
            m = _TOKEN.match(part, pos)
            if m is None or m.end() == pos:
                break
            pos = m.end()
            if m.group(1):
                stack.append([])
            elif m.group(2):
                inner = stack.pop()
                stack[-1].append(inner)
            elif m.group(3) is not None:
                stack[-1].append(re.sub(rb"\\(.)", rb"\1", m.group(3)))
            elif m.group(4):
                stack[-1].append(m.group(4))
    return stack[0]


def _date(text: bytes) -> date:
    day, month, year = text.decode().split("-")
    return date(int(year), _MONTHS[month.upper()], int(day))


class BadCommand(Exception):
    pass


class FakeImap:
    def __init__(
        self,
        *,
        username: str = "bot",
        password: str = "secret",
        folders: tuple[str, ...] = ("INBOX", "Sent", "Drafts"),
        sent: str = "Sent",
        tls: Literal["starttls", "implicit"] | None = None,
        tls_context: ssl.SSLContext | None = None,
        echo_auth: bool = False,
    ) -> None:
        if tls is not None and tls_context is None:
            raise ValueError("tls needs a tls_context (see tests/providers/fakes/smtp.self_signed)")
        self.username = username
        self.password = password
        self.tls = tls
        self.tls_context = tls_context
        self.echo_auth = echo_auth
        self.folders: dict[str, Folder] = {
            name: Folder(uidvalidity=1000 + i, special="\\Sent" if name == sent else None)
            for i, name in enumerate(folders)
        }
        #: Every command line received (``LOGIN`` without its arguments), in order.
        self.commands: list[str] = []
        self.logins: list[str] = []
        self.auth_failures = 0
        self._scripted: dict[str, list[str]] = {}
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self.port = 0

    # -- the test's side -----------------------------------------------------------------

    def script(self, command: str, line: str) -> None:
        """Answer the next ``command`` with ``line`` (``"BYE"``: close the connection)."""
        with self._lock:
            self._scripted.setdefault(command.upper(), []).append(line)

    def file(
        self,
        folder: str,
        raw: bytes,
        *,
        flags: tuple[str, ...] = ("\\Seen",),
        when: datetime | None = None,
    ) -> int:
        """Put ``raw`` in ``folder``; its UID."""
        with self._lock:
            return self._store(self.folders[folder], raw, set(flags), when or datetime.now(UTC))

    def messages(self, folder: str) -> list[Stored]:
        with self._lock:
            return list(self.folders[folder].messages)

    def with_message_id(self, folder: str, message_id: str) -> list[Stored]:
        return [m for m in self.messages(folder) if message_id in m.header("Message-ID")]

    # -- lifecycle ------------------------------------------------------------------------

    def __enter__(self) -> FakeImap:
        self._thread = threading.Thread(target=self._run, name="fake-imap", daemon=True)
        self._thread.start()
        self._ready.wait(10)
        if not self.port:
            raise RuntimeError("the fake IMAP server did not start")
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None:
            loop.call_soon_threadsafe(stop.set)
        if self._thread is not None:
            self._thread.join(10)

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._main())
        finally:
            loop.close()

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        implicit = self.tls_context if self.tls == "implicit" else None
        server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=implicit)
        self.port = int(server.sockets[0].getsockname()[1])
        self._ready.set()
        await self._stop.wait()
        server.close()
        for writer in list(self._writers):
            writer.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await server.wait_closed()

    # -- the protocol ---------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        session = _Session(self, reader, writer, tls=self.tls == "implicit")
        self._writers.add(writer)
        try:
            await session.run()
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    def _store(self, folder: Folder, raw: bytes, flags: set[str], when: datetime) -> int:
        uid = folder.uidnext
        folder.uidnext += 1
        folder.messages.append(Stored(uid, raw, flags, when))
        return uid

    def _next_script(self, command: str) -> str | None:
        with self._lock:
            queue = self._scripted.get(command)
            return queue.pop(0) if queue else None


class _Session:
    def __init__(
        self,
        server: FakeImap,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        tls: bool,
    ) -> None:
        self.s = server
        self.reader = reader
        self.writer = writer
        self.tls = tls
        self.user: str | None = None
        self.selected: Folder | None = None
        self.readonly = False

    async def send(self, line: str) -> None:
        self.writer.write(line.encode() + b"\r\n")
        await self.writer.drain()

    async def run(self) -> None:
        await self.send("* OK FakeImap IMAP4rev1 ready")
        while True:
            parts = await self._read_command()
            if parts is None:
                return
            head = parts[0] if isinstance(parts[0], bytes) else b""
            bits = head.split(None, 2)
            if len(bits) < 2:
                await self.send("* BAD no tag or command")
                continue
            tag, name = bits[0].decode(), bits[1].decode().upper()
            rest: list[bytes | _Literal] = [bits[2] if len(bits) > 2 else b"", *parts[1:]]
            uid = False
            if name == "UID":
                sub = rest[0].split(None, 1) if isinstance(rest[0], bytes) else []
                if not sub:
                    await self.send(f"{tag} BAD UID needs a command")
                    continue
                uid, name = True, sub[0].decode().upper()
                rest[0] = sub[1] if len(sub) > 1 else b""
            shown = "LOGIN" if name == "LOGIN" else head.decode("utf-8", "replace")
            with self.s._lock:
                self.s.commands.append(shown)
            scripted = self.s._next_script(name)
            if scripted == "BYE":
                await self.send("* BYE going away")
                return
            if scripted is not None:
                await self.send(f"{tag} {scripted}")
                continue
            try:
                done = await self._dispatch(tag, name, _parse(rest), uid)
            except BadCommand as exc:
                await self.send(f"{tag} BAD {exc}")
                continue
            if done:
                return

    async def _read_command(self) -> list[bytes | _Literal] | None:
        parts: list[bytes | _Literal] = []
        while True:
            line = await self.reader.readline()
            if not line:
                return None
            line = line.rstrip(b"\r\n")
            m = _LITERAL.search(line)
            if m is None:
                parts.append(line)
                return parts
            parts.append(line[: m.start()])
            if not m.group(2):
                await self.send("+ Ready for literal data")
            parts.append(_Literal(await self.reader.readexactly(int(m.group(1)))))

    async def _dispatch(self, tag: str, name: str, args: list[Token], uid: bool) -> bool:
        s = self.s
        if name == "CAPABILITY":
            caps = ["IMAP4rev1", "UIDPLUS", "LIST-EXTENDED"]
            if s.tls == "starttls" and not self.tls:
                caps += ["STARTTLS", "LOGINDISABLED"]
            await self.send("* CAPABILITY " + " ".join(caps))
            await self.send(f"{tag} OK CAPABILITY completed")
        elif name == "NOOP":
            await self.send(f"{tag} OK NOOP completed")
        elif name == "LOGOUT":
            await self.send("* BYE FakeImap logging out")
            await self.send(f"{tag} OK LOGOUT completed")
            return True
        elif name == "STARTTLS":
            if s.tls != "starttls" or self.tls:
                raise BadCommand("STARTTLS not available")
            await self.send(f"{tag} OK Begin TLS negotiation now")
            assert s.tls_context is not None
            await self.writer.start_tls(s.tls_context)
            self.tls = True
        elif name == "LOGIN":
            await self._login(tag, args)
        elif self.user is None:
            raise BadCommand(f"{name} needs LOGIN first")
        elif name in ("SELECT", "EXAMINE"):
            await self._select(tag, name, args)
        elif name == "LIST":
            for fname, folder in s.folders.items():
                attrs = "\\HasNoChildren" + (f" {folder.special}" if folder.special else "")
                await self.send(f'* LIST ({attrs}) "/" "{fname}"')
            await self.send(f"{tag} OK LIST completed")
        elif name == "APPEND":
            await self._append(tag, args)
        elif self.selected is None:
            raise BadCommand(f"{name} needs a selected folder")
        elif name == "SEARCH":
            await self._search(tag, args, uid)
        elif name == "STORE":
            await self._store_flags(tag, args, uid)
        elif name == "EXPUNGE":
            await self._expunge(tag, args if uid else None)
        elif name == "CLOSE":
            self.selected = None
            await self.send(f"{tag} OK CLOSE completed")
        else:
            raise BadCommand(f"unknown command {name}")
        return False

    async def _login(self, tag: str, args: list[Token]) -> None:
        s = self.s
        if s.tls == "starttls" and not self.tls:
            raise BadCommand("LOGIN is disabled before STARTTLS")
        if len(args) != 2 or not all(isinstance(a, bytes) for a in args):
            raise BadCommand("LOGIN needs a user and a password")
        user, password = (a.decode() for a in args if isinstance(a, bytes))
        if (user, password) != (s.username, s.password):
            with s._lock:
                s.auth_failures += 1
            echo = f' (got "{user}" "{password}")' if s.echo_auth else ""
            await self.send(f"{tag} NO [AUTHENTICATIONFAILED] Invalid credentials{echo}")
            return
        self.user = user
        with s._lock:
            s.logins.append(user)
        await self.send(f"{tag} OK [CAPABILITY IMAP4rev1 UIDPLUS] Logged in")

    def _folder_arg(self, args: list[Token]) -> str:
        if not args or not isinstance(args[0], bytes):
            raise BadCommand("a folder name is needed")
        return args[0].decode()

    async def _select(self, tag: str, name: str, args: list[Token]) -> None:
        fname = self._folder_arg(args)
        folder = self.s.folders.get(fname)
        self.selected = None
        if folder is None:
            await self.send(f"{tag} NO [NONEXISTENT] Mailbox doesn't exist: {fname}")
            return
        self.selected, self.readonly = folder, name == "EXAMINE"
        with self.s._lock:
            count = len(folder.messages)
            uidnext = folder.uidnext
        await self.send(r"* FLAGS (\Answered \Flagged \Deleted \Seen \Draft)")
        await self.send(f"* {count} EXISTS")
        await self.send("* 0 RECENT")
        await self.send(f"* OK [UIDVALIDITY {folder.uidvalidity}] UIDs valid")
        await self.send(f"* OK [UIDNEXT {uidnext}] Predicted next UID")
        mode = "READ-ONLY" if self.readonly else "READ-WRITE"
        await self.send(f"{tag} OK [{mode}] {name} completed")

    async def _append(self, tag: str, args: list[Token]) -> None:
        fname = self._folder_arg(args)
        flags: set[str] = set()
        when = datetime.now(UTC)
        rest = args[1:]
        if rest and isinstance(rest[0], list):
            flags = {f.decode() for f in rest[0] if isinstance(f, bytes)}
            rest = rest[1:]
        if len(rest) == 2 and isinstance(rest[0], bytes) and not isinstance(rest[0], _Literal):
            when = datetime.strptime(rest[0].decode(), "%d-%b-%Y %H:%M:%S %z")
            rest = rest[1:]
        if len(rest) != 1 or not isinstance(rest[0], _Literal):
            raise BadCommand("APPEND needs a literal message")
        folder = self.s.folders.get(fname)
        if folder is None:
            await self.send(f"{tag} NO [TRYCREATE] Mailbox doesn't exist: {fname}")
            return
        with self.s._lock:
            uid = self.s._store(folder, bytes(rest[0]), flags, when)
        await self.send(f"{tag} OK [APPENDUID {folder.uidvalidity} {uid}] APPEND completed")

    def _matches(self, m: Stored, keys: list[Token]) -> bool:
        i = 0
        while i < len(keys):
            key = keys[i]
            if not isinstance(key, bytes):
                raise BadCommand("parenthesised search keys are not supported")
            word = key.decode().upper()
            i += 1
            if word == "ALL":
                continue
            if word in ("SINCE", "BEFORE"):
                if i >= len(keys) or not isinstance(keys[i], bytes):
                    raise BadCommand(f"{word} needs a date")
                value = keys[i]
                assert isinstance(value, bytes)
                i += 1
                try:
                    day = _date(value)
                except (ValueError, KeyError):
                    raise BadCommand(f"bad date {value!r}") from None
                got = m.internal.astimezone(UTC).date()
                if (word == "SINCE" and got < day) or (word == "BEFORE" and got >= day):
                    return False
            elif word == "HEADER":
                if i + 1 >= len(keys):
                    raise BadCommand("HEADER needs a field and a string")
                name, needle = keys[i], keys[i + 1]
                i += 2
                assert isinstance(name, bytes) and isinstance(needle, bytes)
                want = needle.decode().lower()
                if not any(want in v.lower() for v in m.header(name.decode())):
                    return False
            elif word in ("DRAFT", "DELETED", "SEEN", "UNDRAFT", "UNDELETED", "UNSEEN"):
                flag = "\\" + word.removeprefix("UN").capitalize()
                if (flag in m.flags) == word.startswith("UN"):
                    return False
            else:
                raise BadCommand(f"unsupported search key {word}")
        return True

    async def _search(self, tag: str, args: list[Token], uid: bool) -> None:
        assert self.selected is not None
        with self.s._lock:
            messages = list(self.selected.messages)
        hits = [
            str(m.uid if uid else n) for n, m in enumerate(messages, 1) if self._matches(m, args)
        ]
        await self.send("* SEARCH" + "".join(f" {h}" for h in hits))
        await self.send(f"{tag} OK SEARCH completed")

    def _uids(self, text: bytes) -> set[int]:
        out: set[int] = set()
        for piece in text.decode().split(","):
            lo, _, hi = piece.partition(":")
            out.update(range(int(lo), int(hi or lo) + 1))
        return out

    async def _store_flags(self, tag: str, args: list[Token], uid: bool) -> None:
        assert self.selected is not None
        if self.readonly:
            await self.send(f"{tag} NO [READ-ONLY] the folder was opened with EXAMINE")
            return
        if len(args) != 3 or not isinstance(args[0], bytes) or not isinstance(args[1], bytes):
            raise BadCommand("STORE needs a set, an item and flags")
        wanted = self._uids(args[0])
        item = args[1].decode().upper()
        values = args[2] if isinstance(args[2], list) else [args[2]]
        flags = {f.decode() for f in values if isinstance(f, bytes)}
        lines: list[str] = []
        with self.s._lock:
            for n, m in enumerate(self.selected.messages, 1):
                if (m.uid if uid else n) not in wanted:
                    continue
                if item.startswith("+FLAGS"):
                    m.flags |= flags
                elif item.startswith("-FLAGS"):
                    m.flags -= flags
                elif item.startswith("FLAGS"):
                    m.flags = set(flags)
                else:
                    raise BadCommand(f"unknown STORE item {item}")
                if not item.endswith(".SILENT"):
                    lines.append(f"* {n} FETCH (UID {m.uid} FLAGS ({' '.join(sorted(m.flags))}))")
        for line in lines:
            await self.send(line)
        await self.send(f"{tag} OK STORE completed")

    async def _expunge(self, tag: str, args: list[Token] | None) -> None:
        assert self.selected is not None
        wanted = None
        if args is not None:
            if not args or not isinstance(args[0], bytes):
                raise BadCommand("UID EXPUNGE needs a set")
            wanted = self._uids(args[0])
        gone: list[int] = []
        with self.s._lock:
            kept: list[Stored] = []
            for n, m in enumerate(self.selected.messages, 1):
                if "\\Deleted" in m.flags and (wanted is None or m.uid in wanted):
                    gone.append(n)
                else:
                    kept.append(m)
            self.selected.messages = kept
        for offset, n in enumerate(gone):
            await self.send(f"* {n - offset} EXPUNGE")
        await self.send(f"{tag} OK EXPUNGE completed")

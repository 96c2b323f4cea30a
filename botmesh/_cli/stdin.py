"""The runtime of ``botmesh run`` (``botmesh._cli.run``): a bot in this process with stdin as
its transport.

Each line of stdin is one inbound message: plain text for one chat, or (``json_lines``) an
inbound record as it travels on the inbound topic (``{"v": 1, "id": ..., "chat_id": ...}``).
A line gets the id ``stdin:<chat>:<line number>:<hash of the text>``, whether it comes from
a file, a pipe or a terminal: the same lines fed again, in the same order, are the same
messages, answered from the journal and not sent twice (each such line is reported as a
``duplicate``). At a terminal a prompt asks for each line. At the end of input the runtime
finishes what is due (enqueued sends, retries that are due now) and stops.

Lines are UTF-8: a line that is not (or a record that cannot be decoded) is skipped with its
line number and reason, and the lines after it are handled. An outcome other than
``handled`` and every error is reported on stderr. The exit status is 0, or 1 when a line
was skipped, could not be journaled (``JournalUnavailableError``) or was refused.
"""

from __future__ import annotations

import asyncio
import hashlib
import sys
from collections.abc import AsyncIterator, Mapping
from typing import TextIO

import msgspec

from botmesh._bot.bot import Bot
from botmesh.state.errors import BadRecord, JournalUnavailableError
from botmesh.state.inbox import Outcome
from botmesh.state.messages import Inbound
from botmesh.state.ports import Provider
from botmesh.topics.records import decode_inbound

__all__ = ["run_stdin"]

PROMPT = "> "

_OUTCOMES = {
    Outcome.DUPLICATE: "duplicate: handled before (the same line at the same place); "
    "answered from the journal, nothing sent again",
}


def _inbound(line: str, n: int, chat: str, json_lines: bool) -> Inbound:
    digest = hashlib.sha256(line.encode()).hexdigest()[:12]
    if json_lines:
        message = decode_inbound(line.encode())
        if not message.id:
            return msgspec.structs.replace(message, id=f"stdin:{n}:{digest}")
        return message
    return Inbound(id=f"stdin:{chat}:{n}:{digest}", chat_id=chat, text=line)


class _NotText(ValueError):
    """A line that is not UTF-8 text."""


def _decoded(raw: bytes | str) -> str:
    """The line as text; ``_NotText`` when it is not UTF-8 (a byte sequence, or a text
    stream's undecodable bytes carried as surrogates), naming the column."""
    try:
        data = raw if isinstance(raw, bytes) else raw.encode("utf-8", "surrogateescape")
        return data.decode("utf-8")
    except (UnicodeDecodeError, UnicodeEncodeError) as exc:
        bad = exc.object[exc.start : exc.start + 1] if isinstance(exc.object, bytes) else b""
        what = f"byte 0x{bad.hex()}" if bad else "a character"
        raise _NotText(
            f"not UTF-8 text ({what} at column {exc.start + 1}); botmesh run reads UTF-8"
        ) from None


async def _lines(source: TextIO, prompt: TextIO | None) -> AsyncIterator[bytes | str]:
    """The lines of ``source`` (as bytes when it has a binary buffer, so that an undecodable
    byte is reported on its line instead of ending the run); ``prompt`` shows the prompt
    before each one."""
    binary = getattr(source, "buffer", None)
    read = binary.readline if binary is not None else source.readline
    while True:
        if prompt is not None:
            prompt.write(PROMPT)
            prompt.flush()
        line = await asyncio.to_thread(read)
        if not line:
            if prompt is not None:
                prompt.write("\n")
            return
        yield line


async def run_stdin(
    bot: Bot,
    provider: Provider,
    *,
    journal: str | None,
    chat: str = "console",
    json_lines: bool = False,
    instance_id: str | None = None,
    stdin: TextIO | None = None,
    stderr: TextIO | None = None,
    fallbacks: Mapping[str, Provider] | None = None,
) -> int:
    """Feed ``stdin`` to ``bot`` line by line; returns the exit status."""
    source = stdin if stdin is not None else sys.stdin
    err = stderr if stderr is not None else sys.stderr
    status = 0
    typed = source.isatty()
    async with bot.bind(provider, journal, instance_id=instance_id, fallbacks=fallbacks) as app:
        if typed:
            print(
                f"botmesh run: {bot.scope} in chat {chat!r}, journal {journal or 'none'}; "
                "one message a line, Ctrl-D ends",
                file=err,
            )
        n = 0
        async for raw in _lines(source, err if typed else None):
            n += 1
            try:
                text = _decoded(raw).rstrip("\r\n")
                if not text.strip():
                    continue
                outcome = await app.handle(_inbound(text, n, chat, json_lines))
            except (BadRecord, _NotText) as exc:
                print(f"botmesh run: line {n} skipped: {exc}", file=err)
                status = 1
                continue
            except JournalUnavailableError as exc:
                print(f"botmesh run: line {n} not handled (journal): {exc}", file=err)
                status = 1
                continue
            if outcome != Outcome.HANDLED:
                print(f"botmesh run: line {n}: {_OUTCOMES.get(outcome, outcome)}", file=err)
        if app.durability is not None:
            await app.durability.drain()
    return status

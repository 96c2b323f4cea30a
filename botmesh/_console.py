"""``botmesh run``: a bot in this process with stdin as its transport.

Each line of stdin is one inbound message: plain text for one chat, or (``json_lines``) an
inbound record as it travels on the inbound topic (``{"v": 1, "id": ..., "chat_id": ...}``).
A line read from a file or a pipe gets the id ``stdin:<chat>:<line number>:<hash of the
text>``, so feeding the same file twice replays the same messages (they are answered from
the journal, not twice); a line typed at a terminal gets a fresh id. At the end of input
the runtime finishes what is due (enqueued sends, retries that are due now) and stops.

An outcome other than ``handled`` and every error is reported on stderr; a record that
cannot be decoded is skipped with its reason. The exit status is 0, or 1 when a message
could not be journaled (``JournalUnavailableError``) or was refused.
"""

from __future__ import annotations

import asyncio
import hashlib
import sys
import time
from collections.abc import Mapping
from typing import TextIO

import msgspec

from botmesh._bot import Bot
from botmesh.state.errors import BadRecord, JournalUnavailableError
from botmesh.state.inbox import Outcome
from botmesh.state.messages import Inbound
from botmesh.state.ports import Provider
from botmesh.topics.records import decode_inbound

__all__ = ["run_console"]


def _inbound(line: str, n: int, chat: str, json_lines: bool, typed: bool) -> Inbound:
    digest = hashlib.sha256(line.encode()).hexdigest()[:12]
    if typed:  # a terminal: every line is a new message
        digest = f"{time.time_ns()}"
    if json_lines:
        message = decode_inbound(line.encode())
        if not message.id:
            return msgspec.structs.replace(message, id=f"stdin:{n}:{digest}")
        return message
    return Inbound(id=f"stdin:{chat}:{n}:{digest}", chat_id=chat, text=line)


async def run_console(
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
        n = 0
        while line := await asyncio.to_thread(source.readline):
            text = line.rstrip("\n")
            if not text.strip():
                continue
            n += 1
            try:
                outcome = await app.handle(_inbound(text, n, chat, json_lines, typed))
            except BadRecord as exc:
                print(f"botmesh run: line {n} skipped: {exc}", file=err)
                status = 1
                continue
            except JournalUnavailableError as exc:
                print(f"botmesh run: line {n} not handled (journal): {exc}", file=err)
                status = 1
                continue
            if outcome != Outcome.HANDLED:
                print(f"botmesh run: line {n}: {outcome}", file=err)
        if app.durability is not None:
            await app.durability.drain()
    return status

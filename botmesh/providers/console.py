"""``ConsoleProvider``: prints each send to a stream; the provider of the demo."""

from __future__ import annotations

import itertools
import sys
from typing import TextIO

from botmesh.state.messages import Outbound, SendResult

__all__ = ["ConsoleProvider"]


class ConsoleProvider:
    """Writes ``[chat] text`` lines; ``quiet=True`` counts without printing."""

    def __init__(
        self,
        name: str = "console",
        *,
        stream: TextIO | None = None,
        text_limit: int | None = 4096,
        quiet: bool = False,
    ) -> None:
        self.name = name
        self.text_limit = text_limit
        self.stream = stream if stream is not None else sys.stdout
        self.quiet = quiet
        self.count = 0
        self._ids = itertools.count(1)

    async def send(self, message: Outbound) -> SendResult:
        self.count += 1
        if not self.quiet:
            self.stream.write(f"[{message.chat_id}] {message.text or ''}\n")
            self.stream.flush()
        return SendResult(f"{self.name}-{next(self._ids)}")

"""``MockProvider``: records every call and can be told to fail. The fake channel of tests."""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from dataclasses import dataclass

from botmesh.state.messages import Outbound, SendResult

__all__ = ["MockProvider", "SentCall"]


@dataclass(frozen=True, slots=True)
class SentCall:
    """One call the provider accepted (or refused, with ``error`` set)."""

    message: Outbound
    message_id: str | None
    error: BaseException | None = None


class MockProvider:
    """A provider that accepts every send and remembers it.

    ``fail_next(err, times=n)`` makes the next ``n`` calls raise ``err``; ``fail_chat`` makes
    every call for one chat raise. ``delay`` (seconds) simulates a slow channel.
    """

    def __init__(
        self, name: str = "mock", *, text_limit: int | None = None, delay: float = 0.0
    ) -> None:
        self.name = name
        self.text_limit = text_limit
        self.delay = delay
        self.calls: list[SentCall] = []
        self._failures: deque[BaseException] = deque()
        self._chat_failures: dict[str, BaseException] = {}
        self._ids = itertools.count(1)

    def fail_next(self, error: BaseException, times: int = 1) -> None:
        self._failures.extend([error] * times)

    def fail_chat(self, chat_id: str, error: BaseException | None) -> None:
        if error is None:
            self._chat_failures.pop(chat_id, None)
        else:
            self._chat_failures[chat_id] = error

    @property
    def sent(self) -> list[Outbound]:
        """Messages the provider accepted, in call order."""
        return [c.message for c in self.calls if c.error is None]

    async def send(self, message: Outbound) -> SendResult:
        if self.delay:
            await asyncio.sleep(self.delay)
        error = self._chat_failures.get(message.chat_id)
        if error is None and self._failures:
            error = self._failures.popleft()
        if error is not None:
            self.calls.append(SentCall(message, None, error))
            raise error
        mid = f"{self.name}-{next(self._ids)}"
        self.calls.append(SentCall(message, mid))
        return SendResult(mid)

"""``MockProvider``: records every call and can be told to fail. The fake channel of tests."""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from dataclasses import dataclass

from botmesh.state.errors import SendError
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

    It edits and deletes the messages it accepted (``texts`` holds each one's text now,
    ``edits`` and ``deletes`` every such call) and records typing indicators (``typings``).
    """

    def __init__(
        self,
        name: str = "mock",
        *,
        text_limit: int | None = None,
        delay: float = 0.0,
        delivery_statuses: bool = False,
    ) -> None:
        self.name = name
        #: Whether the channel it stands for posts status webhooks (the statuses are fed by
        #: the test: ``Runtime.delivery_status``).
        self.delivery_statuses = delivery_statuses
        self.text_limit = text_limit
        self.delay = delay
        self.calls: list[SentCall] = []
        self._failures: deque[BaseException] = deque()
        self._chat_failures: dict[str, BaseException] = {}
        self._ids = itertools.count(1)
        #: The text of each message accepted and not deleted, by message id.
        self.texts: dict[str, str | None] = {}
        #: Every edit call: (message id, new text); every delete call: message id.
        self.edits: list[tuple[str, str | None]] = []
        self.deletes: list[str] = []
        #: The chats a typing indicator was shown in, in call order.
        self.typings: list[str] = []

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
        self.texts[mid] = message.text
        return SendResult(mid)

    def _failure(self, chat_id: str) -> BaseException | None:
        error = self._chat_failures.get(chat_id)
        if error is None and self._failures:
            error = self._failures.popleft()
        return error

    async def edit(self, message: Outbound, message_id: str) -> SendResult:
        error = self._failure(message.chat_id)
        if error is not None:
            raise error
        self.edits.append((message_id, message.text))
        if message_id not in self.texts:
            raise SendError(f"{self.name}: no message {message_id!r} to edit", retryable=False)
        self.texts[message_id] = message.text
        return SendResult(message_id)

    async def delete(self, chat_id: str, message_id: str) -> None:
        error = self._failure(chat_id)
        if error is not None:
            raise error
        self.deletes.append(message_id)
        self.texts.pop(message_id, None)  # already gone: no error

    async def typing(self, chat_id: str) -> None:
        self.typings.append(chat_id)

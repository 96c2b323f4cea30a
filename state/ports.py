"""The ports that adapters implement: ``Provider`` (a channel) lives here; ``DurableKv`` (a
journal backend) lives in ``state.kv``."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from state.messages import Outbound, SendResult

__all__ = ["Provider"]


@runtime_checkable
class Provider(Protocol):
    """A channel adapter. ``send`` raises a ``SendError`` subclass on failure; its
    ``retryable`` field decides between a retry and the dead-letter queue."""

    name: str
    #: Longest text one message may carry on this channel; ``None`` means no limit.
    text_limit: int | None

    async def send(self, message: Outbound) -> SendResult: ...

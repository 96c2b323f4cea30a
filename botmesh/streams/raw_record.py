"""One consumed record as the worker's inbound path takes it (``RawRecord``): plain
fields, so the consumer loop and tests hand the runner the same thing."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["RawRecord"]


@dataclass(frozen=True, slots=True)
class RawRecord:
    """A record of an inbound, requests or control partition, where it was read."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes]] = ()
    #: The record's timestamp in seconds (Kafka's, producer time), when known: it orders a
    #: chat's inbound and request records of one batch.
    timestamp: float | None = None

    @property
    def where(self) -> str:
        return f"{self.topic}:{self.partition}:{self.offset}"

"""Durability events, as emitted on the bot (``bot.on("durability:dead", cb)``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["AMBIGUOUS", "DEAD", "AmbiguousEvent", "DeadEvent"]

DEAD = "durability:dead"
AMBIGUOUS = "durability:ambiguous"


@dataclass(frozen=True, slots=True)
class DeadEvent:
    """A record was dead-lettered: ``kind`` inbox or outbox, ``id`` the inbound id or the
    idempotency key, ``error`` why."""

    kind: Literal["inbox", "outbox"]
    id: str
    error: str


@dataclass(frozen=True, slots=True)
class AmbiguousEvent:
    """A send was found in flight after a crash; ``resent`` says which policy applied."""

    key: str
    chat_id: str
    resent: bool

"""The events a running bot emits, one typed class each.

Listen with ``bot.on(DeadEvent, listener)`` (or ``@bot.on(DeadEvent)``); the listener gets
an instance of that class. ``name`` keeps the reference's event name for logs and operators.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeAlias

from botmesh.state.errors import Reason
from botmesh.state.messages import Receipt

if TYPE_CHECKING:  # erasure.py emits these events: only the type is needed here
    from botmesh.state.erasure import ErasureReceipt

__all__ = [
    "AmbiguousEvent",
    "DeadEvent",
    "Emit",
    "ErasedEvent",
    "ErrorEvent",
    "Event",
    "FallbackEvent",
    "FlowEndedEvent",
    "FlowStatus",
    "SentEvent",
]

#: How a flow ended: it returned (``done``), the chat cancelled it (``cancelled``, also when
#: another flow replaced it), an ask timed out (``timed_out``), it raised (``failed``), or
#: an operator or ``on_incompatible="drop"`` dropped its checkpoint (``dropped``).
FlowStatus = Literal["done", "cancelled", "timed_out", "failed", "dropped"]


@dataclass(frozen=True, slots=True)
class SentEvent:
    """A send went out (each part); ``background`` when the sweeper delivered it."""

    name: ClassVar[str] = "sent"
    receipt: Receipt
    background: bool


@dataclass(frozen=True, slots=True)
class DeadEvent:
    """A record was dead-lettered: ``kind`` inbox or outbox, ``id`` the inbound id or the
    idempotency key, ``reason`` why, ``error`` the last error's message."""

    name: ClassVar[str] = "durability:dead"
    kind: Literal["inbox", "outbox"]
    id: str
    reason: Reason
    error: str


@dataclass(frozen=True, slots=True)
class AmbiguousEvent:
    """A send was found in flight after a crash; ``resent`` says which policy applied."""

    name: ClassVar[str] = "durability:ambiguous"
    key: str
    chat_id: str
    resent: bool


@dataclass(frozen=True, slots=True)
class FallbackEvent:
    """The channel refused send ``key`` with ``error`` (an error name its fallback lists):
    its fallback goes out instead, under ``fallback_key``, through ``channel`` (``None``:
    the bot's own). Emitted once per send: the switch is one journal write."""

    name: ClassVar[str] = "durability:fallback"
    key: str
    fallback_key: str
    error: str
    channel: str | None = None


@dataclass(frozen=True, slots=True)
class ErasedEvent:
    """The journal records of ``chat_id`` were erased (``app.durability.erase_chat``, or the
    ``erase_chat`` control action on Kafka); ``receipt`` says what went (no message text)."""

    name: ClassVar[str] = "durability:erased"
    chat_id: str
    receipt: ErasureReceipt


@dataclass(frozen=True, slots=True)
class ErrorEvent:
    """Something failed that the bot reports rather than raises: a handler, a listener, a
    journal write the engine retries later. ``inbound_id`` names the message when there is
    one; ``where`` says what was running (``handler``, ``inbox.mark_done``, ``sweeper``…)."""

    name: ClassVar[str] = "error"
    error: BaseException
    where: str
    inbound_id: str | None = None


@dataclass(frozen=True, slots=True)
class FlowEndedEvent:
    """A conversation flow ended in ``chat_id``: ``flow`` its name, ``status`` how,
    ``result`` what it returned (``done``, or a flow that caught its cancel or timeout and
    returned), ``error`` what ended it otherwise. Delivered at least once: a turn replayed
    after a crash before its checkpoint landed ends the flow again."""

    name: ClassVar[str] = "flow:ended"
    flow: str
    chat_id: str
    status: FlowStatus
    result: Any = None
    error: BaseException | None = None


Event = (
    SentEvent
    | DeadEvent
    | AmbiguousEvent
    | FallbackEvent
    | ErasedEvent
    | ErrorEvent
    | FlowEndedEvent
)

#: Delivers an event to the bot's listeners (never raises): the engine's ``hooks.emit``.
Emit: TypeAlias = Callable[[Event], Awaitable[None]]

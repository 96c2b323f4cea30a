"""What the parts of the bot library ask of each other, said once.

The runtime's core (``core.py``) runs a turn: it builds the ``Turn`` of an inbound and the
``Context`` a handler gets, and hands both to the flow runner. The context and the flow
runner never see the core itself: they take it as a ``Host`` (the provider, the engine once
the journal is open, the clock, the events, the send path), and the core and the runtime
read a bot as a ``Definition`` (its names, its policy, its ``Registry``). So each module of
this package imports only the ones below it, and none reads another's private attributes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from botmesh._bot.flow import Flow
from botmesh.state.config import DurabilityConfig
from botmesh.state.edits import Change
from botmesh.state.engine import Engine
from botmesh.state.events import Event
from botmesh.state.fallback import Fallback
from botmesh.state.kv import Op
from botmesh.state.messages import Inbound, Outbound, Receipt
from botmesh.state.ports import Provider
from botmesh.state.timing import Timing

if TYPE_CHECKING:
    from botmesh.state.records import Json

__all__ = [
    "AfterSend",
    "BeforeSend",
    "Definition",
    "FlowStarter",
    "Handler",
    "Host",
    "Received",
    "Registry",
    "Slot",
    "Turn",
]

#: A message handler: ``async def handler(ctx: Context) -> None``.
Handler = Callable[[Any], Awaitable[None]]
#: ``before_send``: may return a changed ``Outbound`` (or ``None`` to keep it).
BeforeSend = Callable[[Outbound], "Outbound | Awaitable[Outbound | None] | None"]
#: ``after_send``: called with the receipt of each part that went out.
AfterSend = Callable[[Receipt], object]


@dataclass
class Registry:
    """What a bot registered: its handlers (each with the predicate that picks its
    inbounds, ``None`` for all), its event listeners by event type, its send hooks and its
    flows by name. ``Bot`` fills it; the runtime reads it."""

    handlers: list[tuple[Callable[[Inbound], bool] | None, Handler]] = field(default_factory=list)
    listeners: dict[type, list[Callable[[Any], object]]] = field(default_factory=dict)
    before_send: list[BeforeSend] = field(default_factory=list)
    after_send: list[AfterSend] = field(default_factory=list)
    flows: dict[str, Flow[Any]] = field(default_factory=dict)


class Definition(Protocol):
    """A bot as the runtime reads it (``Bot`` is one)."""

    @property
    def bot_id(self) -> str: ...

    @property
    def connection_id(self) -> str: ...

    @property
    def scope(self) -> str: ...

    @property
    def config(self) -> DurabilityConfig: ...

    @property
    def registry(self) -> Registry: ...


@dataclass(slots=True)
class Slot:
    """A chat's flow as a turn read it: the record and the version to compare-and-set."""

    key: str
    record: Json | None
    version: int
    journaled: bool


@dataclass(slots=True)
class Turn:
    """One inbound's run through the handlers and flows: what its context and the flow
    runner share. ``sends`` counts the sends keyed from the inbound (``<id>:<n>``);
    ``flow`` is the chat's flow once read; ``riders`` are the journal writes that land
    with the inbound's done (a flow checkpoint), by key."""

    message: Inbound
    sends: int = 0
    flow: Slot | None = None
    riders: dict[str, Op] = field(default_factory=dict)


class Received(Protocol):
    """A message on the channel it came from: what ``load_media_of`` reads."""

    @property
    def message(self) -> Inbound: ...

    @property
    def provider(self) -> Provider: ...


class FlowStarter(Protocol):
    """What a context asks of the flow runner: start a flow in its turn's chat."""

    async def start(self, turn: Turn, flow: Flow[Any] | str, args: Mapping[str, Any]) -> None: ...


class Host(Protocol):
    """What the context and the flow runner ask of the runtime they run in."""

    @property
    def provider(self) -> Provider: ...

    @property
    def engine(self) -> Engine | None:
        """The journal's engine while the runtime runs on one; else ``None``."""

    def now(self) -> float:
        """The runtime's clock, in seconds since the epoch."""

    async def emit(self, event: Event) -> None:
        """Hand ``event`` to the bot's listeners (never raises)."""

    async def submit(
        self,
        message: Outbound,
        key: str,
        derived: bool,
        inbound_id: str | None,
        *,
        inline: bool,
        fallback: Fallback | None = None,
        timing: Timing | None = None,
    ) -> Receipt:
        """Journal and send ``message`` under ``key`` (``derived``: keyed from an inbound,
        so a replay is checked against what was sent); inline now, or for the sweeper
        (always when ``timing`` schedules it)."""

    async def change(
        self,
        key: str,
        op: Change,
        own_key: str,
        *,
        text: str | None = None,
        options: Mapping[str, Any] | None = None,
        derived: bool = False,
        inbound_id: str | None = None,
    ) -> Receipt:
        """Edit or delete the send ``key``, journaled under ``own_key``
        (``botmesh.state.edits``)."""

    async def typing(self, chat_id: str) -> bool:
        """Show the channel's typing indicator in ``chat_id``, unjournaled; ``False`` when
        the channel has none (or refused it)."""

    def flows(self) -> FlowStarter:
        """The bot's flow runner (``ValueError`` when the bot has none)."""

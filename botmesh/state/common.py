"""``Common``: what the engine's parts share, passed once: the ``Basis`` (the journal, the
scope's keys, this instance, its time, randomness, counters, wake-up call), the first
parts, which nearly every later part calls (the leases, the provider session's lease, the
receipts publisher, the retention rule), and the bot's listeners (``emit``).

The engine (``botmesh.state.engine``) makes one ``Common`` once those first parts exist and
hands it to each part after them (``Delivery``, ``Outbox``, ``Inbox``, ``Sweeper``, ...),
with the collaborators that part alone uses (other parts, its configuration, the bot's
channel and hooks); the part keeps it as ``self._common``. So a part's signature names only
what is its own, and a collaborator the parts share is added in one place.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from botmesh.state.basis import Basis
from botmesh.state.events import Emit
from botmesh.state.leader import Leadership
from botmesh.state.lease import Leases
from botmesh.state.receipts import Publisher
from botmesh.state.retention import Retention

__all__ = ["Common"]


@dataclass(frozen=True, slots=True)
class Common(Basis):
    """The ``Basis``, the engine's first parts and the bot's listeners."""

    #: The leases this engine holds, and its fenced writes.
    leases: Leases
    #: The provider session's lease (``provider_session="leader"``), else ``None``.
    leader: Leadership | None
    #: Where settled records' receipts go, when the runtime takes them; else ``None``.
    publisher: Publisher | None
    #: When finished records are purged (``Retention.purge_at``), and their purge.
    retention: Retention
    #: Delivers an event to the bot's listeners (never raises).
    emit: Emit

    @classmethod
    def on(
        cls,
        basis: Basis,
        *,
        leases: Leases,
        leader: Leadership | None,
        publisher: Publisher | None,
        retention: Retention,
        emit: Emit,
    ) -> Common:
        """``basis`` with the first parts built on it, and the bot's listeners."""
        built = {field.name: getattr(basis, field.name) for field in dataclasses.fields(basis)}
        return cls(
            **built,
            leases=leases,
            leader=leader,
            publisher=publisher,
            retention=retention,
            emit=emit,
        )

"""The durability counters, under the reference's names (``metrics()``), and two of ours.

``Metric`` defines each name once; ``Metrics`` keeps one counter per member, as a plain
attribute (``metrics.outbox_dead += 1`` on the hot path) named after the member.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Protocol

__all__ = ["Metric", "Metrics", "Timings"]


class Metric(StrEnum):
    """A counter of ``metrics()``: the value is the reference's name."""

    INBOUND_JOURNALED = "inboundJournaled"
    INBOUND_DUPLICATES = "inboundDuplicates"
    INBOUND_REPLAYED = "inboundReplayed"
    INBOUND_DEAD = "inboundDead"
    OUTBOX_JOURNALED = "outboxJournaled"
    OUTBOX_DEDUPED = "outboxDeduped"
    OUTBOX_RETRIED = "outboxRetried"
    OUTBOX_DEFERRED = "outboxDeferred"
    OUTBOX_DEAD = "outboxDead"
    OUTBOX_AMBIGUOUS = "outboxAmbiguous"
    OUTBOX_BYPASSED = "outboxBypassed"
    STALE_LEASES = "staleLeases"
    OUTBOX_DIVERGED = "outboxDiverged"
    #: Beyond the reference: ambiguous sends the channel said had gone out (not resent).
    OUTBOX_RESOLVED_SENT = "outboxResolvedSent"
    #: Beyond the reference: ambiguous sends the channel said had never arrived (sent now).
    OUTBOX_RESOLVED_UNSENT = "outboxResolvedUnsent"
    #: Beyond the reference: delivery attempts a standby refused before calling the
    #: provider (``provider_session="leader"``); left to the leader, never charged.
    PROVIDER_NOT_LEADER = "providerNotLeader"
    #: Beyond the reference: sends journaled for a later time (``at``, ``delay``).
    OUTBOX_SCHEDULED = "outboxScheduled"
    #: Beyond the reference: sends dead because their deadline passed (reason ``expired``).
    OUTBOX_EXPIRED = "outboxExpired"
    #: Beyond the reference: sends cancelled before they went out.
    OUTBOX_CANCELLED = "outboxCancelled"
    #: Beyond the reference: sends that waited for their slot under the channel's rate
    #: limits before calling the provider (``botmesh.state.pacing``).
    OUTBOX_PACED = "outboxPaced"
    #: Beyond the reference: the milliseconds those sends waited, in all.
    OUTBOX_PACED_MS = "outboxPacedMs"
    #: Beyond the reference: channel status webhooks that changed a send's delivery state
    #: (delivered, read, failed).
    DELIVERY_UPDATES = "deliveryUpdates"
    #: Beyond the reference: sends the channel accepted and then reported failed.
    DELIVERY_FAILED = "deliveryFailed"
    #: Beyond the reference: statuses that changed nothing (a copy, or overtaken).
    DELIVERY_UNCHANGED = "deliveryUnchanged"
    #: Beyond the reference: statuses of a message the journal does not hold (never ours,
    #: past retention, erased): dropped.
    DELIVERY_UNMATCHED = "deliveryUnmatched"
    #: Beyond the reference: edits and deletes journaled (``ctx.edit``, ``ctx.delete``).
    OUTBOX_EDITS = "outboxEdits"


_ATTRS = tuple(m.name.lower() for m in Metric)


class Metrics:
    """Counters of one bot's engine; ``as_dict()`` uses the reference's names."""

    __slots__ = _ATTRS
    inbound_journaled: int
    inbound_duplicates: int
    inbound_replayed: int
    inbound_dead: int
    outbox_journaled: int
    outbox_deduped: int
    outbox_retried: int
    outbox_deferred: int
    outbox_dead: int
    outbox_ambiguous: int
    outbox_bypassed: int
    stale_leases: int
    outbox_diverged: int
    outbox_resolved_sent: int
    outbox_resolved_unsent: int
    provider_not_leader: int
    outbox_scheduled: int
    outbox_expired: int
    outbox_cancelled: int
    outbox_paced: int
    outbox_paced_ms: int
    delivery_updates: int
    delivery_failed: int
    delivery_unchanged: int
    delivery_unmatched: int
    outbox_edits: int

    def __init__(self) -> None:
        for attr in _ATTRS:
            setattr(self, attr, 0)

    def as_dict(self) -> dict[str, int]:
        return {m.value: getattr(self, attr) for m, attr in zip(Metric, _ATTRS, strict=True)}


class Timings(Protocol):
    """What the engine times, when a timer is given (the worker's Prometheus histograms,
    ``botmesh.observability.metrics``); without one nothing is timed. Each call gets the
    seconds a thing took; labels are bounded (a channel's name, a result), never a chat."""

    def handler(self, seconds: float) -> None:
        """The bot's handlers of one inbound ran for ``seconds``."""

    def provider_call(self, channel: str, result: str, seconds: float) -> None:
        """One call of the provider's send: ``result`` is ``ok`` or ``error``."""

    def delivery_status(self, channel: str, outcome: str) -> None:
        """A channel's status webhook about a send: ``outcome`` is the delivery state it
        set (``delivered``, ``read``, ``failed``), ``unchanged`` or ``unmatched``."""

    def calling(self, delta: int) -> None:
        """Provider calls in flight went up (``1``) or down (``-1``)."""

"""The thirteen durability counters, under the reference's names (``metrics()``)."""

from __future__ import annotations

__all__ = ["METRIC_NAMES", "Metrics"]

METRIC_NAMES: tuple[str, ...] = (
    "inboundJournaled",
    "inboundDuplicates",
    "inboundReplayed",
    "inboundDead",
    "outboxJournaled",
    "outboxDeduped",
    "outboxRetried",
    "outboxDeferred",
    "outboxDead",
    "outboxAmbiguous",
    "outboxBypassed",
    "staleLeases",
    "outboxDiverged",
)


class Metrics:
    """Counters of one bot's durability view. ``as_dict()`` uses the reference's names."""

    __slots__ = (
        "inbound_dead",
        "inbound_duplicates",
        "inbound_journaled",
        "inbound_replayed",
        "outbox_ambiguous",
        "outbox_bypassed",
        "outbox_dead",
        "outbox_deduped",
        "outbox_deferred",
        "outbox_diverged",
        "outbox_journaled",
        "outbox_retried",
        "stale_leases",
    )

    def __init__(self) -> None:
        self.inbound_journaled = 0
        self.inbound_duplicates = 0
        self.inbound_replayed = 0
        self.inbound_dead = 0
        self.outbox_journaled = 0
        self.outbox_deduped = 0
        self.outbox_retried = 0
        self.outbox_deferred = 0
        self.outbox_dead = 0
        self.outbox_ambiguous = 0
        self.outbox_bypassed = 0
        self.stale_leases = 0
        self.outbox_diverged = 0

    def as_dict(self) -> dict[str, int]:
        return {
            "inboundJournaled": self.inbound_journaled,
            "inboundDuplicates": self.inbound_duplicates,
            "inboundReplayed": self.inbound_replayed,
            "inboundDead": self.inbound_dead,
            "outboxJournaled": self.outbox_journaled,
            "outboxDeduped": self.outbox_deduped,
            "outboxRetried": self.outbox_retried,
            "outboxDeferred": self.outbox_deferred,
            "outboxDead": self.outbox_dead,
            "outboxAmbiguous": self.outbox_ambiguous,
            "outboxBypassed": self.outbox_bypassed,
            "staleLeases": self.stale_leases,
            "outboxDiverged": self.outbox_diverged,
        }

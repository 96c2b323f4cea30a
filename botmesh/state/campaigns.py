"""Campaigns: one send per recipient, each keyed ``campaign:<campaign id>:<chat id>``
(``botmesh.state.keys.campaign_key``), so a campaign started again sends no recipient twice
and skips none. A campaign's progress is read from the journal: the states of its sends'
records (``CampaignStatus``); cancelling it cancels every send of it that has not gone out
(``Operations.cancel_campaign``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from botmesh.state.errors import Reason
from botmesh.state.keys import CAMPAIGN_PREFIX, check_campaign
from botmesh.state.messages import OutboxState
from botmesh.state.records import Json

__all__ = ["CampaignStatus", "campaign_prefix", "tally"]


def campaign_prefix(campaign: str) -> str:
    """The start of the keys of a campaign's sends."""
    return f"{CAMPAIGN_PREFIX}{check_campaign(campaign)}:"


@dataclass(frozen=True, slots=True)
class CampaignStatus:
    """Where a campaign's sends stand, one count per recipient (a split text counts once,
    by its first part): ``pending`` has not gone out yet (scheduled, waiting its turn or a
    retry), ``sent``, ``dead`` (refused for good or retries spent), ``expired`` (its
    deadline passed first), ``unknown`` (its outcome lost in a crash), ``cancelled``."""

    campaign: str
    pending: int = 0
    sent: int = 0
    dead: int = 0
    expired: int = 0
    unknown: int = 0
    cancelled: int = 0

    @property
    def total(self) -> int:
        """The recipients the journal holds a send of."""
        return self.pending + self.sent + self.dead + self.expired + self.unknown + self.cancelled

    @property
    def settled(self) -> int:
        """The recipients whose send settled (all but ``pending``)."""
        return self.total - self.pending


def tally(campaign: str, values: Iterable[Json]) -> CampaignStatus:
    """The status of ``campaign`` from the outbox records of its sends (others ignored)."""
    prefix = campaign_prefix(campaign)
    counts: Counter[str] = Counter()
    for value in values:
        key = str(value.get("key", ""))
        if not key.startswith(prefix) or value.get("part", 1) != 1:
            continue
        state = value.get("state")
        if state in (OutboxState.PENDING, OutboxState.FAILED):
            counts["pending"] += 1
        elif state == OutboxState.DEAD:
            reason = (value.get("error") or {}).get("reason")
            counts["expired" if reason == Reason.EXPIRED else "dead"] += 1
        elif state in (OutboxState.SENT, OutboxState.UNKNOWN, OutboxState.CANCELLED):
            counts[str(state)] += 1
    return CampaignStatus(campaign, **counts)

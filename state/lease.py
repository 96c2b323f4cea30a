"""Leases and fencing tokens.

A claim writes ``lease = {owner, boot, until}`` and raises the record's ``token`` by one,
in one compare-and-set. The holder keeps a ``Held``: the token and the version it last
wrote. Every later write of the holder is a compare-and-set on that version; when it
fails, the record is read again: another token there means the lease was taken over and
the write is refused (``FencedError``, counted in ``staleLeases``); the same token means
the holder's own concurrent write (a heartbeat) landed first, and the write is retried.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["Held", "LeaseState", "claim_value", "lease_state"]

Json = dict[str, Any]

#: ``free``: no lease; ``live``: held and not expired; ``expired``: held, past ``until``;
#: ``orphan``: held by this instance id under an earlier boot (reclaimable at once).
LeaseState = Literal["free", "live", "expired", "orphan"]


@dataclass(slots=True)
class Held:
    """A lease this process holds on one record."""

    key: str
    token: int
    version: int
    value: Json
    lease: float
    until: float
    fenced: bool = False


def lease_state(value: Json, owner: str, boot: str, now: float) -> LeaseState:
    lease = value.get("lease")
    if not lease:
        return "free"
    if lease.get("owner") == owner and lease.get("boot") != boot:
        return "orphan"
    if lease.get("until", 0.0) <= now:
        return "expired"
    return "live"


def claim_value(value: Json, owner: str, boot: str, now: float, lease: float) -> Json:
    """A copy of ``value`` leased to ``owner`` under the next fencing token."""
    new = dict(value)
    new["token"] = int(value.get("token", 0)) + 1
    new["lease"] = {"owner": owner, "boot": boot, "until": now + lease}
    new["updated"] = now
    return new

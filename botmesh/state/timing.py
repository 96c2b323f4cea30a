"""When a send may go out and when it must have: a scheduled send's time (``at``) and a
send's deadline.

A scheduled send is journaled at once, due at its time: the sweeper never sends it before
(``botmesh.state.delivery``). A send with a deadline that is not delivered by then dies
``expired`` (``Reason.EXPIRED``), with its dead letter and its receipt, instead of arriving
late; a send that may have gone out (in flight at a crash, ambiguous) never expires.

Times are epoch seconds of the engine's clock; ``Timing`` holds what the caller gave and
``resolve`` turns it into the two times the journal keeps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Timing"]


@dataclass(frozen=True, slots=True)
class Timing:
    """What a send says about time: ``at`` (epoch seconds) or ``delay`` (seconds from now)
    for a scheduled send; ``expires_at`` (epoch seconds) or ``deliver_within`` (seconds from
    its time, or from now) for its deadline. At most one of each pair."""

    at: float | None = None
    delay: float | None = None
    expires_at: float | None = None
    deliver_within: float | None = None

    def __post_init__(self) -> None:
        if self.at is not None and self.delay is not None:
            raise ValueError("give a scheduled send 'at' or 'delay', not both")
        if self.expires_at is not None and self.deliver_within is not None:
            raise ValueError("give a send 'expires_at' or 'deliver_within', not both")
        for name in ("at", "delay", "expires_at", "deliver_within"):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise TypeError(f"'{name}' must be a number of seconds, got {value!r}")
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"'{name}' must be a finite number >= 0, got {value!r}")
        if self.deliver_within == 0:
            raise ValueError("'deliver_within' must be above 0 (for example 300 for 5 min)")

    @property
    def scheduled(self) -> bool:
        """Whether the send is for a later time (journaled for the sweeper, never inline)."""
        return self.at is not None or self.delay is not None

    def resolve(
        self, now: float, default_within: float | None
    ) -> tuple[float | None, float | None]:
        """The send's time and deadline (epoch seconds, ``None`` when it has none); a
        deadline counts from the send's time when it has one, else from ``now``.
        ``default_within`` is the policy's ``outbox.deliver_within``. Raises
        ``ValueError`` for a deadline at or before the send's time."""
        at = self.at if self.at is not None else None
        if self.delay is not None:
            at = now + self.delay
        deadline = self.expires_at
        within = self.deliver_within if self.deliver_within is not None else default_within
        if deadline is None and within is not None:
            deadline = max(at if at is not None else now, now) + within
        if deadline is not None and at is not None and deadline <= at:
            raise ValueError(
                f"the send's deadline ({deadline:.3f}) is not after its time ({at:.3f}): it "
                "would expire before it may go out; give a later 'expires_at' or leave it out"
            )
        return at, deadline

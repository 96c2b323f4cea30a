"""Retry timing and the retry decision: ``Backoff`` (exponential, with jitter),
``Retries`` (retry or give up), used by the inbox, the outbox and the Kafka worker alike, and
the delay tiers a failed send is parked on (``RETRY_TIERS``, ``park_delay``)."""

from __future__ import annotations

import random
from dataclasses import dataclass

from botmesh.state.errors import RateLimitedError, Reason

__all__ = [
    "PARK_GRACE",
    "RETRY_TIERS",
    "Backoff",
    "GiveUp",
    "Retries",
    "Retry",
    "park_delay",
    "tier_of",
]


@dataclass(frozen=True, slots=True)
class Backoff:
    """``base * 2**(attempt-1)``, capped at ``cap``, then spread by ``±jitter`` (a fraction).

    Attempt numbers start at 1 (the delay after the first failed attempt is about ``base``).
    """

    base: float = 1.0
    cap: float = 60.0
    jitter: float = 0.2

    def delay(self, attempt: int, rng: random.Random | None = None, floor: float = 0.0) -> float:
        """Seconds to wait after failed attempt number ``attempt``; never under ``floor``
        (a ``RateLimitedError.retry_after``)."""
        exp = min(max(attempt, 1) - 1, 62)
        raw = min(self.cap, self.base * (2.0**exp))
        if self.jitter:
            r = (rng or random).random()
            raw *= 1.0 + self.jitter * (2.0 * r - 1.0)
        return max(raw, floor, 0.0)


@dataclass(frozen=True, slots=True)
class Retry:
    """Try again after ``delay`` seconds."""

    delay: float


@dataclass(frozen=True, slots=True)
class GiveUp:
    """Dead-letter it, for ``reason``."""

    reason: Reason


@dataclass(frozen=True, slots=True)
class Retries:
    """The one retry decision: after failed attempt ``attempts`` with ``error``, retry (and
    when) or give up (and why). An error whose ``retryable`` is False gives up at once;
    a ``RateLimitedError`` waits at least its ``retry_after`` (at most one day, see
    ``RateLimitedError.floor_of``: ``None``, NaN or a negative value is no floor)."""

    max_attempts: int
    backoff: Backoff
    #: The reason given when the attempts run out.
    exhausted: Reason
    #: The reason given for an error that is not retryable.
    refused: Reason = Reason.SEND_REFUSED

    def decide(
        self, error: BaseException, attempts: int, rng: random.Random | None = None
    ) -> Retry | GiveUp:
        if not getattr(error, "retryable", True):
            return GiveUp(self.refused)
        if attempts >= self.max_attempts:
            return GiveUp(self.exhausted)
        floor = 0.0
        if isinstance(error, RateLimitedError):  # sane even when set after construction
            floor = RateLimitedError.floor_of(getattr(error, "retry_after", None))
        return Retry(self.backoff.delay(attempts, rng, floor))


#: The delay tiers of parked retries (name, seconds): a send is parked on the first tier at
#: least as long as its backoff (or its ``RateLimitedError.retry_after``), so it never comes
#: back earlier than asked; past the last tier it is parked there again until due.
RETRY_TIERS: tuple[tuple[str, float], ...] = (
    ("1s", 1.0),
    ("5s", 5.0),
    ("30s", 30.0),
    ("1m", 60.0),
    ("5m", 300.0),
    ("10m", 600.0),
)

#: How long after its planned retry the sweeper takes a parked send that did not come back
#: (its retry record lost: a crash between the journal write and the park).
PARK_GRACE = 30.0


def park_delay(delay: float) -> float:
    """The retry delay a parked send gets: its tier's (at least ``delay``), or ``delay``
    itself past the last tier."""
    for _, seconds in RETRY_TIERS:
        if seconds >= delay:
            return seconds
    return delay


def tier_of(delay: float) -> str:
    """The name of the tier a send due in ``delay`` seconds is parked on."""
    for name, seconds in RETRY_TIERS:
        if seconds >= delay:
            return name
    return RETRY_TIERS[-1][0]

"""Exponential backoff with jitter, for inbox and outbox retries."""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["Backoff"]


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

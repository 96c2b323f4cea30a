"""Retry timing and the retry decision: ``Backoff`` (exponential, with jitter) and
``Retries`` (retry or give up), used by the inbox, the outbox and the Kafka worker alike."""

from __future__ import annotations

import random
from dataclasses import dataclass

from state.errors import RateLimitedError, Reason

__all__ = ["Backoff", "GiveUp", "Retries", "Retry"]


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
    a ``RateLimitedError`` waits at least its ``retry_after``."""

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
        floor = error.retry_after if isinstance(error, RateLimitedError) else 0.0
        return Retry(self.backoff.delay(attempts, rng, floor))

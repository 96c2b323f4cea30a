"""A channel's ``retry_after`` never breaks the retry decision (defect 2 of the audit).

``RateLimitedError(retry_after=None)`` made ``Retries.decide`` raise ``TypeError`` (the send
ended ``unknown``); ``retry_after=inf`` left the send ``failed`` forever. The rule now
(``RateLimitedError`` docstring, docs/guarantees.md): ``None``, NaN or a negative value asks
for no wait (the normal backoff applies); a longer wait than ``MAX_RETRY_AFTER`` (one day),
infinity included, is cut to one day. The decision never raises on it.
"""

from __future__ import annotations

import math
import pickle

import pytest

from botmesh.errors import RateLimitedError, SendDeferredError
from botmesh.state.backoff import Backoff, Retries, Retry
from botmesh.state.errors import Reason
from tests.kit import make_app

DAY = 86400.0
RETRIES = Retries(5, Backoff(base=1.0, cap=60.0, jitter=0.0), Reason.RETRIES_EXHAUSTED)


@pytest.mark.parametrize(
    ("given", "delay"),
    [
        (None, 1.0),  # no hint: the backoff's own delay after attempt 1
        (math.nan, 1.0),
        (-5.0, 1.0),
        (30.0, 30.0),  # a sane hint is a floor, as before
        (math.inf, DAY),
        (1e12, DAY),
        (10**400, DAY),  # too large for a float
    ],
)
def test_the_decision_takes_any_retry_after(given: float | None, delay: float) -> None:
    error = RateLimitedError("slow", retry_after=given)
    assert RETRIES.decide(error, 1) == Retry(delay)
    assert RateLimitedError.MAX_RETRY_AFTER == DAY
    copy = pickle.loads(pickle.dumps(error))
    assert RETRIES.decide(copy, 1) == Retry(delay)


def test_a_retry_after_set_after_construction_does_not_break_the_decision() -> None:
    error = RateLimitedError("slow")
    error.retry_after = None  # type: ignore[assignment]  # what a careless adapter may do
    assert RETRIES.decide(error, 1) == Retry(1.0)
    error.retry_after = math.inf
    assert RETRIES.decide(error, 1) == Retry(DAY)


@pytest.mark.parametrize("given", [None, math.inf, math.nan, -1.0])
async def test_a_rate_limited_send_with_any_retry_after_goes_out_later(
    given: float | None,
) -> None:
    app = await make_app(outbox={"inline_max": 0})
    app.provider.fail_next(RateLimitedError("slow", retry_after=given))
    with pytest.raises(SendDeferredError):
        await app.runtime.send("c", "x", idempotency_key="k")
    rec = await app.ops.outbox.get("k")
    assert rec is not None and rec.state == "failed", rec
    app.clock.advance(DAY + 1)  # at most one day, whatever the channel said
    await app.ops.drain()
    rec = await app.ops.outbox.get("k")
    assert rec is not None and rec.state == "sent", rec
    assert [m.text for m in app.provider.sent] == ["x"]
    await app.stop()

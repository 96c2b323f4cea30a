"""Inline retries: a retryable failure is retried with the outbox backoff (a rate limit
waits at least its ``retry_after``), on the engine's clock."""

from __future__ import annotations

from botmesh.errors import RateLimitedError, SendError
from tests.kit import make_app


async def test_retryable_errors_retry_inline_with_backoff() -> None:
    app = await make_app(outbox={"backoff": {"base": "1s", "cap": "1m", "jitter": 0}})
    app.provider.fail_next(SendError("flaky"), times=3)
    t0 = app.clock.now()
    receipt = await app.runtime.send("c", "x", idempotency_key="k")
    assert receipt.state == "sent" and len(app.provider.calls) == 4
    assert app.clock.now() - t0 == 1 + 2 + 4  # exponential, no jitter
    rec = await app.ops.outbox.get("k")
    assert rec is not None and rec.attempts == 4 and rec.token == 4
    assert app.ops.metrics()["outboxRetried"] == 3


async def test_a_rate_limit_waits_at_least_its_retry_after() -> None:
    app = await make_app(outbox={"backoff": {"base": "1s", "jitter": 0}})
    app.provider.fail_next(RateLimitedError(retry_after=9.0))
    t0 = app.clock.now()
    receipt = await app.runtime.send("c", "x")
    assert app.clock.now() - t0 == 9.0 and receipt.state == "sent"

"""An operator cannot discard a send in flight (defect 3 of the audit).

``outbox.discard`` used to forget a send whose provider call was under way; the call then
landed on nothing, and the next send (or replay) under that key went out a second time.
Now it is refused with ``RecordStateError`` (as ``retry_send`` refuses a send that is not
settled), naming the key and saying to wait until it settles. The Kafka worker carries out
the CLI's and the console's ``discard`` (``botmesh dlq discard``, through the control
topic) with this same call, so they are refused the same way (``refused`` with this text).
"""

from __future__ import annotations

import asyncio

import pytest

from botmesh.errors import RecordStateError
from tests.kit import GatedProvider, make_app, settle


async def test_a_send_in_flight_cannot_be_discarded() -> None:
    provider = GatedProvider()
    app = await make_app(provider)
    sending = asyncio.create_task(app.runtime.send("c", "once", idempotency_key="k"))
    await provider.entered.wait()  # the provider call is under way
    with pytest.raises(RecordStateError) as info:
        await app.ops.outbox.discard("k")
    assert info.value.key == "k" and info.value.state == "pending"
    assert "in flight" in str(info.value) and "wait" in str(info.value)
    provider.release.set()
    receipt = await sending
    assert receipt.state == "sent"
    # the key is still answered from the outbox: a replay of the send does not repeat it
    again = await app.runtime.send("c", "once", idempotency_key="k")
    assert again.message_id == receipt.message_id
    assert [m.text for m in provider.sent] == ["once"]
    await app.ops.outbox.discard("k")  # settled: the operator may discard it now
    assert await app.ops.outbox.get("k") is None
    await app.stop()


async def test_a_send_whose_holder_died_can_be_discarded_once_its_lease_ran_out() -> None:
    provider = GatedProvider()
    app = await make_app(provider)
    sending = asyncio.create_task(app.runtime.send("c", "x", idempotency_key="k"))
    await provider.entered.wait()
    app.clock.advance(61.0)  # the holder's lease (60 s) ran out: nothing is under way for it
    await app.ops.outbox.discard("k")
    assert await app.ops.outbox.get("k") is None
    sending.cancel()
    with pytest.raises(asyncio.CancelledError):
        await sending
    await app.stop()


async def test_dead_and_waiting_sends_can_still_be_discarded() -> None:
    app = await make_app(outbox={"inline_max": 0, "retries": 0})
    app.provider.fail_next(RuntimeError("down"))
    with pytest.raises(RuntimeError):
        await app.runtime.send("c", "x", idempotency_key="dead")
    rec = await app.ops.outbox.get("dead")
    assert rec is not None and rec.state == "dead"
    await app.ops.outbox.discard("dead")
    waiting = await app.runtime.enqueue("c", "later", idempotency_key="queued")
    await app.ops.outbox.discard(waiting)
    await settle(app, passes=2)
    assert await app.ops.outbox.list() == []
    await app.stop()

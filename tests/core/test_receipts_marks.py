"""A receipt's ``published`` mark that the journal refuses for a moment (a rebalance, the
broker) is tried again by the next flush, and the sweeper says so once, without a
traceback: the receipt is not published a second time when its record falls due."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

import pytest

from botmesh import Inbound
from botmesh.errors import JournalUnavailableError
from botmesh.journal import MemoryKv
from botmesh.state.kv import IndexName, Op
from botmesh.state.writes import Write
from tests.kit import ListSink, make_app, settle


class RefusingKv(MemoryKv):
    """A memory journal that refuses the writes labelled ``refuse`` while ``down`` is set,
    and its ``range`` reads while ``ranges_down`` is set."""

    def __init__(self, refuse: str = "") -> None:
        super().__init__()
        self.refuse = refuse
        self.down = False
        self.ranges_down = False
        self.refused = 0

    async def commit(self, ops: Sequence[Op], *, label: str = "") -> list[int]:
        if self.down and label == self.refuse:
            self.refused += 1
            raise JournalUnavailableError(f"journal write {label} refused: the broker is away")
        return await super().commit(ops, label=label)

    async def range(
        self, index: IndexName, prefix: str, until: float, limit: int = 100
    ) -> list[str]:
        if self.ranges_down:
            self.refused += 1
            raise JournalUnavailableError("journal partition 0 is being handed over")
        return await super().range(index, prefix, until, limit)


async def test_a_refused_mark_is_recorded_by_the_next_flush_and_published_once() -> None:
    kv = RefusingKv(refuse=Write.OUTBOX_PUBLISHED)
    sink = ListSink()
    app = await make_app(reply="hello", receipts=sink, kv=kv)
    await app.runtime.handle(Inbound(id="m", chat_id="c"))
    kv.down = True
    with pytest.raises(JournalUnavailableError, match="refused"):
        await app.runtime.flush_receipts()
    [record] = await app.ops.outbox.list()
    assert not record.published and kv.refused == 1
    # past its due time, a sweeper pass leaves it alone (its receipt was acked already) and
    # tries the mark again, refused again
    app.clock.advance(61.0)
    with pytest.raises(JournalUnavailableError, match="refused"):
        await app.ops.sweep_once()
    assert sink.keys() == ["m:1"] and kv.refused == 2
    kv.down = False
    assert await app.runtime.flush_receipts() == 1
    [record] = await app.ops.outbox.list()
    assert record.published
    await settle(app, passes=2)
    assert sink.keys() == ["m:1"]  # once, however long it waited
    await app.stop()


async def test_a_sweeper_pass_the_journal_refuses_is_said_once_without_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    kv = RefusingKv()
    app = await make_app(reply="hello", kv=kv, poll="10ms")
    caplog.set_level(logging.DEBUG, logger="botmesh.sweeper")
    kv.ranges_down = True
    deadline = time.monotonic() + 30  # a hang guard: a pass comes every tick
    while kv.refused < 3:
        assert time.monotonic() < deadline, "the sweeper made no pass"
        await asyncio.sleep(0.01)
    kv.ranges_down = False
    said = [r for r in caplog.records if r.name == "botmesh.sweeper"]
    warned = [r for r in said if r.levelno >= logging.WARNING]
    assert len(warned) == 1, [r.getMessage() for r in warned]
    assert "the journal is unavailable" in warned[0].getMessage()
    assert warned[0].exc_info is None and warned[0].levelno == logging.WARNING
    assert len(said) >= 3  # the later ones at DEBUG
    await app.stop()

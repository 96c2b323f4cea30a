"""``botmesh.streams.worker.checkpoint.Checkpoint``: a partition's committable offset is its
lowest record not settled; the journal is flushed before the offsets are committed; a
forgotten (revoked) partition is never committed again; nothing to commit does nothing."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from botmesh.streams.worker.checkpoint import Checkpoint, TopicPart


class Steps:
    """The flush and the commit a checkpoint makes, in the order it makes them."""

    def __init__(self) -> None:
        self.done: list[object] = []
        self.fail_flush: BaseException | None = None

    async def flush(self) -> None:
        if self.fail_flush is not None:
            raise self.fail_flush
        self.done.append("flush")

    async def commit(self, offsets: Mapping[TopicPart, int]) -> None:
        self.done.append(dict(offsets))


@pytest.fixture
def steps() -> Steps:
    return Steps()


@pytest.fixture
def cp(steps: Steps) -> Checkpoint:
    return Checkpoint(steps.flush, steps.commit)


async def test_the_committable_offset_is_the_lowest_record_not_settled(
    cp: Checkpoint, steps: Steps
) -> None:
    for offset in (10, 11, 12):
        cp.taken("in", 0, offset)
    cp.settled("in", 0, 11)  # settled out of order: 10 is still open
    assert await cp.run() == {("in", 0): 10}
    assert steps.done == ["flush", {("in", 0): 10}]
    cp.settled("in", 0, 10)
    assert await cp.run() == {("in", 0): 12}  # 12 still open
    cp.settled("in", 0, 12)
    assert await cp.run() == {("in", 0): 13}  # every record settled: one past the last
    assert cp.unsettled() == 0 and cp.commits == 3


async def test_nothing_to_commit_does_nothing(cp: Checkpoint, steps: Steps) -> None:
    assert await cp.run() == {}
    cp.taken("in", 1, 5)
    assert await cp.run() == {("in", 1): 5}  # the first record open: its offset
    assert await cp.run() == {}  # nothing moved since
    assert steps.done == ["flush", {("in", 1): 5}] and cp.commits == 1


async def test_partitions_commit_each_their_own_offset(cp: Checkpoint) -> None:
    cp.taken("in", 0, 3)
    cp.taken("rq", 0, 7)
    cp.taken("in", 1, 0)
    cp.settled("in", 0, 3)
    cp.settled("in", 1, 0)
    assert await cp.run() == {("in", 0): 4, ("rq", 0): 7, ("in", 1): 1}


async def test_a_forgotten_partition_is_never_committed_again(cp: Checkpoint) -> None:
    cp.taken("in", 0, 1)
    cp.taken("in", 1, 1)
    cp.forget([("in", 1)])  # revoked: its offsets are the new owner's
    cp.settled("in", 1, 1)  # settling late: not counted
    cp.settled("in", 0, 1)
    assert await cp.run() == {("in", 0): 2}
    assert cp.unsettled() == 0


async def test_a_failed_flush_commits_nothing_and_the_next_checkpoint_tries_again(
    cp: Checkpoint, steps: Steps
) -> None:
    cp.taken("in", 0, 0)
    cp.settled("in", 0, 0)
    steps.fail_flush = ConnectionError("broker down")
    with pytest.raises(ConnectionError):
        await cp.run()
    assert steps.done == []  # no offset before the journal's writes are durable
    steps.fail_flush = None
    assert await cp.run() == {("in", 0): 1}
    assert steps.done == ["flush", {("in", 0): 1}]

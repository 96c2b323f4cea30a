"""``worker.loop.current_records``: a batch the consumer fetched before a partition was
taken away (or taken and given again) reaches the loop after the rebalance's hook ran; its
records of that partition are dropped, not started (started, they found their journal
partition gone and the worker exited 75: CI's two-worker kill test, a survivor that lost
partitions 0 and 1 to its restarted peer). The records are the consumer's own type."""

from __future__ import annotations

from confluent_kafka import Message

from botmesh.streams.worker.consumer import Batch
from botmesh.streams.worker.loop import current_records


def batch(epoch: int, *partitions: int) -> Batch:
    messages = [
        Message(topic="t.inbound", partition=p, offset=10 + i, key=b"chat", value=b"{}")
        for i, p in enumerate(partitions)
    ]
    return Batch(messages, epoch)


def test_records_of_partitions_served_since_the_fetch_are_started() -> None:
    got = current_records(batch(5, 0, 1, 0), {0: 3, 1: 5})
    assert [(r.partition, r.offset) for r in got] == [(0, 10), (1, 11), (0, 12)]


def test_records_of_a_partition_taken_away_since_the_fetch_are_dropped() -> None:
    got = current_records(batch(5, 0, 1, 2), {1: 2})  # 0 and 2 were revoked
    assert [(r.partition, r.offset) for r in got] == [(1, 11)]


def test_records_fetched_before_a_partition_was_given_again_are_dropped() -> None:
    # revoked, then assigned again in epoch 7: the batch of epoch 5 holds records of the old
    # assignment; the consumer fetches them again from the committed offset
    got = current_records(batch(5, 0, 1), {0: 7, 1: 2})
    assert [(r.partition, r.offset) for r in got] == [(1, 11)]

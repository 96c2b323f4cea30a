"""A real ``botmesh worker`` process for the Kafka tests, and what the tests read back.

``Worker`` runs ``tests/kafka/bot.py`` (the bot and its file provider) in a child process
(``tests.kill.Child``: the one SIGKILL harness), with its own topic prefix, data dir and
files: ``handled.txt`` (one line per handler run), ``sends.jsonl`` (one line per provider
call). It is a static group member (``--instance-id``), so a restarted worker gets its
partitions back at once, even after a SIGKILL. Every wait below ends as soon as its
condition holds; the time limits are hang guards only.
"""

from __future__ import annotations

import asyncio
import collections
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from examples.demo import worker_command
from streams.tools import Seen, end_offsets, tail_receipts
from tests.kill import Child

__all__ = ["WAIT_S", "Worker", "collect", "dead_letters", "read_all", "wait_line"]

PARTITIONS = 4
WAIT_S = 120.0  # hang guard only


@dataclass
class Worker:
    """``botmesh worker --app tests.kafka.bot:bot --provider tests.kafka.bot:provider``."""

    bootstrap: str
    prefix: str
    tmp: Path
    journal: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    partitions: int = PARTITIONS
    child: Child | None = None
    runs: int = 0

    @property
    def handled_file(self) -> Path:
        return self.tmp / "handled.txt"

    @property
    def sends_file(self) -> Path:
        return self.tmp / "sends.jsonl"

    @property
    def data_dir(self) -> Path:
        return self.tmp / "data"

    def start(self) -> Child:
        self.runs += 1
        options = [
            "--provider",
            "tests.kafka.bot:provider",
            "--bootstrap",
            self.bootstrap,
            "--prefix",
            self.prefix,
            "--data-dir",
            str(self.data_dir),
            "--partitions",
            str(self.partitions),
            "--instance-id",
            f"{self.prefix}-0",
            "--loglevel",
            "warning",
        ]
        if self.journal is not None:
            options += ["--journal", self.journal]
        env = {
            "BOTMESH_TEST_HANDLED": str(self.handled_file),
            "BOTMESH_TEST_SENDS": str(self.sends_file),
            "PYTHONUNBUFFERED": "1",
            **self.env,
        }
        self.child = Child(worker_command(*options, app="tests.kafka.bot:bot"), env=env)
        return self.child.start()

    def check_alive(self) -> None:
        assert self.child is not None
        if not self.child.alive():
            pytest.fail(f"the worker exited:\n{self.child.tail(60)}")

    def stop(self) -> int:
        """SIGTERM (a clean stop: the batch finishes, offsets are committed); the status."""
        assert self.child is not None
        return self.child.stop()

    def kill(self) -> None:
        assert self.child is not None
        self.child.kill()

    def close(self) -> None:
        if self.child is not None and self.child.alive():
            self.child.stop()

    def lines(self) -> list[str]:
        """What the current run printed so far (its log included)."""
        return list(self.child.lines) if self.child is not None else []

    def handled(self) -> collections.Counter[str]:
        """Inbound id -> handler runs, over every run of the worker."""
        if not self.handled_file.exists():
            return collections.Counter()
        return collections.Counter(self.handled_file.read_text().split())

    def sends(self) -> list[dict[str, Any]]:
        """Every provider call, in order, over every run of the worker."""
        if not self.sends_file.exists():
            return []
        return [json.loads(line) for line in self.sends_file.read_text().splitlines()]


def wait_line(worker: Worker, *texts: str, timeout: float = WAIT_S) -> str:
    """The first line the worker printed (its log included) that contains all ``texts``."""
    child = worker.child
    assert child is not None
    deadline = time.monotonic() + timeout
    while True:
        for line in worker.lines():
            if all(t in line for t in texts):
                return line
        worker.check_alive()
        if time.monotonic() > deadline:
            pytest.fail(f"no line with {texts!r} from the worker:\n{child.tail(60)}")
        time.sleep(0.05)


async def collect(
    worker: Worker,
    topic: str,
    start: dict[int, int],
    want: set[str],
    *,
    alive: Callable[[], None] | None = None,
) -> list[Seen]:
    """Receipts on ``topic`` from ``start`` until every inbound id in ``want`` has one."""
    check = alive or worker.check_alive
    seen: list[Seen] = []
    missing = set(want)
    receipts = tail_receipts(worker.bootstrap, topic, start=start)
    deadline = time.monotonic() + WAIT_S
    try:
        while missing:
            task = asyncio.ensure_future(anext(receipts))
            while not task.done():
                check()
                if time.monotonic() > deadline:
                    task.cancel()
                    pytest.fail(f"{len(missing)} receipts missing, e.g. {sorted(missing)[:5]}")
                await asyncio.wait({task}, timeout=0.5)
            s = task.result()
            seen.append(s)
            missing.discard(s.receipt.inbound_id or "")
    finally:
        await receipts.aclose()
    return seen


async def dead_letters(
    bootstrap: str, topic: str, until: Callable[[list[Any]], bool], check: Callable[[], None]
) -> list[Any]:
    """The records of a DLQ topic from the beginning, until ``until(records)`` holds."""
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    try:
        dead: list[Any] = []
        deadline = time.monotonic() + WAIT_S
        while not until(dead):
            check()
            if time.monotonic() > deadline:
                pytest.fail(f"the DLQ {topic} has only {len(dead)} records")
            batch = await consumer.getmany(timeout_ms=300)
            dead += [m for msgs in batch.values() for m in msgs]
        return dead
    finally:
        await consumer.stop()


async def read_all(bootstrap: str, topic: str) -> list[Any]:
    """Every record on ``topic`` now (up to the end offsets read first), in partition order."""
    ends = await end_offsets(bootstrap, topic)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in sorted(ends)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        out: list[Any] = []
        deadline = time.monotonic() + WAIT_S
        while [tp for tp in tps if await consumer.position(tp) < ends[tp.partition]]:
            if time.monotonic() > deadline:
                pytest.fail(f"cannot read {topic} to its end offsets {ends}")
            batch = await consumer.getmany(timeout_ms=300)
            out += [m for tp in tps for m in batch.get(tp, [])]
        return out
    finally:
        await consumer.stop()

"""A real ``botmesh worker`` process for the Kafka tests, and what the tests read back.

``Worker`` runs ``tests/kafka/bot.py`` (the bot and its file provider) in a child process
(``tests.kill.Child``: the one SIGKILL harness), with its own topic prefix, data dir and
files: ``handled.txt`` (one line per handler run), ``sends.jsonl`` (one line per provider
call). With ``recorder`` (a ``tests.kafka.recorder.Recorder`` URL) its provider is
``tests.kafka.bot:http_provider`` instead, and the sends are recorded in the test process.
It is a static group member (``--instance-id <prefix>-<instance>``), so a restarted worker
gets its partitions back at once, even after a SIGKILL; several workers of one test share
the prefix (one group) and differ by ``instance`` and ``tmp``. Every wait below ends as
soon as its condition holds; the time limits are hang guards only.

``read_journal`` reads a worker's journal back after the run: from the journal's changelog
topic (``botmesh.streams.table_kv``) when the worker ran on the default journal and that module
exists, else from the file journal it ran on.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import importlib
import json
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, KafkaException, Message, TopicPartition

from botmesh.examples.demo import worker_command
from botmesh.state.backends import open_backend
from botmesh.state.messages import Inbound
from botmesh.streams.clients import read_to_end, reader, wait_topic, watermarks
from botmesh.streams.config import default_journal
from botmesh.streams.connection import Brokers, KafkaSettings
from botmesh.streams.journal_db import JournalView
from botmesh.streams.ops.tools import Seen, end_offsets, produce_inbound, tail_receipts
from botmesh.topics import Catalog
from tests.kafka.recorder import RECORDER_ENV
from tests.kill import Child

__all__ = [
    "WAIT_S",
    "Answers",
    "Record",
    "Worker",
    "collect",
    "dead_letters",
    "journal_source",
    "kill_as_answers_come",
    "read_all",
    "read_journal",
    "stream_slices",
    "wait_line",
]

PARTITIONS = 4
WAIT_S = 120.0  # hang guard only
#: The worker's first line: from it on, a SIGTERM is a clean stop (status 0).
STARTING = "botmesh worker: starting"


@dataclass
class Worker:
    """``botmesh worker --app tests.kafka.bot:bot --provider tests.kafka.bot:provider``."""

    bootstrap: str
    prefix: str
    tmp: Path
    journal: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    partitions: int = PARTITIONS
    instance: str = "0"
    loglevel: str = "warning"
    recorder: str | None = None
    #: ``--provider`` (a channel name such as ``telegram``, or ``module:attr``); default the
    #: test bot's file provider, or its HTTP one with ``recorder``.
    provider: str | None = None
    app: str = "tests.kafka.bot:bot"
    child: Child | None = None
    runs: int = 0
    #: the pid of each run this test SIGKILLed (``kill``)
    killed: list[int] = field(default_factory=list)
    #: a secured listener's settings, for what the test reads back (the worker gets them
    #: through ``env``)
    kafka: KafkaSettings | None = None

    @property
    def brokers(self) -> Brokers:
        return self.kafka if self.kafka is not None else self.bootstrap

    @property
    def handled_file(self) -> Path:
        return self.tmp / "handled.txt"

    @property
    def sends_file(self) -> Path:
        return self.tmp / "sends.jsonl"

    @property
    def data_dir(self) -> Path:
        return self.tmp / "data"

    @property
    def instance_id(self) -> str:
        return f"{self.prefix}-{self.instance}"

    @property
    def pid(self) -> int:
        assert self.child is not None
        return self.child.pid

    def start(self) -> Child:
        self.runs += 1
        provider = self.provider or (
            "tests.kafka.bot:provider" if self.recorder is None else "tests.kafka.bot:http_provider"
        )
        options = [
            "--provider",
            provider,
            "--bootstrap",
            self.bootstrap,
            "--prefix",
            self.prefix,
            "--data-dir",
            str(self.data_dir),
            "--partitions",
            str(self.partitions),
            "--instance-id",
            self.instance_id,
            "--loglevel",
            self.loglevel,
        ]
        if self.journal is not None:
            options += ["--journal", self.journal]
        env = {
            "BOTMESH_TEST_HANDLED": str(self.handled_file),
            "BOTMESH_TEST_SENDS": str(self.sends_file),
            "PYTHONUNBUFFERED": "1",
            **({RECORDER_ENV: self.recorder} if self.recorder is not None else {}),
            **self.env,
        }
        if self.child is not None and self.child.proc is not None:
            self.close()  # the run before (killed or exited): reaped, its log saved
        self.child = Child(worker_command(*options, app=self.app), env=env)
        return self.child.start()

    def check_alive(self) -> None:
        assert self.child is not None
        if not self.child.alive():
            saved = self.save_log("exited")
            pytest.fail(f"the worker exited (its whole log: {saved}):\n{self.child.tail(60)}")

    def save_log(self, why: str) -> Path:
        """The current run's whole output, written to a file in the test's folder."""
        assert self.child is not None
        self.tmp.mkdir(parents=True, exist_ok=True)  # a run that ended before making it
        saved = self.tmp / f"{why}-{self.child.pid}.log"
        saved.write_text("\n".join(self.child.lines) + "\n")
        return saved

    def stop(self) -> int:
        """SIGTERM (a clean stop: the batch finishes, offsets are committed); the status.
        Sent once the worker said ``botmesh worker: starting``, from when the docs promise a
        SIGTERM is a clean stop (before it, Python itself is still starting)."""
        assert self.child is not None
        with contextlib.suppress(AssertionError):  # it exited already: its status stands
            self.child.wait_for(STARTING, timeout=WAIT_S)
        try:
            status = self.child.stop()
        except AssertionError as exc:
            raise AssertionError(f"{exc} (its whole log: {self.save_log('stuck')})") from None
        if status != 0:  # kept for the test's report: close() finds nothing left to save
            self.save_log(f"stopped-{status}")
        return status

    def kill(self) -> None:
        assert self.child is not None
        self.killed.append(self.child.pid)
        self.child.kill()

    def close(self) -> None:
        if self.child is not None and self.child.proc is not None:
            with contextlib.suppress(AssertionError):  # a stop that hung was said already
                self.child.stop()  # reaped, its pipes closed, even when it had exited
            self.save_log("run")  # the last run's whole log, next to its data

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


class Answers:
    """The receipts on ``topic`` from ``start`` on, read in the background while a test
    kills and restarts ``worker``: ``seen`` in the order read, ``answered`` the inbound ids
    they answer. ``async with Answers(...) as got:`` starts and stops the reader."""

    def __init__(self, worker: Worker, topic: str, start: dict[int, int]) -> None:
        self.worker = worker
        self.topic = topic
        self.start = start
        self.seen: list[Seen] = []
        self.answered: set[str] = set()
        self._reader: asyncio.Future[None] | None = None

    async def _read(self) -> None:
        async for s in tail_receipts(self.worker.brokers, self.topic, start=self.start):
            self.seen.append(s)
            self.answered.add(s.receipt.inbound_id or "")

    async def __aenter__(self) -> Answers:
        self._reader = asyncio.ensure_future(self._read())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader

    def check(self) -> None:
        """The worker is alive and the reader has not failed (its error, not "0 answered")."""
        self.worker.check_alive()
        if self._reader is not None and self._reader.done():
            self._reader.result()

    async def until(self, ids: set[str], done: int) -> None:
        """Wait until ``done`` of ``ids`` were answered (a hang guard of ``WAIT_S``)."""
        deadline = time.monotonic() + WAIT_S
        while len(self.answered & ids) < done:
            self.check()
            assert time.monotonic() < deadline, f"{len(self.answered & ids)}/{done} answered"
            await asyncio.sleep(0.02)


async def stream_slices(
    bootstrap: str, topic: str, records: Sequence[Inbound], size: int, pause: float
) -> None:
    """Produce ``records`` ``size`` at a time, ``pause`` s apart: the traffic keeps coming
    while the worker dies."""
    for i in range(0, len(records), size):
        await produce_inbound(bootstrap, topic, list(records[i : i + size]))
        await asyncio.sleep(pause)


async def kill_as_answers_come(
    worker: Worker,
    got: Answers,
    ids: set[str],
    *,
    kills: int,
    rng: random.Random,
    jitter: float,
) -> None:
    """SIGKILL and restart ``worker`` ``kills`` times, the k-th once (k+1)/(kills+2) of
    ``ids`` were answered, then at a random moment up to ``jitter`` s later."""
    for k in range(kills):
        await got.until(ids, (k + 1) * len(ids) // (kills + 2))
        await asyncio.sleep(rng.uniform(0.0, jitter))  # a different moment each time
        worker.kill()
        worker.start()


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
    receipts = tail_receipts(worker.brokers, topic, start=start)
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


@dataclass(frozen=True, slots=True)
class Record:
    """A record read back: where it is, its key, value (``None``: a tombstone), headers and
    timestamp (ms since the epoch): the attributes the Kafka tests read of a record."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]
    timestamp: int

    @classmethod
    def of(cls, m: Message) -> Record:
        raw = m.headers() or []
        pairs = raw.items() if isinstance(raw, dict) else raw
        headers = [(k, v.encode() if isinstance(v, str) else v or b"") for k, v in pairs]
        _, timestamp = m.timestamp()
        return cls(
            str(m.topic()),
            int(m.partition() or 0),
            int(m.offset() or 0),
            m.key(),
            m.value(),
            headers,
            int(timestamp),
        )


#: The group id the readers below name (they assign partitions: no group is joined).
_READER = "botmesh-tests"


def _isolation(committed: bool) -> dict[str, str]:
    return {"isolation.level": "read_committed" if committed else "read_uncommitted"}


def _read_spans(
    bootstrap: Brokers, topic: str, ends: dict[int, int], *, committed: bool
) -> list[Record]:
    """The records of ``topic`` from each partition's beginning up to its end offset in
    ``ends``, in partition order (a hang guard of ``WAIT_S``)."""
    out: list[Record] = []
    deadline = time.monotonic() + WAIT_S

    def guard(_read: int) -> None:
        if time.monotonic() > deadline:
            raise AssertionError(f"cannot read {topic} to its end offsets {ends}")

    consumer = reader(bootstrap, _READER, _isolation(committed))
    try:
        spans = {(topic, p): (OFFSET_BEGINNING, end) for p, end in ends.items() if end > 0}
        read_to_end(consumer, spans, lambda m: out.append(Record.of(m)), progress=guard)
    finally:
        consumer.close()
    return sorted(out, key=lambda r: (r.partition, r.offset))


def _dead_letters(
    bootstrap: str, topic: str, until: Callable[[list[Any]], bool], check: Callable[[], None]
) -> list[Any]:
    parts = wait_topic(bootstrap, topic, 30.0)
    assert parts, f"no topic {topic}"
    consumer = reader(bootstrap, _READER, {**_isolation(False), "enable.partition.eof": False})
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        dead: list[Any] = []
        deadline = time.monotonic() + WAIT_S
        while not until(dead):
            check()
            if time.monotonic() > deadline:
                raise AssertionError(f"the DLQ {topic} has only {len(dead)} records")
            for m in consumer.consume(500, 0.3):
                err = m.error()
                if err is None:
                    dead.append(Record.of(m))
                elif err.fatal():
                    raise KafkaException(err)
        return dead
    finally:
        consumer.close()


async def dead_letters(
    bootstrap: str, topic: str, until: Callable[[list[Any]], bool], check: Callable[[], None]
) -> list[Any]:
    """The records (``Record``) of a DLQ topic from the beginning, until ``until(records)``
    holds."""
    return await asyncio.to_thread(_dead_letters, bootstrap, topic, until, check)


async def read_all(bootstrap: str, topic: str, *, committed: bool = False) -> list[Any]:
    """Every record (``Record``) on ``topic`` now (up to the end offsets read first), in
    partition order; ``committed``: only those of committed transactions
    (``read_committed``)."""
    ends = await end_offsets(bootstrap, topic)
    return await asyncio.to_thread(_read_spans, bootstrap, topic, ends, committed=committed)


#: ``--journal`` values naming the journal on Kafka (``botmesh.streams.config``).
_KAFKA_JOURNALS = {"kafka", "kafka:", "kafka://", "table"}


def _table_kv() -> Any:
    """``botmesh.streams.table_kv`` (the journal in a changelogged table), or None while it does not
    exist."""
    try:
        return importlib.import_module("botmesh.streams.table_kv")
    except ModuleNotFoundError as exc:
        if exc.name != "botmesh.streams.table_kv":
            raise
        return None


def journal_source(worker: Worker) -> str:
    """Where ``read_journal`` reads this worker's journal: ``"changelog"`` or ``"file"``."""
    on_kafka = worker.journal is None or worker.journal.strip().lower() in _KAFKA_JOURNALS
    return "changelog" if on_kafka and _table_kv() is not None else "file"


async def read_journal(worker: Worker) -> dict[str, dict[str, Any]]:
    """Key -> value of every entry of the journal ``worker`` ran on (read with the worker
    stopped): the changelog topic of the default journal once ``botmesh.streams.table_kv`` exists,
    else the file journal (``--journal``, or the default one in the data dir)."""
    table_kv = _table_kv()
    if journal_source(worker) == "changelog":
        topic = table_kv.changelog_topic(Catalog(worker.prefix))
        return await read_changelog(worker.bootstrap, topic)
    url = worker.journal if worker.journal is not None else default_journal(worker.data_dir)
    kv = await open_backend(url)
    try:
        return {e.key: e.value for e in await kv.scan("")}
    finally:
        await kv.close()


async def read_changelog(bootstrap: str, topic: str) -> dict[str, dict[str, Any]]:
    """The journal a compacted changelog holds now (``JournalView``: the last record of a
    key wins, a tombstone deletes it, a group record replaces its group); read_committed, up
    to the end offsets."""
    return await asyncio.to_thread(_read_changelog, bootstrap, topic)


def _read_changelog(bootstrap: str, topic: str) -> dict[str, dict[str, Any]]:
    parts = wait_topic(bootstrap, topic)
    assert parts, f"no changelog topic {topic}"
    consumer = reader(bootstrap, _READER, _isolation(True))
    try:
        ends = {
            p: end for (_, p), (_, end) in watermarks(consumer, [(topic, p) for p in parts]).items()
        }
    finally:
        consumer.close()
    view = JournalView()
    for m in _read_spans(bootstrap, topic, ends, committed=True):
        assert m.key is not None, f"a changelog record without a key at {m.offset}"
        view.apply(m.key, m.value)
    return {k: e.value for k, e in view.entries.items()}

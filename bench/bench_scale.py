"""The worker on a large journal: N retained inbound records (and their sends), one run.

    .venv/bin/python bench/bench_scale.py [--records N | --quick] [-n 5000] [--rounds 2]
                                          [--idle 30] [--chats C] [--spread DAYS] [--keep]

Targets (the "scale" target): after N = 1,000,000 retained inbound records and their sends,
throughput >= 0.9x that on an empty journal, worker RSS <= 512 MiB, idle CPU <= 5 % of a
core, restart with the same instance id to first reply <= 5 s; a partition restored from the
changelog by a worker with no copy at >= 50,000 journal records/s. ``--quick`` is N = 100,000.

One worker (``python -m botmesh worker --app botmesh.examples.echo_bot:bot --provider mock
--instance-id ...``, as ``bench/bench_worker.py`` starts it, 4 partitions) on a fresh prefix:

0. empty journal: time from the process start to the receipt of a record sent right after it,
   RSS (``VmRSS``), idle CPU over ``--idle`` s, a template record (inbound id and chat id
   that occur nowhere else), then throughput (``--rounds`` runs of ``-n`` records at once
   over 50 chats, clock from the first send to the last receipt, as ``bench_worker``; their
   mean); clean stop (SIGTERM);
1. seed: the worker's changelog is read back (the last record of each key: what
   compaction keeps); the template inbound's records (``<scope>/in/<id>``: done, no due
   score, a purge score; ``<scope>/out/<id>:1``: sent, published; the send's message-log
   entry ``<scope>/log/<chat>/<sent µs>/<id>:1/0001``) are cloned N times with new inbound
   ids, chats (``--chats``), provider message ids, sources and fingerprints, and their
   timestamps (purge score and the log key's time included) moved back by up to
   ``--spread`` (1 day of traffic: every purge score stays in the future), and produced
   straight to the changelog
   (a bare confluent-kafka producer, acks=all, batches of up to 1 MB, the worker's
   ``botmesh.writer`` header), each to the partition of its chat (murmur2 of the chat key:
   the inbound partition, as the worker keys it). 3N journal entries (2N before the
   message log); since the worker writes one record a turn (a group record holding the
   inbound, its send and the send's log entry), N changelog records; none through the
   worker;
2. start on the seeded journal, same instance id and data dir (the worker restores the 3N
   records its RocksDB lacks, from the offset after the one it holds: its restore,
   ``botmesh/streams/worker/restore.py``): time to first reply, RSS, idle CPU, throughput
   (ratio to 0.);
3. restart: SIGKILL, same instance id, same data dir (RocksDB holds everything but what was
   written after its last persisted offset): time to first reply;
4. restore: SIGKILL, the data dir deleted, same instance id: time to first reply and the
   restore rate, the changelog records the worker read (its ``journal partition N restored:
   R changelog records read from offset A to B`` lines) / seconds from the process start to
   the last of those lines; beside it the same records over the window from the worker's
   ``runtime started`` line (the process up, its journal opened, before it joins the group)
   to that line.

For each start the times (from the process start) of the runtime started, the journal
partitions restored (records read, and from which offsets), opened and their recovery pass
done (the worker's log lines) are printed beside the first reply. Every worker runs the
runtime on librdkafka, as ``bench_worker`` starts it; the bench's own clients are
confluent-kafka's. Topics
and data dirs are deleted at the end unless ``--keep``. Broker: as ``bench/bench_worker.py``
(``KAFKA_BOOTSTRAP_SERVERS``, else the local ``deploy/kafka/kafka.sh`` one).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import msgspec

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition  # noqa: E402

from bench.bench_worker import (  # noqa: E402
    KAFKA_SH,
    PARTITIONS,
    RECORD_BYTES,
    Bench,
    Side,
    Tail,
    admin_client,
    broker,
    catalog,
    cpu_seconds,
    high_watermarks,
    log_tail,
    receipt_id,
    records,
    take,
    worker_args,
    worker_command,
)
from botmesh.state.keys import fingerprint  # noqa: E402
from botmesh.state.messages import Inbound, Outbound  # noqa: E402
from botmesh.topics import Catalog, chat_key, encode_inbound  # noqa: E402

TARGET_RATIO = 0.9
TARGET_RSS_MIB = 512.0
TARGET_IDLE_PCT = 5.0
TARGET_RESTART_S = 5.0
TARGET_RESTORE_RATE = 50_000.0
DAY = 86400.0
BATCH = 500
#: The journal's table name: its changelog is ``<app id>-journal-changelog`` (the worker's
#: ``botmesh.streams.table_kv.TABLE_NAME``; that module is not imported here).
TABLE_NAME = "journal"


def changelog_topic(cat: Catalog) -> str:
    """The worker's journal changelog for a topic catalog."""
    return cat.changelog(TABLE_NAME)


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


# -- the worker process -------------------------------------------------------------------


def vm_mib(pid: int, name: str) -> float:
    """``VmRSS`` / ``VmHWM`` of a live process, MiB (nan if unknown)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{name}:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


#: A worker's text log line (``botmesh.observability.logs.TEXT_FORMAT``): time, level,
#: logger, message.
_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) [A-Z]+ [\w.]+: (.*)$")
#: A journal partition brought up to the end of its changelog (``worker/loop.py``).
_RESTORED = re.compile(
    r"journal partition (\d+) restored: (\d+) changelog records read from offset (\d+) to (\d+)"
)
#: A journal partition open on its restored database (``TableKv.assign``).
_OPENED = re.compile(r"journal partition (\d+) opened")


@dataclass
class Start:
    """One start of the worker, seconds from the spawn."""

    first_reply: float = float("nan")
    rss: float = float("nan")
    peak: float = float("nan")
    started: float | None = None  # "runtime started": up, before joining the group
    restored: float | None = None  # the last "journal partition %d restored"
    opened: float | None = None  # the last "journal partition %d opened"
    recovered: float | None = None  # the last "journal partition %d recovered"
    #: per partition: (changelog records read, from offset, to offset)
    reads: dict[int, tuple[int, int, int]] = field(default_factory=dict)
    idle_pct: float = float("nan")
    rate: float = float("nan")

    @property
    def read(self) -> int:
        """Changelog records the worker's restore read, every partition."""
        return sum(r for r, _, _ in self.reads.values())

    def phases(self) -> str:
        def at(name: str, t: float | None) -> str:
            return f"{name} {t:.1f}" if t is not None else f"{name} -"

        spans = " ".join(f"p{p} {a}->{b}" for p, (_, a, b) in sorted(self.reads.items()))
        return ", ".join(
            [
                at("runtime started", self.started),
                at(f"journal restored ({self.read} records read: {spans or '-'})", self.restored),
                at("opened", self.opened),
                at("recovery pass done", self.recovered),
            ]
        )


def read_log(log: Path, start: Start, *, offset: int, wall0: float, until: float) -> None:
    """The worker's start-up milestones from its log (the lines after ``offset``, the
    process started last, up to ``until``, wall clock), as seconds after ``wall0``."""
    with open(log, "rb") as f:
        f.seek(offset)
        text = f.read().decode(errors="replace")
    for line in text.splitlines():
        m = _LINE.match(line)
        if m is None:
            continue
        wall = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        if wall > until:
            break
        t, msg = wall - wall0, m.group(2)
        if msg.startswith("runtime started") and start.started is None:
            start.started = t
        elif (restored := _RESTORED.search(msg)) is not None:
            p, n, a, b = (int(g) for g in restored.groups())
            start.restored = t
            start.reads[p] = (n, a, b)
        elif _OPENED.search(msg) is not None:
            start.opened = t
        elif "recovered (" in msg and msg.startswith("journal partition"):
            start.recovered = t


async def start_worker(bench: Bench, side: Side, run: str, within: float) -> Start:
    """Spawn the worker, send one record right away, time its receipt; RSS once it came."""
    mark = len(side.output.seen)
    offset = side.log.stat().st_size if side.log.exists() else 0
    rid, key, value = records(1, run)[0]
    wall0, t0 = time.time(), time.monotonic()
    side.start()
    await bench.send_all(side.cat.inbound, [(rid, key, value)])
    try:
        got = await side.output.collect(mark, lambda s: s.id == rid, 1, side.alive, within)
    except SystemExit:
        print(f"--- worker log ({side.log}):\n{log_tail(side.log)}", file=sys.stderr)
        raise
    pid = side.alive().pid
    start = Start(first_reply=got[rid].at - t0)
    start.rss, start.peak = vm_mib(pid, "VmRSS"), vm_mib(pid, "VmHWM")
    await asyncio.sleep(0.5)  # the log lines of the first reply are written
    read_log(side.log, start, offset=offset, wall0=wall0, until=time.time())
    return start


async def idle_cpu(side: Side, seconds: float, settle: float = 3.0) -> float:
    """% of a core the worker used over ``seconds`` with no traffic (after ``settle`` s)."""
    await asyncio.sleep(settle)
    pid = side.alive().pid
    c0, t0 = cpu_seconds(pid), time.monotonic()
    await asyncio.sleep(seconds)
    return (cpu_seconds(pid) - c0) / (time.monotonic() - t0) * 100


async def throughput(bench: Bench, side: Side, plan: Plan, run: str) -> float:
    """The mean of ``plan.rounds`` throughput runs of ``plan.n`` records, records/s."""
    rates = [await bench.throughput(side, plan.n, f"{run}-{k}") for k in range(plan.rounds)]
    return statistics.mean(rates)


def runs(side: Side, plan: Plan) -> str:
    """The last throughput runs of ``side``: mean (each run; CPU per record)."""
    rates, cpu = side.rates[-plan.rounds :], side.cpu[-plan.rounds :]
    each = ", ".join(f"{r:.0f}" for r in rates)
    return (
        f"{statistics.mean(rates):.0f} records/s (runs {each}; "
        f"{statistics.mean(cpu) * 1e3:.2f} ms CPU/record)"
    )


def kill(side: Side) -> None:
    side.alive().send_signal(signal.SIGKILL)
    side.alive().wait()


# -- the journal: read back, cloned -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Logged:
    partition: int
    key: bytes
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]


async def read_changelog(bootstrap: str, topic: str) -> tuple[dict[bytes, Logged], int]:
    """The last record of each key (what compaction keeps), and the records read."""
    return await asyncio.to_thread(_read_changelog, bootstrap, topic)


def _read_changelog(bootstrap: str, topic: str) -> tuple[dict[bytes, Logged], int]:
    ends = {p: end for (_, p), end in high_watermarks(bootstrap, tps_of(topic)).items()}
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-scale-read-{uuid.uuid4().hex[:8]}",  # never joined: assigned
            "enable.auto.commit": False,
            "isolation.level": "read_uncommitted",
        }
    )
    last: dict[bytes, Logged] = {}
    n = 0
    try:
        left = {p for p, end in ends.items() if end > 0}
        consumer.assign([TopicPartition(topic, p, 0) for p in sorted(left)])
        while left:
            for m in take(consumer, 10_000, 1.0):
                if m.error() is not None:
                    continue
                n += 1
                key, part = m.key(), m.partition()
                if key is not None and part is not None:
                    got = m.headers() or []
                    pairs = got.items() if isinstance(got, dict) else got
                    heads = tuple((k, as_bytes(v)) for k, v in pairs)
                    last[key] = Logged(part, key, m.value(), heads)
            # done on the position, not a record: it passes what is never handed out
            for tp in consumer.position([TopicPartition(topic, p) for p in sorted(left)]):
                if tp.offset >= ends[tp.partition]:
                    left.discard(tp.partition)
    finally:
        consumer.close()
    return last, n


def as_bytes(value: str | bytes | None) -> bytes:
    return value.encode() if isinstance(value, str) else (value or b"")


def tps_of(topic: str) -> list[tuple[str, int]]:
    return [(topic, p) for p in range(PARTITIONS)]


async def changelog_size(bootstrap: str, topic: str) -> int:
    """Records on ``topic``: the sum of its end offsets."""
    ends = await asyncio.to_thread(high_watermarks, bootstrap, tps_of(topic))
    return sum(ends.values())


def kind(key: bytes, value: bytes | None) -> str:
    """``in/done``, ``out/sent+published``, ``log``...: a journal record's sort (the key's
    part after the scope) and state (a message-log entry has none)."""
    sort = key.decode(errors="replace").split("/")[1] if b"/" in key else "?"
    if value is None:
        return f"{sort}/(deleted)"
    stored = msgspec.json.decode(value)
    if "g" in stored:  # one record a turn: its members' kinds
        return (
            f"{sort}/group("
            + ", ".join(
                kind(m.encode(), msgspec.json.encode(v)) for m, v in stored["g"] if v is not None
            )
            + ")"
        )
    r = stored.get("r", {})
    if "state" not in r:
        return sort
    state = str(r["state"])
    if "published" in r:
        state += "+published" if r["published"] else "+unpublished"
    return f"{sort}/{state}"


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (``org.apache.kafka.common.utils.Utils.murmur2``, librdkafka's
    ``murmur2_random`` partitioner on a keyed record), as an unsigned 32-bit value."""
    m, mask = 0x5BD1E995, 0xFFFFFFFF
    length = len(data)
    h = (0x9747B28C ^ length) & mask
    for i in range(0, length - length % 4, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * m) & mask
        k ^= k >> 24
        k = (k * m) & mask
        h = ((h * m) & mask) ^ k
    tail = length - length % 4
    extra = length % 4
    if extra == 3:
        h ^= data[tail + 2] << 16
    if extra >= 2:
        h ^= data[tail + 1] << 8
    if extra >= 1:
        h ^= data[tail]
        h = (h * m) & mask
    h ^= h >> 13
    h = (h * m) & mask
    return h ^ (h >> 15)


def partition_of(chat: str) -> int:
    """The inbound partition of a chat: Kafka's default partitioner (murmur2) on its key."""
    return (murmur2(chat_key(chat)) & 0x7FFFFFFF) % PARTITIONS


Part = bytes | str  # literal bytes, or the name of a slot filled per clone


def compile_template(data: bytes, needles: dict[bytes, str]) -> list[Part]:
    """``data`` cut at each needle (longest first) into literal bytes and slot names."""
    if not needles:
        return [data]
    pattern = re.compile(b"|".join(re.escape(n) for n in sorted(needles, key=len, reverse=True)))
    parts: list[Part] = []
    pos = 0
    for m in pattern.finditer(data):
        parts += [data[pos : m.start()], needles[m.group(0)]]
        pos = m.end()
    parts.append(data[pos:])
    return [p for p in parts if p != b""]


def render(parts: Sequence[Part], slots: dict[str, bytes]) -> bytes:
    return b"".join(p if isinstance(p, bytes) else slots[p] for p in parts)


def timestamps(obj: Any, now: float, found: set[float]) -> None:
    """The float values of ``obj`` within 60 days of ``now`` (its times), into ``found``."""
    if isinstance(obj, dict):
        for v in obj.values():
            timestamps(v, now, found)
    elif isinstance(obj, list):
        for v in obj:
            timestamps(v, now, found)
    elif isinstance(obj, float) and abs(obj - now) < 60 * DAY:
        found.add(obj)


@dataclass
class Template:
    """One journal record of the template inbound, as slots to fill per clone."""

    what: str
    key: list[Part]
    value: list[Part]
    headers: tuple[tuple[str, bytes], ...]
    times: dict[str, float]  # slot -> the template's time
    fp_text: str | None  # the text of the send whose fingerprint is in the value
    #: slot -> the template's time in its key (a message-log entry's, ``key_time``)
    key_times: dict[str, float] = field(default_factory=dict)


def key_time(t: float) -> bytes:
    """A time as a message-log key holds it: microseconds, 17 digits
    (``botmesh.state.message_log.position_of``)."""
    return f"{max(round(t * 1_000_000), 0):017d}".encode()


def members_of(stored: dict[str, Any]) -> list[dict[str, Any]]:
    """The stored entries of a changelog value: a group record's members (one record a
    turn: the inbound, its sends, their message-log entries), else the value itself."""
    if "g" in stored:
        return [m for _, m in stored["g"] if isinstance(m, dict)]
    return [stored]


def make_template(rec: Logged, tpl_id: str, tpl_chat: str, now: float) -> Template:
    assert rec.value is not None
    stored = msgspec.json.decode(rec.value)
    needles = {tpl_id.encode(): "id", tpl_chat.encode(): "chat"}
    found: set[float] = set()
    timestamps(stored, now, found)
    times: dict[str, float] = {}
    key_times: dict[str, float] = {}
    for k, t in enumerate(sorted(found)):
        text = msgspec.json.encode(t)
        if text not in rec.value:
            raise SystemExit(f"template {rec.key!r}: time {t!r} not found as {text!r}")
        needles[text] = f"t{k}"
        times[f"t{k}"] = t
        # a message-log entry: its key sorts by its time (in a group record, the member's
        # key is in the value)
        if key_time(t) in rec.key or key_time(t) in rec.value:
            needles[key_time(t)] = f"k{k}"
            key_times[f"k{k}"] = t
    fp_text = None
    for member in members_of(stored):
        r = member.get("r", {})
        if isinstance(r.get("fp"), str) and isinstance(r.get("payload"), dict):
            text = r["payload"].get("text")
            if fingerprint(Outbound(chat_id=tpl_chat, text=text)) == r["fp"]:
                needles[r["fp"].encode()] = "fp"
                fp_text = text
        if isinstance(r.get("message_id"), str):
            needles[msgspec.json.encode({"message_id": r["message_id"]})[1:-1]] = "mid"
        if isinstance(r.get("source"), str):
            needles[msgspec.json.encode({"source": r["source"]})[1:-1]] = "src"
        if member.get("d") is not None:
            print(f"  note: template {rec.key.decode()} has a due score ({member['d']})")
    return Template(
        kind(rec.key, rec.value),
        compile_template(rec.key, needles),
        compile_template(rec.value, needles),
        rec.headers,
        times,
        fp_text,
        key_times,
    )


@dataclass
class Seeded:
    templates: list[Template]
    clones: int
    produced: int
    chats: int
    generate_s: float
    produce_s: float
    kinds: dict[str, int]
    before: int  # changelog records before seeding
    after: int


async def seed(
    bootstrap: str,
    cat: Catalog,
    *,
    tpl_id: str,
    tpl_chat: str,
    n: int,
    chats: int,
    spread: float,
    tag: str,
) -> Seeded:
    topic = changelog_topic(cat)
    last, before = await read_changelog(bootstrap, topic)
    kinds: dict[str, int] = {}
    for rec in last.values():
        kinds[kind(rec.key, rec.value)] = kinds.get(kind(rec.key, rec.value), 0) + 1
    mine = [rec for rec in last.values() if tpl_id.encode() in rec.key]
    per_chat = [
        rec
        for rec in last.values()
        if tpl_chat.encode() in rec.key and tpl_id.encode() not in rec.key
    ]
    if per_chat:
        raise SystemExit(f"records keyed by the template chat, not cloned: {per_chat}")
    if not mine or any(rec.value is None for rec in mine):
        raise SystemExit(f"no live journal record of the template inbound {tpl_id} in {topic}")
    now = time.time()
    for rec in mine:
        if rec.partition != partition_of(tpl_chat):
            raise SystemExit(f"{rec.key!r} is in partition {rec.partition}, not its chat's")
        assert rec.value is not None
        for stored in members_of(msgspec.json.decode(rec.value)):
            if stored.get("p") is None or stored["p"] < now + spread:
                raise SystemExit(f"{rec.key!r}: no purge score far enough in the future: {stored}")
    templates = [make_template(rec, tpl_id, tpl_chat, now) for rec in mine]
    chat_ids = [f"s{tag}c{k}" for k in range(chats)]
    parts = [partition_of(c) for c in chat_ids]
    fps: dict[tuple[int, str], bytes] = {}

    def clones() -> Iterator[tuple[int, bytes, bytes, tuple[tuple[str, bytes], ...]]]:
        for i in range(n):
            c = i % chats
            chat, p = chat_ids[c], parts[c]
            age = spread * (n - 1 - i) / max(n - 1, 1)  # the newest last
            slots = {
                "id": f"s{tag}-{i}".encode(),
                "chat": chat.encode(),
                "mid": f'"message_id":"mock-{tag}-{i}"'.encode(),
                "src": f'"source":"{cat.inbound}:{p}:{i}"'.encode(),
            }
            for tpl in templates:
                for slot, t in tpl.times.items():
                    slots[slot] = msgspec.json.encode(t - age)
                for slot, t in tpl.key_times.items():
                    slots[slot] = key_time(t - age)
                if tpl.fp_text is not None:
                    fp = fps.get((c, tpl.fp_text))
                    if fp is None:
                        fp = fingerprint(Outbound(chat_id=chat, text=tpl.fp_text)).encode()
                        fps[(c, tpl.fp_text)] = fp
                    slots["fp"] = fp
                yield p, render(tpl.key, slots), render(tpl.value, slots), tpl.headers

    t_all = time.monotonic()
    produced, gen_s = await produce(bootstrap, topic, clones())
    produce_s = time.monotonic() - t_all
    after = await changelog_size(bootstrap, topic)
    if after - before != produced:
        raise SystemExit(f"{topic}: {after - before} new records, {produced} produced")
    return Seeded(
        templates,
        n,
        produced,
        chats,
        gen_s,
        produce_s,
        kinds,
        before,
        after,
    )


async def produce(
    bootstrap: str,
    topic: str,
    recs: Iterator[tuple[int, bytes, bytes, tuple[tuple[str, bytes], ...]]],
) -> tuple[int, float]:
    """Produce ``recs`` (partition, key, value, headers) in batches of up to 1 MB per
    partition, acks=all; (records produced, seconds spent making them)."""
    return await asyncio.to_thread(_produce, bootstrap, topic, recs)


def _produce(
    bootstrap: str,
    topic: str,
    recs: Iterator[tuple[int, bytes, bytes, tuple[tuple[str, bytes], ...]]],
) -> tuple[int, float]:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "linger.ms": 50,
            "batch.size": 1_000_000,
            "queue.buffering.max.messages": 1_000_000,
        }
    )
    failed: list[KafkaError] = []

    def delivered(err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            failed.append(err)

    n = 0
    gen = 0.0
    while True:
        t = time.monotonic()
        rec = next(recs, None)
        gen += time.monotonic() - t
        if rec is None:
            break
        p, key, value, headers = rec
        n += 1
        while True:
            try:
                producer.produce(
                    topic, value, key, partition=p, headers=list(headers), on_delivery=delivered
                )
                break
            except BufferError:  # the local queue is full: let the acks drain it
                producer.poll(0.05)
        if failed:
            break
    left = producer.flush(300.0)
    if failed:
        raise SystemExit(f"{topic}: a record was not produced: {failed[0]}")
    if left:
        raise SystemExit(f"{topic}: {left} records not acked within 300 s")
    return n, gen


async def delete_topics(bootstrap: str, prefix: str) -> list[str]:
    def delete() -> list[str]:
        admin = admin_client(bootstrap)
        names = [t for t in admin.list_topics(timeout=10.0).topics if t.startswith(f"{prefix}.")]
        if names:
            for future in admin.delete_topics(names, operation_timeout=30).values():
                future.result(60)
        return names

    return await asyncio.to_thread(delete)


# -- the run --------------------------------------------------------------------------------


def template_record(tpl_id: str, tpl_chat: str) -> tuple[str, bytes, bytes]:
    """An inbound like ``bench_worker.record``'s (~200 B) with an id and chat of its own."""
    bare = encode_inbound(
        Inbound(chat_id=tpl_chat, id=tpl_id, text="x", sender="bench", channel="b")
    )
    text = "x" * (1 + max(0, RECORD_BYTES - len(bare)))
    rec = Inbound(chat_id=tpl_chat, id=tpl_id, text=text, sender="bench", channel="b")
    return tpl_id, chat_key(tpl_chat), encode_inbound(rec)


@dataclass(frozen=True, slots=True)
class Plan:
    records: int
    n: int
    rounds: int
    idle: float
    chats: int
    spread: float
    keep: bool


async def run(bootstrap: str, broker_pid: int | None, tmp: Path, plan: Plan) -> int:
    tag = uuid.uuid4().hex[:6]
    cat = catalog(f"bscale{tag}", bootstrap)
    data = tmp / "worker"
    args = worker_args(
        bootstrap, cat, data, batch=BATCH, instance=f"bench-scale-{tag}", provider="mock"
    )
    side = Side("worker", cat, worker_command(*args), tmp / "worker.log", receipt_id)
    long = 120.0 + plan.records / 1000  # a first reply may wait for a whole restore
    print(
        f"scale: N={plan.records} retained inbounds (+ their sends) over {plan.chats} chats, "
        f"{PARTITIONS} partitions; throughput runs of {plan.n} records (~{RECORD_BYTES} B, 50 "
        f"chats); idle {plan.idle:g} s; broker {bootstrap}; prefix {cat.prefix}; logs in {tmp}"
    )
    print(f"  {' '.join(side.cmd[1:])}")
    rows: list[tuple[str, str, str, bool]] = []
    async with Bench(bootstrap, broker_pid) as bench:
        side.tail = Tail(bootstrap, cat.sent, receipt_id)
        await side.tail.start()
        try:
            empty = await start_worker(bench, side, f"e{tag}", 120.0)
            empty.idle_pct = await idle_cpu(side, plan.idle)
            tpl_id, tpl_chat = f"tpl{tag}I", f"tpl{tag}C"
            rid, key, value = template_record(tpl_id, tpl_chat)
            mark = len(side.output.seen)
            await bench.send_all(cat.inbound, [(rid, key, value)])
            await side.output.collect(mark, lambda s: s.id == rid, 1, side.alive, 60.0)
            empty.rate = await throughput(bench, side, plan, f"te{tag}")
            print(
                f"0. empty journal: first reply {empty.first_reply:.2f} s after the start; RSS "
                f"{empty.rss:.0f} MiB; idle CPU {empty.idle_pct:.1f} % of a core; throughput "
                f"{runs(side, plan)}"
            )
            side.stop()  # SIGTERM: a clean stop, every receipt recorded published

            t = time.monotonic()
            s = await seed(
                bootstrap,
                cat,
                tpl_id=tpl_id,
                tpl_chat=tpl_chat,
                n=plan.records,
                chats=plan.chats,
                spread=plan.spread,
                tag=tag,
            )
            took = time.monotonic() - t
            per_s = s.produced / s.produce_s
            print(
                f"1. seeded in {took:.1f} s (producing {s.produce_s:.1f} s, {per_s:.0f} "
                f"records/s, of which making them {s.generate_s:.1f} s): the worker's journal held "
                + ", ".join(f"{k} {v}" for k, v in sorted(s.kinds.items()))
                + f" ({s.before} changelog records); cloned {s.clones}x "
                + " + ".join(tp.what for tp in s.templates)
                + f" -> {s.produced} records; changelog now {s.after} records"
            )

            full = await start_worker(bench, side, f"f{tag}", long)
            print(
                f"2. start on the seeded journal (same instance id and data dir: the worker "
                f"restores the {s.produced} seeded records its RocksDB lacks): first reply "
                f"{full.first_reply:.1f} s"
                f"\n   ({full.phases()}); RSS {full.rss:.0f} MiB (peak {full.peak:.0f})"
            )
            full.idle_pct = await idle_cpu(side, plan.idle)
            full.rate = await throughput(bench, side, plan, f"tf{tag}")
            ratio = full.rate / empty.rate
            cpu_ratio = statistics.mean(side.cpu[-plan.rounds :]) / statistics.mean(
                side.cpu[: plan.rounds]
            )
            rss_now = vm_mib(side.alive().pid, "VmRSS")
            print(
                f"   idle CPU {full.idle_pct:.1f} % of a core; throughput {runs(side, plan)}, "
                f"{ratio:.2f}x the empty journal's (CPU per record {cpu_ratio:.2f}x); RSS now "
                f"{rss_now:.0f} MiB"
            )

            kill(side)
            again = await start_worker(bench, side, f"r{tag}", long)
            print(
                f"3. restart (SIGKILL, same instance id and data dir): first reply "
                f"{again.first_reply:.2f} s\n   ({again.phases()}); RSS {again.rss:.0f} MiB"
            )

            kill(side)
            held = await changelog_size(bootstrap, changelog_topic(cat))
            shutil.rmtree(data)
            fresh = await start_worker(bench, side, f"w{tag}", long)
            if fresh.restored is not None:  # the worker's own count of what it read
                read, until = fresh.read, fresh.restored
            else:  # no "restored" line: every record on the changelog, to the first reply
                read, until = held, fresh.first_reply
            rate = read / until
            if fresh.restored is not None and fresh.started is not None:
                span = max(until - fresh.started, 1e-3)
                window = (
                    f"{read / span:.0f} records/s from the runtime started, {span:.1f} s "
                    "(the process's start-up left out)"
                )
            else:
                window = "no restore window: log lines missing"
            print(
                f"4. restore (SIGKILL, empty data dir, same instance id; {held} changelog "
                f"records): first reply {fresh.first_reply:.1f} s\n   ({fresh.phases()}); "
                f"{rate:.0f} records/s from the start to the journal restored ({read} records "
                f"in {until:.1f} s; {window}); RSS {fresh.rss:.0f} MiB (peak {fresh.peak:.0f})"
            )
            rows = [
                ("throughput seeded/empty", f"{ratio:.2f}", f">= {TARGET_RATIO}", ratio >= 0.9),
                ("RSS (seeded, ready)", f"{full.rss:.0f} MiB", "<= 512 MiB", full.rss <= 512),
                (
                    "idle CPU (seeded)",
                    f"{full.idle_pct:.1f} %",
                    f"<= {TARGET_IDLE_PCT:g} %",
                    full.idle_pct <= TARGET_IDLE_PCT,
                ),
                (
                    "restart to first reply",
                    f"{again.first_reply:.2f} s",
                    f"<= {TARGET_RESTART_S:g} s",
                    again.first_reply <= TARGET_RESTART_S,
                ),
                (
                    "restore rate",
                    f"{rate:.0f} rec/s",
                    f">= {TARGET_RESTORE_RATE:.0f} rec/s",
                    rate >= TARGET_RESTORE_RATE,
                ),
            ]
        finally:
            side.stop()
            await side.output.stop()
    print(f"targets (N={plan.records}):")
    for name, got, target, ok in rows:
        print(f"  {name:<24} {got:>12}  {target:<18} {verdict(ok)}")
    if not plan.keep:
        await delete_topics(bootstrap, cat.prefix)
    return 0  # a missed target is printed (MISS), as the other benchmarks do; not an error


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--records", type=int, default=1_000_000, help="retained inbounds")
    parser.add_argument("--quick", action="store_true", help="--records 100000")
    parser.add_argument("-n", type=int, default=5000, help="records per throughput run")
    parser.add_argument("--rounds", type=int, default=2, help="throughput runs per journal")
    parser.add_argument("--idle", type=float, default=30.0, help="seconds of the idle CPU")
    parser.add_argument("--chats", type=int, help="chats of the clones (default N/100)")
    parser.add_argument(
        "--spread", type=float, default=1.0, help="days of traffic the clones' times cover"
    )
    parser.add_argument("--keep", action="store_true", help="keep the topics, logs, data dir")
    args = parser.parse_args(argv)
    n = 100_000 if args.quick else args.records
    plan = Plan(
        records=n,
        n=args.n,
        rounds=args.rounds,
        idle=args.idle,
        chats=args.chats or max(1, n // 100),
        spread=args.spread * DAY,
        keep=args.keep,
    )
    bootstrap, started, broker_pid = broker()
    tmp = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    t0 = time.monotonic()
    try:
        rc = asyncio.run(run(bootstrap, broker_pid, tmp, plan))
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    finally:
        print(f"(took {time.monotonic() - t0:.0f} s)")
        if started:
            subprocess.run([str(KAFKA_SH), "stop"], check=False)
    return rc


if __name__ == "__main__":
    sys.exit(main())

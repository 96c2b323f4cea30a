"""A journal partition restored from its changelog: the worker's reader
(``botmesh/streams/worker/restore.py``) against the database writes it used before (a
RocksDB point read for each record, tables without Bloom filters: copied below as the
BASELINE), side by side on the same changelog, and a bare confluent-kafka read of the same
records (what reading alone costs).

The changelog: one partition of N records (300 000 by default) shaped as the journal's
(two inbounds to a reply, about 250 bytes a value, 5 000 chats, each with a purge score),
produced once. Then, alternating, ``--rounds`` times: the bare read, the baseline restore
and ours, each into a fresh database; and 100 000 reads of keys the restored database lacks
(a new inbound's dedupe read). Printed: records/s of each, the ratios, µs a missing key.
``.venv/bin/python bench/bench_restore.py [-n N] [--rounds R] [--groups] [--profile]``; the
broker as ``bench_worker.py`` finds or starts it (``KAFKA_BOOTSTRAP_SERVERS``, else a local
one). ``--groups``: the records are group records, a finished turn each as the worker
writes it now (the inbound, its reply and the reply's message-log entry; the baseline then
writes each as one value, without its members: a reference, not a correct restore);
``--profile``: our restore once under cProfile, nothing else.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import rocksdict
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from botmesh.state.kv import Entry
from botmesh.streams.journal_db import JournalDb, encode_entry, encode_group
from botmesh.streams.journal_db import _index_entries as index_entries
from botmesh.streams.worker import restore as ours

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.bench_worker import KAFKA_SH, broker

CHATS = 5000


# ---------------------------------------------------------------------------------------------
# BASELINE: the database side of the restore before the Bloom filters and the batch's
# multi-get (commit 80309bd): ``open_database`` and ``JournalDb.write`` as they were.
# ---------------------------------------------------------------------------------------------


class OldJournalDb(JournalDb):
    def write(
        self, records: Sequence[tuple[bytes, bytes | None]], offset: int | None = None
    ) -> None:
        batch = rocksdict.WriteBatch(raw_mode=True)
        last: dict[bytes, bytes | None] = {}
        db = self.db
        for key, value in records:
            old = last[key] if key in last else db.get(key)
            gone = index_entries(key, old) if old is not None else []
            new = index_entries(key, value)
            for ik in gone:
                if ik not in new:
                    batch.delete(ik)
            for ik in new:
                if ik not in gone:
                    batch.put(ik, b"")
            if value is None:
                batch.delete(key)
            else:
                batch.put(key, value)
            last[key] = value
        if offset is not None:
            batch.put(self.offset_key, str(offset).encode())
        db.write(batch)


def old_open_database(path: Path) -> JournalDb:
    options = rocksdict.Options(raw_mode=True)
    options.create_if_missing(True)
    options.set_write_buffer_size(ours.WRITE_BUFFER_SIZE)
    options.set_max_write_buffer_number(ours.MAX_WRITE_BUFFERS)
    return OldJournalDb.open(rocksdict.Rdict(str(path), options=options), ours.OFFSET_KEY)


# ---------------------------------------------------------------------------------------------


def key_of(i: int) -> str:
    chat = f"chat-{i % CHATS}"
    return f"bot/out/{chat}/m{i}:1" if i % 3 == 0 else f"bot/in/{chat}/m{i}"


def group_of(i: int) -> tuple[str, bytes]:
    """Record ``i`` shaped as the worker writes a finished turn now (``--groups``): a group
    record keyed by the inbound's key, holding the inbound (done), its reply (sent,
    published) and the reply's message log entry, each with a purge score."""
    chat = f"chat-{i % CHATS}"
    inbound, send = f"bot/in/m{i}", f"bot/out/m{i}:1"
    log_key = f"bot/log/{chat}/{1.79e9 + i:.6f}/m{i}%3A1/0"
    at = 1.79e9 + i
    text = "hello there " * 4
    members = [
        (log_key, Entry(log_key, {"key": f"m{i}:1", "message_id": f"p{i}", "at": at}, 1, None, at)),
        (inbound, Entry(inbound, {"id": f"m{i}", "state": "done", "text": text}, 3, None, at)),
        (send, Entry(send, {"key": f"m{i}:1", "state": "sent", "published": True}, 4, None, at)),
    ]
    return inbound, encode_group((k, encode_entry(e)) for k, e in members)


def single_of(i: int) -> tuple[str, bytes]:
    key = key_of(i)
    value = {"id": f"m{i}", "state": "done", "text": "hello there " * 4, "attempts": 1}
    return key, encode_entry(Entry(key, {**value, "created": 1.79e9 + i}, 3, None, 1.79e9 + i))


def seed(bootstrap: str, n: int, *, groups: bool = False) -> str:
    topic = f"bench-restore-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept until the answer came
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 20, "compression.type": "lz4"}
    )
    make = group_of if groups else single_of
    for i in range(n):
        key, value = make(i)
        while True:
            try:
                producer.produce(topic, value, key.encode(), partition=0)
                break
            except BufferError:
                producer.poll(0.05)
    producer.flush(60)
    return topic


def bare_read(bootstrap: str, topic: str, end: int) -> float:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "bench-restore", "enable.auto.commit": False}
    )
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        started, seen = time.perf_counter(), 0
        while seen < end:
            for m in consumer.consume(10_000, 0.5):
                if m.error() is None:
                    seen += 1
        return time.perf_counter() - started
    finally:
        consumer.close()


def restore_into(bootstrap: str, topic: str, db: JournalDb) -> float:
    started = time.perf_counter()
    done = ours.restore(bootstrap, topic, {0: db})
    took = time.perf_counter() - started
    assert done[0].records == done[0].end, done
    return took


def missing_read_us(db: JournalDb, n: int = 100_000) -> float:
    keys = [f"bot/in/chat-{i % CHATS}/x{i}".encode() for i in range(n)]
    get = db.db.get
    started = time.perf_counter()
    for k in keys:
        get(k)
    return (time.perf_counter() - started) / n * 1e6


def profile(bootstrap: str, topic: str, path: Path, n: int) -> None:
    import cProfile
    import pstats

    db = ours.open_database(path)
    profiler = cProfile.Profile()
    profiler.enable()
    took = restore_into(bootstrap, topic, db)
    profiler.disable()
    db.db.close()
    print(f"ours under cProfile: {n / took:,.0f} records/s")
    pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("-n", type=int, default=300_000, help="changelog records")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds")
    parser.add_argument(
        "--groups",
        action="store_true",
        help="group records, as the worker writes a turn now (a reply and its log entry each)",
    )
    parser.add_argument(
        "--profile", action="store_true", help="our restore once, under cProfile, only"
    )
    args = parser.parse_args(argv)
    bootstrap, started, _ = broker()
    tmp = Path(tempfile.mkdtemp(prefix="bench-restore-"))
    try:
        t0 = time.perf_counter()
        topic = seed(bootstrap, args.n, groups=args.groups)
        shape = "group" if args.groups else "single"
        took = time.perf_counter() - t0
        print(f"{args.n} {shape} changelog records produced to {topic} in {took:.1f} s")
        if args.profile:
            profile(bootstrap, topic, tmp / "profiled", args.n)
            return 0
        rates: dict[str, list[float]] = {"bare read": [], "baseline": [], "ours": []}
        missing: dict[str, list[float]] = {"baseline": [], "ours": []}
        opens: dict[str, Any] = {"baseline": old_open_database, "ours": ours.open_database}
        for r in range(args.rounds):
            rates["bare read"].append(args.n / bare_read(bootstrap, topic, args.n))
            for side, open_db in opens.items():
                db = open_db(tmp / f"{side}-{r}")
                rates[side].append(args.n / restore_into(bootstrap, topic, db))
                missing[side].append(missing_read_us(db))
                db.db.close()
                shutil.rmtree(tmp / f"{side}-{r}", ignore_errors=True)
            print(
                f"round {r + 1}: "
                + ", ".join(f"{side} {v[-1]:,.0f} records/s" for side, v in rates.items())
            )
        med = {side: statistics.median(v) for side, v in rates.items()}
        print(
            f"median of {args.rounds}: bare read {med['bare read']:,.0f}, baseline restore "
            f"{med['baseline']:,.0f}, ours {med['ours']:,.0f} records/s"
        )
        print(f"ours / baseline: {med['ours'] / med['baseline']:.2f}x")
        print(f"ours / bare read: {med['ours'] / med['bare read']:.2f}x")
        print(
            "a key the restored database lacks: baseline "
            f"{statistics.median(missing['baseline']):.2f} µs, ours "
            f"{statistics.median(missing['ours']):.2f} µs a read"
        )
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.delete_topics([topic])[topic].result(30)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if started:
            subprocess.run([str(KAFKA_SH), "stop"], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())

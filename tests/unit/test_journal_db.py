"""``botmesh.streams.journal_db``: a journal partition's records and sorted indexes in a
real RocksDB database (rocksdict, as Faust's store opens it)."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
import rocksdict

from botmesh.state.kv import Entry
from botmesh.streams.journal_db import (
    FORMAT_KEY,
    INDEX_PREFIX,
    JournalDb,
    encode_entry,
    sortable,
)

OFFSET = b"__faust\x00offset__"


@pytest.fixture
def db(tmp_path: Path) -> Iterator[JournalDb]:
    options = rocksdict.Options(raw_mode=True)
    options.create_if_missing(True)
    raw = rocksdict.Rdict(str(tmp_path / "p0"), options=options)
    try:
        yield JournalDb.open(raw, OFFSET)
    finally:
        raw.close()


def put(
    key: str, n: int, due: float | None = None, purge: float | None = None
) -> tuple[bytes, bytes]:
    return key.encode(), encode_entry(Entry(key, {"n": n}, n, due, purge))


def index_keys(db: JournalDb) -> list[bytes]:
    return [k for k in db.db.keys(from_key=INDEX_PREFIX) if k.startswith(INDEX_PREFIX)]


def test_scores_sort_as_bytes_as_they_do_as_floats() -> None:
    scores = [-math.inf, -1e9, -2.5, -1e-300, 0.0, 1e-300, 1.0, 1.5, 1764892800.25, math.inf]
    shuffled = random.Random(7).sample(scores, len(scores))
    assert sorted(shuffled, key=sortable) == scores


def test_a_record_moves_in_the_index_with_its_score_and_leaves_it_when_deleted(
    db: JournalDb,
) -> None:
    db.write([put("s/a", 1, due=5.0, purge=100.0), put("s/b", 1, due=3.0)], offset=1)
    assert db.range("due", "s/", 10.0, 10, ()) == [(3.0, "s/b"), (5.0, "s/a")]
    assert db.range("purge", "s/", math.inf, 10, ()) == [(100.0, "s/a")]
    db.write([put("s/a", 2, due=1.0)], offset=2)  # due earlier, purge cleared
    assert db.range("due", "s/", 10.0, 10, ()) == [(1.0, "s/a"), (3.0, "s/b")]
    assert db.range("purge", "s/", math.inf, 10, ()) == []
    db.write([(b"s/b", None)], offset=3)
    assert db.range("due", "s/", 10.0, 10, ()) == [(1.0, "s/a")]
    assert len(index_keys(db)) == 1
    assert db.db.get(OFFSET) == b"3"
    entry = db.get("s/a")
    assert entry is not None and (entry.value, entry.version, entry.due) == ({"n": 2}, 2, 1.0)
    assert db.get("s/b") is None


def test_writes_of_one_key_in_one_batch_leave_only_the_last_in_the_index(db: JournalDb) -> None:
    db.write([put("s/a", 1, due=5.0), put("s/a", 2, due=7.0), put("s/a", 3, due=2.0)])
    assert db.range("due", "s/", math.inf, 10, ()) == [(2.0, "s/a")]
    assert len(index_keys(db)) == 1
    db.write([put("s/c", 1, due=1.0), (b"s/c", None)])
    assert db.range("due", "s/", math.inf, 10, ()) == [(2.0, "s/a")]


def test_a_range_stops_at_its_time_and_limit_and_skips_other_prefixes(db: JournalDb) -> None:
    db.write([put(f"s/{i:03}", 1, due=float(i)) for i in range(100)])
    db.write([put(f"t/{i:03}", 1, due=float(i) + 0.5) for i in range(100)])
    assert [k for _, k in db.range("due", "s/", 4.0, 100, ())] == [f"s/{i:03}" for i in range(5)]
    assert [k for _, k in db.range("due", "t/", 99.0, 3, ())] == ["t/000", "t/001", "t/002"]
    skip = {"s/000", "s/002"}
    assert [k for _, k in db.range("due", "s/", 3.0, 10, skip)] == ["s/001", "s/003"]
    assert db.range("due", "s/", 10.0, 0, ()) == []


def test_a_scan_sees_the_records_only(db: JournalDb) -> None:
    db.write([put("s/b", 2, due=1.0), put("s/a", 1, purge=2.0), put("t/c", 1)], offset=9)
    assert [e.key for e in db.scan("s/", ())] == ["s/a", "s/b"]
    assert [e.key for e in db.scan("", ())] == ["s/a", "s/b", "t/c"]  # no index, no offset
    assert [e.key for e in db.scan("", {"s/b"})] == ["s/a", "t/c"]


def test_records_an_earlier_version_wrote_are_indexed_once_when_opened(tmp_path: Path) -> None:
    """Before the indexes, the database held the records only: opening it indexes them."""
    options = rocksdict.Options(raw_mode=True)
    options.create_if_missing(True)
    raw = rocksdict.Rdict(str(tmp_path / "old"), options=options)
    try:
        for i in range(25_000):  # more than one of the indexing's batches
            key, value = put(f"s/{i:05}", 1, due=float(i) if i % 2 else None, purge=1e12)
            raw.put(key, value)
        raw.put(OFFSET, b"24999")
        db = JournalDb.open(raw, OFFSET)
        assert raw.get(FORMAT_KEY) is not None
        assert [k for _, k in db.range("due", "s/", 5.0, 10, ())] == [
            "s/00001",
            "s/00003",
            "s/00005",
        ]
        assert len(db.range("purge", "s/", math.inf, 10**6, ())) == 25_000
        raw.delete(b"s/00001")  # not through the journal: a second open does not index again
        again = JournalDb.open(raw, OFFSET)
        assert [k for _, k in again.range("due", "s/", 1.0, 10, ())] == ["s/00001"]
    finally:
        raw.close()

"""Group records: an inbound and what its turn wrote in one changelog record
(``botmesh.state.keys.record_group``, ``botmesh.streams.journal_db``). The group's last
record says everything of its members, so the log stays correct under compaction: these
tests replay logs whole and compacted (each key's last record only), into an empty database
and into one that holds an earlier state, and check that every reader agrees."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

from botmesh.state.keys import derived_key, part_key, record_group
from botmesh.state.kv import Entry
from botmesh.state.message_log import position_of
from botmesh.streams.journal_db import (
    GROUP_PREFIX,
    JournalDb,
    JournalView,
    encode_entry,
    encode_group,
    group_members,
    is_group,
)
from botmesh.streams.worker.restore import open_database

S = "t:e:b%2Fx:c"  # a scope, percent-encoded as ``scope_id`` makes it
Record = tuple[bytes, bytes | None]


def test_an_inbound_its_first_sends_and_their_log_entries_share_a_group() -> None:
    inbound = f"{S}/in/m:1"
    assert record_group(inbound) == inbound
    for n in range(8):
        assert record_group(f"{S}/out/{derived_key('m:1', n)}") == inbound
    log = f"{S}/log/{quote('chat/9', safe='')}/{position_of(5.0, derived_key('m:1', 0), 1)}"
    assert record_group(log) == inbound
    # stored alone: later sends, parts, fallbacks, diverged sends, other kinds
    alone = [
        f"{S}/out/{derived_key('m:1', 8)}",
        f"{S}/out/{part_key(derived_key('m:1', 0), 2)}",
        f"{S}/out/m:1:0~fallback",
        f"{S}/out/m:1:0~0123456789ab",
        f"{S}/out/order-42",
        f"{S}/log/c/{position_of(5.0, derived_key('m:1', 0), 5)}",
        f"{S}/turn/c",
        f"{S}/flow/c",
        f"{S}/leader",
        "no-scope",
    ]
    assert [record_group(k) for k in alone] == [None] * len(alone)


def entry(key: str, n: int, due: float | None = None, purge: float | None = None) -> bytes:
    return encode_entry(Entry(key, {"n": n}, n, due, purge))


IN = f"{S}/in/m"
A, B = f"{S}/out/m:0", f"{S}/out/m:1"


def g(inbound: int | None = None, a: int | None = None, b: int | None = None) -> Record:
    members = [
        (k, entry(k, n, due=float(n))) for k, n in ((IN, inbound), (A, a), (B, b)) if n is not None
    ]
    return IN.encode(), encode_group(members) if members else None


@pytest.fixture
def db(tmp_path: Path) -> Iterator[JournalDb]:
    """A partition's database as the worker opens it (its options, its Bloom filters)."""
    opened = open_database(tmp_path / "p0")
    yield opened
    opened.db.close()


def state(db: JournalDb) -> dict[str, int]:
    found = {e.key: e.version for e in db.scan(f"{S}/", ())}
    # the indexes agree with the records
    assert sorted(k for _, k in db.range("due", f"{S}/", math.inf, 100, ())) == sorted(found)
    return found


def viewed(log: list[Record]) -> dict[str, int]:
    view = JournalView()
    for key, value in log:
        view.apply(key, value)
    return {k: e.version for k, e in view.entries.items()}


def compacted(log: list[Record]) -> list[Record]:
    """What compaction may leave: each key's last record, in log order."""
    last = {key: i for i, (key, _) in enumerate(log)}
    return [r for i, r in enumerate(log) if last[r[0]] == i]


LOG: list[Record] = [
    g(inbound=1),  # the inbound journaled (with its send's claim in a real turn)
    g(inbound=1, a=1),  # the send claimed
    g(inbound=2, a=2, b=1),  # done, sent; a second send claimed
    (f"{S}/out/solo".encode(), entry(f"{S}/out/solo", 1, due=1.0)),  # a key stored alone
    g(inbound=2, b=2),  # the first send purged: the group's record leaves it out...
    (A.encode(), None),  # ...and its own key gets a tombstone
]


@pytest.mark.parametrize("shape", ["whole", "compacted"])
def test_a_group_record_replaces_its_group_whole_log_or_compacted(
    db: JournalDb, shape: str
) -> None:
    log = LOG if shape == "whole" else compacted(LOG)
    db.write(log, offset=len(log))
    want = {IN: 2, B: 2, f"{S}/out/solo": 1}
    assert state(db) == want
    assert viewed(log) == want
    assert db.members(IN) == [IN, B]


def test_a_database_restored_earlier_meets_a_compacted_log(db: JournalDb) -> None:
    """A data dir that holds the log up to some record, restored later from a log whose
    records after it were compacted: the group's last record still deletes what it left
    out (a member the database holds from the group's earlier record)."""
    db.write(LOG[:3], offset=3)  # in, a, b
    rest = compacted(LOG)[-3:]  # what compaction left after offset 3
    assert all(k != A.encode() or v is None for k, v in rest)
    db.write([r for r in rest if r not in LOG[:3]], offset=len(LOG))
    assert state(db) == {IN: 2, B: 2, f"{S}/out/solo": 1}


def test_a_tombstone_of_the_groups_key_deletes_every_member(db: JournalDb) -> None:
    db.write([g(inbound=1, a=1, b=1)])
    assert db.members(IN) == [IN, A, B]
    db.write([g()])  # a group with nothing left: a tombstone
    assert state(db) == {}
    assert db.db.get(GROUP_PREFIX + IN.encode()) is None
    view = JournalView()
    for key, value in [g(inbound=1, a=1, b=1), g()]:
        view.apply(key, value)
    assert view.entries == {}


def test_a_record_of_the_groups_key_from_before_groups_is_replaced(db: JournalDb) -> None:
    """A changelog written before groups holds the inbound (and its sends) in records of
    their own: the first group record of the inbound's key replaces the old record of that
    key; a send's old record stays until its own key's tombstone."""
    old: list[Record] = [
        (IN.encode(), entry(IN, 1, due=1.0)),
        (A.encode(), entry(A, 1, due=1.0)),
    ]
    db.write(old)
    db.write([g(a=2)])  # the inbound deleted meanwhile, the send written again
    assert state(db) == {A: 2}
    db.write([g(), (A.encode(), None)])
    assert state(db) == {}


def test_group_values_are_told_from_single_ones_and_open_to_single_values() -> None:
    _, value = g(inbound=3, a=4)
    assert value is not None and is_group(value)
    assert not is_group(entry(IN, 1)) and not is_group(None)
    assert group_members(value) == [
        (IN.encode(), entry(IN, 3, 3.0)),
        (A.encode(), entry(A, 4, 4.0)),
    ]


def test_a_member_the_groups_next_record_leaves_out_is_deleted_by_that_record(
    db: JournalDb,
) -> None:
    """No tombstone of the member's own key needed: the group's record says it all."""
    db.write([g(inbound=1, a=1, b=1)], offset=0)
    db.write([g(inbound=2, b=2)], offset=1)
    assert state(db) == {IN: 2, B: 2}
    assert viewed([g(inbound=1, a=1, b=1), g(inbound=2, b=2)]) == {IN: 2, B: 2}
    db.write([g(a=3)], offset=2)  # the inbound and b gone, a back
    assert state(db) == {A: 3}


def test_a_member_too_large_to_share_is_listed_and_stored_alone(db: JournalDb) -> None:
    """A member listed with no value keeps the record of its own key; a later group record
    that leaves it out deletes it all the same."""
    alone = IN.encode(), encode_group([(IN, entry(IN, 1, due=1.0)), (A, None)])
    log: list[Record] = [g(inbound=1, a=1), alone, (A.encode(), entry(A, 2, due=2.0))]
    for shape in (log, compacted(log)):
        assert viewed(shape) == {IN: 1, A: 2}
    db.write(log, offset=2)
    assert state(db) == {IN: 1, A: 2}
    assert db.members(IN) == [IN, A]
    db.write([alone], offset=3)  # the group written again: A's own record stands
    assert state(db) == {IN: 1, A: 2}
    db.write([g(inbound=2)], offset=4)
    assert state(db) == {IN: 2}

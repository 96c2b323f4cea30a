"""The DurableKv contract: every backend in ``tests/backends.py`` must pass all of it."""

from __future__ import annotations

import asyncio

import pytest

from botmesh.state.errors import DurabilityError, VersionConflictError
from botmesh.state.kv import Delete, DurableKv, Put
from tests.backends import BackendHandle


def kv_of(backend: BackendHandle) -> DurableKv:
    assert backend.kv is not None
    return backend.kv


async def test_missing_key_reads_none(backend: BackendHandle) -> None:
    kv = kv_of(backend)
    assert await kv.get("nope") is None
    assert await kv.get_many(["nope", "also"]) == {}
    assert isinstance(kv, DurableKv)


async def test_versions_count_from_one(backend: BackendHandle) -> None:
    kv = kv_of(backend)
    assert await kv.commit([Put("a", {"n": 1}, expect=0)], label="t.create") == [1]
    assert await kv.commit([Put("a", {"n": 2}, expect=1)]) == [2]
    assert await kv.commit([Put("a", {"n": 3}, expect=None)]) == [3]
    entry = await kv.get("a")
    assert entry is not None
    assert (entry.key, entry.value, entry.version) == ("a", {"n": 3}, 3)


async def test_conflict_names_key_and_applies_nothing(backend: BackendHandle) -> None:
    kv = kv_of(backend)
    await kv.commit([Put("a", {"v": "a1"}, expect=0), Put("b", {"v": "b1"}, expect=0)])
    with pytest.raises(VersionConflictError) as info:
        await kv.commit([Put("a", {"v": "a2"}, expect=1), Put("b", {"v": "b2"}, expect=7)])
    assert info.value.key == "b"
    assert info.value.expected == 7
    assert info.value.actual == 1
    a, b = await kv.get("a"), await kv.get("b")
    assert a is not None and b is not None
    assert (a.value, a.version, b.value, b.version) == ({"v": "a1"}, 1, {"v": "b1"}, 1)


async def test_create_only_refuses_existing_key(backend: BackendHandle) -> None:
    kv = kv_of(backend)
    await kv.commit([Put("k", {}, expect=0)])
    with pytest.raises(VersionConflictError):
        await kv.commit([Put("k", {"again": True}, expect=0)])


async def test_delete_then_put_starts_again(backend: BackendHandle) -> None:
    kv = kv_of(backend)
    await kv.commit([Put("k", {"x": 1}, expect=0, due=5.0, purge=9.0)])
    with pytest.raises(VersionConflictError):
        await kv.commit([Delete("k", expect=2)])
    assert await kv.commit([Delete("k", expect=1)]) == [0]
    assert await kv.get("k") is None
    assert await kv.range("due", "", 100.0) == []
    assert await kv.range("purge", "", 100.0) == []
    assert await kv.commit([Put("k", {"x": 2}, expect=0)]) == [1]


async def test_same_key_twice_in_one_commit(backend: BackendHandle) -> None:
    kv = kv_of(backend)
    versions = await kv.commit([Put("k", {"s": 1}, expect=0), Put("k", {"s": 2}, expect=1)])
    assert versions == [1, 2]
    entry = await kv.get("k")
    assert entry is not None and entry.value == {"s": 2}


async def test_values_are_copied_both_ways(backend: BackendHandle) -> None:
    kv = kv_of(backend)
    items = [1, 2]
    value = {"list": items, "nested": {"a": "b"}}
    await kv.commit([Put("k", value, expect=0)])
    items.append(3)
    first = await kv.get("k")
    assert first is not None
    first.value["nested"]["a"] = "changed"
    again = await kv.get("k")
    assert again is not None
    assert again.value == {"list": [1, 2], "nested": {"a": "b"}}


async def test_a_handed_over_value_still_reads_back_as_copies(backend: BackendHandle) -> None:
    kv = kv_of(backend)
    await kv.commit([Put("k", {"nested": {"a": "b"}}, expect=0, handover=True)])
    first = await kv.get("k")
    assert first is not None
    first.value["nested"]["a"] = "changed"
    again = await kv.get("k")
    assert again is not None and again.value == {"nested": {"a": "b"}}


async def test_json_values_round_trip(backend: BackendHandle) -> None:
    kv = kv_of(backend)
    value = {
        "text": 'héllo ✓ \u0000 \n "quoted"',
        "int": 2**53,
        "float": 0.1,
        "bool": False,
        "none": None,
        "list": [[], {}, "x"],
        "b64": "AAEC/w==",
    }
    await kv.commit([Put("k/ü space", value, expect=0)])
    entry = await kv.get("k/ü space")
    assert entry is not None and entry.value == value


async def test_indexes_order_by_score_then_key(backend: BackendHandle) -> None:
    kv = kv_of(backend)
    await kv.commit(
        [
            Put("s/c", {}, expect=0, due=3.0),
            Put("s/a", {}, expect=0, due=2.0, purge=1.0),
            Put("s/b", {}, expect=0, due=2.0),
            Put("s/d", {}, expect=0, due=9.0),
            Put("t/a", {}, expect=0, due=1.0),
            Put("s/e", {}, expect=0),
        ]
    )
    assert await kv.range("due", "s/", 3.0) == ["s/a", "s/b", "s/c"]  # until is inclusive
    assert await kv.range("due", "s/", 3.0, limit=2) == ["s/a", "s/b"]
    assert await kv.range("due", "", 100.0) == ["t/a", "s/a", "s/b", "s/c", "s/d"]
    assert await kv.range("purge", "s/", 100.0) == ["s/a"]
    assert await kv.range("due", "s/", 1.0) == []


async def test_put_moves_or_clears_index_scores(backend: BackendHandle) -> None:
    kv = kv_of(backend)
    await kv.commit([Put("k", {}, expect=0, due=1.0)])
    await kv.commit([Put("k", {}, expect=1, due=50.0, purge=7.0)])
    assert await kv.range("due", "", 10.0) == []
    assert await kv.range("due", "", 50.0) == ["k"]
    await kv.commit([Put("k", {}, expect=2)])
    assert await kv.range("due", "", 100.0) == []
    assert await kv.range("purge", "", 100.0) == []
    entry = await kv.get("k")
    assert entry is not None and (entry.due, entry.purge) == (None, None)


async def test_scan_returns_prefix_in_key_order(backend: BackendHandle) -> None:
    kv = kv_of(backend)
    await kv.commit([Put(k, {"k": k}, expect=0) for k in ["b/2", "a/1", "b/1", "c", "b/10"]])
    assert [e.key for e in await kv.scan("b/")] == ["b/1", "b/10", "b/2"]
    assert [e.value["k"] for e in await kv.scan("")] == ["a/1", "b/1", "b/10", "b/2", "c"]
    got = await kv.get_many(["c", "zz", "a/1"])
    assert sorted(got) == ["a/1", "c"]
    assert got["c"].version == 1


async def test_concurrent_compare_and_set_has_one_winner(backend: BackendHandle) -> None:
    kv = kv_of(backend)
    await kv.commit([Put("lease", {"owner": None}, expect=0)])

    async def claim(owner: int) -> bool:
        try:
            await kv.commit([Put("lease", {"owner": owner}, expect=1)], label="t.claim")
        except VersionConflictError:
            return False
        return True

    results = await asyncio.gather(*(claim(i) for i in range(20)))
    assert results.count(True) == 1
    entry = await kv.get("lease")
    assert entry is not None and entry.version == 2
    assert entry.value["owner"] == results.index(True)


async def test_concurrent_independent_commits_all_land(backend: BackendHandle) -> None:
    kv = kv_of(backend)
    await asyncio.gather(*(kv.commit([Put(f"k{i}", {"i": i}, expect=0)]) for i in range(50)))
    entries = await kv.scan("k")
    assert sorted(e.value["i"] for e in entries) == list(range(50))


async def test_reopen_keeps_committed_state(backend: BackendHandle) -> None:
    kv = kv_of(backend)
    await kv.commit([Put("a", {"n": 1}, expect=0, due=4.0), Put("b", {"n": 2}, expect=0)])
    await kv.commit([Put("a", {"n": 3}, expect=1, due=4.0, purge=8.0), Delete("b", expect=1)])
    kv = await backend.reopen()
    entry = await kv.get("a")
    assert entry is not None
    assert (entry.value, entry.version, entry.due, entry.purge) == ({"n": 3}, 2, 4.0, 8.0)
    assert await kv.get("b") is None
    assert await kv.range("purge", "", 10.0) == ["a"]
    assert await kv.commit([Put("a", {"n": 4}, expect=2)]) == [3]


async def test_closed_backend_refuses_calls(backend: BackendHandle) -> None:
    kv = kv_of(backend)
    await kv.close()
    await kv.close()  # idempotent
    with pytest.raises(DurabilityError):
        await kv.get("a")
    with pytest.raises(DurabilityError):
        await kv.commit([Put("a", {}, expect=0)])

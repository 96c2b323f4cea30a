"""Snapshot mode, append-log mode, compaction, folding, group commit, options."""

# ruff: noqa: ASYNC240  # the tests read and damage journal files directly, on purpose

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from botmesh.state.backends.file import FileKv, FileOptions, open_file_kv
from botmesh.state.errors import ConfigError, JournalUnavailableError, VersionConflictError
from botmesh.state.kv import Delete, Put
from tests.file.helpers import CountingOps, state_of


def header(path: Path) -> dict[str, object]:
    first = path.read_bytes().split(b"\n", 1)[0]
    got = json.loads(first)
    assert isinstance(got, dict)
    return got


def log_lines(path: Path) -> list[dict[str, object]]:
    log = Path(str(path) + ".log")
    return [json.loads(line) for line in log.read_bytes().splitlines()]


async def test_snapshot_mode_rewrites_the_snapshot_per_commit(tmp_path: Path) -> None:
    path = tmp_path / "j"
    ops = CountingOps()
    kv = await open_file_kv(path, file_ops=ops)
    await kv.commit([Put("a", {"n": 1}, expect=0)])
    await kv.commit([Put("a", {"n": 2}, expect=1), Put("b", {}, expect=0, due=3.0)])
    assert header(path)["format"] == "botmesh-file-journal"
    assert (header(path)["version"], header(path)["seq"], header(path)["count"]) == (1, 2, 2)
    assert ops.calls.get("replace") == 2
    assert "fsync" not in ops.calls  # snapshot mode: no fsync unless asked
    assert sorted(p.name for p in tmp_path.iterdir()) == ["j", "j.lock"]
    await kv.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["j"]


async def test_snapshot_mode_fsyncs_file_and_folder_when_asked(tmp_path: Path) -> None:
    ops = CountingOps()
    kv = await open_file_kv(tmp_path / "j", fsync=True, file_ops=ops)
    before = dict(ops.calls)
    await kv.commit([Put("a", {}, expect=0)])
    assert ops.calls["fsync"] - before.get("fsync", 0) == 1
    assert ops.calls["fsync_dir"] - before.get("fsync_dir", 0) == 1
    await kv.close()


async def test_append_log_appends_one_line_per_commit(tmp_path: Path) -> None:
    path = tmp_path / "j"
    ops = CountingOps()
    kv = await open_file_kv(path, append_log=True, file_ops=ops)
    for i in range(3):
        await kv.commit([Put(f"k{i}", {"i": i}, expect=0)], label="t.put")
    await kv.commit([Delete("k0", expect=1)], label="t.del")
    lines = log_lines(path)
    assert [line["seq"] for line in lines] == [1, 2, 3, 4]
    assert lines[3]["del"] == ["k0"] and lines[3]["label"] == "t.del"
    assert "replace" not in ops.calls  # the snapshot is not rewritten per commit
    assert ops.calls["fsync"] == 4  # fsync defaults on with the append log
    await kv.close()
    # close() folds the log into the snapshot
    assert not Path(str(path) + ".log").exists()
    assert header(path)["seq"] == 4
    kv = await open_file_kv(path)
    assert sorted(await state_of(kv)) == ["k1", "k2"]
    await kv.close()


async def test_compacts_every_n_entries(tmp_path: Path) -> None:
    path = tmp_path / "j"
    kv = await open_file_kv(path, append_log=True, compact_every=5, fsync=False)
    for i in range(12):
        await kv.commit([Put(f"k{i}", {}, expect=0)])
    assert header(path)["seq"] == 10
    assert [line["seq"] for line in log_lines(path)] == [11, 12]
    await kv.close()


async def test_compacts_at_a_log_size(tmp_path: Path) -> None:
    path = tmp_path / "j"
    kv = await open_file_kv(path, append_log=True, compact_bytes=1000, fsync=False)
    await kv.commit([Put("k000", {"pad": "x" * 200}, expect=0)])
    per = -(-1000 // len(Path(kv.log_path).read_bytes()))  # lines that reach 1000 bytes
    for i in range(1, per * 3):
        await kv.commit([Put(f"k{i:03d}", {"pad": "x" * 200}, expect=0)])
    # the writer compacts after a batch; the next commit queues behind that
    await kv.commit([Put("last", {}, expect=0)])
    assert header(path)["seq"] == per * 3
    assert [line["seq"] for line in log_lines(path)] == [per * 3 + 1]
    await kv.close()
    kv = await open_file_kv(path)
    assert len(await state_of(kv)) == per * 3 + 1
    await kv.close()


async def test_leftover_log_is_replayed_without_the_option(tmp_path: Path) -> None:
    src, dst = tmp_path / "a", tmp_path / "b"
    src.mkdir()
    dst.mkdir()
    kv = await open_file_kv(src / "j", append_log=True, fsync=False)
    await kv.commit([Put("x", {"v": 1}, expect=0, purge=5.0)])
    await kv.commit([Put("x", {"v": 2}, expect=1, purge=6.0)])
    # a copy of the files while the journal is open: what a crash leaves behind
    shutil.copy(src / "j.log", dst / "j.log")
    expected = await state_of(kv)
    await kv.close()
    other = await open_file_kv(dst / "j")  # snapshot mode
    assert await state_of(other) == expected
    assert not (dst / "j.log").exists()  # folded into the snapshot
    await other.close()
    again = await open_file_kv(dst / "j")
    assert await state_of(again) == expected
    await again.close()


async def test_crash_between_snapshot_and_log_truncation_replays_harmlessly(
    tmp_path: Path,
) -> None:
    path = tmp_path / "j"
    kv = await open_file_kv(path, append_log=True, fsync=False)
    for i in range(4):
        await kv.commit([Put("k", {"i": i}, expect=i)])
    log_bytes = Path(str(path) + ".log").read_bytes()
    expected = await state_of(kv)
    await kv.close()  # snapshot at seq 4, log removed
    Path(str(path) + ".log").write_bytes(log_bytes)  # as if the truncation never happened
    kv = await open_file_kv(path, append_log=True)
    assert await state_of(kv) == expected
    assert await kv.commit([Put("k", {"i": 4}, expect=4)]) == [5]
    await kv.close()
    kv = await open_file_kv(path)
    assert (await state_of(kv))["k"][1] == 5
    await kv.close()


@pytest.mark.parametrize("append_log", [False, True], ids=["snapshot", "append-log"])
async def test_concurrent_commits_share_one_write(tmp_path: Path, append_log: bool) -> None:
    ops = CountingOps()
    kv = await open_file_kv(tmp_path / "j", append_log=append_log, fsync=True, file_ops=ops)
    await kv.commit([Put("lease", {}, expect=0)])
    before = dict(ops.calls)

    async def claim(i: int) -> str:
        try:
            await kv.commit([Put("lease", {"by": i}, expect=1)])
        except VersionConflictError:
            return "lost"
        return "won"

    results = await asyncio.gather(
        *(kv.commit([Put(f"k{i}", {"i": i}, expect=0)]) for i in range(40)),
        *(claim(i) for i in range(10)),
    )
    assert results[:40] == [[1]] * 40  # a conflict in the batch fails only its own commit
    assert sorted(str(r) for r in results[40:]) == ["lost"] * 9 + ["won"]
    fsyncs = ops.calls["fsync"] - before.get("fsync", 0)
    assert fsyncs < 5, f"50 concurrent commits took {fsyncs} fsyncs"
    kv2_state = await state_of(kv)
    await kv.close()
    kv = await open_file_kv(tmp_path / "j")
    assert await state_of(kv) == kv2_state
    assert len(kv2_state) == 41
    await kv.close()


async def test_a_value_that_is_not_json_fails_its_commit_alone(tmp_path: Path) -> None:
    kv = await open_file_kv(tmp_path / "j", append_log=True, fsync=False)
    bad = kv.commit([Put("bad", {"when": object()}, expect=0)])
    good = kv.commit([Put("good", {}, expect=0)])
    results = await asyncio.gather(bad, good, return_exceptions=True)
    assert isinstance(results[0], TypeError) and "'bad'" in str(results[0])
    assert results[1] == [1]
    assert await kv.get("bad") is None
    await kv.close()


async def test_open_file_kv_gives_an_opened_journal(tmp_path: Path) -> None:
    kv = await open_file_kv(tmp_path / "j", append_log=True)
    assert isinstance(kv, FileKv) and kv.options.fsync_writes and not getattr(kv, "shared", False)
    await kv.open()  # idempotent: what a runtime does with a journal it was given
    await kv.commit([Put("a", {}, expect=0)])
    await kv.close()
    with pytest.raises(JournalUnavailableError):
        await kv.get("a")


async def test_the_backend_registry_opens_file_urls(tmp_path: Path) -> None:
    from botmesh.state.backends import open_backend

    kv = await open_backend(f"file://{tmp_path}/j?append_log=1&compact_every=10")
    assert isinstance(kv, FileKv) and kv.options.compact_every == 10
    await kv.commit([Put("a", {}, expect=0)])
    await kv.close()
    assert (tmp_path / "j").exists() and not (tmp_path / "j.log").exists()


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"compact_every": 0}, "file.compact_every"),
        ({"compact_bytes": -1}, "file.compact_bytes"),
        ({"append_log": "yes"}, "file.append_log"),
        ({"fsync": 1}, "file.fsync"),
    ],
)
def test_bad_options_name_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        FileOptions(**kwargs)  # type: ignore[arg-type]
    assert info.value.field == field


async def test_missing_folder_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(JournalUnavailableError, match="does not exist"):
        await open_file_kv(tmp_path / "nope" / "j")


async def test_open_again_after_close_reads_the_files_back(tmp_path: Path) -> None:
    kv = FileKv(tmp_path / "j", FileOptions(append_log=True, fsync=False))
    await kv.open()
    await kv.open()  # idempotent
    await kv.commit([Put("a", {"x": 1}, expect=0)])
    await kv.close()
    await kv.open()
    entry = await kv.get("a")
    assert entry is not None and entry.version == 1
    await kv.close()


async def test_url_names_the_path_and_options(tmp_path: Path) -> None:
    from botmesh.state.backends.file import from_url

    kv = from_url(f"file://{tmp_path}/my%20journal?append_log=true&fsync=off&compact_every=50")
    assert kv.path == str(tmp_path / "my journal")
    assert kv.options == FileOptions(append_log=True, fsync=False, compact_every=50)
    await kv.open()
    await kv.commit([Put("a", {}, expect=0)])
    await kv.close()
    assert (tmp_path / "my journal").exists()


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        ("file://host/x", "file:///absolute"),
        ("sqlite:///x", "file:///absolute"),
        ("file:///x?fsync=maybe", "true or false"),
        ("file:///x?compact_every=-3", "whole number"),
        ("file:///x?colour=red", "unknown option"),
    ],
)
def test_bad_urls_are_refused_clearly(url: str, needle: str) -> None:
    from botmesh.state.backends.file import from_url

    with pytest.raises(ConfigError, match=needle):
        from_url(url)


async def test_an_unreadable_journal_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "j").mkdir()  # a folder where the snapshot should be
    with pytest.raises(JournalUnavailableError, match="opening the file journal"):
        await open_file_kv(tmp_path / "j")
    assert not (tmp_path / "j.lock").exists()


@pytest.mark.parametrize("append_log", [False, True], ids=["snapshot", "append-log"])
async def test_close_lets_commits_in_flight_finish_and_refuses_later_ones(
    tmp_path: Path, append_log: bool
) -> None:
    kv = await open_file_kv(tmp_path / "j", append_log=append_log)
    tasks = [asyncio.create_task(kv.commit([Put(f"k{i}", {}, expect=0)])) for i in range(10)]
    await asyncio.sleep(0)  # every commit is called and queued
    await kv.close()
    assert [await t for t in tasks] == [[1]] * 10
    with pytest.raises(JournalUnavailableError, match="closed"):
        await kv.commit([Put("late", {}, expect=0)])
    kv = await open_file_kv(tmp_path / "j")
    assert len(await state_of(kv)) == 10
    await kv.close()

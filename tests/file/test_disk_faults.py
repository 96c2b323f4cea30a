"""Disk errors on a write (EIO, ENOSPC, a short write, a failed fsync or rename), injected
through the journal's own ``FileOps``: the write fails loudly, nothing of it is applied,
and the journal on disk stays readable with exactly the commits that returned."""

# ruff: noqa: ASYNC240  # the tests read and damage journal files directly, on purpose

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from botmesh.state.backends.file import open_file_kv
from botmesh.state.errors import JournalWriteError
from botmesh.state.kv import Put
from tests.file.helpers import FaultyOps, state_of

# (mode, call, errno, short write, the instance takes further writes)
FAULTS = [
    ("snapshot", "write", errno.EIO, False, True),
    ("snapshot", "write", errno.ENOSPC, False, True),
    ("snapshot", "write", errno.ENOSPC, True, True),
    ("snapshot", "fsync", errno.EIO, False, True),
    ("snapshot", "replace", errno.EIO, False, True),
    ("snapshot", "fsync_dir", errno.EIO, False, False),
    ("append-log", "write", errno.EIO, False, True),
    ("append-log", "write", errno.ENOSPC, False, True),
    ("append-log", "write", errno.ENOSPC, True, True),
    ("append-log", "fsync", errno.EIO, False, False),
]


def _id(fault: tuple[str, str, int, bool, bool]) -> str:
    mode, call, err, short, _ = fault
    return f"{mode}-{'short-' if short else ''}{call}-{errno.errorcode[err]}"


@pytest.mark.parametrize("fault", FAULTS, ids=[_id(f) for f in FAULTS])
async def test_a_failed_write_fails_loudly_and_leaves_the_journal_readable(
    tmp_path: Path, fault: tuple[str, str, int, bool, bool]
) -> None:
    mode, call, err, short, goes_on = fault
    path = tmp_path / "j"
    options = {"append_log": mode == "append-log", "fsync": True}
    good = await open_file_kv(path, **options)  # type: ignore[arg-type]
    await good.commit([Put("a", {"n": 1}, expect=0)])
    await good.close()

    ops = FaultyOps(call, nth=1, err=err, short=short)
    kv = await open_file_kv(path, file_ops=ops, **options)
    ops.seen = 0  # count from the first commit on, not from open
    before = await state_of(kv)
    with pytest.raises(JournalWriteError) as info:
        await kv.commit([Put("a", {"n": 2}, expect=1), Put("b", {}, expect=0)], label="t.fail")
    assert ops.fired
    assert errno.errorcode[err] in str(info.value) or str(err) in str(info.value)
    assert isinstance(info.value.__cause__, OSError) and info.value.__cause__.errno == err
    assert str(path) in str(info.value) and "Operator action" in str(info.value)
    assert await state_of(kv) == before  # not applied in memory
    if goes_on:
        assert await kv.commit([Put("c", {}, expect=0)]) == [1]
        expected = {**before, "c": ({}, 1, None, None)}
    else:
        with pytest.raises(JournalWriteError, match="reopen"):
            await kv.commit([Put("c", {}, expect=0)])
        expected = before
    await kv.close()
    assert not Path(str(path) + ".tmp").exists()

    reopened = await open_file_kv(path)
    got = await state_of(reopened)
    await reopened.close()
    if call == "fsync_dir":
        # the new snapshot was already in place when its folder's fsync failed: the
        # commit's outcome is unknown (it failed, and it may be there)
        assert got in (
            expected,
            {**before, "a": ({"n": 2}, 2, None, None), "b": ({}, 1, None, None)},
        )
    else:
        assert got == expected


async def test_a_fault_fails_every_commit_of_its_batch_and_only_those(tmp_path: Path) -> None:
    import asyncio

    ops = FaultyOps("write", nth=2, err=errno.EIO)
    kv = await open_file_kv(tmp_path / "j", append_log=True, fsync=False, file_ops=ops)
    ops.seen = 0
    await kv.commit([Put("first", {}, expect=0)])  # write 1 succeeds
    results = await asyncio.gather(
        *(kv.commit([Put(f"k{i}", {}, expect=0)]) for i in range(5)), return_exceptions=True
    )
    assert all(isinstance(r, JournalWriteError) for r in results)  # one batch, one write
    assert await kv.commit([Put("k0", {}, expect=0)]) == [1]
    await kv.close()
    kv = await open_file_kv(tmp_path / "j")
    assert sorted(await state_of(kv)) == ["first", "k0"]
    await kv.close()


async def test_a_failed_compaction_loses_nothing(tmp_path: Path) -> None:
    ops = FaultyOps("replace", nth=1, err=errno.ENOSPC)
    kv = await open_file_kv(tmp_path / "j", append_log=True, compact_every=3, file_ops=ops)
    ops.seen = 0
    for i in range(7):
        await kv.commit([Put(f"k{i}", {}, expect=0)])  # compaction after 3 fails, after 6 works
    assert ops.fired
    await kv.close()
    kv = await open_file_kv(tmp_path / "j")
    assert len(await state_of(kv)) == 7
    await kv.close()

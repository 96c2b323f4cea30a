"""The shared-file journal: several processes on one journal file, under one mutex.

- Real processes claiming one lease by compare-and-set under load never both win a
  version, and every commit that returned is in the file (snapshot, log, log with
  compactions); writers SIGKILLed at random moments leave their mutex to the others at
  once (with a stale limit of an hour, only the dead-pid rule can free it).
- A SIGKILLed holder's mutex is broken at once; a SIGSTOPped one after the stale limit,
  and, thawed, it does not remove the mutex of the process that holds it now; a live
  holder busy for longer than the stale limit keeps it (heartbeat); a write whose mutex
  was broken meanwhile is refused.
- A torn last log line is cut, a bad line in the middle refused naming file, line and
  offset, with the files left as they were.
- The single-process file journal and this one refuse each other's live file, in this
  process and across processes, whichever opened first.
- ``close()`` lets the operations already called finish and refuses later ones.
- URL options, checked with errors that name the option and the fix.
"""

# ruff: noqa: ASYNC240  # the tests read and damage journal files directly, on purpose

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from botmesh.state.backends import check_url, is_shared, open_backend
from botmesh.state.backends.file import open_file_kv
from botmesh.state.backends.shared_file import SharedFileKv, from_url, open_shared_file_kv
from botmesh.state.backends.shared_file_lock import FileMutex, Holder
from botmesh.state.errors import (
    ConfigError,
    JournalCorruptError,
    JournalLockedError,
    JournalUnavailableError,
    VersionConflictError,
)
from botmesh.state.kv import Delete, Put
from tests.file.helpers import CHILD, state_of
from tests.kill import Child, python

SHARED_CHILD = Path(__file__).with_name("_shared_child.py")
MODES = ["snapshot", "log", "log-compact"]


def child(*args: str) -> Child:
    return Child(python(str(SHARED_CHILD), *args), stdin=True)


def tell(c: Child, line: str = "") -> None:
    assert c.proc is not None and c.proc.stdin is not None
    c.proc.stdin.write(line + "\n")
    c.proc.stdin.flush()


def mutex_holder(path: Path) -> Holder | None:
    try:
        return Holder.decode(Path(str(path) + ".mutex").read_bytes())
    except FileNotFoundError:
        return None


# -- one journal, two instances ------------------------------------------------------------


@pytest.mark.parametrize("append_log", [False, True])
async def test_instances_see_each_others_commits_and_conflicts(
    tmp_path: Path, append_log: bool
) -> None:
    path = tmp_path / "j"
    a = await open_shared_file_kv(path, append_log=append_log)
    b = await open_shared_file_kv(path, append_log=append_log, compact_every=3)
    try:
        await a.commit([Put("k", {"n": 1}, expect=0, due=5.0)])
        got = await b.get("k")
        assert got is not None and (got.value, got.version, got.due) == ({"n": 1}, 1, 5.0)
        await b.commit([Put("k", {"n": 2}, expect=1, due=5.0), Put("x", {}, expect=0)])
        with pytest.raises(VersionConflictError) as info:  # a's copy is stale: refused
            await a.commit([Put("k", {"n": 3}, expect=1)])
        assert (info.value.expected, info.value.actual) == (1, 2)
        for i in range(7):  # b compacts every 3 entries; a follows every time
            await (a, b)[i % 2].commit([Put(f"c{i}", {"i": i}, expect=0)])
        await a.commit([Delete("x", expect=1)])
        assert await state_of(a) == await state_of(b)
        assert await b.range("due", "", 10.0) == ["k"] and await b.get("x") is None
    finally:
        await a.close()
        await b.close()
    again = await open_file_kv(path)  # the same file format: the file journal reads it
    try:
        assert len(await again.scan("c")) == 7
    finally:
        await again.close()


async def test_a_batch_of_concurrent_operations_shares_one_hold(tmp_path: Path) -> None:
    a = await open_shared_file_kv(tmp_path / "j", append_log=True)
    b = await open_shared_file_kv(tmp_path / "j", append_log=True)
    try:
        await asyncio.gather(
            *(
                kv.commit([Put(f"{n}/{i}", {}, expect=0)])
                for i in range(30)
                for n, kv in [("a", a), ("b", b)]
            ),
            *(kv.scan("") for kv in (a, b) for _ in range(5)),
        )
        assert len(await a.scan("")) == len(await b.scan("")) == 60
    finally:
        await a.close()
        await b.close()


# -- real processes under load ---------------------------------------------------------------


@pytest.mark.crash
@pytest.mark.parametrize("mode", MODES)
def test_processes_claiming_under_load_never_both_win(tmp_path: Path, mode: str) -> None:
    path, workers, each = tmp_path / "j", 3, 150
    group = [child("claim", str(path), mode, str(w), str(each)).start() for w in range(workers)]
    try:
        for c in group:
            c.wait_for("ready")
        for c in group:
            tell(c)  # go, all together
        lines = [c.finish() for c in group]
    finally:
        for c in group:
            c.__exit__(None, None, None)
    won = [int(line.split()[1]) for out in lines for line in out if line.startswith("won ")]
    conflicts = sum(int(out[-1].split()[1]) for out in lines)
    assert sorted(won) == list(range(1, workers * each + 1))  # each version won once
    assert conflicts > 0  # they did race, else this proves nothing
    state = asyncio.run(_state(path))
    assert state["lease"][1] == workers * each
    tokens = sorted(v[0]["token"] for k, v in state.items() if k.startswith("w"))
    assert tokens == list(range(1, workers * each + 1))  # every claim's write is there


async def _state(path: Path) -> dict[str, tuple[Any, ...]]:
    kv = await open_shared_file_kv(path)
    try:
        return await state_of(kv)
    finally:
        await kv.close()


@pytest.mark.crash
@pytest.mark.parametrize("mode", MODES)
def test_writers_sigkilled_under_load_lose_nothing(tmp_path: Path, mode: str) -> None:
    """Three writers; one SIGKILLed at a random moment, twice (holding the mutex or not).
    The others go on (its mutex, if it held it, is broken at once: the stale limit is an
    hour), and every commit any of them saw returned is in the journal."""
    path, rng = tmp_path / "j", random.Random()
    acked: dict[str, int] = {}
    group = {w: child("write", str(path), mode, w).start() for w in ("0", "1", "2")}
    try:
        for c in group.values():
            c.wait_for("ready")
        for victim in ("0", "1"):
            time.sleep(rng.uniform(0.05, 0.3))  # the random moment; nothing timed is asserted
            group[victim].kill()
            others = [w for w in group if group[w].alive()]
            marks = {w: len(group[w].lines) for w in others}
            for w in others:  # the survivors commit more: the dead holder did not block them
                group[w].wait_for(str(_last(group[w], marks[w]) + 5), timeout=60)
        group["2"].kill()
    finally:
        for c in group.values():
            c.__exit__(None, None, None)
    for w, c in group.items():
        acked[w] = max((int(x) for x in c.lines[1:] if x.isdigit()), default=-1)
    state = asyncio.run(_state(path))
    for w, top in acked.items():
        mine = sorted(
            v[0]["n"] for k, v in state.items() if k.startswith(f"w{w}/") and "last" not in k
        )
        last = state.get(f"w{w}/last")
        n = last[0]["n"] if last is not None else -1
        assert n >= top, (w, n, top)  # every commit seen returned is there
        assert mine == list(range(n + 1)), w  # and nothing half-applied


def _last(c: Child, upto: int) -> int:
    numbers = [int(x) for x in c.lines[1:upto] if x.isdigit()]
    return max(numbers, default=-1)


# -- the mutex: dead, stalled and busy holders -----------------------------------------------


@pytest.mark.crash
async def test_a_sigkilled_holders_mutex_is_broken_at_once(tmp_path: Path) -> None:
    path = tmp_path / "j"
    with child("hold-mutex", str(path), "1h") as holder:
        holder.wait_for("holding")
        holder.kill()
    held = mutex_holder(path)  # the dead holder's mutex is still there
    assert held is not None and held.pid == holder.pid
    # an hour of stale limit and of waiting: only the dead-pid rule lets this through
    kv = await open_shared_file_kv(path, stale_lock="1h")
    try:
        await kv.commit([Put("a", {}, expect=0)])
        assert len(kv.mutex_breaks) == 1 and f"pid {holder.pid}" in kv.mutex_breaks[0]
        assert "is dead" in kv.mutex_breaks[0]
    finally:
        await kv.close()
    left = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("j.mutex"))
    assert left in ([], ["j.mutex.wait"])  # neither the mutex nor the dead one's own file


@pytest.mark.crash
async def test_a_stalled_holder_is_broken_after_the_stale_limit(tmp_path: Path) -> None:
    path = tmp_path / "j"
    with child("hold-mutex", str(path), "500ms") as holder:
        holder.wait_for("holding")
        os.kill(holder.pid, signal.SIGSTOP)
        try:
            kv = await open_shared_file_kv(path, stale_lock="500ms", lock_timeout="60s")
            try:
                await kv.commit([Put("a", {}, expect=0)])
                assert len(kv.mutex_breaks) == 1
                assert f"pid {holder.pid}" in kv.mutex_breaks[0]
                assert "stalled" in kv.mutex_breaks[0]
            finally:
                await kv.close()
            # someone else holds the mutex now; the thawed holder must leave it alone
            mine = FileMutex(os.path.realpath(path), stale=30.0, heartbeat=10.0)
            mine.start()
            mine.acquire(timeout=10)
        finally:
            os.kill(holder.pid, signal.SIGCONT)
        tell(holder)  # give it back
        holder.wait_for("released")
        assert mine.owned()
        mine.release()
        mine.stop()
        holder.finish()


@pytest.mark.crash
async def test_the_heartbeat_keeps_a_busy_holders_mutex(tmp_path: Path) -> None:
    """A holder whose write takes three stale limits keeps the mutex: the other process
    waits for it instead of breaking it, and both commits land."""
    path, stale = tmp_path / "j", 0.4
    kv = await open_shared_file_kv(path, stale_lock=f"{int(stale * 1000)}ms", lock_timeout="60s")
    try:
        with child("busy", str(path), f"{int(stale * 1000)}ms") as busy:
            busy.wait_for("ready")
            busy.wait_for("writing")  # it holds the mutex, and stays in its write
            mine = asyncio.create_task(kv.commit([Put("mine", {}, expect=0)]))
            await asyncio.sleep(3 * stale)  # long enough to be robbed, were it not alive
            assert not mine.done()  # not robbed: we still wait
            held = mutex_holder(path)
            assert held is not None and held.pid == busy.pid
            assert kv.mutex_breaks == []
            tell(busy)  # let its write finish
            await asyncio.wait_for(mine, 60)
            busy.wait_for("committed")
            busy.finish()
        assert set(await state_of(kv)) == {"busy/1", "mine"}
        assert kv.mutex_breaks == []
    finally:
        await kv.close()


class _Robbed(SharedFileKv):
    """Another process breaks the mutex after this instance read the file, before it
    writes (as when this process stalls past the stale limit)."""

    async def _refresh(self) -> None:
        await super()._refresh()
        if self.rob:
            os.rename(self._mutex.path, self._mutex.path + ".gone")
            Path(self._mutex.path).write_bytes(b"otherhost 1 0 cafe\n")

    rob = False


@pytest.mark.parametrize("append_log", [False, True])
async def test_a_write_whose_mutex_was_broken_is_refused(tmp_path: Path, append_log: bool) -> None:
    from botmesh.state.backends.shared_file import SharedFileOptions

    path = tmp_path / "j"
    kv = _Robbed(path, SharedFileOptions(append_log=append_log))
    await kv.open()
    try:
        await kv.commit([Put("a", {"n": 1}, expect=0)])
        before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.suffix != ".mutex"}
        kv.rob = True
        with pytest.raises(JournalUnavailableError, match="was broken by another process"):
            await kv.commit([Put("a", {"n": 2}, expect=1)])
        kv.rob = False
        after = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.suffix != ".mutex"}
        assert {k: v for k, v in after.items() if not k.endswith(".gone")} == before
        # the thief gave it back: the instance works on, from the files
        os.unlink(str(path) + ".mutex")
        os.unlink(str(path) + ".mutex.gone")
        entry = await kv.get("a")
        assert entry is not None and entry.value == {"n": 1}
        assert await kv.commit([Put("a", {"n": 2}, expect=1)]) == [2]
    finally:
        await kv.close()


async def test_a_live_holder_past_lock_timeout_fails_the_operation(tmp_path: Path) -> None:
    path = tmp_path / "j"
    kv = await open_shared_file_kv(path, stale_lock="30s", lock_timeout="300ms")
    holder = FileMutex(os.path.realpath(path), stale=30.0, heartbeat=10.0)
    holder.start()
    holder.acquire(timeout=10)
    try:
        with pytest.raises(JournalUnavailableError) as info:
            await kv.get("a")
        assert f"pid {os.getpid()}" in str(info.value) and "mutex" in str(info.value)
        assert kv.mutex_breaks == []  # a live, fresh holder is never broken
    finally:
        holder.release()
        holder.stop()
    assert await kv.get("a") is None
    await kv.close()


# -- the log: torn and corrupt lines ---------------------------------------------------------


async def test_a_torn_last_line_is_cut_and_the_rest_kept(tmp_path: Path) -> None:
    path = tmp_path / "j"
    log = Path(str(path) + ".log")
    a = await open_shared_file_kv(path, append_log=True)
    b = await open_shared_file_kv(path, append_log=True)
    try:
        await a.commit([Put("x", {"n": 1}, expect=0)])
        await b.commit([Put("y", {"n": 1}, expect=0)])
        good = log.read_bytes()
        # a writer that died in the middle of its line
        log.write_bytes(good + b'{"seq":3,"label":"t","put":[["z",{}')
        assert await a.get("z") is None
        assert log.read_bytes() == good  # cut back to the last whole line
        await a.commit([Put("z", {"n": 1}, expect=0)])
        got = await b.get("z")
        assert got is not None and got.version == 1
        assert sorted(e.key for e in await b.scan("")) == ["x", "y", "z"]
    finally:
        await a.close()
        await b.close()


async def test_a_corrupt_middle_line_is_refused_naming_file_line_offset(tmp_path: Path) -> None:
    path = tmp_path / "j"
    log = Path(str(path) + ".log")
    reader = await open_shared_file_kv(path, append_log=True)  # has seen an empty journal
    writer = await open_shared_file_kv(path, append_log=True)
    try:
        for i in range(3):
            await writer.commit([Put(f"k{i}", {"i": i}, expect=0)])
        data = bytearray(log.read_bytes())
        second = data.index(b"\n") + 1
        data[second + 12] ^= 0x01  # a flipped bit in line 2, with line 3 after it
        log.write_bytes(bytes(data))
        with pytest.raises(JournalCorruptError) as info:
            await reader.get("k0")
        err = info.value
        assert (err.code, err.file, err.line, err.offset) == (
            "APPEND_LOG_CORRUPT",
            str(log),
            2,
            second,
        )
        with pytest.raises(JournalCorruptError) as again:  # refused on every try, not cut
            await reader.scan("")
        assert again.value.line == 2
        with pytest.raises(JournalCorruptError):
            await open_shared_file_kv(path, append_log=True)
        assert log.read_bytes() == bytes(data)  # left as it was
    finally:
        await reader.close()
        await writer.close()


# -- the file journal and the shared one refuse each other -----------------------------------


async def test_each_refuses_the_other_in_this_process(tmp_path: Path) -> None:
    path = tmp_path / "j"
    single = await open_file_kv(path)
    with pytest.raises(JournalLockedError, match="close"):
        await open_shared_file_kv(path)
    await single.close()
    shared = await open_shared_file_kv(path)
    with pytest.raises(JournalLockedError, match="shared-file"):
        await open_file_kv(path)
    await shared.close()
    single = await open_file_kv(path)  # free again once both are closed
    await single.close()


async def test_a_live_file_journal_in_another_process_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "j"
    with Child(python(str(CHILD), "hold", str(path)), stdin=True) as holder:
        try:
            holder.wait_for("ready")
            with pytest.raises(JournalLockedError) as info:
                await open_shared_file_kv(path)
            assert info.value.pid == holder.pid and f"pid {holder.pid}" in str(info.value)
        finally:
            holder.close_stdin()
            holder.finish(timeout=30)
    kv = await open_shared_file_kv(path)  # its holder closed: free
    await kv.close()


async def test_a_file_journal_opening_later_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "j"
    with child("file-hold", str(path)) as holder:
        try:
            holder.wait_for("ready")
            with pytest.raises(JournalLockedError, match="shared-file journal by other live"):
                await open_file_kv(path)
            with pytest.raises(JournalLockedError):
                await open_file_kv(path, append_log=True)
            shared = await open_shared_file_kv(path)  # another shared one is welcome
            await shared.commit([Put("a", {}, expect=0)])
            await shared.close()
        finally:
            holder.close_stdin()
            holder.finish(timeout=30)
    single = await open_file_kv(path)
    try:
        assert await single.get("a") is not None
    finally:
        await single.close()


async def test_a_replaced_lock_file_makes_every_operation_refuse(tmp_path: Path) -> None:
    """Someone removed the lock file while the shared journal was open, so a file journal
    could open the file: the shared one then refuses instead of writing over it."""
    path = tmp_path / "j"
    shared = await open_shared_file_kv(path)
    try:
        await shared.commit([Put("a", {}, expect=0)])
        os.unlink(str(path) + ".lock")
        with Child(python(str(CHILD), "hold", str(path)), stdin=True) as single:
            try:
                single.wait_for("ready")  # a file journal holds the file now
                with pytest.raises(JournalLockedError, match="was removed or replaced"):
                    await shared.commit([Put("b", {}, expect=0)])
                with pytest.raises(JournalLockedError):
                    await shared.get("a")
            finally:
                single.close_stdin()
                single.finish(timeout=30)
    finally:
        await shared.close()
    kv = await open_file_kv(path)
    try:
        assert await kv.get("a") is not None and await kv.get("b") is None
    finally:
        await kv.close()


# -- close() ---------------------------------------------------------------------------------


async def test_close_finishes_what_was_called_and_refuses_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "j"
    kv = await open_shared_file_kv(path, append_log=True)
    holder = FileMutex(os.path.realpath(path), stale=30.0, heartbeat=10.0)
    holder.start()
    holder.acquire(timeout=10)  # the operations below wait for the mutex
    calls = [asyncio.create_task(kv.commit([Put(f"k{i}", {}, expect=0)])) for i in range(5)] + [
        asyncio.create_task(kv.get("k0"))
    ]
    await asyncio.sleep(0)  # they are called
    closing = asyncio.create_task(kv.close())
    await asyncio.sleep(0.05)
    assert not closing.done()  # close waits for them
    with pytest.raises(JournalUnavailableError, match="closed"):
        await kv.commit([Put("late", {}, expect=0)])
    with pytest.raises(JournalUnavailableError, match="closed"):
        await kv.get("k0")
    holder.release()
    holder.stop()
    await closing
    results = await asyncio.gather(*calls)
    assert results[:5] == [[1]] * 5  # every commit called before close() landed
    await kv.close()  # idempotent
    again = await open_shared_file_kv(path)
    try:
        assert sorted(e.key for e in await again.scan("")) == [f"k{i}" for i in range(5)]
    finally:
        await again.close()


# -- URLs and options ------------------------------------------------------------------------


async def test_the_url_opens_a_shared_journal(tmp_path: Path) -> None:
    url = f"shared-file://{tmp_path}/j?append_log=1&stale_lock=2s&heartbeat=500ms&compact_every=9"
    assert is_shared(url) and check_url(url) == url
    kv = await open_backend(url)
    try:
        assert isinstance(kv, SharedFileKv) and kv.shared
        opts = kv.shared_options
        assert (opts.append_log, opts.stale_lock, opts.beat, opts.compact_every) == (
            True,
            2.0,
            0.5,
            9,
        )
        assert opts.wait == 4.0
        await kv.commit([Put("a", {}, expect=0)])
    finally:
        await kv.close()
    defaults = from_url(f"shared-file://{tmp_path}/j").shared_options
    assert (defaults.stale_lock, defaults.beat, defaults.wait, defaults.append_log) == (
        30.0,
        10.0,
        60.0,
        False,
    )


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("shared-file://relative/j", "shared-file:///absolute/path"),
        ("shared-file:///tmp/j?stale_lock=30", "cannot read '30' as a duration"),
        ("shared-file:///tmp/j?stale_lock=soon", "stale_lock"),
        ("shared-file:///tmp/j?stale_lock=0s", "must be seconds > 0"),
        ("shared-file:///tmp/j?stale_lock=1s&heartbeat=2s", "below stale_lock"),
        ("shared-file:///tmp/j?append_log=maybe", "true or false"),
        ("shared-file:///tmp/j?compact_every=0", "compact_every"),
        ("shared-file:///tmp/j?busy_timeout=5", "takes append_log, fsync"),
    ],
)
def test_bad_urls_are_refused_naming_the_option_and_fix(url: str, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        check_url(url)
    assert words in str(info.value)
    assert info.value.field.startswith("journal")


async def test_options_of_the_python_api_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"shared_file\.stale_lock"):
        await open_shared_file_kv(tmp_path / "j", stale_lock=30)
    with pytest.raises(ConfigError, match=r"shared_file\.heartbeat"):
        await open_shared_file_kv(tmp_path / "j", stale_lock="1s", heartbeat="1s")
    with pytest.raises(JournalUnavailableError, match="does not exist"):
        await open_shared_file_kv(tmp_path / "nope" / "j")
    assert list(tmp_path.iterdir()) == []  # a refused open leaves nothing behind

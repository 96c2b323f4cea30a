"""Damaged journals: refused with the right code and position and left as they were, or (a
torn last line) cut and the rest replayed. Never applied half-way.

The fuzzer builds one journal (a snapshot plus a log of commits), then damages copies of
it: truncation at every byte offset of the last entries, bit flips, zeroed blocks, junk
lines, a crash between the snapshot rewrite and the log truncation, and damage to the
snapshot. Each case must either open with exactly the state after a prefix of the commits
(every commit before the damage kept) or be refused with the right code, line and offset.
"""

# ruff: noqa: ASYNC240  # the tests read and damage journal files directly, on purpose

from __future__ import annotations

import asyncio
import json
import random
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from botmesh.state.backends.file import open_file_kv
from botmesh.state.errors import JournalCorruptError
from botmesh.state.kv import Delete, Put
from tests.file.conftest import FUZZ_OUTCOMES
from tests.file.helpers import NoSyncOps, state_of

State = dict[str, tuple[Any, ...]]

# -- the base journal ---------------------------------------------------------------------


@dataclass(frozen=True)
class Base:
    snapshot: bytes  # the snapshot at seq SNAP_SEQ
    log: bytes  # the log lines after it
    starts: list[int]  # byte offset of each log line; starts[-1] == len(log)
    states: list[State]  # states[j]: after the snapshot and the first j log lines
    snapshots: list[bytes]  # snapshots[j]: a snapshot of states[j] (what a compaction writes)


SNAP_SEQ = 4


def _commits() -> list[list[Put | Delete]]:
    return [
        [Put("chat/1", {"text": "héllo ✓", "n": 1}, expect=None, due=10.0)],
        [Put("chat/2", {"nested": {"a": [1, 2, {"b": None}]}}, expect=None, purge=99.5)],
        [Put("chat/1", {"text": "second"}, expect=None), Delete("old/1", expect=None)],
        [Put(f"bulk/{i}", {"i": i, "pad": "p" * i}, expect=None) for i in range(3)],
        [Put("crc32", {"crc32": 5, "s": ',"crc32":1}'}, expect=None)],
        [Delete("chat/2", expect=None)],
        [Put("chat/3", {"quote": '"\\\n\t\u0000'}, expect=None, due=1.5, purge=2.5)],
        [Put("chat/1", {"text": "third"}, expect=None, due=None)],
        [Put("k", {"v": 0.1}, expect=None), Put("k", {"v": 2**60}, expect=None)],
        [Put("chat/2", {"back": True}, expect=None)],
        [Put("z" * 40, {"list": list(range(20))}, expect=None)],
        [Delete("bulk/1", expect=None), Put("bulk/9", {}, expect=None, due=3.0)],
    ]


async def _build(folder: Path) -> Base:
    path = folder / "j"
    kv = await open_file_kv(path, append_log=True, file_ops=NoSyncOps())
    for i in range(SNAP_SEQ):
        await kv.commit([Put(f"old/{i}", {"i": i}, expect=0)], label="fuzz.setup")
    await kv.close()  # folds: snapshot at seq 4, no log
    kv = await open_file_kv(path, append_log=True, file_ops=NoSyncOps())
    states = [await state_of(kv)]
    snapshots = [path.read_bytes()]
    for ops in _commits():
        await kv.commit(ops, label="fuzz.commit")
        states.append(await state_of(kv))
    log = Path(kv.log_path).read_bytes()
    snapshot = path.read_bytes()
    await kv.close()
    # the snapshot a compaction would have written after each prefix of the log
    for j in range(1, len(states)):
        sub = folder / f"s{j}"
        sub.mkdir()
        (sub / "j").write_bytes(snapshot)
        (sub / "j.log").write_bytes(log[: _starts(log)[j]])
        k = await open_file_kv(sub / "j", file_ops=NoSyncOps())  # folds the log
        await k.close()
        snapshots.append((sub / "j").read_bytes())
    return Base(snapshot, log, _starts(log), states, snapshots)


def _starts(log: bytes) -> list[int]:
    starts = [0]
    for i, b in enumerate(log):
        if b == 0x0A:
            starts.append(i + 1)
    return starts


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Base:
    return asyncio.run(_build(tmp_path_factory.mktemp("fuzzbase")))


# -- cases ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    kind: str
    snapshot: bytes
    log: bytes | None
    #: log damage [first, end) in the original log's coordinates; None: log intact
    damage: tuple[int, int] | None = None
    #: the snapshot is damaged: must be refused with SNAPSHOT_CORRUPT
    bad_snapshot: bool = False
    #: the snapshot already holds this many log lines (crash before the truncation)
    folded: int = 0
    truncation: bool = False
    #: an original log line starting at or after this offset is intact and follows the
    #: damage (so the damage must be refused); None: nothing survives after the damage
    later_from: int | None = None


def _flip(data: bytes, pos: int, bit: int) -> bytes:
    b = bytearray(data)
    b[pos] ^= 1 << bit
    return bytes(b)


def _zero(data: bytes, pos: int, size: int) -> bytes:
    b = bytearray(data)
    end = min(len(b), pos + size)
    b[pos:end] = bytes(end - pos)
    return bytes(b)


def _junk(rng: random.Random) -> bytes:
    choices = [
        b"garbage",
        b"{}",
        b'{"seq":99,"label":"x","put":[],"del":[],"crc32":1}',
        bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40))).replace(b"\n", b"?"),
        json.dumps({"seq": 5, "put": [], "del": []}).encode(),
    ]
    return rng.choice(choices)


def truncations(base: Base, last: int) -> Iterator[Case]:
    """The log cut at every byte offset of its last ``last`` entries."""
    for cut in range(base.starts[-1 - last], len(base.log)):
        yield Case("truncate", base.snapshot, base.log[:cut], (cut, cut), truncation=True)


def random_case(base: Base, rng: random.Random) -> Case:
    log, snap = base.log, base.snapshot
    kind = rng.choice(
        [
            "bitflip",
            "bitflip",
            "zero-block",
            "zero-tail",
            "junk-line",
            "crash-compaction",
            "snapshot-truncate",
            "snapshot-bitflip",
            "snapshot-zero",
        ]
    )
    if kind == "bitflip":
        pos = rng.randrange(len(log))
        return Case(
            kind, snap, _flip(log, pos, rng.randrange(8)), (pos, pos + 1), later_from=pos + 2
        )
    if kind == "zero-block":
        pos, size = rng.randrange(len(log)), rng.choice([1, 7, 64, 512, 4096])
        end = min(len(log), pos + size)
        return Case(kind, snap, _zero(log, pos, size), (pos, end), later_from=end + 1)
    if kind == "zero-tail":  # a power loss that extended the file with zeros
        return Case(kind, snap, log + bytes(rng.choice([1, 100, 4096])), (len(log), len(log)))
    if kind == "junk-line":
        at = rng.choice(base.starts)
        junk = log[:at] + _junk(rng) + b"\n" + log[at:]
        return Case(kind, snap, junk, (at, at), later_from=at)
    if kind == "crash-compaction":
        # the snapshot was rewritten after `folded` log lines, the log not yet cut (and maybe
        # torn at the end by the same crash)
        folded = rng.randrange(1, len(base.starts))
        cut = rng.choice([len(log), rng.randrange(base.starts[folded], len(log) + 1)])
        return Case(
            kind, base.snapshots[folded], log[:cut], (cut, cut), folded=folded, truncation=True
        )
    if kind == "snapshot-truncate":
        return Case(kind, snap[: rng.randrange(len(snap))], log, bad_snapshot=True)
    if kind == "snapshot-bitflip":
        pos = rng.randrange(len(snap))
        return Case(kind, _flip(snap, pos, rng.randrange(8)), log, bad_snapshot=True)
    pos = rng.randrange(len(snap))
    return Case(kind, _zero(snap, pos, rng.choice([1, 16, 512])), log, bad_snapshot=True)


# -- the oracle -----------------------------------------------------------------------------


async def check(case: Case, base: Base, folder: Path, append_log: bool) -> str:
    """Run one case; return its outcome name, or raise AssertionError saying what broke."""
    folder.mkdir()
    path = folder / "j"
    path.write_bytes(case.snapshot)
    if case.log is not None:
        Path(str(path) + ".log").write_bytes(case.log)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    kept = 0  # log lines wholly before the damage (their newline included)
    if case.damage is not None:
        first, _ = case.damage
        kept = max(j for j, s in enumerate(base.starts) if s <= first)
    else:
        kept = len(base.starts) - 1
    later = case.later_from is not None and any(
        case.later_from <= s < base.starts[-1] for s in base.starts
    )
    try:
        kv = await open_file_kv(path, append_log=append_log, file_ops=NoSyncOps())
    except JournalCorruptError as exc:
        after = {p.name: p.read_bytes() for p in folder.iterdir()}
        assert after == before, "a refused journal was changed"
        if case.bad_snapshot:
            assert (exc.code, exc.file) == ("SNAPSHOT_CORRUPT", str(path)), exc
            return "refused SNAPSHOT_CORRUPT"
        assert not case.truncation, f"a truncated log was refused: {exc}"
        assert exc.code == "APPEND_LOG_CORRUPT", exc
        assert exc.file == str(path) + ".log", exc
        assert (exc.line, exc.offset) == (kept + 1, base.starts[kept]), (
            f"refused at line {exc.line} offset {exc.offset}, the damage starts in line "
            f"{kept + 1} at offset {base.starts[kept]}: {exc}"
        )
        return "refused APPEND_LOG_CORRUPT"
    try:
        assert not case.bad_snapshot, "a damaged snapshot was opened"
        assert not later, "opened although entries follow the damaged line"
        got = await state_of(kv)
        want = base.states[max(kept, case.folded)]
        assert got == want, f"opened with another state than after {kept} commits"
        # the cut must leave a journal that takes new commits and reads back
        await kv.commit([Put("after/open", {"ok": True}, expect=0)])
    finally:
        await kv.close()
    kv = await open_file_kv(path, file_ops=NoSyncOps())
    try:
        again = await state_of(kv)
        assert again.pop("after/open", None) is not None and again == want, "reopen differs"
    finally:
        await kv.close()
    return "opened with every commit" if kept == len(base.starts) - 1 else "opened, tail cut"


def cases(base: Base, total: int, seed: int) -> list[Case]:
    """``total`` cases: truncations at every offset of the last entries, then random ones."""
    rng = random.Random(seed)
    fixed = list(truncations(base, last=2))
    fixed = fixed[: total // 2]
    return fixed + [random_case(base, rng) for _ in range(max(0, total - len(fixed)))]


async def test_fuzzer(base: Base, tmp_path: Path, fuzz_cases: int, fuzz_seed: int | None) -> None:
    assert fuzz_cases >= 1
    seed = zlib.crc32(b"botmesh") if fuzz_seed is None else fuzz_seed
    all_cases = cases(base, fuzz_cases, seed=seed)
    failures: list[str] = []
    for i, case in enumerate(all_cases):
        try:
            outcome = await check(case, base, tmp_path / f"c{i}", append_log=i % 2 == 1)
        except AssertionError as exc:
            failures.append(f"case {i} ({case.kind}, damage {case.damage}): {exc}")
            continue
        FUZZ_OUTCOMES[f"{case.kind}: {outcome}"] += 1
    assert not failures, (
        f"{len(failures)} of {len(all_cases)} cases failed (seed {seed}):\n"
        + "\n".join(failures[:20])
    )


# -- named cases ----------------------------------------------------------------------------


async def test_truncated_snapshot_is_refused_naming_the_file(base: Base, tmp_path: Path) -> None:
    path = tmp_path / "j"
    path.write_bytes(base.snapshot[:-10])
    with pytest.raises(JournalCorruptError) as info:
        await open_file_kv(path)
    assert (info.value.code, info.value.file) == ("SNAPSHOT_CORRUPT", str(path))
    assert str(path) in str(info.value) and "Operator action" in str(info.value)
    assert path.read_bytes() == base.snapshot[:-10]
    assert not (tmp_path / "j.lock").exists()  # the refused open let go of the lock


async def test_bad_middle_line_is_refused_with_line_and_offset(base: Base, tmp_path: Path) -> None:
    path = tmp_path / "j"
    path.write_bytes(base.snapshot)
    third = base.starts[2]
    log = base.log[:third] + b"{not json}\n" + base.log[third:]
    Path(str(path) + ".log").write_bytes(log)
    with pytest.raises(JournalCorruptError) as info:
        await open_file_kv(path, append_log=True)
    err = info.value
    assert (err.code, err.file, err.line, err.offset) == (
        "APPEND_LOG_CORRUPT",
        str(path) + ".log",
        3,
        third,
    )
    assert f"line 3 (byte offset {third})" in str(err)
    assert Path(str(path) + ".log").read_bytes() == log
    assert path.read_bytes() == base.snapshot


async def test_torn_last_line_is_cut_and_the_rest_replayed(base: Base, tmp_path: Path) -> None:
    path = tmp_path / "j"
    path.write_bytes(base.snapshot)
    torn = base.log[: base.starts[-2] + 17]
    Path(str(path) + ".log").write_bytes(torn)
    kv = await open_file_kv(path, append_log=True)
    assert await state_of(kv) == base.states[-2]
    assert Path(kv.log_path).read_bytes() == base.log[: base.starts[-2]]
    await kv.close()


async def test_missing_commits_between_snapshot_and_log_are_refused(
    base: Base, tmp_path: Path
) -> None:
    path = tmp_path / "j"
    path.write_bytes(base.snapshot)
    Path(str(path) + ".log").write_bytes(base.log[base.starts[1] :])  # line 1 lost
    with pytest.raises(JournalCorruptError) as info:
        await open_file_kv(path)
    assert (info.value.code, info.value.line, info.value.offset) == ("APPEND_LOG_CORRUPT", 1, 0)
    assert "missing" in str(info.value)

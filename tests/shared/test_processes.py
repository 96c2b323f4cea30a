"""Several processes on one journal: compare-and-set holds across processes (and hosts, for
the server backends), so no increment of a shared counter is lost or applied twice."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.backends import BACKENDS, BackendHandle
from tests.kill import Child, python

SHARED = ["sqlite", "shared-file", "shared-file-log", "postgres", "redis"]
WORKERS = 3
EACH = 60


@pytest.mark.parametrize("backend_name", SHARED)
def test_compare_and_set_holds_across_processes(backend_name: str, tmp_path: Path) -> None:
    path = tmp_path / "journal"
    asyncio.run(_create(backend_name, path))  # the server (if any) starts in this process
    children = [
        Child(
            python("-m", "tests.shared._counter", backend_name, str(path), str(w), str(EACH)),
            stdin=True,
        ).start()
        for w in range(WORKERS)
    ]
    try:
        for child in children:
            child.wait_for("ready")
        for child in children:  # go, all together
            assert child.proc is not None and child.proc.stdin is not None
            child.proc.stdin.write("go\n")
            child.proc.stdin.flush()
        conflicts = [int(child.finish()[-1].split()[1]) for child in children]
    finally:
        for child in children:
            child.__exit__(None, None, None)
    counter, steps = asyncio.run(_read(backend_name, path))
    assert counter == WORKERS * EACH  # no increment lost, none applied twice
    assert sorted(steps) == list(range(1, WORKERS * EACH + 1))  # each value seen once
    assert sum(conflicts) > 0  # the workers did race (else this proves nothing)


async def _create(name: str, path: Path) -> None:
    handle = BackendHandle(BACKENDS[name], path)
    await handle.open()
    await handle.close()


async def _read(name: str, path: Path) -> tuple[int, list[int]]:
    handle = BackendHandle(BACKENDS[name], path)
    kv = await handle.open()
    try:
        entry = await kv.get("c/shared")
        assert entry is not None
        assert entry.version == WORKERS * EACH
        steps = [e.value["at"] for e in await kv.scan("c/w")]
        return int(entry.value["n"]), steps
    finally:
        await handle.close()

"""The lock file: one live process, one open per process, a dead holder's lock taken over."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from botmesh.state.backends.file import open_file_kv
from botmesh.state.errors import JournalLockedError
from botmesh.state.kv import Put
from tests.file.helpers import CHILD
from tests.kill import Child, python


async def test_second_open_in_this_process_is_refused_until_close(tmp_path: Path) -> None:
    kv = await open_file_kv(tmp_path / "j")
    with pytest.raises(JournalLockedError) as info:
        await open_file_kv(tmp_path / "j", append_log=True)
    assert info.value.pid == os.getpid()
    assert "close()" in str(info.value)
    # the same file by another spelling of its path
    with pytest.raises(JournalLockedError):
        await open_file_kv(tmp_path / "." / "j")
    await kv.commit([Put("a", {}, expect=0)])
    await kv.close()
    again = await open_file_kv(tmp_path / "j")
    assert await again.get("a") is not None
    await again.close()


async def test_a_refused_open_leaves_the_holder_working(tmp_path: Path) -> None:
    kv = await open_file_kv(tmp_path / "j", append_log=True, fsync=False)
    with pytest.raises(JournalLockedError):
        await open_file_kv(tmp_path / "j")
    assert (tmp_path / "j.lock").read_text().strip() == str(os.getpid())
    await kv.commit([Put("a", {}, expect=0)])
    await kv.close()
    assert not (tmp_path / "j.lock").exists()


async def test_another_live_process_is_refused_with_its_pid(tmp_path: Path) -> None:
    with Child(python(str(CHILD), "hold", str(tmp_path / "j")), stdin=True) as child:
        try:
            assert child.wait_for("ready").split() == ["ready", str(child.pid)]
            with pytest.raises(JournalLockedError) as info:
                await open_file_kv(tmp_path / "j")
            assert info.value.pid == child.pid
            assert f"pid {child.pid}" in str(info.value)
        finally:
            child.close_stdin()  # the child closes its journal and exits
            child.finish(timeout=30)
    kv = await open_file_kv(tmp_path / "j")
    await kv.close()


async def test_a_dead_process_lock_is_taken_over(tmp_path: Path) -> None:
    with Child(python(str(CHILD), "hold", str(tmp_path / "j")), stdin=True) as child:
        child.wait_for("ready")
        child.kill()
    # the dead holder's lock file is still there, with its pid
    assert (tmp_path / "j.lock").read_text().strip() == str(child.pid)
    kv = await open_file_kv(tmp_path / "j")
    assert (tmp_path / "j.lock").read_text().strip() == str(os.getpid())
    await kv.commit([Put("a", {}, expect=0)])
    await kv.close()

"""A real child process killed with SIGKILL, then started again on the same journal."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

import pytest

from tests.backends import BACKENDS

pytestmark = pytest.mark.crash

PERSISTENT = sorted(n for n, c in BACKENDS.items() if c.persistent)
ROOT = Path(__file__).resolve().parents[2]


async def _child(*args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.crash.child",
        *args,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


async def _kill_at(marker: str, *args: str) -> None:
    proc = await _child(*args)
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 60)
    assert line.decode().strip() == marker, line
    proc.send_signal(signal.SIGKILL)
    assert await proc.wait() == -signal.SIGKILL


async def _recover(*args: str) -> dict:  # type: ignore[type-arg]
    proc = await _child(*args)
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0
    return json.loads(out.decode().strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_there_is_a_persistent_backend() -> None:
    assert PERSISTENT, "the SIGKILL tests need a persistent backend in tests/backends.py"


@pytest.mark.parametrize("backend_name", PERSISTENT)
async def test_sigkill_in_the_middle_of_a_handler(backend_name: str, tmp_path: Path) -> None:
    args = (backend_name, str(tmp_path / "journal"), str(tmp_path / "sent.log"))
    await _kill_at("IN_HANDLER", *args, "hang-in-handler", "skip")
    summary = await _recover(*args, "recover", "skip")
    assert (tmp_path / "sent.log").read_text().splitlines() == ["a", "b"]  # "a" not repeated
    assert summary["inbox"] == {"m1": ["done", 2]}
    assert summary["outbox"] == {"m1:1": "sent", "m1:2": "sent"}
    m = summary["metrics"]
    assert (m["inboundReplayed"], m["outboxDeduped"], m["outboxAmbiguous"]) == (1, 1, 0)


@pytest.mark.parametrize("policy", ["skip", "resend"])
@pytest.mark.parametrize("backend_name", PERSISTENT)
async def test_sigkill_between_provider_and_record(
    backend_name: str, policy: str, tmp_path: Path
) -> None:
    args = (backend_name, str(tmp_path / "journal"), str(tmp_path / "sent.log"))
    await _kill_at("SENT", *args, "hang-after-send", policy)
    summary = await _recover(*args, "recover", policy)
    sent = (tmp_path / "sent.log").read_text().splitlines()
    assert summary["metrics"]["outboxAmbiguous"] == 1
    assert summary["inbox"]["m1"][0] == "done"
    if policy == "skip":
        assert sent == ["a", "b"]  # never a duplicate
        assert summary["outbox"] == {"m1:1": "unknown", "m1:2": "sent"}
    else:
        assert sent == ["a", "a", "b"]  # never lost
        assert summary["outbox"] == {"m1:1": "sent", "m1:2": "sent"}

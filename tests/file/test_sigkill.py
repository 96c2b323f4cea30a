"""Real SIGKILL of a child process writing the journal, at random moments; then reopen and
check: every commit that returned before the kill is there, nothing is half-applied.

``pytest tests/file --kill-runs=50`` runs more (default 6: each mode at least once).
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from botmesh.state.backends.file import open_file_kv
from tests.file._child import WRITERS
from tests.file.conftest import KILL_OUTCOMES
from tests.file.helpers import CHILD, state_of
from tests.kill import Child, python

pytestmark = pytest.mark.crash

MODES = ["snapshot", "log", "log-compact", "snapshot-fsync"]


def _kill_run(path: Path, mode: str, delay: float) -> list[int]:
    """Run a writing child, SIGKILL it after ``delay`` seconds of writing; return, per
    writer, the highest commit the child reported as returned (-1: none)."""
    acked = [-1] * WRITERS
    with Child(python(str(CHILD), "write", str(path), mode)) as child:
        child.wait_for("ready")
        time.sleep(delay)  # the random moment of the kill; nothing is asserted on time
        child.kill()
    for line in child.lines[1:]:  # complete lines only: what the child saw returned
        w, n = (int(x) for x in line.split())
        acked[w] = max(acked[w], n)
    return acked


def test_sigkill_at_random_moments(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    import asyncio

    runs = int(request.config.getoption("--kill-runs"))
    rng = random.Random()
    seed = rng.randrange(2**32)
    rng.seed(seed)
    problems: list[str] = []
    for run in range(runs):
        mode = MODES[run % len(MODES)]
        folder = tmp_path / f"run{run}"
        folder.mkdir()
        path = folder / "j"
        # kill twice on the same journal: the second child starts from the recovered one
        for round_ in range(2):
            acked = _kill_run(path, mode, rng.uniform(0.02, 0.4))
            what = f"run {run} round {round_} ({mode}, seed {seed})"
            problem = asyncio.run(_check(path, acked))
            if problem:
                problems.append(f"{what}: {problem}")
            KILL_OUTCOMES[f"{mode}: {'bad' if problem else 'recovered'}"] += 1
            KILL_OUTCOMES["commits returned before a kill"] += sum(a + 1 for a in acked)
    assert not problems, "\n".join(problems)


async def _check(path: Path, acked: list[int]) -> str | None:
    kv = await open_file_kv(path)  # also takes over the dead child's lock
    try:
        state = await state_of(kv)
    finally:
        await kv.close()
    for w in range(WRITERS):
        last = state.get(f"w{w}/last")
        mine = sorted(
            int(k.split("/")[1]) for k in state if k.startswith(f"w{w}/") and k[-1] != "t"
        )
        top = last[0]["n"] if last is not None else -1
        if mine != list(range(top + 1)):
            return f"writer {w}: entries {mine[:3]}…{mine[-3:]} but last says {top}"
        if last is not None and last[1] != top + 1:
            return f"writer {w}: last has version {last[1]}, {top + 1} commits"
        if top < acked[w]:
            return f"writer {w}: commit {acked[w]} returned before the kill but is lost"
    return None

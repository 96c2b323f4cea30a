"""The leader of a leader-only provider session SIGKILLed mid-stream: two replica
processes on a shared journal (SQLite, PostgreSQL, Redis), sends queued on both; the
standby takes the session once the lease (1 s) lapsed and every queued send reaches the
channel exactly once (the fake channel's own record, a shared file, is the judge)."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.backends import BACKENDS, BackendHandle
from tests.kill import Child, python

pytestmark = pytest.mark.crash

SENDS = 40
LEASE = 1.0


def _tell(child: Child, line: str) -> None:
    assert child.proc is not None and child.proc.stdin is not None
    child.proc.stdin.write(line + "\n")
    child.proc.stdin.flush()


def _sent(folder: Path) -> list[tuple[float, str, str]]:
    log = folder / "sent.log"
    if not log.exists():
        return []
    lines = [line.split(" ", 3) for line in log.read_text().splitlines()]
    return [(float(p[0]), p[1], p[2]) for p in lines if len(p) == 4]


async def _create(name: str, path: Path) -> None:
    handle = BackendHandle(BACKENDS[name], path)
    await handle.open()
    await handle.close()


@pytest.mark.parametrize("backend_name", ["sqlite", "postgres", "redis"])
def test_the_standby_takes_the_session_when_the_leader_is_killed(
    backend_name: str, tmp_path: Path
) -> None:
    path = tmp_path / "journal"
    asyncio.run(_create(backend_name, path))
    argv = [
        python("-m", "tests.shared._leader_replica", backend_name, str(path), name, str(tmp_path))
        for name in ("r1", "r2")
    ]
    with ExitStack() as stack:
        r1 = stack.enter_context(Child(argv[0], stdin=True))
        r1.wait_for("ready")  # first: it takes the session
        r2 = stack.enter_context(Child(argv[1], stdin=True))
        r2.wait_for("ready")
        _tell(r1, "role")
        _tell(r2, "role")
        assert r1.wait_for("ROLE ") == "ROLE leader"
        assert r2.wait_for("ROLE ") == "ROLE standby"
        keys = [f"k{i}" for i in range(SENDS)]
        for i, key in enumerate(keys):  # alternately on both; the standby half inline
            if i % 2 == 0:
                _tell(r1, f"enq {key}")
                r1.wait_for(f"Q {key}")
            else:
                verb = "send" if i % 4 == 1 else "enq"
                _tell(r2, f"{verb} {key}")
                answer = r2.wait_for(f"{'S' if verb == 'send' else 'Q'} {key}")
                assert verb == "enq" or answer.endswith(" pending")  # left to the leader
        deadline = time.monotonic() + 60
        while len(_sent(tmp_path)) < SENDS // 4:  # mid-stream
            assert time.monotonic() < deadline, "the leader delivers nothing"
            time.sleep(0.005)
        r1.kill()
        killed = time.time()
        _tell(r2, "end")
        summary = json.loads(r2.wait_for("SUMMARY ", timeout=90).split(" ", 1)[1])
        r2.finish()
    sent = _sent(tmp_path)
    by_key = Counter(key for _, _, key in sent)
    before = [s for s in sent if s[1] == "r1"]
    after = [s for s in sent if s[1] == "r2"]
    assert by_key == Counter(keys)  # every queued send delivered once: none lost, none twice
    assert before and after and max(t for t, _, _ in before) <= min(t for t, _, _ in after)
    assert all(state == "sent" for state, _ in summary["outbox"].values())
    assert len(summary["outbox"]) == SENDS
    takeover = min(t for t, _, _ in after) - killed
    figures = {
        "sends": SENDS,
        "kills": 1,
        "by the leader before the kill": len(before),
        "by the standby after": len(after),
        "takeover (leases)": round(takeover / LEASE, 2),
        "duplicates": sum(n - 1 for n in by_key.values()),
        "lost": len(set(keys) - set(by_key)),
        "standby refusals (providerNotLeader)": summary["metrics"]["providerNotLeader"],
    }
    print(json.dumps({f"leader-kill/{backend_name}": figures}))

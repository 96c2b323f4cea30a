"""A child process for the lock and SIGKILL tests (run by path, not collected).

    python _child.py hold PATH            open, print "ready <pid>", wait for stdin to close
    python _child.py write PATH MODE      open, print "ready", then W writers commit
                                          forever, printing "<writer> <n>" after each
                                          commit returned

MODE: ``snapshot``, ``snapshot-fsync``, ``log`` or ``log-compact`` (compacts every 7 entries).
Writer ``w``'s commit ``n`` (going on from ``w<w>/last``) puts ``w<w>/<n>`` and moves
``w<w>/last`` to ``n`` in one commit.
"""

from __future__ import annotations

import asyncio
import os
import sys

from botmesh.state.backends.file import open_file_kv
from botmesh.state.kv import Put

WRITERS = 4

MODES: dict[str, dict[str, object]] = {
    "snapshot": {},
    "snapshot-fsync": {"fsync": True},
    "log": {"append_log": True},
    "log-compact": {"append_log": True, "compact_every": 7},
}


async def hold(path: str) -> None:
    kv = await open_file_kv(path)
    print(f"ready {os.getpid()}", flush=True)
    await asyncio.to_thread(sys.stdin.read)
    await kv.close()


async def write(path: str, mode: str) -> None:
    kv = await open_file_kv(path, **MODES[mode])  # type: ignore[arg-type]
    print("ready", flush=True)

    async def writer(w: int) -> None:
        last = await kv.get(f"w{w}/last")  # a second run goes on where the first stopped
        n = last.value["n"] + 1 if last is not None else 0
        while True:
            await kv.commit(
                [
                    Put(f"w{w}/{n}", {"w": w, "n": n, "pad": "x" * (n % 50)}, expect=0),
                    Put(f"w{w}/last", {"n": n}, expect=n),
                ],
                label="kill.write",
            )
            sys.stdout.write(f"{w} {n}\n")
            sys.stdout.flush()
            n += 1

    await asyncio.gather(*(writer(w) for w in range(WRITERS)))


if __name__ == "__main__":
    if sys.argv[1] == "hold":
        asyncio.run(hold(sys.argv[2]))
    else:
        asyncio.run(write(sys.argv[2], sys.argv[3]))

"""A child process of the cross-process tests: increments shared counters by
compare-and-set, retrying on conflict (run by module, not collected).

    python -m tests.shared._counter BACKEND PATH WORKER N

Prints ``ready``, waits for a line on stdin (so every worker starts together), then makes
N increments of the counter ``c/shared`` (read, put with ``expect`` = the version read)
and prints ``done <conflicts>``.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from botmesh.state.errors import VersionConflictError
from botmesh.state.kv import Put
from tests.backends import BACKENDS


async def main(backend: str, path: str, worker: str, n: str) -> None:
    kv = await BACKENDS[backend].open(Path(path))
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.readline)
    conflicts = 0
    for i in range(int(n)):
        while True:
            entry = await kv.get("c/shared")
            count = entry.value["n"] if entry is not None else 0
            version = entry.version if entry is not None else 0
            try:
                await kv.commit(
                    [
                        Put("c/shared", {"n": count + 1}, expect=version),
                        Put(f"c/w{worker}/{i}", {"at": count + 1}, expect=0),
                    ],
                    label="t.increment",
                )
                break
            except VersionConflictError:
                conflicts += 1
    await kv.close()
    print(f"done {conflicts}", flush=True)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))

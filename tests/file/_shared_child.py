"""A child process of the shared-file journal tests (run by path, not collected).

    python _shared_child.py hold-mutex PATH STALE     take PATH's mutex (heartbeat on), print
                                                      "holding <pid>", give it back at a line
                                                      on stdin, print "released"
    python _shared_child.py busy PATH STALE           open the journal, print "ready", commit
                                                      busy/1; its write prints "writing" and
                                                      blocks until a line on stdin; then print
                                                      "committed"
    python _shared_child.py claim PATH MODE W N       open, print "ready", wait for a line on
                                                      stdin, then N times: claim "lease" by
                                                      compare-and-set and add w<W>/<i> in the
                                                      same commit, printing "won <version>";
                                                      end with "done <conflicts>"
    python _shared_child.py write PATH MODE W         open, print "ready", commit w<W>/<n> and
                                                      move w<W>/last to n forever, printing
                                                      "<n>" after each commit returned
    python _shared_child.py file-hold PATH            open PATH as a shared-file journal,
                                                      print "ready <pid>", close at EOF of stdin

MODE: ``snapshot``, ``log`` or ``log-compact`` (compacts every 5 entries). STALE: a duration.
"""

from __future__ import annotations

import asyncio
import os
import sys

from botmesh.state.backends.file_ops import FileOps
from botmesh.state.backends.shared_file import open_shared_file_kv
from botmesh.state.backends.shared_file_lock import FileMutex
from botmesh.state.durations import parse_duration
from botmesh.state.errors import VersionConflictError
from botmesh.state.kv import Put

MODES: dict[str, dict[str, object]] = {
    "snapshot": {},
    "log": {"append_log": True},
    "log-compact": {"append_log": True, "compact_every": 5},
}


def hold_mutex(path: str, stale: str) -> None:
    seconds = parse_duration(stale, "stale")
    mutex = FileMutex(os.path.realpath(path), stale=seconds, heartbeat=seconds / 5)
    mutex.start()
    mutex.acquire(timeout=60)
    print(f"holding {os.getpid()}", flush=True)
    sys.stdin.readline()
    mutex.release()
    mutex.stop()
    print("released", flush=True)


class BlockingOps(FileOps):
    """The first write prints "writing" and blocks until a line arrives on stdin."""

    def __init__(self) -> None:
        self.first = True

    def write(self, fd: int, data: memoryview) -> int:
        if self.first:
            self.first = False
            print("writing", flush=True)
            sys.stdin.readline()
        return super().write(fd, data)


async def busy(path: str, stale: str) -> None:
    kv = await open_shared_file_kv(path, stale_lock=stale, file_ops=BlockingOps())
    print("ready", flush=True)
    await kv.commit([Put("busy/1", {"by": os.getpid()}, expect=0)], label="t.busy")
    print("committed", flush=True)
    await kv.close()


async def claim(path: str, mode: str, worker: str, n: str) -> None:
    kv = await open_shared_file_kv(path, stale_lock="1h", **MODES[mode])  # type: ignore[arg-type]
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.readline)
    conflicts = 0
    for i in range(int(n)):
        while True:
            lease = await kv.get("lease")
            version = lease.version if lease is not None else 0
            try:
                versions = await kv.commit(
                    [
                        Put("lease", {"owner": worker, "i": i}, expect=version),
                        Put(f"w{worker}/{i}", {"token": version + 1}, expect=0),
                    ],
                    label="t.claim",
                )
            except VersionConflictError:
                conflicts += 1
                continue
            print(f"won {versions[0]}", flush=True)
            break
    await kv.close()
    print(f"done {conflicts}", flush=True)


async def write(path: str, mode: str, worker: str) -> None:
    kv = await open_shared_file_kv(path, stale_lock="1h", **MODES[mode])  # type: ignore[arg-type]
    print("ready", flush=True)
    last = await kv.get(f"w{worker}/last")
    n = last.value["n"] + 1 if last is not None else 0
    while True:
        await kv.commit(
            [
                Put(f"w{worker}/{n}", {"n": n, "pad": "x" * (n % 40)}, expect=0),
                Put(f"w{worker}/last", {"n": n}, expect=n),
            ],
            label="t.write",
        )
        sys.stdout.write(f"{n}\n")
        sys.stdout.flush()
        n += 1


async def file_hold(path: str) -> None:
    kv = await open_shared_file_kv(path)
    print(f"ready {os.getpid()}", flush=True)
    await asyncio.to_thread(sys.stdin.read)
    await kv.close()


if __name__ == "__main__":
    what, args = sys.argv[1], sys.argv[2:]
    if what == "hold-mutex":
        hold_mutex(*args)
    elif what == "busy":
        asyncio.run(busy(*args))
    elif what == "claim":
        asyncio.run(claim(*args))
    elif what == "write":
        asyncio.run(write(*args))
    elif what == "file-hold":
        asyncio.run(file_hold(*args))
    else:
        raise SystemExit(f"unknown mode {what!r}")

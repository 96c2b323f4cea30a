"""The file journal: snapshot mode vs append log, at 1k / 10k / 100k records, fsync on/off.

A send is the runtime's own ``send`` (a bot on a ``MockProvider`` and the file journal):
the journal writes it makes (``outbox.journal`` before the provider call, ``outbox.mark_sent``
after) plus the mock provider call. The journal is filled beforehand with N records of
~300 bytes (outside the bot's scope, so that only their size counts). Sends run one after
another (the latency a single chat sees); one extra line shows group commit with 64 sends
to 64 chats at once.

Snapshot mode rewrites the whole file per write, so it runs for a bounded time (at least 3
sends) and says how many sends it measured; the append log runs long enough to include at
least one compaction (every 1000 entries). Figures are ratios within this run: the machine
is shared, absolute numbers move.

    .venv/bin/python bench/bench_file.py [--quick]
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import botmesh
from botmesh import Bot
from botmesh.providers.mock import MockProvider
from botmesh.state.backends.file import open_file_kv
from botmesh.state.kv import Put

SIZES = [1_000, 10_000, 100_000]
PAYLOAD = {
    "chat": "whatsapp:+4915112345678",
    "text": "Your order #12345 has shipped and will arrive tomorrow between 9 and 12. " * 2,
    "provider": "mock",
    "attempts": 0,
    "state": "pending",
}


@dataclass
class Result:
    sends: int
    seconds: float

    @property
    def per_second(self) -> float:
        return self.sends / self.seconds

    @property
    def us_per_send(self) -> float:
        return self.seconds / self.sends * 1e6


async def populate(path: Path, records: int) -> None:
    kv = await open_file_kv(path, append_log=True, fsync=False, compact_every=10**9)
    chunk = 5000
    for start in range(0, records, chunk):
        ops = [
            Put(f"other/out/{i}", {**PAYLOAD, "state": "sent", "i": i}, expect=0, purge=1e9)
            for i in range(start, min(records, start + chunk))
        ]
        await kv.commit(ops, label="bench.populate")
    await kv.close()  # folds into the snapshot


def journal_url(path: Path, *, append_log: bool, fsync: bool) -> str:
    options = f"append_log={str(append_log).lower()}&fsync={str(fsync).lower()}"
    return f"file://{os.path.abspath(path)}?{options}"


async def engine(path: Path, *, append_log: bool, fsync: bool) -> botmesh.Runtime:
    """A runtime on the file journal; the journal is closed with the runtime (URL-opened)."""
    url = journal_url(path, append_log=append_log, fsync=fsync)
    app = botmesh.run(Bot("bench", durability={"poll": 0}), MockProvider(), journal=url)
    await app.start()
    return app


async def send(app: botmesh.Runtime, chat: str, key: str) -> None:
    await app.send(chat, str(PAYLOAD["text"]), idempotency_key=key)


async def measure(
    path: Path, *, append_log: bool, fsync: bool, min_sends: int, max_sends: int, budget: float
) -> Result:
    app = await engine(path, append_log=append_log, fsync=fsync)
    try:
        n = 0
        start = time.perf_counter()
        while n < max_sends and (n < min_sends or time.perf_counter() - start < budget):
            await send(app, "chat-1", f"send-{n}")
            n += 1
        return Result(n, time.perf_counter() - start)
    finally:
        await app.stop()


async def measure_group(path: Path, concurrency: int, rounds: int) -> Result:
    app = await engine(path, append_log=True, fsync=True)
    try:
        start = time.perf_counter()
        for r in range(rounds):
            await asyncio.gather(
                *(send(app, f"chat-{c}", f"group-{r}-{c}") for c in range(concurrency))
            )
        return Result(concurrency * rounds, time.perf_counter() - start)
    finally:
        await app.stop()


async def main(quick: bool) -> None:
    sizes = SIZES[:2] if quick else SIZES
    budget = 0.5 if quick else 1.5
    print(__doc__.split("\n\n")[0])
    print(
        f"{'records':>8} {'fsync':>5} | {'snapshot sends/s':>16} {'µs/send':>10} {'sends':>6} | "
        f"{'append-log sends/s':>18} {'µs/send':>9} {'sends':>6} | {'log ÷ snapshot':>14}"
    )
    group: tuple[Result, Result] | None = None
    with tempfile.TemporaryDirectory(prefix="bench-file-") as tmp:
        for records in sizes:
            for fsync in (False, True):
                row: list[Result] = []
                for append_log in (False, True):
                    path = Path(tmp) / f"j-{records}-{fsync}-{append_log}"
                    await populate(path, records)
                    row.append(
                        await measure(
                            path,
                            append_log=append_log,
                            fsync=fsync,
                            # the append log runs past a compaction (every 1000 entries)
                            min_sends=510 if append_log else 3,
                            max_sends=20_000,
                            budget=budget,
                        )
                    )
                snap, log = row
                print(
                    f"{records:>8} {'on' if fsync else 'off':>5} | {snap.per_second:>16,.0f} "
                    f"{snap.us_per_send:>10,.0f} {snap.sends:>6} | {log.per_second:>18,.0f} "
                    f"{log.us_per_send:>9,.0f} {log.sends:>6} | "
                    f"{log.per_second / snap.per_second:>13,.1f}×"
                )
                if records == 10_000 and fsync:
                    path = Path(tmp) / "j-group"
                    await populate(path, records)
                    group = (log, await measure_group(path, concurrency=64, rounds=3))
    print(
        "snapshot mode rewrites the whole file on every write; at large sizes it measured only "
        "the sends that fit its time budget (column 'sends')"
    )
    if group is not None:
        one, many = group
        print(
            f"group commit (append log, fsync on, 10k records): 64 sends at once "
            f"{many.per_second:,.0f} sends/s, {many.per_second / one.per_second:.1f}× "
            "one send at a time"
        )


if __name__ == "__main__":
    asyncio.run(main("--quick" in sys.argv))

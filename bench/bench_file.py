"""The file journal: snapshot mode vs append log, at 1k / 10k / 100k records, fsync on/off.

A send is the three journal writes the outbox makes for one send (until ``KvDurability``
lands, a representative sequence, not the engine itself): ``outbox.enqueue`` (create the
record, due now), ``outbox.claim`` (the lease: due in 60 s) and ``outbox.mark_sent``
(the provider's id recorded, purge score set), each a compare-and-set commit of a ~300-byte
record. Sends run one after another (the latency a single chat sees); one extra line shows
group commit with 64 sends at once.

Snapshot mode rewrites the whole file per write, so it runs for a bounded time (at least 3
sends) and says how many sends it measured; the append log runs long enough to include at
least one compaction (every 1000 entries). Figures are ratios within this run: the machine
is shared, absolute numbers move.

    .venv/bin/python bench/bench_file.py [--quick]
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from state.backends.file import FileKv, open_file_kv
from state.kv import Put

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
            Put(f"outbox/old/{i}", {**PAYLOAD, "state": "sent", "i": i}, expect=0, purge=1e9)
            for i in range(start, min(records, start + chunk))
        ]
        await kv.commit(ops, label="bench.populate")
    await kv.close()  # folds into the snapshot


async def send(kv: FileKv, key: str, now: float) -> None:
    await kv.commit([Put(key, PAYLOAD, expect=0, due=now)], label="outbox.enqueue")
    await kv.commit(
        [Put(key, {**PAYLOAD, "state": "sending"}, expect=1, due=now + 60)], label="outbox.claim"
    )
    await kv.commit(
        [Put(key, {**PAYLOAD, "state": "sent", "id": "m-1"}, expect=2, purge=now + 7 * 86400)],
        label="outbox.mark_sent",
    )


async def measure(
    path: Path, *, append_log: bool, fsync: bool, min_sends: int, max_sends: int, budget: float
) -> Result:
    kv = await open_file_kv(path, append_log=append_log, fsync=fsync)
    try:
        now = time.time()
        n = 0
        start = time.perf_counter()
        while n < max_sends and (n < min_sends or time.perf_counter() - start < budget):
            await send(kv, f"outbox/new/{append_log}/{fsync}/{n}", now)
            n += 1
        return Result(n, time.perf_counter() - start)
    finally:
        await kv.close()


async def measure_group(path: Path, concurrency: int, rounds: int) -> Result:
    kv = await open_file_kv(path, append_log=True, fsync=True)
    try:
        now = time.time()
        start = time.perf_counter()
        for r in range(rounds):
            await asyncio.gather(
                *(send(kv, f"outbox/group/{r}/{c}", now) for c in range(concurrency))
            )
        return Result(concurrency * rounds, time.perf_counter() - start)
    finally:
        await kv.close()


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
                            min_sends=340 if append_log else 3,
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

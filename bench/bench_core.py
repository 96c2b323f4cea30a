"""Journal cost of the durable core, memory backend vs durability off, in one process.

Prints µs per send (CPU time), sends per second, and the ratio durable / off, for a bare
``app.send`` and for a whole inbound turn (journal, handler with one reply, done). "Off" is
the same runtime with ``journal=None`` (the explicit opt-out); "memory journal" is
``journal="memory://"``. ``python bench/bench_core.py [N]``.
"""

from __future__ import annotations

import asyncio
import gc
import sys
import time
from collections.abc import Awaitable, Callable

import botmesh
from botmesh import Bot, Context, Inbound
from botmesh.testing import MockProvider

Run = Callable[[int], Awaitable[None]]


def _app(durable: bool) -> botmesh.Runtime:
    bot = Bot("bench", durability={"poll": 0})

    @bot.on_message
    async def handler(ctx: Context) -> None:
        await ctx.reply("thanks, got it")

    return botmesh.run(bot, MockProvider(), journal="memory://" if durable else None)


async def _measure(app: botmesh.Runtime, n: int, turn: bool) -> tuple[float, float]:
    await app.start()
    for i in range(200):  # warm up
        await app.send("warm", "x", idempotency_key=f"w{i}")
    gc.collect()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    if turn:
        for i in range(n):
            await app.handle(Inbound(id=f"m{i}", chat_id=f"chat{i % 50}", text="hello"))
    else:
        for i in range(n):
            await app.send(f"chat{i % 50}", "hello there", idempotency_key=f"k{i}")
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    await app.stop()
    return cpu, wall


async def main(n: int) -> None:
    print(f"botmesh core benchmark: {n} operations each, memory backend, same process")
    for label, turn in (("app.send", False), ("inbound turn (1 reply)", True)):
        best: dict[bool, tuple[float, float]] = {}
        for _ in range(3):  # best of three, alternating, to damp the shared machine's noise
            for durable in (False, True):
                cpu, wall = await _measure(_app(durable), n, turn)
                if durable not in best or cpu < best[durable][0]:
                    best[durable] = (cpu, wall)
        off_cpu, off_wall = best[False]
        on_cpu, on_wall = best[True]
        print(f"\n  {label}")
        print(f"    durability off : {off_cpu / n * 1e6:7.1f} µs CPU/op  {n / off_wall:9.0f} ops/s")
        print(f"    memory journal : {on_cpu / n * 1e6:7.1f} µs CPU/op  {n / on_wall:9.0f} ops/s")
        print(f"    journal cost   : {(on_cpu - off_cpu) / n * 1e6:7.1f} µs CPU per op")
        print(
            f"    ratio          : {off_wall / on_wall:.2f}x the throughput of durability off "
            f"({on_cpu / off_cpu:.1f}x the CPU)"
        )


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 20_000))

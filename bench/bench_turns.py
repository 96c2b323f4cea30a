"""Cost of chat turns (``inbox.chat_turns``) on the SQLite journal, in one process.

Prints the wall time per inbound (journal, turn taken, handler with one reply, done and
turn released in one commit) with chat turns on and off, and their ratio, same run, same
machine. ``python bench/bench_turns.py [N]`` (default 500 inbounds, 50 chats).
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path

import botmesh
from botmesh import Bot, Context, Inbound
from botmesh.testing import MockProvider


def _app(folder: Path, turns: bool) -> botmesh.Runtime:
    bot = Bot("bench", durability={"poll": 0, "inbox": {"chat_turns": turns}})

    @bot.on_message
    async def handler(ctx: Context) -> None:
        await ctx.reply("thanks, got it")

    journal = f"sqlite://{folder}/{'on' if turns else 'off'}.db"
    return botmesh.run(bot, MockProvider(), journal=journal, instance_id="bench")


async def _measure(folder: Path, n: int, turns: bool, run: int) -> float:
    app = _app(folder / str(run), turns)
    (folder / str(run)).mkdir(exist_ok=True)
    await app.start()
    for i in range(50):  # warm up
        await app.handle(Inbound(id=f"w{i}", chat_id=f"chat{i}", text="hello"))
    wall0 = time.perf_counter()
    for i in range(n):
        await app.handle(Inbound(id=f"m{i}", chat_id=f"chat{i % 50}", text="hello"))
    wall = time.perf_counter() - wall0
    await app.stop()
    return wall


async def main(n: int) -> None:
    print(f"chat turns benchmark: {n} inbounds each, SQLite journal, same process")
    best: dict[bool, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        run = 0
        for _ in range(3):  # best of three, alternating, to damp the shared machine's noise
            for turns in (False, True):
                run += 1
                wall = await _measure(Path(tmp), n, turns, run)
                best[turns] = min(best.get(turns, wall), wall)
    off, on = best[False], best[True]
    print(f"  turns off : {off / n * 1e6:8.1f} µs/inbound  {n / off:8.0f} inbounds/s")
    print(f"  turns on  : {on / n * 1e6:8.1f} µs/inbound  {n / on:8.0f} inbounds/s")
    print(f"  ratio     : {off / on:.2f}x the throughput of turns off")


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 500))

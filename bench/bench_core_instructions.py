"""The journal's cost per send and per inbound turn in CPU instructions (callgrind), so that
the figure does not move with the machine's load; the same loops as ``bench_core.py``.

For each of ``app.send`` and an inbound turn (one reply), it counts the instructions of N
and 3N operations with the memory journal and with ``journal=None``, under
``valgrind --tool=callgrind``, and prints the instructions per operation (the difference
divided by 2N: start-up cancels out) and the journal's cost (memory minus none).
``--against DIR`` runs the same loops on another checkout (e.g. a ``git worktree`` of an
older commit, with the old API) and prints the ratio. ``python bench/bench_core_instructions.py
[--n 500] [--against /tmp/oldtree]``. Needs valgrind (on every machine of ours).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
KINDS = ("send", "turn")


async def _child(kind: str, durable: bool, n: int) -> None:
    import botmesh

    app: Any
    inbound: Any
    if hasattr(botmesh, "run"):
        from botmesh import Bot, Context, Inbound
        from botmesh.testing import MockProvider

        bot = Bot("bench", durability={"poll": 0})

        @bot.on_message
        async def handler(ctx: Context) -> None:
            await ctx.reply("thanks, got it")

        app = botmesh.run(bot, MockProvider(), journal="memory://" if durable else None)

        def inbound(i: int) -> Any:
            return Inbound(id=f"m{i}", chat_id=f"chat{i % 50}", text="hello")
    else:  # a checkout from before the runtime: the bot held its provider and journal
        old: Any = botmesh
        app = old.Bot(old.MockProvider(), durability={"poll": 0} if durable else None)

        @app.on_message  # type: ignore[untyped-decorator]  # the old API, untyped here
        async def old_handler(ctx: Any) -> None:
            await ctx.reply("thanks, got it")

        def inbound(i: int) -> Any:
            return old.Inbound(f"m{i}", f"chat{i % 50}", "hello")

    await app.start()
    for i in range(200):  # warm up
        await app.send("warm", "x", idempotency_key=f"w{i}")
    for i in range(n):
        if kind == "turn":
            await app.handle(inbound(i))
        else:
            await app.send(f"chat{i % 50}", "hello there", idempotency_key=f"k{i}")
    await app.stop()


def _instructions(root: Path, kind: str, durable: bool, n: int) -> int:
    cmd = [
        "valgrind",
        "--tool=callgrind",
        "--callgrind-out-file=/dev/null",
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        kind,
        "1" if durable else "0",
        str(n),
    ]
    env = {**os.environ, "PYTHONPATH": str(root)}
    out = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, check=True)
    match = re.search(r"Collected : (\d+)", out.stderr)
    if match is None:
        raise RuntimeError(f"no instruction count from callgrind: {out.stderr[-500:]}")
    return int(match.group(1))


def per_op(root: Path, kind: str, durable: bool, n: int) -> float:
    return (_instructions(root, kind, durable, 3 * n) - _instructions(root, kind, durable, n)) / (
        2 * n
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=500)
    parser.add_argument("--against", type=Path, help="another checkout to compare with")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, durable, n = args.child
        asyncio.run(_child(kind, durable == "1", int(n)))
        return
    roots = [("this checkout", ROOT)] + ([("against", args.against)] if args.against else [])
    print(f"journal cost in instructions per operation (callgrind, N={args.n} and {3 * args.n})")
    cost: dict[tuple[str, str], float] = {}
    for label, root in roots:
        for kind in KINDS:
            off = per_op(root, kind, False, args.n)
            on = per_op(root, kind, True, args.n)
            cost[label, kind] = on - off
            print(
                f"  {label:<14} {kind:<5} off {off:>9,.0f}  memory journal {on:>9,.0f}  "
                f"journal cost {on - off:>9,.0f}"
            )
    if args.against:
        for kind in KINDS:
            ratio = cost["this checkout", kind] / cost["against", kind]
            print(f"  {kind}: this checkout's journal cost is {ratio:.2f}x the other's")


if __name__ == "__main__":
    main()

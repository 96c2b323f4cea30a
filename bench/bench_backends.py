"""Journal backends side by side: what each costs per send and per inbound turn, and sends
per second with 1, 8 and 64 chats sending at once — every figure also as a ratio to the
memory backend measured in the same run.

A send is the runtime's own ``send`` (a bot on a ``MockProvider``): the journal writes it
makes (``outbox.journal`` before the provider call, ``outbox.mark_sent`` after) plus the
mock call. An inbound turn is ``handle()`` of a message whose handler replies once (inbox
journal, claim, the reply's writes, done). The journal cost is the time above the memory
backend's. Servers run as in production (PostgreSQL ``fsync=on``, Redis AOF with
``appendfsync always``), started here on 127.0.0.1 (ports 15433 and 16380, so a test
session may run meanwhile) and stopped at the end; SQLite with ``synchronous=full``, the
file journal with its append log (fsync on). Figures are ratios within this run: the
machine is shared, absolute numbers move.

    .venv/bin/python bench/bench_backends.py [--quick]
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

# This checkout first (the bench starts its servers with tests/servers.py).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("BOTMESH_TEST_PG_PORT", "15433")
os.environ.setdefault("BOTMESH_TEST_REDIS_PORT", "16380")
os.environ["BOTMESH_TEST_SERVERS_DURABLE"] = "1"  # read when a server starts

import botmesh
from botmesh import Bot, Context, Inbound
from botmesh.providers.mock import MockProvider
from botmesh.state.backends import open_backend
from botmesh.state.kv import DurableKv
from tests import servers

CONCURRENCY = [1, 8, 64]
TEXT = "Your order #12345 has shipped and will arrive tomorrow between 9 and 12."


@dataclass
class Figures:
    us_send: float = 0.0
    us_turn: float = 0.0
    per_second: dict[int, float] = field(default_factory=dict)


def backends(tmp: Path) -> dict[str, Callable[[], Awaitable[DurableKv]]]:
    def url(u: str) -> Callable[[], Awaitable[DurableKv]]:
        return lambda: open_backend(u)

    pg = servers.postgres_url()
    rd = servers.redis_url()
    n = iter(range(1_000_000))
    return {
        "memory": url("memory://"),
        "file (log)": lambda: open_backend(f"file://{tmp}/f{next(n)}?append_log=true"),
        "sqlite": lambda: open_backend(f"sqlite://{tmp}/s{next(n)}.db"),
        "postgres": lambda: open_backend(f"{pg}?table_prefix=b{next(n)}_"),
        "redis": lambda: open_backend(f"{rd}?prefix=b{next(n)}"),
    }


def bot() -> Bot:
    b = Bot("bench", durability={"poll": 0})

    @b.on_message
    async def handler(ctx: Context) -> None:
        await ctx.reply(TEXT)

    return b


async def timed(
    open_kv: Callable[[], Awaitable[DurableKv]],
    body: Callable[[botmesh.Runtime, int], Awaitable[int]],
    *,
    min_rounds: int,
    budget: float,
) -> tuple[int, float]:
    """Run ``body(app, round)`` (it returns the operations it made) at least ``min_rounds``
    times and for ``budget`` seconds; return operations and seconds."""
    kv = await open_kv()
    app = bot().bind(MockProvider(), kv, instance_id="bench")
    await app.start()
    try:
        for r in range(5):  # warm up: connections, statement caches
            await body(app, -1 - r)
        ops, rounds = 0, 0
        start = time.perf_counter()
        while rounds < min_rounds or time.perf_counter() - start < budget:
            ops += await body(app, rounds)
            rounds += 1
        return ops, time.perf_counter() - start
    finally:
        await app.stop()
        await kv.close()


async def measure(open_kv: Callable[[], Awaitable[DurableKv]], budget: float) -> Figures:
    f = Figures()

    async def one_send(app: botmesh.Runtime, r: int) -> int:
        await app.send("chat-1", TEXT, idempotency_key=f"send-{r}")
        return 1

    async def one_turn(app: botmesh.Runtime, r: int) -> int:
        await app.handle(Inbound(id=f"in-{r}", chat_id="chat-1", text="hi"))
        return 1

    ops, seconds = await timed(open_kv, one_send, min_rounds=30, budget=budget)
    f.us_send = seconds / ops * 1e6
    ops, seconds = await timed(open_kv, one_turn, min_rounds=30, budget=budget)
    f.us_turn = seconds / ops * 1e6
    for c in CONCURRENCY:

        async def burst(app: botmesh.Runtime, r: int, c: int = c) -> int:
            await asyncio.gather(
                *(app.send(f"chat-{i}", TEXT, idempotency_key=f"c{r}-{i}") for i in range(c))
            )
            return c

        ops, seconds = await timed(open_kv, burst, min_rounds=max(3, 300 // c), budget=budget)
        f.per_second[c] = ops / seconds
    return f


async def main(quick: bool) -> None:
    budget = 0.4 if quick else 1.5
    print(__doc__.split("\n\n")[0])
    results: dict[str, Figures] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="bench-backends-") as tmp:
            for name, open_kv in backends(Path(tmp)).items():
                results[name] = await measure(open_kv, budget)
    finally:
        servers.stop_all()
    mem = results["memory"]
    head = " ".join(f"{f'sends/s c={c}':>18}" for c in CONCURRENCY)
    print(
        f"\n{'backend':<11} | {'µs/send':>8} {'× mem':>6} {'+µs':>7} | "
        f"{'µs/turn':>8} {'× mem':>6} {'+µs':>7} | {head}"
    )
    for name, f in results.items():
        rates = " ".join(
            f"{f.per_second[c]:>9,.0f} ({f.per_second[c] / mem.per_second[c]:>5.2f}×)"
            for c in CONCURRENCY
        )
        print(
            f"{name:<11} | {f.us_send:>8,.0f} {f.us_send / mem.us_send:>5.1f}× "
            f"{f.us_send - mem.us_send:>7,.0f} | {f.us_turn:>8,.0f} "
            f"{f.us_turn / mem.us_turn:>5.1f}× {f.us_turn - mem.us_turn:>7,.0f} | {rates}"
        )
    print(
        "\n× mem: time (or rate) over the memory backend's; +µs: the journal's cost above "
        "memory, per send or per inbound turn."
    )


if __name__ == "__main__":
    servers.allow_start()
    asyncio.run(main("--quick" in sys.argv))

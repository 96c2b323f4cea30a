"""What delivery outcomes and edits cost the engine, against a send, in one process.

On the memory journal with the mock channel: N sends (``app.send``), then for each a
``delivered`` and a ``read`` status (``app.delivery_status``: the message-id lookup, the
record's write and its receipt), a copy of ``read`` (a lookup that changes nothing), and an
edit (``app.edit``: the send's parts read, the edit journaled and delivered). Beside them,
sends on a channel without status webhooks (no name under the message id). Prints µs of
CPU per operation and the ratio to a send (named), best of three.
``python bench/bench_outcomes.py [N]``.
"""

from __future__ import annotations

import asyncio
import gc
import sys
import time
from collections.abc import Awaitable, Callable

import botmesh
from botmesh import Bot
from botmesh.testing import MockProvider

Step = Callable[[botmesh.Runtime, int, list[str]], Awaitable[None]]


class Receipts:
    """A receipts sink that acknowledges each receipt at once (publishing is what a status
    costs besides its write: each change gets a receipt)."""

    def __init__(self) -> None:
        self.count = 0

    async def publish(self, receipt: botmesh.Receipt) -> asyncio.Future[None]:
        self.count += 1
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


async def _sends(app: botmesh.Runtime, n: int, mids: list[str]) -> None:
    for i in range(n):
        receipt = await app.send(f"chat{i % 50}", "hello there", idempotency_key=f"k{i}")
        mids.append(str(receipt.message_id))


def _statuses(state: str) -> Step:
    async def run(app: botmesh.Runtime, n: int, mids: list[str]) -> None:
        for i in range(n):
            await app.delivery_status(f"chat{i % 50}", mids[i], state)

    return run


async def _edits(app: botmesh.Runtime, n: int, mids: list[str]) -> None:
    for i in range(n):
        await app.edit(f"k{i}", "hello again", idempotency_key=f"e{i}")


STEPS: list[tuple[str, Step]] = [
    ("send", _sends),
    ("status delivered", _statuses("delivered")),
    ("status read", _statuses("read")),
    ("status read again (unchanged)", _statuses("read")),
    ("edit", _edits),
]


async def _round(n: int) -> dict[str, float]:
    """CPU seconds of each step over ``n`` operations, on one runtime (a channel with
    status webhooks: each send is named under its message id, as WhatsApp's is)."""
    bot = Bot("bench", durability={"poll": 0})
    channel = MockProvider(delivery_statuses=True)  # its sends named under their ids
    app = botmesh.run(bot, channel, journal="memory://", receipts=Receipts())
    await app.start()
    mids: list[str] = []
    spent: dict[str, float] = {}
    try:
        for label, step in STEPS:
            gc.collect()
            cpu = time.process_time()
            await step(app, n, mids)
            spent[label] = time.process_time() - cpu
    finally:
        await app.stop()
    return spent


async def _unnamed_sends(n: int) -> float:
    """CPU seconds of ``n`` sends on a channel without status webhooks (no name)."""
    app = botmesh.run(Bot("bench", durability={"poll": 0}), MockProvider(), journal="memory://")
    await app.start()
    try:
        gc.collect()
        cpu = time.process_time()
        await _sends(app, n, [])
        return time.process_time() - cpu
    finally:
        await app.stop()


async def main(n: int) -> None:
    print(f"botmesh delivery outcomes benchmark: {n} operations a step, memory journal")
    best: dict[str, float] = {}
    for _ in range(3):
        unnamed = await _unnamed_sends(n)
        best["send, no status webhooks"] = min(
            best.get("send, no status webhooks", unnamed), unnamed
        )
        for label, cpu in (await _round(n)).items():
            best[label] = min(best.get(label, cpu), cpu)
    send = best["send"]
    for label, cpu in best.items():
        print(f"  {label:32s} {cpu / n * 1e6:8.1f} µs CPU   x{cpu / send:5.2f} of a send")
    if best["status delivered"] < best["status read again (unchanged)"] * 1.5:
        print("  (a status costs no more than a lookup: were the sends named? see the docstring)")


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 3000))

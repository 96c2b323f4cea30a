"""One replica of the leader kill test: a bot with ``provider_session="leader"`` on a
shared journal, fed sends on stdin (run by module, not collected).

    python -m tests.shared._leader_replica BACKEND PATH NAME DIR

NAME is the replica's instance id. The leadership lease is 1 s, the sweeper runs every
50 ms. The fake channel (the only thing faked) appends each send it accepts to
``DIR/sent.log`` (``<epoch s> <replica> <key> <text>``, fsynced before the call returns:
the channel's own record, shared by every replica), taking 20 ms a send; it can tell
whether a key went out (``resolve_ambiguous``), as a channel with its own deduplication
can, so a send in flight when its replica died is neither lost nor sent twice.

stdin commands, one a line:

- ``enq <key>``: ``app.enqueue`` a send keyed ``key`` (prints ``Q <key>``)
- ``send <key>``: ``app.send`` it inline (prints ``S <key> <receipt state>``)
- ``role``: print ``ROLE leader`` or ``ROLE standby``
- ``end``: sweep until nothing is pending (up to 15 s), print ``SUMMARY <json>``, exit
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from botmesh import Bot
from botmesh.state.messages import Outbound, OutboxState, SendResult
from tests.backends import BACKENDS

LEASE = 1.0


def _append(path: Path, line: str) -> None:
    with open(path, "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


class Channel:
    name = "leader-test"
    text_limit: int | None = None

    def __init__(self, folder: Path, replica: str) -> None:
        self.log = folder / "sent.log"
        self.replica = replica

    async def send(self, message: Outbound) -> SendResult:  # pragma: no cover - keyed
        raise AssertionError("send_keyed is used")

    async def send_keyed(self, message: Outbound, key: str) -> SendResult:
        await asyncio.sleep(0.02)
        line = f"{time.time():.6f} {self.replica} {key} {message.text}"
        await asyncio.to_thread(_append, self.log, line)
        return SendResult(f"{self.replica}-{key}")

    async def resolve_ambiguous(
        self, message: Outbound, key: str, since: float
    ) -> SendResult | None:
        if not self.log.exists():
            return None
        for line in self.log.read_text().splitlines():
            parts = line.split(" ", 3)
            if len(parts) > 2 and parts[2] == key:
                return SendResult(f"{parts[1]}-{key}")
        return None


async def main(backend: str, path: str, name: str, folder: str) -> None:
    kv = await BACKENDS[backend].open(Path(path))
    bot = Bot(
        "leader-kill",
        durability={
            "poll": "50ms",
            "provider_session": "leader",
            "leader": {"lease": f"{LEASE:g}s"},
            "outbox": {"lease": "1s", "backoff": {"base": "0.05ms", "jitter": 0}},
        },
    )
    async with bot.bind(Channel(Path(folder), name), kv, instance_id=name) as app:
        d = app.durability
        engine = app._core.engine
        assert d is not None and engine is not None and engine.leader is not None
        print("ready", flush=True)
        while True:
            words = (await asyncio.to_thread(sys.stdin.readline)).split()
            if not words or words[0] == "end":
                break
            if words[0] == "enq":
                await app.enqueue("chat", f"t-{words[1]}", idempotency_key=words[1])
                print(f"Q {words[1]}", flush=True)
            elif words[0] == "send":
                receipt = await app.send("chat", f"t-{words[1]}", idempotency_key=words[1])
                print(f"S {words[1]} {receipt.state}", flush=True)
            elif words[0] == "role":
                print("ROLE " + ("leader" if engine.leader.is_leader else "standby"), flush=True)
        deadline = time.monotonic() + 15.0
        while time.monotonic() < deadline:
            records = await d.outbox.list()
            if all(r.state not in (OutboxState.PENDING, OutboxState.FAILED) for r in records):
                break
            await asyncio.sleep(0.1)
        summary: dict[str, Any] = {
            "metrics": d.metrics(),
            "outbox": {r.key: [r.state, r.attempts] for r in await d.outbox.list()},
        }
    await kv.close()
    print("SUMMARY " + json.dumps(summary), flush=True)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))

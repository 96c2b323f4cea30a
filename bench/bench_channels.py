"""A channel adapter's cost per send: ``TelegramProvider.send`` (the HTTP client of
``botmesh/providers/http.py``: one pooled session, timeouts, the status mapping, redaction) against
two baselines in the same run, each sending the same messages to the same local server (a
minimal Bot API ``sendMessage`` on 127.0.0.1 answering ``{"ok": true, "result": ...}``):

- **raw**: a bare ``aiohttp`` POST on one shared session, reading the JSON: the floor. The
  ratio adapter / raw is what the adapter adds;
- **new session per send**: what an adapter that opens ``aiohttp.ClientSession()`` per call
  pays (a TCP connection each time). The ratio new-session / adapter is what pooling saves.

Sends run ``CONCURRENCY`` at a time (a worker's batch of chats). Times are µs per send, best
of 5 alternating rounds; ``.venv/bin/python bench/bench_channels.py [N]``.
"""

from __future__ import annotations

import asyncio
import itertools
import sys
import time
from collections.abc import Awaitable, Callable

import aiohttp
from aiohttp import web

from botmesh.providers.telegram import TelegramProvider
from botmesh.state.messages import Outbound

TOKEN = "123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw"
CONCURRENCY = 16
ROUNDS = 5


def app() -> web.Application:
    ids = itertools.count(1)

    async def send_message(request: web.Request) -> web.Response:
        body = await request.json()
        result = {"message_id": next(ids), "chat": {"id": body["chat_id"]}, "text": body["text"]}
        return web.json_response({"ok": True, "result": result})

    application = web.Application()
    application.router.add_post("/bot{token}/sendMessage", send_message)
    return application


async def timed(n: int, send: Callable[[int], Awaitable[object]]) -> float:
    """µs per send for ``n`` sends, ``CONCURRENCY`` in flight."""
    queue = iter(range(n))

    async def lane() -> None:
        for i in queue:
            await send(i)

    start = time.perf_counter()
    await asyncio.gather(*(lane() for _ in range(CONCURRENCY)))
    return (time.perf_counter() - start) / n * 1e6


async def main(n: int) -> None:
    runner = web.AppRunner(app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    base = f"http://127.0.0.1:{runner.addresses[0][1]}"
    url = f"{base}/bot{TOKEN}/sendMessage"
    adapter = TelegramProvider(TOKEN, base_url=base)
    session = aiohttp.ClientSession()

    async def via_adapter(i: int) -> object:
        return await adapter.send(Outbound(str(1000 + i % 50), f"reply {i}"))

    async def raw(i: int) -> object:
        payload = {"chat_id": str(1000 + i % 50), "text": f"reply {i}"}
        async with session.post(url, json=payload) as resp:
            return (await resp.json())["result"]["message_id"]

    async def new_session(i: int) -> object:
        payload = {"chat_id": str(1000 + i % 50), "text": f"reply {i}"}
        async with aiohttp.ClientSession() as s, s.post(url, json=payload) as resp:
            return (await resp.json())["result"]["message_id"]

    try:
        for warm in (via_adapter, raw, new_session):
            await timed(200, warm)
        best: dict[str, float] = {}
        for _ in range(ROUNDS):
            for name, fn in (("adapter", via_adapter), ("raw", raw), ("new", new_session)):
                us = await timed(n if name != "new" else max(n // 4, 200), fn)
                best[name] = min(best.get(name, us), us)
    finally:
        await adapter.close()
        await session.close()
        await runner.cleanup()
    print(f"{n} sends, {CONCURRENCY} in flight, µs per send (best of {ROUNDS}):")
    print(f"  raw aiohttp, one session     {best['raw']:8.1f}")
    print(f"  TelegramProvider.send        {best['adapter']:8.1f}")
    print(f"  a new session per send       {best['new']:8.1f}")
    print(f"  adapter / raw                {best['adapter'] / best['raw']:8.2f}x (its overhead)")
    print(f"  new session / adapter        {best['new'] / best['adapter']:8.2f}x (pooling saves)")


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 2000))

"""Run an aiohttp application on 127.0.0.1 (an ephemeral port) for a test: in the test's
loop (``serving``) or in a thread of its own (``Background``, for a worker in another process)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TypeVar

from aiohttp import web

T = TypeVar("T")


@asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[str]:
    """Serve ``app`` until the block ends; yields its base URL (``http://127.0.0.1:<port>``)."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = int(runner.addresses[0][1])
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


class Background:
    """An aiohttp app served from a thread of the test process (its own event loop), for
    tests whose worker is another process: ``with Background(app) as url: ...``. Read what
    the app recorded from the test thread only between requests, or through ``call``."""

    def __init__(self, app: web.Application) -> None:
        self.app = app
        self.url = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None

    def __enter__(self) -> str:
        self._thread = threading.Thread(target=self._run, name="fake-channel", daemon=True)
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the fake channel did not start in 30 s")
        if self._error is not None:
            raise RuntimeError("the fake channel failed to start") from self._error
        return self.url

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(30)

    def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the server's loop (between requests) and return its result."""
        assert self._loop is not None

        async def run() -> T:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(30)

    def _run(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            try:
                async with serving(self.app) as url:
                    self.url = url
                    self._ready.set()
                    await self._stop.wait()
            except BaseException as exc:
                self._error = exc
                self._ready.set()

        asyncio.run(main())

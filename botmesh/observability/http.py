"""The worker's HTTP server: ``/healthz``, ``/readyz`` and ``/metrics``
(``BOTMESH_HTTP_HOST``, ``BOTMESH_HTTP_PORT``; off when no port is set).

- ``GET /healthz``: 200 ``ok`` while the process runs and its event loop answers (the
  answer comes from the loop itself, so a loop blocked or gone answers nothing).
- ``GET /readyz``: 200 with what the worker owns when it can take traffic; 503 with the
  reason while it starts, joins the group, rebalances, restores or recovers its journal
  partitions, or stops. ``readiness`` says which.
- ``GET /metrics``: the Prometheus text format (``botmesh.observability.metrics``).

The server runs in the worker's event loop and starts before the worker joins its group,
so a probe sees every step of the start.

``serving_app`` serves any aiohttp app for the length of a block (the gateway's, the ops
console's).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from aiohttp import web

from botmesh.observability.metrics import CONTENT_TYPE

__all__ = ["HealthServer", "Readiness", "serving_app"]

log = logging.getLogger("botmesh.http")

#: The longest the server's stop waits for requests in progress.
STOP_S = 3.0


@contextlib.asynccontextmanager
async def serving_app(
    app: web.Application, host: str, port: int, *, shutdown_timeout: float = 60.0
) -> AsyncIterator[str]:
    """Serve ``app`` on ``host:port`` (0: any free port) until the block ends; yields its
    base URL (``http://host:port``, an IPv6 host in brackets). On the way out it stops
    accepting and waits up to ``shutdown_timeout`` for the requests in flight."""
    runner = web.AppRunner(
        app, access_log=None, handle_signals=False, shutdown_timeout=shutdown_timeout
    )
    try:
        await runner.setup()
        await web.TCPSite(runner, host, port).start()
        bound = runner.addresses[0]
        shown = f"[{host}]" if ":" in host else host
        yield f"http://{shown}:{bound[1]}"
    finally:
        await runner.cleanup()


@dataclass(frozen=True, slots=True)
class Readiness:
    """Whether the worker can take traffic, and why (or why not)."""

    ready: bool
    why: str


class HealthServer:
    """The routes above, served on ``host:port`` (port 0: any free port, logged)."""

    def __init__(
        self,
        host: str,
        port: int,
        readiness: Callable[[], Readiness],
        scrape: Callable[[], bytes],
    ) -> None:
        self.host = host
        self.port = port
        self._readiness = readiness
        self._scrape = scrape
        self._runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/metrics", self._metrics)
        return app

    async def start(self) -> None:
        # a probe left waiting holds a stop no longer than STOP_S (aiohttp's default: 60 s)
        runner = web.AppRunner(self.app(), access_log=None, shutdown_timeout=STOP_S)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise OSError(
                f"cannot serve /healthz, /readyz and /metrics on {self.host}:{self.port}: "
                f"{exc.strerror or exc}; set BOTMESH_HTTP_PORT to a free port "
                "(or unset it to serve none)"
            ) from exc
        self._runner = runner
        if runner.addresses:  # the port bound, for port 0
            self.port = int(runner.addresses[0][1])
        log.info("serving /healthz, /readyz and /metrics on http://%s:%d", self.host, self.port)

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _readyz(self, request: web.Request) -> web.Response:
        state = self._readiness()
        if state.ready:
            return web.Response(text=f"ready: {state.why}\n")
        return web.Response(status=503, text=f"not ready: {state.why}\n")

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=self._scrape(), headers={"Content-Type": CONTENT_TYPE})

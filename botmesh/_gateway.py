"""The webhook gateway (``botmesh gateway``): an HTTP server that receives the channels'
webhooks and produces them as inbound records on ``<prefix>.inbound``.

Routes: ``GET|POST /<channel>`` per configured channel, ``GET /healthz`` (200 while the
process runs), ``GET /readyz`` (200 when the producer is connected, the seen topic is loaded
and ``<prefix>.inbound`` exists; else 503 with the reason), ``GET /metrics`` (Prometheus text
format: ``botmesh_gateway_webhooks_total`` by channel and result: received, produced,
duplicates, bad_signature, malformed, produce_failed, too_large; and
``botmesh_gateway_connected``, ``botmesh_gateway_seen_entries``).

A webhook goes through, in order:

1. the body is read (over ``max_body`` bytes → 413; not read within ``request_timeout`` → 408);
2. ``GET``: the channel's unsigned handshake (Meta's ``hub.challenge``) → its answer;
3. ``verify`` → 401 on ``BadSignature`` (or any error: fail closed), nothing produced;
4. ``POST``: the signed handshake (Slack's ``url_verification``, Discord's PING);
5. ``parse`` → 400 on ``MalformedWebhook`` or any error, nothing produced;
6. each record is produced to ``<prefix>.inbound`` keyed by chat id (acks=all, idempotent
   producer), and the webhook is answered only once the broker acked every one of them; a
   failure, or no ack within ``request_timeout``, → 503, so the channel retries (a record
   acked after its 503 still counts as produced: the retry is then a duplicate);
7. ``reply`` (usually a bare 200).

With tracing on (``botmesh.observability.tracing``) all of it is one ``SERVER`` span, and
each record produced carries that span's W3C ``traceparent`` header, which the worker continues.

Duplicates: a channel retries a webhook it got no 2xx for, with the same event id. The
gateway keeps the ``(channel, id)`` of what it produced in memory (at most ``seen_max``
entries, 200,000 by default, oldest dropped first, and none older than the 7 d retention of
the inbound topic) and in the compacted topic ``<prefix>.gateway.seen``, written after the
inbound record is acked and read back from the start when a gateway starts. A record whose
``(channel, id)`` is known is not produced again (counted as a duplicate); the same event
arriving twice at once waits for the first delivery's ack. A crash between the two writes
(inbound acked, seen not yet) produces that record at most once more when the channel
retries; the worker's inbox dedupes by id anyway, so the bot still handles it once.

Several replicas: each one tails the seen topic (a consumer without a group, reading every
partition), so a retry landing on another replica is recognised too, *eventually*: once
that replica has read the first one's seen record (usually milliseconds; during that window
both may produce it, and the worker's inbox dedupes). Records without an id are produced
every time.

Kafka not reachable: the gateway still starts and answers ``/healthz``; it connects in the
background (retrying with backoff), ``/readyz`` says why it is not ready and webhooks get
503 until it is. It never creates ``<prefix>.inbound`` (``botmesh topics create`` or the
worker does): until it exists, ``/readyz`` and webhooks answer 503.

SIGTERM or SIGINT: stop accepting, finish the requests in flight, flush the producer, exit 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import signal
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

import msgspec
from aiohttp import web
from prometheus_client import CollectorRegistry

from botmesh.observability import tracing
from botmesh.observability.http import serving_app
from botmesh.observability.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from botmesh.observability.metrics import exposition, gateway_registry
from botmesh.providers.webhooks import (
    BadSignature,
    ChannelWebhook,
    MalformedWebhook,
    StatusWebhook,
    WebhookReply,
    WebhookRequest,
)
from botmesh.state.messages import DeliveryStatus, Inbound
from botmesh.streams.connection import Brokers
from botmesh.streams.gateway_kafka import GatewayKafka, KafkaUnavailable
from botmesh.topics.catalog import Catalog
from botmesh.topics.records import chat_key, encode_inbound, encode_status

__all__ = [
    "COUNTERS",
    "DEFAULT_MAX_BODY",
    "DEFAULT_REQUEST_TIMEOUT",
    "DEFAULT_SEEN_MAX",
    "Gateway",
    "GatewayConfig",
    "SeenSet",
    "run_gateway",
    "serving",
]

log = logging.getLogger("botmesh.gateway")

DEFAULT_MAX_BODY = 1024 * 1024
DEFAULT_REQUEST_TIMEOUT = 10.0
DEFAULT_SEEN_MAX = 200_000
#: How long a produced event is remembered: the inbound topic's retention (7 d).
SEEN_TTL_S = 7 * 24 * 3600.0
COUNTERS = (
    "received",
    "produced",
    "duplicates",
    "bad_signature",
    "malformed",
    "produce_failed",
    "too_large",
    "statuses",
)
_RESERVED = {"healthz", "readyz", "metrics"}
_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
_FORM = "application/x-www-form-urlencoded"


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    """The gateway's settings (the CLI fills them from options and the environment)."""

    #: the brokers: a bootstrap string (TLS and SASL from the environment) or the settings
    bootstrap: Brokers
    prefix: str = "botmesh"
    #: The URL the channels call, without the channel path (``https://hooks.example.com``);
    #: ``None``: the scheme and Host header of each request.
    public_url: str | None = None
    max_body: int = DEFAULT_MAX_BODY
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT
    seen_max: int = DEFAULT_SEEN_MAX
    replication: int = 1

    def __post_init__(self) -> None:
        if self.max_body < 1:
            raise ValueError(f"--max-body {self.max_body}: must be at least 1 byte")
        if self.request_timeout <= 0:
            raise ValueError(f"--request-timeout {self.request_timeout:g}: must be > 0 seconds")
        if self.seen_max < 1:
            raise ValueError(f"--seen-max {self.seen_max}: must be at least 1")
        if self.public_url is not None and not self.public_url.startswith(("http://", "https://")):
            raise ValueError(
                f"--public-url {self.public_url!r}: must start with https:// (or http://), "
                "e.g. https://hooks.example.com"
            )
        Catalog(self.prefix)


class SeenSet:
    """The ``(channel, id)`` pairs produced, with when: at most ``limit``, oldest dropped
    first; an entry older than ``ttl`` seconds counts as unknown."""

    def __init__(
        self, limit: int, ttl: float = SEEN_TTL_S, clock: Callable[[], float] = time.time
    ) -> None:
        self.limit = limit
        self.ttl = ttl
        self._clock = clock
        self._at: OrderedDict[tuple[str, str], float] = OrderedDict()

    def __len__(self) -> int:
        return len(self._at)

    def __contains__(self, key: object) -> bool:
        at = self._at.get(key)  # type: ignore[call-overload]
        if at is None:
            return False
        if self._clock() - at > self.ttl:
            del self._at[key]  # type: ignore[arg-type]
            return False
        return True

    def add(self, key: tuple[str, str], at: float) -> None:
        if self._clock() - at > self.ttl:
            return
        self._at[key] = at
        self._at.move_to_end(key)
        while len(self._at) > self.limit:
            self._at.popitem(last=False)


class Gateway:
    """The webhook gateway for ``webhooks`` (channel name → its ``ChannelWebhook``)."""

    def __init__(
        self,
        webhooks: Mapping[str, ChannelWebhook],
        config: GatewayConfig,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not webhooks:
            raise ValueError("the gateway needs at least one channel")
        for name in webhooks:
            if not _NAME.match(name) or name in _RESERVED:
                raise ValueError(
                    f"channel name {name!r}: use lower-case letters, digits, '_' or '-', "
                    f"and none of {', '.join(sorted(_RESERVED))}"
                )
        self.webhooks = dict(webhooks)
        self.config = config
        self.catalog = Catalog(config.prefix)
        self._clock = clock
        self.seen = SeenSet(config.seen_max, clock=clock)
        self._registry: CollectorRegistry | None = None  # /metrics, made at the first scrape
        self.counts: dict[str, dict[str, int]] = {
            name: dict.fromkeys(COUNTERS, 0) for name in self.webhooks
        }
        self._kafka = GatewayKafka(
            config.bootstrap,
            config.prefix,
            request_timeout=config.request_timeout,
            replication=config.replication,
            on_seen=self._remember,
        )
        self._connected = False
        self._reason = "connecting to Kafka"
        self._connector: asyncio.Task[None] | None = None
        self._inflight: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._background: set[asyncio.Task[None]] = set()

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        """Start connecting to Kafka in the background (returns at once)."""
        if self._connector is None:
            self._connector = asyncio.create_task(self._connect(), name="gateway-connect")

    async def _connect(self) -> None:
        delay = 0.2
        while True:
            try:
                await self._kafka.connect()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._reason = (
                    f"not connected to Kafka at {self.config.bootstrap} ({_what(exc)}); "
                    f"retrying in {delay:.1f} s"
                )
                log.warning("gateway: %s", self._reason)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            self._connected = True
            self._reason = ""
            log.info("gateway: connected to Kafka at %s", self.config.bootstrap)
            return

    async def wait_connected(self) -> None:
        """Return once connected to Kafka with the seen topic loaded."""
        if self._connector is None:
            raise RuntimeError("start() the gateway first")
        await asyncio.shield(self._connector)

    async def close(self) -> None:
        """Finish the produces in flight, flush the producer, stop (idempotent)."""
        if self._connector is not None:
            self._connector.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._connector
        pending = [*self._inflight.values(), *self._background]
        if pending:
            await asyncio.wait(pending, timeout=self.config.request_timeout)
        await self._kafka.close()
        self._connected = False
        self._reason = "stopped"

    def _remember(self, channel: str, event_id: str, at: float) -> None:
        self.seen.add((channel, event_id), at)

    # -- HTTP -----------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.config.max_body)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/metrics", self._metrics)
        for name in self.webhooks:
            app.router.add_route("GET", f"/{name}", self._handler(name))
            app.router.add_route("POST", f"/{name}", self._handler(name))
        return app

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _readyz(self, request: web.Request) -> web.Response:
        reason = await self.not_ready()
        if reason:
            return web.Response(status=503, text=f"not ready: {reason}\n")
        return web.Response(text="ready\n")

    async def not_ready(self) -> str:
        """Why the gateway cannot take webhooks now; ``""`` when it can."""
        if not self._connected:
            return self._reason
        try:
            topics = await asyncio.wait_for(self._kafka.topics(), 5.0)
        except Exception as exc:
            return f"Kafka at {self.config.bootstrap} does not answer ({type(exc).__name__})"
        if self.catalog.inbound not in topics:
            return (
                f"topic {self.catalog.inbound} does not exist; create it with `botmesh "
                f"topics create --prefix {self.catalog.prefix}`"
            )
        return ""

    async def _metrics(self, request: web.Request) -> web.Response:
        if self._registry is None:
            self._registry = gateway_registry(self.metrics)
        body = exposition(self._registry)
        return web.Response(body=body, headers={"Content-Type": METRICS_CONTENT_TYPE})

    def metrics(self) -> dict[str, Any]:
        return {
            "channels": {name: dict(c) for name, c in self.counts.items()},
            "seen": {"entries": len(self.seen), "max": self.seen.limit},
            "connected": self._connected,
        }

    def _handler(self, name: str) -> Callable[[web.Request], Awaitable[web.Response]]:
        route = f"/{name}"

        async def handle(request: web.Request) -> web.Response:
            # a SERVER span per webhook when tracing is on (botmesh.observability.tracing)
            with tracing.webhook_span(request.method, route, request.headers) as span:
                response = await self._webhook(name, request)
                span.answered(response.status)
                return response

        return handle

    async def _webhook(self, name: str, request: web.Request) -> web.Response:
        counts = self.counts[name]
        counts["received"] += 1
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.request_timeout
        if (request.content_length or 0) > self.config.max_body:
            counts["too_large"] += 1
            return _text(413, f"body over {self.config.max_body} bytes")
        try:
            async with asyncio.timeout_at(deadline):
                body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            counts["too_large"] += 1
            return _text(413, f"body over {self.config.max_body} bytes")
        except TimeoutError:
            return _text(408, "the body did not arrive in time")
        try:
            hook_request = self._request(request, body)
        except ValueError:
            counts["malformed"] += 1
            log.warning("gateway %s: a form body that is not UTF-8; answered 400", name)
            return _text(400, "malformed webhook")
        hook = self.webhooks[name]
        outcome = self._checked(name, hook, hook_request)
        if isinstance(outcome, web.Response):
            return outcome
        records, statuses = outcome
        try:
            async with asyncio.timeout_at(deadline):
                await self._produce(name, records)
                await self._produce_statuses(name, statuses)
        except (TimeoutError, KafkaUnavailable) as exc:
            counts["produce_failed"] += 1
            why = str(exc) or f"no ack within {self.config.request_timeout:g} s"
            log.warning("gateway %s: not produced, answered 503: %s", name, why)
            return _text(503, "not stored, retry later")
        return _reply(hook.reply(hook_request, records))

    def _checked(
        self, name: str, hook: ChannelWebhook, req: WebhookRequest
    ) -> web.Response | tuple[list[Inbound], list[DeliveryStatus]]:
        """Handshakes, verify and parse: a response to give now, or the records and the
        delivery statuses (a channel with status webhooks: ``StatusWebhook``)."""
        counts = self.counts[name]
        stage = "handshake"
        try:
            if req.method == "GET":
                reply = hook.handshake(req)
                if reply is not None:
                    return _reply(reply)
            stage = "verify"
            hook.verify(req)
            stage = "handshake"
            if req.method != "GET":
                reply = hook.handshake(req)
                if reply is not None:
                    return _reply(reply)
            stage = "parse"
            records = hook.parse(req)
            statuses = hook.statuses(req) if isinstance(hook, StatusWebhook) else []
        except BadSignature as exc:
            counts["bad_signature"] += 1
            log.warning("gateway %s: bad signature, answered 401: %s", name, _short(exc))
            return _text(401, "bad signature")
        except Exception as exc:
            if stage == "verify":  # fail closed: an error checking it is no signature
                counts["bad_signature"] += 1
                log.warning(
                    "gateway %s: verify failed, answered 401: %s: %s",
                    name,
                    type(exc).__name__,
                    _short(exc),
                )
                return _text(401, "bad signature")
            counts["malformed"] += 1
            kind = "" if isinstance(exc, MalformedWebhook) else f"{type(exc).__name__}: "
            log.warning(
                "gateway %s: malformed (%s), answered 400: %s%s", name, stage, kind, _short(exc)
            )
            return _text(400, "malformed webhook")
        named = [r if r.channel else msgspec.structs.replace(r, channel=name) for r in records]
        return named, [
            s if s.channel else msgspec.structs.replace(s, channel=name) for s in statuses
        ]

    def _request(self, request: web.Request, body: bytes) -> WebhookRequest:
        base = self.config.public_url or f"{request.scheme}://{request.host}"
        query: dict[str, str] = {}
        for k, v in request.query.items():
            query.setdefault(k, v)
        form: dict[str, str] = {}
        if request.content_type == _FORM:
            for k, v in parse_qsl(body.decode("utf-8"), keep_blank_values=True):
                form.setdefault(k, v)
        return WebhookRequest(
            method=request.method,
            path=request.path,
            url=base.rstrip("/") + request.raw_path,
            headers={k.lower(): v for k, v in request.headers.items()},
            query=query,
            body=body,
            form=form,
        )

    # -- producing ------------------------------------------------------------------------

    async def _produce(self, name: str, records: list[Inbound]) -> None:
        """Produce the records not produced before; return once every one is acked."""
        if not self._connected:
            raise KafkaUnavailable(f"not connected: {self._reason}")
        if not self._kafka.inbound_exists:
            reason = await self.not_ready()
            if reason:
                raise KafkaUnavailable(reason)
        counts = self.counts[name]
        waits: list[tuple[asyncio.Task[None], bool]] = []
        for rec in records:
            key = (name, rec.id)
            if rec.id and key in self.seen:
                counts["duplicates"] += 1
                continue
            other = self._inflight.get(key) if rec.id else None
            if other is not None:  # the same event, arrived twice at once
                waits.append((other, False))
                continue
            # registered before the first await, so that the same event arriving meanwhile
            # waits for this delivery; enqueued in this loop, so a chat's records keep order
            enqueued: asyncio.Future[Awaitable[Any]] = asyncio.get_running_loop().create_future()
            task = asyncio.create_task(self._settle(name, rec, enqueued))
            if rec.id:
                self._inflight[key] = task
                task.add_done_callback(lambda t, k=key: self._settled(k, t))  # type: ignore[misc]
            else:
                self._background.add(task)
                task.add_done_callback(self._background_done)
            waits.append((task, True))
            try:
                value = encode_inbound(rec)
                topic, chat = self.catalog.inbound, chat_key(rec.chat_id)
                # with tracing on, the webhook's span (W3C traceparent): the worker goes on
                headers = tracing.record_headers()
                sending = (
                    self._kafka.send(topic, chat, value)
                    if headers is None
                    else self._kafka.send_with_headers(topic, chat, value, headers)
                )
                enqueued.set_result(await sending)
            except BaseException as exc:
                failure = exc if isinstance(exc, KafkaUnavailable) else KafkaUnavailable(_what(exc))
                if not enqueued.done():
                    enqueued.set_exception(failure)
                if isinstance(exc, Exception):
                    raise failure from None
                raise
        if not waits:
            return
        results = await asyncio.gather(
            *(asyncio.shield(t) for t, _ in waits), return_exceptions=True
        )
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            raise KafkaUnavailable(f"{len(failed)} of {len(waits)} not acked: {failed[0]!r}")
        counts["duplicates"] += sum(1 for _, mine in waits if not mine)

    async def _produce_statuses(self, name: str, statuses: list[DeliveryStatus]) -> None:
        """Produce the delivery statuses to ``<prefix>.statuses``, keyed by chat id, in the
        order the channel gave them; return once every one is acked. Not deduplicated: a
        status the channel posts again changes nothing at the chat's owner."""
        if not statuses:
            return
        if not self._connected:
            raise KafkaUnavailable(f"not connected: {self._reason}")
        topic = self.catalog.statuses
        try:
            acks = [
                await self._kafka.send(topic, chat_key(s.chat_id), encode_status(s))
                for s in statuses
            ]
            await asyncio.gather(*acks)
        except KafkaUnavailable:
            raise
        except Exception as exc:
            raise KafkaUnavailable(_what(exc)) from None
        self.counts[name]["statuses"] += len(statuses)

    async def _settle(
        self, name: str, rec: Inbound, enqueued: asyncio.Future[Awaitable[Any]]
    ) -> None:
        where = await (await enqueued)
        self.counts[name]["produced"] += 1
        if rec.id:
            self.seen.add((name, rec.id), self._clock())
            task = asyncio.create_task(self._kafka.write_seen(name, rec.id, where))
            self._background.add(task)
            task.add_done_callback(self._background_done)

    def _settled(self, key: tuple[str, str], task: asyncio.Task[None]) -> None:
        if self._inflight.get(key) is task:
            del self._inflight[key]
        if not task.cancelled() and task.exception() is not None:
            log.debug("gateway: produce of %s failed: %r", key, task.exception())

    def _background_done(self, task: asyncio.Task[None]) -> None:
        self._background.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: a failure was logged or answered already


def _what(exc: BaseException) -> str:
    """``Type: message`` (the type once, even when the message starts with it)."""
    name, text = type(exc).__name__, _short(exc)
    return text if text.startswith(name) else f"{name}: {text}"


def _short(exc: BaseException, limit: int = 200) -> str:
    text = str(exc)
    return text if len(text) <= limit else text[:limit] + "…"


def _text(status: int, text: str) -> web.Response:
    return web.Response(status=status, text=text + "\n")


def _reply(reply: WebhookReply) -> web.Response:
    return web.Response(
        status=reply.status, body=reply.body, headers={"Content-Type": reply.content_type}
    )


@asynccontextmanager
async def serving(gateway: Gateway, host: str, port: int) -> AsyncIterator[str]:
    """Run ``gateway`` on ``host:port`` (0: any free port) until the block ends; yields its
    base URL. On the way out: stop accepting, finish the requests in flight, flush, stop."""
    app = gateway.app()
    try:
        await gateway.start()
        timeout = gateway.config.request_timeout + 5.0
        async with serving_app(app, host, port, shutdown_timeout=timeout) as url:
            yield url
    finally:
        await gateway.close()


def run_gateway(gateway: Gateway, host: str, port: int) -> int:
    """Serve until SIGTERM or SIGINT; 0 after a clean stop."""

    async def main() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        async with serving(gateway, host, port) as url:
            log.info(
                "gateway: listening on %s for %s (topic %s)",
                url,
                ", ".join(f"/{n}" for n in gateway.webhooks),
                gateway.catalog.inbound,
            )
            print(f"botmesh gateway: listening on {url}", flush=True)
            await stop.wait()
            log.info("gateway: stopping (finishing the requests in flight)")
        return 0

    return asyncio.run(main())

"""Traces (OpenTelemetry), optional: ``pip install 'botmesh[otel]'``.

**When it is on.** ``botmesh worker`` and ``botmesh gateway`` decide once, at start
(``configure``; the worker after importing the bot module), and never again:

- the extra is not installed: off (a warning names the ``pip install`` when an ``OTEL_*``
  variable below asks for traces);
- a ``TracerProvider`` is installed already (the bot module, or the program that embeds
  botmesh, called ``opentelemetry.trace.set_tracer_provider``): on, with that provider;
- else ``OTEL_TRACES_EXPORTER`` (``otlp``, ``console``, or any installed span exporter's
  name; ``none``: off), ``OTEL_EXPORTER_OTLP_ENDPOINT`` or
  ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is set: on, with the SDK's provider, a batch
  processor per exporter (``otlp`` is OTLP over HTTP/protobuf, the exporter the extra
  installs), the resource from ``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES``
  (``service.name`` defaults to ``botmesh-worker`` / ``botmesh-gateway``); the SDK reads
  its other ``OTEL_*`` variables itself (sampler, batch delays, headers);
- else off. ``OTEL_SDK_DISABLED=true`` is off whatever else is set.

**The spans.** The gateway starts a ``SERVER`` span per webhook (``POST /<channel>``) and
puts its W3C ``traceparent`` header (and ``tracestate``, when set) on each inbound record it
produces. The worker continues that trace for each record it settles, from the record's
headers (a record without them starts a trace): a ``CONSUMER`` span ``botmesh.turn`` (an
inbound: the handlers and their sends), ``botmesh.request`` (a send request) or
``botmesh.control`` (an operator's action), around every attempt; a record replayed after a
crash or a restart gets a new span in the same trace. The provider's HTTP calls are its
children (aiohttp's client instrumentation; their URLs are recorded without user info, query
or ids and tokens in the path), and so is each awaited journal write
(``botmesh.journal.write``). Receipts published while a record is settled carry its span's
``traceparent`` header on ``<prefix>.sent``.

What runs outside a record's settling is outside its trace (the journal keeps no trace
context): the recovery pass of a worker that starts with work its killed predecessor left in
flight (the record, redelivered, still continues its trace in a new turn, which answers from
the journal and republishes the receipts with its ``traceparent``), the sweeper's retries
and the retry tiers' sends (their provider calls are traces of their own), and the receipts
they publish (no ``traceparent``).

**Off** (the default): ``ENABLED`` is ``False``, checked once a record or a webhook; every
function here returns at once, or a shared no-op object: nothing is allocated per record and
OpenTelemetry is not even imported.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import sys
import time
from collections.abc import Mapping, Sequence
from contextvars import ContextVar
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

from botmesh._version import __version__
from botmesh.state.messages import DeliveryStatus, Inbound
from botmesh.topics.records import SendRequest

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.propagators.textmap import Getter, Setter
    from opentelemetry.trace import Span, Tracer

    from botmesh.topics.control import ControlRequest

__all__ = [
    "ENABLED",
    "NO_SPAN",
    "TRACE_HEADERS",
    "ReadRecord",
    "configure",
    "current_ids",
    "extract",
    "inject",
    "journal_write",
    "record_headers",
    "record_span",
    "safe_url",
    "webhook_span",
]

log = logging.getLogger("botmesh.tracing")

#: On (``configure`` decided so): read once a record or a webhook, nothing else is done
#: while it is ``False``.
ENABLED = False
_tracer: Tracer | None = None
#: The variables that ask for traces (``configure``).
ASKING = (
    "OTEL_TRACES_EXPORTER",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
)
_EXTRA = "pip install 'botmesh[otel]'"
#: The W3C headers (``traceparent``) of the record being settled, set by its span when
#: tracing is on: the receipts the worker publishes meanwhile carry them.
TRACE_HEADERS: ContextVar[tuple[tuple[str, bytes], ...]] = ContextVar(
    "botmesh_trace_headers", default=()
)


class ReadRecord(Protocol):
    """A record as the worker read it: where it was, and its headers."""

    @property
    def topic(self) -> str: ...

    @property
    def partition(self) -> int: ...

    @property
    def offset(self) -> int: ...

    @property
    def headers(self) -> Sequence[tuple[str, bytes]]: ...


def _env(environ: Mapping[str, str], name: str) -> str:
    return environ.get(name, "").strip()


def _asked(environ: Mapping[str, str]) -> bool:
    exporters = _env(environ, "OTEL_TRACES_EXPORTER").lower()
    if exporters == "none":
        return False
    return bool(
        exporters
        or _env(environ, "OTEL_EXPORTER_OTLP_ENDPOINT")
        or _env(environ, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


def configure(service: str = "botmesh", environ: Mapping[str, str] | None = None) -> bool:
    """Decide whether tracing is on (the rule of the module doc) and set it up; whether it
    is. ``service``: the default ``service.name``. ``ValueError`` naming
    ``OTEL_TRACES_EXPORTER`` when it names no installed exporter."""
    global ENABLED, _tracer  # noqa: PLW0603 - the one switch, set once at start
    env = os.environ if environ is None else environ
    if _env(env, "OTEL_SDK_DISABLED").lower() == "true":
        return False
    if not _asked(env) and "opentelemetry.trace" not in sys.modules:
        return False  # nobody installed a provider, nothing asks: not even imported
    try:
        from opentelemetry import trace  # noqa: PLC0415 - the optional extra
    except ImportError:
        if _asked(env):
            log.warning(
                "tracing asked for (%s) but OpenTelemetry is not installed: traces are off; %s",
                ", ".join(n for n in ASKING if _env(env, n)),
                _EXTRA,
            )
        return False
    provider = trace.get_tracer_provider()
    installed = not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)
    if not installed:
        if not _asked(env):
            return False
        provider = _sdk_provider(service, env)
        trace.set_tracer_provider(provider)
    _tracer = provider.get_tracer("botmesh", __version__)
    _instrument_http()
    ENABLED = True
    return True


def _exporter(name: str) -> Any:
    """The span exporter class an ``OTEL_TRACES_EXPORTER`` name gives (entry points of
    ``opentelemetry_traces_exporter``; ``otlp`` falls back on OTLP over HTTP)."""
    from importlib.metadata import entry_points  # noqa: PLC0415

    found = {e.name: e for e in entry_points(group="opentelemetry_traces_exporter")}
    if name == "otlp" and "otlp" not in found and "otlp_proto_http" in found:
        name = "otlp_proto_http"
    if name not in found:
        raise ValueError(
            f"OTEL_TRACES_EXPORTER: no span exporter {name!r} is installed (installed: "
            f"{', '.join(sorted(found)) or 'none'}); {_EXTRA} brings otlp and console"
        )
    return found[name].load()


def _sdk_provider(service: str, env: Mapping[str, str]) -> Any:
    try:
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource  # noqa: PLC0415
        from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415
        from opentelemetry.sdk.trace.export import BatchSpanProcessor  # noqa: PLC0415
    except ImportError as exc:
        raise ValueError(
            f"tracing asked for but the OpenTelemetry SDK is not installed ({exc}); {_EXTRA}"
        ) from None
    names = [n.strip().lower() for n in _env(env, "OTEL_TRACES_EXPORTER").split(",")]
    exporters = [_exporter(n) for n in dict.fromkeys(n for n in names if n) or ["otlp"]]
    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "unknown_service")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: service}))
    provider = TracerProvider(resource=resource)
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter()))
    return provider


def _instrument_http() -> None:
    """The provider's HTTP calls as client spans (aiohttp sessions made from now on)."""
    try:
        from opentelemetry.instrumentation.aiohttp_client import (  # noqa: PLC0415
            AioHttpClientInstrumentor,
        )
    except ImportError:
        log.warning("no aiohttp client instrumentation: provider calls are not traced; %s", _EXTRA)
        return
    instrumentor = AioHttpClientInstrumentor()
    if not instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.instrument(url_filter=safe_url)


#: A path segment kept in a traced URL: a word (an API method, a version), not an id or a
#: token (``bot123:AA...``, a Twilio account, a Discord interaction token).
_WORD = re.compile(r"^[A-Za-z][A-Za-z0-9._-]{0,31}$")


def safe_url(url: Any) -> str:
    """A URL as a span records it: scheme, host, port and the path's words; user info, the
    query and the path's other segments (ids, tokens) left out."""
    path = "/".join(
        s if not s or (_WORD.match(s) and ":" not in s) else "*" for s in url.path.split("/")
    )
    port = f":{url.port}" if url.port is not None and not url.is_default_port() else ""
    return f"{url.scheme}://{url.host}{port}{path}"


# -- propagation: W3C headers on Kafka records ---------------------------------------------


Carrier = Sequence[tuple[str, bytes]]


@functools.cache
def _codec() -> tuple[Getter[Carrier], Setter[list[tuple[str, bytes]]]]:
    """OpenTelemetry's getter and setter of a record's headers (``(name, bytes)`` pairs)."""
    from opentelemetry.propagators.textmap import Getter, Setter  # noqa: PLC0415

    class HeaderGetter(Getter[Carrier]):
        def get(self, carrier: Carrier, key: str) -> list[str] | None:
            found = [v.decode("latin-1") for k, v in carrier if k.lower() == key and v]
            return found or None

        def keys(self, carrier: Carrier) -> list[str]:
            return [k for k, _ in carrier]

    class HeaderSetter(Setter[list[tuple[str, bytes]]]):
        def set(self, carrier: list[tuple[str, bytes]], key: str, value: str) -> None:
            carrier.append((key, value.encode("latin-1")))

    return HeaderGetter(), HeaderSetter()


def inject(headers: list[tuple[str, bytes]], context: Context | None = None) -> None:
    """Append the W3C headers of ``context`` (the current one) to ``headers``."""
    from opentelemetry import propagate  # noqa: PLC0415

    propagate.inject(headers, context=context, setter=_codec()[1])


def extract(headers: Carrier) -> Context:
    """The context a record's W3C headers carry (an empty one when they carry none)."""
    from opentelemetry import propagate  # noqa: PLC0415

    return propagate.extract(headers, getter=_codec()[0])


def record_headers() -> list[tuple[str, bytes]] | None:
    """The headers a record produced now carries: the current span's ``traceparent``
    (``None`` when tracing is off)."""
    if not ENABLED:
        return None
    headers: list[tuple[str, bytes]] = []
    inject(headers)
    return headers or None


def current_ids() -> tuple[str, str] | None:
    """``(trace_id, span_id)`` of the current span, in hex; ``None`` outside a span."""
    if not ENABLED:
        return None
    from opentelemetry import trace  # noqa: PLC0415

    ctx = trace.get_current_span().get_span_context()
    if not ctx.is_valid:
        return None
    return f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}"


# -- spans ------------------------------------------------------------------------------------


class _NoSpan:
    """The span of tracing off: one object, shared, that does nothing."""

    __slots__ = ()

    def __enter__(self) -> _NoSpan:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def answered(self, status: int) -> None:
        """(A webhook's span: the status it was answered with.)"""


NO_SPAN = _NoSpan()


class _Span:
    """A span made current while entered (``start_as_current_span``)."""

    __slots__ = ("_cm", "span")

    def __init__(self, cm: Any) -> None:
        self._cm = cm
        self.span: Span | None = None

    def __enter__(self) -> _Span:
        self.span = self._cm.__enter__()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._cm.__exit__(kind, exc, tb)

    def answered(self, status: int) -> None:
        """The HTTP status the webhook was answered with (5xx: the span is an error)."""
        from opentelemetry.trace import StatusCode  # noqa: PLC0415

        assert self.span is not None
        self.span.set_attribute("http.response.status_code", status)
        if status >= 500:
            self.span.set_status(StatusCode.ERROR)


def webhook_span(method: str, route: str, headers: Mapping[str, str]) -> _Span | _NoSpan:
    """The gateway's ``SERVER`` span of one webhook (continuing a W3C ``traceparent`` the
    request carries); ``NO_SPAN`` when tracing is off."""
    if not ENABLED:
        return NO_SPAN
    from opentelemetry import propagate  # noqa: PLC0415
    from opentelemetry.trace import SpanKind  # noqa: PLC0415

    assert _tracer is not None
    parent = propagate.extract(headers)
    return _Span(
        _tracer.start_as_current_span(
            f"{method} {route}",
            context=parent,
            kind=SpanKind.SERVER,
            attributes={"http.request.method": method, "http.route": route, "url.path": route},
        )
    )


class _RecordSpan(_Span):
    """A record's span while the worker settles it; the receipts published meanwhile carry
    its ``traceparent`` (``TRACE_HEADERS``)."""

    __slots__ = ("_token",)

    def __enter__(self) -> _RecordSpan:
        super().__enter__()
        headers: list[tuple[str, bytes]] = []
        inject(headers)
        self._token = TRACE_HEADERS.set(tuple(headers))
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        TRACE_HEADERS.reset(self._token)
        super().__exit__(kind, exc, tb)


def record_span(
    raw: ReadRecord, item: Inbound | SendRequest | ControlRequest | DeliveryStatus
) -> _RecordSpan | _NoSpan:
    """The worker's span of one record (``CONSUMER``, a child of the context its headers
    carry); ``NO_SPAN`` when tracing is off."""
    if not ENABLED:
        return NO_SPAN
    from opentelemetry.trace import SpanKind  # noqa: PLC0415

    assert _tracer is not None
    attributes: dict[str, str | int] = {
        "messaging.system": "kafka",
        "messaging.operation.type": "process",
        "messaging.destination.name": raw.topic,
        "messaging.destination.partition.id": str(raw.partition),
        "messaging.kafka.offset": raw.offset,
        "messaging.message.id": item.message_id if isinstance(item, DeliveryStatus) else item.id,
        "botmesh.chat_id": item.chat_id,
    }
    name = "botmesh.control"
    if isinstance(item, Inbound):
        name = "botmesh.turn"
    elif isinstance(item, DeliveryStatus):
        name = "botmesh.status"
    elif isinstance(item, SendRequest):
        name = "botmesh.request"
        attributes["botmesh.idempotency_key"] = item.idempotency_key
    return _RecordSpan(
        _tracer.start_as_current_span(
            name,
            context=extract(raw.headers),
            kind=SpanKind.CONSUMER,
            attributes=attributes,
        )
    )


def journal_write(seconds: float) -> None:
    """A ``botmesh.journal.write`` span for an awaited journal write that took ``seconds``
    until the broker acked it (the journal's ``write_seconds`` hook), in the trace of the
    record under way; nothing outside a record's span."""
    if not ENABLED:
        return
    from opentelemetry import trace  # noqa: PLC0415

    if not trace.get_current_span().is_recording():
        return
    assert _tracer is not None
    end = time.time_ns()
    span = _tracer.start_span("botmesh.journal.write", start_time=end - int(seconds * 1e9))
    span.end(end_time=end)

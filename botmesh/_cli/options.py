"""The options many ``botmesh`` commands share, and what they resolve to.

Conventions: ``--chat-id`` names a chat everywhere; ``--json`` prints one JSON document (or
JSON lines) for scripts on every command that reports; ``--timeout`` is the seconds each
request to the broker may take; ``--wait`` the seconds to wait for a chat's owner to answer.
Each option's help shows its default and the environment variable it falls back to
(``CONTEXT``: ``show_default``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

import click

from botmesh.topics.catalog import Catalog, check_prefix, prefix_from_env

__all__ = [
    "CONTEXT",
    "bootstrap_of",
    "catalog_of",
    "check_port",
    "check_seconds",
    "connection_options",
    "count",
    "json_option",
    "log_format_option",
    "logging_options",
    "timeout_option",
    "times_of",
    "timing_options",
    "wait_option",
]

F = TypeVar("F", bound=Callable[..., Any])
#: Every command's and group's settings: -h too, defaults shown, help up to 100 columns.
CONTEXT: dict[str, Any] = {
    "help_option_names": ["-h", "--help"],
    "show_default": True,
    "max_content_width": 100,
}
DEFAULT_BOOTSTRAP = "127.0.0.1:9092"


def connection_options(f: F) -> F:
    """``--prefix`` and ``--bootstrap``: the topics and the cluster a command works on."""
    f = click.option(
        "--prefix",
        envvar="BOTMESH_TOPIC_PREFIX",
        show_envvar=True,
        default="botmesh",
        help="topic prefix (every topic name; the worker group is <prefix>.worker)",
    )(f)
    return click.option(
        "--bootstrap",
        envvar="KAFKA_BOOTSTRAP_SERVERS",
        show_envvar=True,
        default=DEFAULT_BOOTSTRAP,
        help="Kafka bootstrap servers (TLS and SASL: the KAFKA_* settings)",
    )(f)


def json_option(f: F) -> F:
    """``--json``, passed to the command as ``as_json`` (``json`` is the module)."""
    return click.option("--json", "as_json", is_flag=True, help="JSON output, for scripts")(f)


def timeout_option(f: F) -> F:
    return click.option(
        "--timeout",
        type=float,
        default=10.0,
        help="seconds each request to the broker may take (then exit 3)",
    )(f)


def wait_option(f: F) -> F:
    return click.option(
        "--wait",
        type=float,
        default=30.0,
        help="seconds to wait for the chats' owners to answer (then exit 4)",
    )(f)


def log_format_option(f: F) -> F:
    """``--log-format`` of the commands that serve (``worker``, ``gateway``, ``console``)."""
    return click.option(
        "--log-format",
        type=click.Choice(["text", "json"]),
        help="log lines: text, or one JSON object a line  [env var: BOTMESH_LOG_FORMAT; "
        "default: text]",
    )(f)


def logging_options(f: F) -> F:
    """``--loglevel`` (default ``info``) and ``--log-format`` of the servers ``gateway`` and
    ``console``."""
    return click.option("--loglevel", default="info", help="log level")(log_format_option(f))


def bootstrap_of(bootstrap: str | None) -> str:
    """The bootstrap servers: ``--bootstrap``, else ``KAFKA_BOOTSTRAP_SERVERS``, else the
    local broker's."""
    value = bootstrap or os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "").strip()
    return value or DEFAULT_BOOTSTRAP


def catalog_of(prefix: str | None) -> Catalog:
    """The topics of ``--prefix``, else of ``BOTMESH_TOPIC_PREFIX`` (checked)."""
    return Catalog(check_prefix(prefix if prefix else prefix_from_env()))


def count(value: int | None, option: str, env: str, default: int) -> int:
    """A whole number >= 1 from its flag, else the environment (where a configuration file's
    setting is too), else ``default``."""
    if value is not None:
        if value < 1:
            raise ValueError(f"{option} {value}: must be a whole number >= 1")
        return value
    raw = os.environ.get(env, "").strip()
    if not raw:
        return default
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"{env}={raw!r}: must be a whole number >= 1; fix or unset it")
    return int(raw)


def check_seconds(option: str, value: float) -> float:
    """``value`` of ``option`` (``--timeout``, ``--wait``), refused unless positive."""
    if value <= 0:
        raise ValueError(f"{option} {value:g}: must be a positive number of seconds")
    return value


def check_port(port: int) -> int:
    """``--port`` of a command that serves, refused outside 0-65535."""
    if not 0 <= port <= 65535:
        raise ValueError(f"--port {port}: must be 0-65535")
    return port


def timing_options(f: F) -> F:
    """``--at``/``--delay`` (a scheduled send) and ``--deliver-within``/``--expires-at`` (its
    deadline), resolved by :func:`times_of`."""
    for option in reversed(
        [
            click.option(
                "--at", "at_", help="send at this time, not before (ISO 8601 or Unix seconds)"
            ),
            click.option("--delay", help="send this long from now, not before (e.g. 90s, 2h)"),
            click.option(
                "--deliver-within",
                help="not delivered this long after its time (or now), it dies expired (e.g. 5m)",
            ),
            click.option(
                "--expires-at",
                help="not delivered by this time, it dies expired (ISO 8601 or Unix seconds)",
            ),
        ]
    ):
        f = option(f)
    return f


def times_of(
    at_: str | None, delay: str | None, deliver_within: str | None, expires_at: str | None
) -> tuple[float | None, float | None]:
    """A request's ``at`` and ``expires_at`` (epoch seconds) from the timing options, the
    deadline counted now, when the request is produced; ``ValueError`` naming the option."""
    import time  # noqa: PLC0415

    from botmesh.state.durations import parse_duration  # noqa: PLC0415
    from botmesh.streams.ops.dlq import parse_when  # noqa: PLC0415

    if at_ is not None and delay is not None:
        raise ValueError("give --at or --delay, not both")
    if deliver_within is not None and expires_at is not None:
        raise ValueError("give --deliver-within or --expires-at, not both")
    now = time.time()
    at = parse_when(at_, "--at")
    if delay is not None:
        at = now + parse_duration(delay, "--delay")
    deadline = parse_when(expires_at, "--expires-at")
    if deliver_within is not None:
        within = parse_duration(deliver_within, "--deliver-within")
        if within <= 0:
            raise ValueError("--deliver-within must be above 0 (for example 5m)")
        deadline = max(at or now, now) + within
    if deadline is not None and at is not None and deadline <= at:
        raise ValueError("the deadline (--expires-at) is not after the send's time (--at)")
    return at, deadline

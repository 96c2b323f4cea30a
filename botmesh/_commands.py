"""The ``botmesh`` command tree (Click): every command, option, default and environment
variable, and shell completion. The commands' work is in ``botmesh._cli`` (and
``_dlq_cli``, ``_ops``), which take the parsed options as attributes of one object.

Conventions: ``--chat-id`` names a chat everywhere; ``--json`` prints one JSON document (or
JSON lines) for scripts on every command that reports; ``--timeout`` is the seconds each
request to the broker may take; ``--wait`` the seconds to wait for a chat's owner to answer.
Each option's help shows its default and the environment variable it falls back to.
"""

# ruff: noqa: PLC0415 - each command imports its work when it runs (the tree loads fast)
from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, TypeVar

import click

from botmesh._version import __version__
from botmesh.topics.catalog import DEFAULT_PARTITIONS

__all__ = ["cli"]

F = TypeVar("F", bound=Callable[..., Any])
_CONTEXT = {"help_option_names": ["-h", "--help"], "show_default": True, "max_content_width": 100}


def _invoke(command: str, action: str | None = None) -> Callable[[F], F]:
    """The callback runs ``botmesh._cli``'s implementation of ``command`` with the options."""

    def wrap(f: F) -> F:
        def run(**options: Any) -> int:
            from botmesh import _cli

            args = SimpleNamespace(command=command, action=action, **options)
            return int(_cli.COMMANDS[command](args))

        run.__name__ = f.__name__
        run.__doc__ = f.__doc__
        return run  # type: ignore[return-value]

    return wrap


def _connection(f: F) -> F:
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
        default="127.0.0.1:9092",
        help="Kafka bootstrap servers (TLS and SASL: the KAFKA_* settings)",
    )(f)


def _json(f: F) -> F:
    return click.option("--json", is_flag=True, help="JSON output, for scripts")(f)


def _timeout(f: F) -> F:
    return click.option(
        "--timeout",
        type=float,
        default=10.0,
        help="seconds each request to the broker may take (then exit 3)",
    )(f)


def _wait(f: F) -> F:
    return click.option(
        "--wait",
        type=float,
        default=30.0,
        help="seconds to wait for the chats' owners to answer (then exit 4)",
    )(f)


@click.group(context_settings=_CONTEXT)
@click.version_option(__version__, "--version", prog_name="botmesh", message="%(prog)s %(version)s")
@click.option(
    "--config",
    metavar="FILE",
    envvar="BOTMESH_CONFIG",
    show_envvar=True,
    help="a configuration file (TOML) whose settings apply under the environment's "
    "(the settings: python -m botmesh.settings)",
)
def cli(config: str | None) -> None:
    """Durable chat bots on Apache Kafka."""
    from botmesh.settings import apply_config_file

    apply_config_file(config)


# -- a bot: in this process, on Kafka ---------------------------------------------------------


@cli.command(context_settings=_CONTEXT)
@click.option("--app", required=True, help="the bot definition, module:attribute")
@click.option(
    "--provider",
    help="console, mock or module:attribute  [env var: BOTMESH_PROVIDER; default: console]",
)
@click.option(
    "--journal",
    help="journal URL; memory:// keeps nothing across runs, none runs without one  "
    "[default: file://<data dir>/console.journal?append_log=true]",
)
@click.option(
    "--data-dir",
    help="where the default journal lives  [env var: BOTMESH_DATA_DIR; default: ./botmesh-data]",
)
@click.option("--chat-id", default="console", help="the chat of plain-text lines")
@click.option(
    "--records", is_flag=True, help="each stdin line is an inbound record (JSON, v 1), not text"
)
@click.option("--instance-id", help="lease owner  [default: the runtime's]")
@_invoke("run")
def run() -> None:
    """Run a bot in this process, one inbound message per stdin line."""


@cli.command(context_settings=_CONTEXT)
@click.option("--app", required=True, help="the bot definition, module:attribute")
@click.option(
    "--provider",
    help="console, mock, a channel (telegram, whatsapp, ...: its adapter, configured from "
    "the environment) or module:attribute naming a provider or a zero-argument factory  "
    "[env var: BOTMESH_PROVIDER; default: console]",
)
@click.option(
    "--journal",
    help="kafka (on Kafka itself, shared by the group) or file:///path (one worker alone); "
    "never none, never memory://  [env var: BOTMESH_JOURNAL; default: kafka]",
)
@click.option(
    "--instance-id",
    help="lease owner and static group member id: stable across restarts, unique per "
    "replica  [env var: BOTMESH_INSTANCE_ID; default: the runtime's]",
)
@click.option(
    "--bootstrap",
    help="Kafka bootstrap servers  [env var: KAFKA_BOOTSTRAP_SERVERS; default: 127.0.0.1:9092]",
)
@click.option("--prefix", help="topic prefix  [env var: BOTMESH_TOPIC_PREFIX; default: botmesh]")
@click.option(
    "--data-dir",
    help="the journal's RocksDB databases  [env var: BOTMESH_DATA_DIR; default: ./botmesh-data]",
)
@click.option(
    "--http-host",
    help="address of /healthz, /readyz and /metrics  [env var: BOTMESH_HTTP_HOST; default: "
    "127.0.0.1]",
)
@click.option(
    "--http-port",
    type=int,
    help="their port (unset: not served)  [env var: BOTMESH_HTTP_PORT]",
)
@click.option(
    "--partitions",
    type=int,
    help=f"partitions of the topics it creates  [env var: BOTMESH_PARTITIONS; default: "
    f"{DEFAULT_PARTITIONS}]",
)
@click.option(
    "--batch-size",
    type=int,
    help="records per batch  [env var: BOTMESH_BATCH_SIZE; default: 500]",
)
@click.option(
    "--guarantee",
    type=click.Choice(["at_least_once", "exactly_once"]),
    help="processing guarantee; exactly_once commits the journal, the receipts and the "
    "offsets in Kafka transactions  [env var: BOTMESH_PROCESSING_GUARANTEE; default: "
    "at_least_once]",
)
@click.option("--loglevel", help="log level  [env var: BOTMESH_LOG_LEVEL; default: info]")
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    help="log lines: text, or one JSON object a line  [env var: BOTMESH_LOG_FORMAT; default: text]",
)
@_invoke("worker")
def worker() -> None:
    """Run a bot on the inbound topic (the Kafka worker)."""


# -- topics and traffic ---------------------------------------------------------------------


@cli.group(context_settings=_CONTEXT)
def topics() -> None:
    """Create or list the topics of a prefix."""


@topics.command("create", context_settings=_CONTEXT)
@_connection
@click.option(
    "--partitions",
    type=int,
    help=f"partitions of each  [env var: BOTMESH_PARTITIONS; default: {DEFAULT_PARTITIONS}]",
)
@click.option(
    "--replication",
    type=int,
    help="replication factor of each, at most the cluster's brokers  [env var: "
    "BOTMESH_REPLICATION; default: 1]",
)
@_json
@_invoke("topics", "create")
def topics_create() -> None:
    """Create the catalog's topics (idempotent)."""


@topics.command("list", context_settings=_CONTEXT)
@_connection
@click.option(
    "--partitions",
    type=int,
    help=f"partitions wanted  [env var: BOTMESH_PARTITIONS; default: {DEFAULT_PARTITIONS}]",
)
@_json
@_invoke("topics", "list")
def topics_list() -> None:
    """The catalog's topics and whether they exist."""


@cli.command(context_settings=_CONTEXT)
@_connection
@click.option("-n", "--messages", type=int, default=100, help="demo messages")
@click.option("--chats", type=int, default=10, help="over this many chats")
@click.option("--run", "run_id", help="id prefix of the messages  [default: random]")
@click.option(
    "--text",
    multiple=True,
    help="produce this text instead of demo messages (repeatable: one message each, in "
    "order, to --chat-id)",
)
@click.option("--chat-id", default="chat-0", help="the chat of the --text messages")
@_json
@_invoke("produce")
def produce() -> None:
    """Produce demo inbound messages (N over M chats), or given texts."""


@cli.command(context_settings=_CONTEXT)
@_connection
@click.option("--chat-id", required=True, help="the chat to send to")
@click.option("--text", help="the text to send (--text or --media-url is required)")
@click.option("--media-url", help="a media URL to send with the text, or instead of it")
@click.option("--media-mime", help="the media's MIME type, e.g. image/png")
@click.option("--key", help="the send's idempotency key, no '#'  [default: req:<request id>]")
@click.option(
    "--id", "request_id", help="the request id; the same id again sends once  [default: random]"
)
@click.option(
    "--option",
    multiple=True,
    metavar="NAME=VALUE",
    help="a channel option passed to the provider (repeatable; VALUE is JSON if it parses)",
)
@_json
@_invoke("send")
def send() -> None:
    """Ask the bot to send to a chat (a request on <prefix>.requests)."""


@cli.command(context_settings=_CONTEXT)
@_connection
@click.option("--from-beginning", is_flag=True, help="from the topic's start, not its end")
@click.option("--limit", type=int, help="stop after N receipts")
@click.option("--idle", type=float, help="stop after SECONDS without a receipt")
@_invoke("receipts")
def receipts() -> None:
    """Tail the sent-receipts topic (JSON lines)."""


# -- dead letters and flows ------------------------------------------------------------------

_KINDS = click.Choice(["inbound", "outbox", "requests"])


def _dead_letter_filters(f: F) -> F:
    for option in reversed(
        [
            click.option("--chat-id", help="only this chat"),
            click.option("--key", help="only this send key (outbox) or inbound id (inbound)"),
            click.option("--reason", help="only this reason (send-refused, retries-exhausted...)"),
            click.option("--since", help="dead at or after (ISO 8601 or Unix seconds)"),
            click.option("--until", help="dead before (ISO 8601 or Unix seconds)"),
        ]
    ):
        f = option(f)
    return f


@cli.group(context_settings=_CONTEXT)
def dlq() -> None:
    """List, show, retry, replay or discard dead letters."""


@dlq.command("list", context_settings=_CONTEXT)
@_connection
@_json
@click.option("--kind", type=_KINDS, help="one DLQ  [default: all three]")
@click.option("--limit", type=int, help="at most N (the newest)")
@_dead_letter_filters
@_invoke("dlq", "list")
def dlq_list() -> None:
    """The dead letters that match (all three DLQs unless --kind)."""


@dlq.command("show", context_settings=_CONTEXT)
@_connection
@_json
@click.argument("which")
@click.option("--kind", type=_KINDS, help="one DLQ  [default: all three]")
@_invoke("dlq", "show")
def dlq_show() -> None:
    """One dead letter in full: WHICH is topic:partition:offset, a send key or an inbound
    id."""


def _dlq_action(name: str, text: str) -> None:
    @dlq.command(name, context_settings=_CONTEXT, help=text)
    @_connection
    @_json
    @_dead_letter_filters
    @click.option("--dry-run", is_flag=True, help="say what would be done; do nothing")
    @_wait
    @_invoke("dlq", name)
    def action() -> None:
        pass


_dlq_action("retry", "Send the matching dead sends (outbox.dlq) again, through their owners.")
_dlq_action("replay", "Run the matching dead inbounds (inbound.dlq) again, through their owners.")
_dlq_action("discard", "Make the owners forget the matching dead sends (outbox.dlq).")


@cli.group(context_settings=_CONTEXT)
def flows() -> None:
    """Restart or drop a chat's conversation flow (its owner does)."""


def _flows_action(name: str, text: str) -> None:
    @flows.command(name, context_settings=_CONTEXT, help=text)
    @_connection
    @_json
    @click.option("--chat-id", multiple=True, required=True, help="the chat (repeatable)")
    @_wait
    @_invoke("flows", name)
    def action() -> None:
        pass


_flows_action(
    "restart",
    "Start the chat's flow again from its beginning under the worker's code (a checkpoint "
    "refused as another version).",
)
_flows_action("drop", "End the chat's flow (dropped): its next message goes to the handlers.")


@cli.command(context_settings=_CONTEXT)
@_connection
@_json
@click.option("--chat-id", required=True, help="the chat to erase")
@click.option("--yes", is_flag=True, help="erase it (without --yes: a dry run)")
@click.option("--dry-run", is_flag=True, help="say what would be erased; erase nothing")
@click.option("--note", help="who asks, a ticket: goes in the receipt  [default: botmesh-cli]")
@_wait
@_invoke("erase")
def erase() -> None:
    """Erase a chat's journal records (inbounds, sends, flow checkpoint, message log)
    through the worker that owns it, once its sends in flight finished; print the receipt
    (JSON) with the chat's dead letters to handle. A dry run unless --yes."""


# -- operating -------------------------------------------------------------------------------


@cli.command(context_settings=_CONTEXT)
@click.option("--from-offset", type=int, metavar="N", help="this offset (clamped)")
@click.option(
    "--from-time",
    metavar="TIME",
    help="the first record at or after TIME: ISO 8601 (no zone: UTC) or epoch seconds",
)
@click.option("--to-earliest", is_flag=True, help="the earliest retained record")
@click.option(
    "--topic",
    multiple=True,
    type=click.Choice(["inbound", "requests"]),
    help="the topic to reset (repeatable)  [default: inbound]",
)
@click.option(
    "--partition",
    multiple=True,
    type=int,
    metavar="P",
    help="only this partition (repeatable)  [default: all]",
)
@click.option(
    "--force", is_flag=True, help="remove the group's listed members first (stop them first)"
)
@click.option("--dry-run", is_flag=True, help="print the offsets it would set; change nothing")
@_connection
@_json
@_timeout
@_invoke("replay")
def replay() -> None:
    """Reset the worker group's offsets (<prefix>.worker) to replay records: one of
    --from-offset, --from-time, --to-earliest. Refused (exit 1) while the group lists
    members, unless --force. The journal answers what it handled already: handlers run
    again, no send goes out twice."""


@cli.command(context_settings=_CONTEXT)
@click.option(
    "--no-journal",
    is_flag=True,
    help="do not read the journal's changelog (no journal size, no ambiguous sends)",
)
@_connection
@_json
@_timeout
@_invoke("status")
def status() -> None:
    """The worker group, its lag, the journal and the dead letters."""


@cli.command(context_settings=_CONTEXT)
@_connection
@_json
@_timeout
@_invoke("metrics")
def metrics() -> None:
    """The counters each worker published on <prefix>.metrics."""


@cli.command(context_settings=_CONTEXT)
@click.option(
    "--channel",
    multiple=True,
    metavar="NAME",
    help="a channel to serve at /NAME (repeatable, or comma-separated)  "
    "[env var: BOTMESH_GATEWAY_CHANNELS]",
)
@click.option(
    "--host",
    default="127.0.0.1",
    envvar="BOTMESH_GATEWAY_HOST",
    show_envvar=True,
    help="address to listen on (0.0.0.0 in a container)",
)
@click.option(
    "--port",
    type=int,
    default=8080,
    envvar="BOTMESH_GATEWAY_PORT",
    show_envvar=True,
    help="port to listen on",
)
@click.option(
    "--public-url",
    envvar="BOTMESH_GATEWAY_PUBLIC_URL",
    show_envvar=True,
    help="the URL the channels call, without the channel path (Twilio signs it)",
)
@_connection
@click.option("--max-body", type=int, default=1 << 20, help="largest body in bytes (then 413)")
@click.option(
    "--request-timeout",
    type=float,
    default=10.0,
    help="seconds a webhook may take, broker ack included (then 503)",
)
@click.option(
    "--seen-max", type=int, default=200_000, help="event ids remembered to drop retried webhooks"
)
@click.option("--loglevel", default="info", help="log level")
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    help="log lines: text, or one JSON object a line  [env var: BOTMESH_LOG_FORMAT; default: text]",
)
@_invoke("gateway")
def gateway() -> None:
    """Receive the channels' webhooks and produce them to <prefix>.inbound: GET|POST
    /<channel> for each channel, /healthz, /readyz, /metrics."""


@cli.command(context_settings=_CONTEXT)
@_connection
@click.option(
    "--host",
    default="127.0.0.1",
    envvar="BOTMESH_CONSOLE_HOST",
    show_envvar=True,
    help="address to listen on (another than this host's: anyone who reaches it reads the "
    "group and the dead letters)",
)
@click.option(
    "--port",
    type=int,
    default=8470,
    envvar="BOTMESH_CONSOLE_PORT",
    show_envvar=True,
    help="port to listen on (0: any free port, printed)",
)
@click.option(
    "--token-file",
    metavar="FILE",
    help="the operators' tokens, one a line (NAME:TOKEN or TOKEN): one of them is needed to "
    "retry, replay or discard; without a token the console is read-only  "
    "[env var: BOTMESH_CONSOLE_TOKEN or BOTMESH_CONSOLE_TOKEN_FILE]",
)
@click.option("--read-only", is_flag=True, help="no retry, replay or discard, whatever the token")
@click.option("--show-texts", is_flag=True, help="show message texts (else: hidden (N chars))")
@click.option(
    "--timeout",
    type=float,
    default=10.0,
    help="seconds each request to the broker may take (then the page says so)",
)
@click.option(
    "--wait",
    type=float,
    default=30.0,
    help="seconds an action waits for the chats' owners to answer (then: no answer)",
)
@click.option("--loglevel", default="info", help="log level")
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    help="log lines: text, or one JSON object a line  [env var: BOTMESH_LOG_FORMAT; default: text]",
)
@_invoke("console")
def console() -> None:
    """Serve the ops console, a web page: the group, its lag, a chat's timeline, the dead
    letters (retry, replay, discard through their owners), a replay's plan."""


@cli.command(context_settings=_CONTEXT)
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
def completion(shell: str) -> None:
    """Print the shell completion script: eval "$(botmesh completion bash)"."""
    from click.shell_completion import get_completion_class

    complete = get_completion_class(shell)
    assert complete is not None
    click.echo(complete(cli, {}, "botmesh", "_BOTMESH_COMPLETE").source())

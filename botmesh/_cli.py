"""The ``botmesh`` command line (also ``python -m botmesh``).

    botmesh run --app botmesh.examples.echo_bot:bot [--provider ...] [--journal URL] [--chat ID]
                [--json] [--instance-id ID]                the bot in this process, on stdin
    botmesh worker --app botmesh.examples.echo_bot:bot [--provider console|mock|module:attr]
                   [--journal URL] [--instance-id ID] [--bootstrap H:P] [--prefix P]
                   [--data-dir D] [--web-port N] [--partitions N] [--batch-size N]
                   [--guarantee at_least_once|exactly_once]
    botmesh topics create [--prefix P] [--bootstrap H:P] [--partitions N] [--replication N]
    botmesh topics list   [--prefix P] [--bootstrap H:P] [--all]
    botmesh produce [-n 100] [--chats 10] [--text T --chat-id C]  demo traffic or given texts
    botmesh send --chat-id ID --text T [--key K] [--id ID] [--media-url U] [--option K=V]
                                                          a send from outside a handler
    botmesh receipts [--from-beginning] [--limit N]       tail <prefix>.sent
    botmesh dlq list|show|retry|replay|discard [--chat C] [--key K] [--reason R]
                [--since T] [--until T] [--dry-run] [--json]  dead letters (``_dlq_cli``)
    botmesh flows restart|drop --chat-id C [--chat-id C2 ...] [--json]
                                                          a chat's flow, by its owner
    botmesh replay (--from-offset N | --from-time T | --to-earliest) [--topic inbound|requests]
                   [--partition P ...] [--force] [--dry-run] [--json]
                                                          reset the worker group's offsets
    botmesh status [--no-journal] [--json]                group, lag, journal, dead letters
    botmesh metrics [--json]                              the workers' counters
    botmesh gateway --channel NAME [--channel NAME ...] [--host H] [--port N]
                    [--public-url URL] [--bootstrap H:P] [--prefix P]
                                                          the channels' webhooks → inbound

Exit statuses (``botmesh._exit``): 0 ok, 1 refused (a precondition, e.g. live members), 2 a
usage error, 3 the broker unreachable.

``run`` runs the bot in this process (``botmesh.run``), with stdin as its transport: each
line is one inbound message (plain text to ``--chat``, or with ``--json`` an inbound record
as on the inbound topic), and the sends go to the provider (``console`` prints them). Its
journal defaults to ``file://<data dir>/console.journal``, so a message handled before is
answered from the outbox after a restart, not twice; ``--journal memory://`` keeps nothing,
``--journal none`` runs without a journal.

The worker loads a bot *definition* (``--app``) and supplies what it runs on: the provider
(``--provider`` / ``BOTMESH_PROVIDER``, default ``console``; a channel name such as
``telegram`` builds that channel's adapter from its environment variables,
``botmesh.providers.channels``), the journal (``--journal`` /
``BOTMESH_JOURNAL``, default ``kafka``: the journal on Kafka itself, a changelogged table
the group shares; or ``file:///path`` for one worker alone; never none and never
``memory://``) and the instance id (``--instance-id`` / ``BOTMESH_INSTANCE_ID``).
Options default to the environment: ``KAFKA_BOOTSTRAP_SERVERS`` (``127.0.0.1:9092``),
``BOTMESH_TOPIC_PREFIX`` (``botmesh``), ``BOTMESH_DATA_DIR``, ``BOTMESH_WEB_PORT`` (see
``botmesh.streams.config``). Kafka code is imported only by the commands that need it.

``gateway`` (``botmesh._gateway``) serves ``GET|POST /<channel>`` for each ``--channel`` (or
``BOTMESH_GATEWAY_CHANNELS=telegram,whatsapp``), verifies each webhook with the channel's
secret (from the environment only: a missing one exits 2 naming the variable) and produces
its records to ``<prefix>.inbound``, answering the channel once the broker acked them.

``send`` produces one send request on ``<prefix>.requests`` (acks=all; the worker that owns
the chat journals and delivers it in order with the chat's other sends) and prints the
request id and the send's idempotency key (``--key``, else ``req:<request id>``): run it
again with the same ``--id`` or ``--key`` and the bot still sends once.
"""

# Kafka/Faust load only in the commands that need them (import cost ~1 s):
# ruff: noqa: PLC0415

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import json
import os
import signal
import sys
import threading
import uuid
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from botmesh._dlq_cli import add_dlq, add_flows, run_dlq, run_flows
from botmesh._exit import Exit
from botmesh._version import __version__
from botmesh.settings import apply_config_file
from botmesh.state.errors import AppLoadError
from botmesh.state.messages import Inbound
from botmesh.state.ports import Provider
from botmesh.topics.catalog import DEFAULT_PARTITIONS, Catalog, check_prefix, prefix_from_env

if TYPE_CHECKING:
    from botmesh.streams.runner import BotDefinition

__all__ = ["load_app", "load_provider", "main"]

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
BUILTIN_PROVIDERS = ("console", "mock")


def _import(spec: str, option: str, what: str) -> tuple[ModuleType, str, object]:
    """Import ``module:attribute`` for ``option`` (the current directory is importable,
    like uvicorn); returns the module, the attribute path and the object."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise AppLoadError(f"{option} {spec!r}: expected 'module:attribute', e.g. '{what}'")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module_name.startswith(exc.name):
            raise AppLoadError(
                f"{option} {spec!r}: cannot import module {module_name!r} ({exc}); check the "
                "spelling, run from the directory that holds it, or add that directory to "
                "PYTHONPATH"
            ) from None
        raise AppLoadError(
            f"{option} {spec!r}: module {module_name!r} failed to import: {exc}; install the "
            "missing package"
        ) from None
    try:
        obj: object = module
        for part in attr.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        names = sorted(n for n in vars(module) if not n.startswith("_"))
        raise AppLoadError(
            f"{option} {spec!r}: module {module_name!r} has no attribute {attr!r} "
            f"(it has: {', '.join(names[:12]) or 'nothing public'}); name the right "
            "variable after the colon"
        ) from None
    return module, attr, obj


def load_app(spec: str) -> BotDefinition:
    """The bot definition ``--app module:attribute`` names (a ``botmesh.Bot``)."""
    from botmesh.streams.runner import BotDefinition

    module, attr, obj = _import(spec, "--app", "botmesh.examples.echo_bot:bot")
    if not isinstance(obj, BotDefinition):
        raise AppLoadError(
            f"--app {spec!r}: {module.__name__}.{attr} is a {type(obj).__name__}, not a bot; "
            'it must be a botmesh.Bot (define `bot = Bot("my-bot")` in the module; the '
            "worker supplies the provider and the journal)"
        )
    return obj


def load_provider(spec: str, option: str = "--provider") -> Provider:
    """The provider ``spec`` names: ``console`` (``BOTMESH_CONSOLE_QUIET=1``: count, do not
    print), ``mock``, a channel of ``botmesh.providers.channels`` (``telegram``, ``whatsapp``…,
    built
    from the environment by ``provider_from_env``), or ``module:attribute`` naming a provider
    or a zero-argument factory."""
    from botmesh.providers.channels import CHANNELS, provider_from_env
    from botmesh.state.errors import ConfigError

    name = spec.strip()
    if name.lower() in CHANNELS:
        try:
            return provider_from_env(name, os.environ)
        except ConfigError as exc:  # names the variable (or the missing adapter) and the fix
            raise AppLoadError(f"{option} {spec!r}: {exc}") from None
    if name == "console":
        from botmesh.providers.console import ConsoleProvider

        quiet = os.environ.get("BOTMESH_CONSOLE_QUIET", "").strip() == "1"
        return ConsoleProvider(quiet=quiet)
    if name == "mock":
        from botmesh.providers.mock import MockProvider

        return MockProvider()
    if ":" not in name:
        raise AppLoadError(
            f"{option} {spec!r}: expected one of {', '.join(BUILTIN_PROVIDERS)}, a channel "
            f"({', '.join(sorted(CHANNELS))}), or 'module:attribute' naming a provider "
            "instance or a zero-argument factory"
        )
    module, attr, obj = _import(name, option, "mychannel:provider")
    where = f"{module.__name__}.{attr}"
    if isinstance(obj, type) or (not isinstance(obj, Provider) and callable(obj)):
        try:
            obj = obj()
        except Exception as exc:
            raise AppLoadError(
                f"{option} {spec!r}: calling {where}() failed: {type(exc).__name__}: {exc}; "
                "name a provider instance or a factory that takes no arguments"
            ) from None
    if not isinstance(obj, Provider):
        raise AppLoadError(
            f"{option} {spec!r}: {where} gave a {type(obj).__name__}, not a provider; it "
            "must have `name`, `text_limit` and `async def send(message)` (see "
            "botmesh.Provider), or be a zero-argument factory returning one"
        )
    return obj


def _bootstrap(args: argparse.Namespace) -> str:
    value: str = args.bootstrap or os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "").strip()
    return value or DEFAULT_BOOTSTRAP


def _catalog(args: argparse.Namespace) -> Catalog:
    prefix = args.prefix if args.prefix else prefix_from_env()
    return Catalog(check_prefix(prefix))


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bootstrap", help="Kafka bootstrap servers (env KAFKA_BOOTSTRAP_SERVERS)")
    p.add_argument("--prefix", help="topic prefix (env BOTMESH_TOPIC_PREFIX, default botmesh)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="botmesh", description="Durable chat bots on Apache Kafka."
    )
    parser.add_argument("--version", action="version", version=f"botmesh {__version__}")
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="a configuration file (TOML) whose settings apply under the environment's "
        "(env BOTMESH_CONFIG; the settings: python -m botmesh.settings)",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    c = sub.add_parser("run", help="run a bot in this process, one inbound message per stdin line")
    c.add_argument("--app", required=True, help="the bot definition, as module:attribute")
    c.add_argument("--provider", help="console (default), mock, or module:attribute")
    c.add_argument(
        "--journal",
        type=_run_journal_arg,
        help="journal URL (default file://<data dir>/console.journal?append_log=true); "
        "memory:// keeps nothing across runs, none runs without a journal",
    )
    c.add_argument("--data-dir", help="where the default journal lives (env BOTMESH_DATA_DIR)")
    c.add_argument("--chat", default="console", help="chat id of plain-text lines")
    c.add_argument("--json", action="store_true", help="each line is an inbound record (JSON, v 1)")
    c.add_argument("--instance-id", help="lease owner (default the runtime's)")

    w = sub.add_parser("worker", help="run a bot on the inbound topic (Faust worker)")
    w.add_argument("--app", required=True, help="the bot definition, as module:attribute")
    w.add_argument(
        "--provider",
        help="console (default), mock, a channel name (telegram, whatsapp, …: its adapter, "
        "configured from the environment), or module:attribute naming a provider or a "
        "zero-argument factory (env BOTMESH_PROVIDER)",
    )
    w.add_argument(
        "--journal",
        type=_journal_arg,
        help="the journal: kafka (the default: on Kafka itself, shared by the group) or "
        "file:///path (one worker alone); never none, never memory:// (env BOTMESH_JOURNAL)",
    )
    w.add_argument(
        "--instance-id",
        help="lease owner and static group member id: stable across restarts, unique per "
        "replica (env BOTMESH_INSTANCE_ID; default the runtime's)",
    )
    _common(w)
    w.add_argument(
        "--data-dir",
        help="Faust's files: the journal's RocksDB copy (env BOTMESH_DATA_DIR; default "
        "./botmesh-data)",
    )
    w.add_argument("--web-port", type=int, help="Faust web server on 127.0.0.1:PORT (default off)")
    w.add_argument("--partitions", type=int, help="partitions of topics the worker creates")
    w.add_argument("--batch-size", type=int, help="records per batch (default 500)")
    w.add_argument(
        "--guarantee",
        choices=["at_least_once", "exactly_once"],
        help="Faust's processing guarantee (env BOTMESH_PROCESSING_GUARANTEE; default "
        "at_least_once); exactly_once commits the journal in Kafka transactions",
    )
    w.add_argument("--loglevel", help="log level (default info)")

    t = sub.add_parser("topics", help="create or list the topics of a prefix")
    tsub = t.add_subparsers(dest="action", required=True, metavar="ACTION")
    tc = tsub.add_parser("create", help="create the catalog's topics (idempotent)")
    _common(tc)
    tc.add_argument("--partitions", type=int, default=DEFAULT_PARTITIONS)
    tc.add_argument("--replication", type=int, default=1)
    tl = tsub.add_parser("list", help="the catalog's topics and whether they exist")
    _common(tl)
    tl.add_argument("--partitions", type=int, default=DEFAULT_PARTITIONS)

    p = sub.add_parser("produce", help="produce demo inbound messages (N over M chats)")
    _common(p)
    p.add_argument("-n", "--messages", type=int, default=100)
    p.add_argument("--chats", type=int, default=10)
    p.add_argument("--run", help="id prefix of the messages (default random)")
    p.add_argument(
        "--text",
        action="append",
        default=[],
        help="produce this text instead of demo messages (repeatable: one message each, in "
        "order, to --chat-id), e.g. --text /signup --text Ann",
    )
    p.add_argument("--chat-id", default="chat-0", help="the chat of the --text messages")

    s = sub.add_parser(
        "send", help="ask the bot to send to a chat (a request on <prefix>.requests)"
    )
    _common(s)
    s.add_argument("--chat-id", required=True, help="the chat to send to")
    s.add_argument("--text", help="the text to send (--text or --media-url is required)")
    s.add_argument("--media-url", help="a media URL to send with the text, or instead of it")
    s.add_argument("--media-mime", help="the media's MIME type, e.g. image/png")
    s.add_argument("--key", help="the send's idempotency key (default req:<request id>); no '#'")
    s.add_argument(
        "--id",
        dest="request_id",
        help="the request id (default random); the same id again sends once",
    )
    s.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a channel option passed to the provider (repeatable; VALUE is JSON if it "
        "parses, else a string)",
    )

    add_dlq(sub, _common)
    add_flows(sub, _common)

    r = sub.add_parser("receipts", help="tail the sent-receipts topic (JSON lines)")
    _common(r)
    r.add_argument("--from-beginning", action="store_true")
    r.add_argument("--limit", type=int, help="stop after N receipts")
    r.add_argument("--idle", type=float, help="stop after SECONDS without a receipt")
    _operator_commands(sub)
    _gateway_command(sub)
    return parser


def _gateway_command(sub: Any) -> None:
    g = sub.add_parser(
        "gateway",
        help="receive the channels' webhooks and produce them to <prefix>.inbound",
        description="An HTTP server: GET|POST /<channel> for each channel, /healthz, /readyz, "
        "/metrics. Each webhook is verified with the channel's secret (environment "
        "variables only) and answered once the broker acked its records.",
    )
    g.add_argument(
        "--channel",
        action="append",
        default=[],
        metavar="NAME",
        help="a channel to serve at /NAME (repeatable, or comma-separated; env "
        "BOTMESH_GATEWAY_CHANNELS)",
    )
    g.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    g.add_argument("--port", type=int, default=8080, help="port to listen on (8080)")
    g.add_argument(
        "--public-url",
        help="the URL the channels call, without the channel path (e.g. "
        "https://hooks.example.com); Twilio signs it (env BOTMESH_GATEWAY_PUBLIC_URL)",
    )
    _common(g)
    g.add_argument("--max-body", type=int, help="largest body in bytes (default 1 MiB; 413)")
    g.add_argument(
        "--request-timeout",
        type=float,
        help="seconds a webhook may take, broker ack included (default 10; then 503)",
    )
    g.add_argument(
        "--seen-max",
        type=int,
        help="produced event ids remembered to drop retried webhooks (default 200000)",
    )
    g.add_argument("--loglevel", default="info", help="log level (default info)")


def _operator(p: argparse.ArgumentParser) -> None:
    _common(p)
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    p.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        help="seconds each request to the broker may take (default 10; then exit 3)",
    )


def _operator_commands(sub: Any) -> None:
    rp = sub.add_parser(
        "replay",
        help="reset the worker group's offsets (<prefix>.worker) to replay records",
        description="Reset the committed offsets of the worker group on the inbound (and/or "
        "requests) topic. Refused (exit 1) while the group lists members, unless --force. "
        "The journal answers what it handled already: handlers run again, no send goes out "
        "twice.",
    )
    where = rp.add_mutually_exclusive_group(required=True)
    where.add_argument("--from-offset", type=int, metavar="N", help="this offset (clamped)")
    where.add_argument(
        "--from-time",
        metavar="TIME",
        help="the first record at or after TIME: ISO 8601 (no zone: UTC) or epoch seconds",
    )
    where.add_argument("--to-earliest", action="store_true", help="the earliest retained record")
    rp.add_argument(
        "--topic",
        action="append",
        choices=["inbound", "requests"],
        help="the topic to reset (repeatable; default inbound)",
    )
    rp.add_argument(
        "--partition",
        action="append",
        type=int,
        metavar="P",
        help="only this partition (repeatable; default all)",
    )
    rp.add_argument(
        "--force",
        action="store_true",
        help="remove the group's listed members first (their workers must be stopped)",
    )
    rp.add_argument(
        "--dry-run", action="store_true", help="print the offsets it would set; change nothing"
    )
    _operator(rp)
    st = sub.add_parser(
        "status", help="the worker group, its lag, the journal and the dead letters"
    )
    st.add_argument(
        "--no-journal",
        action="store_true",
        help="do not read the journal's changelog (no journal size, no ambiguous sends)",
    )
    _operator(st)
    mt = sub.add_parser("metrics", help="the counters each worker published on <prefix>.metrics")
    _operator(mt)


def _journal_arg(value: str) -> str:
    from botmesh.streams.config import check_worker_journal

    try:
        return check_worker_journal(value, "--journal")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _run_journal_arg(value: str) -> str:
    """A journal URL, or ``none`` (no journal: the explicit opt-out)."""
    from botmesh.state.backends import check_url
    from botmesh.state.errors import ConfigError

    value = value.strip()
    if value.lower() == "none":
        return "none"
    try:
        return check_url(value)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(f"--journal {value!r}: {exc.message}") from None


def _provider_of(args: argparse.Namespace) -> Provider:
    if args.provider is not None:
        return load_provider(args.provider)
    spec = os.environ.get("BOTMESH_PROVIDER", "").strip()
    return load_provider(spec, "BOTMESH_PROVIDER") if spec else load_provider("console")


def _cmd_run(args: argparse.Namespace) -> int:
    from botmesh._bot import Bot
    from botmesh._console import run_console

    bot = load_app(args.app)
    if not isinstance(bot, Bot):
        raise AppLoadError(f"--app {args.app!r}: `botmesh run` runs a botmesh.Bot")
    provider = _provider_of(args)
    journal: str | None = args.journal
    if journal is None:  # the default: a file journal in the data dir
        env = os.environ.get("BOTMESH_DATA_DIR", "").strip()
        data_dir = Path(args.data_dir or env or "botmesh-data").resolve()
        data_dir.mkdir(parents=True, exist_ok=True)
        journal = f"file://{data_dir}/console.journal?append_log=true"
    elif journal == "none":
        journal = None
    return asyncio.run(
        run_console(
            bot,
            provider,
            journal=journal,
            chat=args.chat,
            json_lines=args.json,
            instance_id=args.instance_id,
        )
    )


def _stop_on_sigterm_until_started() -> None:
    """SIGTERM while ``botmesh worker`` starts (its bot module and Faust being imported, the
    topics provisioned) ends it with status 0: nothing has been consumed yet. Python's
    default would end it by the signal (status 143, or -15 to a parent), which a supervisor
    takes for a crash. Faust's handlers replace this one once its event loop runs; this
    stop has ``BOTMESH_STOP_TIMEOUT`` seconds too."""

    def stop(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one: the stop goes on
        print(
            "botmesh worker: SIGTERM before the worker started consuming: stopped, "
            "nothing consumed",
            file=sys.stderr,
            flush=True,
        )
        try:
            limit = float(os.environ.get("BOTMESH_STOP_TIMEOUT", "").strip() or 30)
        except ValueError:
            limit = 30.0
        # the status of a stop past its limit (``botmesh.streams.worker.EXIT_SOFTWARE``)
        timer = threading.Timer(limit, os._exit, (70,))
        timer.daemon = True
        timer.start()
        raise SystemExit(Exit.OK)

    signal.signal(signal.SIGTERM, stop)
    print("botmesh worker: starting", file=sys.stderr, flush=True)


def _cmd_worker(args: argparse.Namespace) -> int:
    from botmesh.streams.config import WorkerConfig

    _stop_on_sigterm_until_started()
    bot = load_app(args.app)
    provider = _provider_of(args)
    if args.instance_id is not None and not args.instance_id.strip():
        raise ValueError("--instance-id: must not be empty; leave it out for the default")
    config = WorkerConfig.from_env(
        bootstrap=args.bootstrap,
        prefix=check_prefix(args.prefix) if args.prefix else None,
        data_dir=Path(args.data_dir) if args.data_dir else None,
        journal=args.journal,
        instance_id=args.instance_id,
        web_port=args.web_port,
        partitions=args.partitions,
        batch_size=args.batch_size,
        loglevel=args.loglevel,
        guarantee=args.guarantee,
    )
    from botmesh.streams.worker import run_worker

    run_worker(bot, provider, config)
    return 0


def _cmd_topics(args: argparse.Namespace) -> int:
    from botmesh.streams.provision import ensure_topics, existing_topics

    cat, bootstrap = _catalog(args), _bootstrap(args)
    if args.action == "create":
        specs = cat.specs_beside(existing_topics(bootstrap), args.partitions, args.replication)
        result = ensure_topics(bootstrap, specs)
        for name in result.created:
            print(f"created  {name}")
        for name in result.existing:
            print(f"exists   {name}")
        for name, (want, got) in result.mismatched.items():
            print(f"note     {name} has {got} partitions (asked {want}); left as is")
        return 0
    have = existing_topics(bootstrap)
    for spec in cat.specs(args.partitions):
        state = f"{have[spec.name]} partitions" if spec.name in have else "missing"
        policy = spec.config.get("cleanup.policy", "delete")
        print(f"{spec.name:<50} {spec.role:<10} {policy:<8} {state}")
    return 0


def _cmd_produce(args: argparse.Namespace) -> int:
    from botmesh.streams.tools import demo_records, produce_inbound

    cat, bootstrap = _catalog(args), _bootstrap(args)
    run = args.run or f"run{uuid.uuid4().hex[:6]}"
    records = text_records(args.text, args.chat_id, run) if args.text else None
    if records is None:
        records = demo_records(args.messages, args.chats, run=run)
    took = asyncio.run(produce_inbound(bootstrap, cat.inbound, records))
    rate = len(records) / took if took > 0 else 0.0
    chats = 1 if args.text else args.chats
    print(
        f"produced {len(records)} messages over {chats} chats to {cat.inbound} "
        f"(ids {run}-0..) in {took:.2f} s ({rate:.0f} msg/s)"
    )
    return 0


def text_records(texts: list[str], chat_id: str, run: str) -> list[Inbound]:
    """``botmesh produce --text``: one inbound per text, in order, to one chat."""
    return [Inbound(id=f"{run}-{i}", chat_id=chat_id, text=t) for i, t in enumerate(texts)]


def _options(pairs: list[str]) -> dict[str, object]:
    out: dict[str, object] = {}
    for pair in pairs:
        name, sep, raw = pair.partition("=")
        if not sep or not name:
            raise ValueError(f"--option {pair!r}: expected NAME=VALUE, e.g. parse_mode=HTML")
        try:
            out[name] = json.loads(raw)
        except ValueError:
            out[name] = raw
    return out


def _cmd_send(args: argparse.Namespace) -> int:
    from botmesh.state.messages import Media
    from botmesh.streams.tools import request_send
    from botmesh.topics.records import REQUEST_KEY_PREFIX

    cat, bootstrap = _catalog(args), _bootstrap(args)
    if args.text is None and args.media_url is None:
        raise ValueError("give --text, --media-url, or both")
    media = Media(url=args.media_url, mime=args.media_mime) if args.media_url else None
    request_id = asyncio.run(
        request_send(
            bootstrap,
            cat.prefix,
            args.chat_id,
            args.text,
            key=args.key,
            media=media,
            options=_options(args.option),
            request_id=args.request_id,
        )
    )
    key = args.key if args.key is not None else REQUEST_KEY_PREFIX + request_id
    print(f"request {request_id} key {key} (chat {args.chat_id}, on {cat.requests})")
    return 0


def _cmd_receipts(args: argparse.Namespace) -> int:
    from botmesh.streams.tools import tail_receipts

    cat, bootstrap = _catalog(args), _bootstrap(args)

    async def tail() -> None:
        n = 0
        async for seen in tail_receipts(
            bootstrap, cat.sent, from_beginning=args.from_beginning, idle_timeout=args.idle
        ):
            r = seen.receipt
            print(
                json.dumps(
                    {
                        "key": r.key,
                        "chat_id": r.chat_id,
                        "message_id": r.message_id,
                        "state": r.state,
                        "inbound_id": r.inbound_id,
                        "part": r.part,
                        "ts": r.ts,
                    }
                ),
                flush=True,
            )
            n += 1
            if args.limit is not None and n >= args.limit:
                return

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(tail())
    return 0


def _cmd_dlq(args: argparse.Namespace) -> int:
    return run_dlq(args, _catalog(args), _bootstrap(args))


def _cmd_flows(args: argparse.Namespace) -> int:
    return run_flows(args, _catalog(args), _bootstrap(args))


def _cmd_operator(args: argparse.Namespace) -> int:
    from botmesh import _ops

    run = {"replay": _ops.cmd_replay, "status": _ops.cmd_status, "metrics": _ops.cmd_metrics}
    if args.timeout <= 0:
        raise ValueError(f"--timeout {args.timeout:g}: must be a positive number of seconds")
    return run[args.command](args, _bootstrap(args), _catalog(args))


def _replication_env() -> int:
    raw = os.environ.get("BOTMESH_REPLICATION", "").strip() or "1"
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"BOTMESH_REPLICATION={raw!r}: must be a whole number >= 1")
    return int(raw)


def _cmd_gateway(args: argparse.Namespace) -> int:
    import logging

    from botmesh import _gateway
    from botmesh.providers.channels import CHANNELS, webhook_from_env

    raw = args.channel or [os.environ.get("BOTMESH_GATEWAY_CHANNELS", "")]
    names = [n.strip().lower() for item in raw for n in item.split(",") if n.strip()]
    if not names:
        raise ValueError(
            "name the channels to serve: --channel NAME (repeatable) or "
            f"BOTMESH_GATEWAY_CHANNELS=a,b; known: {', '.join(sorted(CHANNELS))}"
        )
    webhooks = {name: webhook_from_env(name, os.environ) for name in dict.fromkeys(names)}
    public_url = args.public_url or os.environ.get("BOTMESH_GATEWAY_PUBLIC_URL", "").strip()
    config = _gateway.GatewayConfig(
        bootstrap=_bootstrap(args),
        prefix=_catalog(args).prefix,
        public_url=public_url or None,
        max_body=args.max_body if args.max_body is not None else _gateway.DEFAULT_MAX_BODY,
        request_timeout=args.request_timeout
        if args.request_timeout is not None
        else _gateway.DEFAULT_REQUEST_TIMEOUT,
        seen_max=args.seen_max if args.seen_max is not None else _gateway.DEFAULT_SEEN_MAX,
        replication=_replication_env(),
    )
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port {args.port}: must be 0-65535")
    logging.basicConfig(
        level=args.loglevel.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    return _gateway.run_gateway(_gateway.Gateway(webhooks, config), args.host, args.port)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    commands = {
        "run": _cmd_run,
        "worker": _cmd_worker,
        "topics": _cmd_topics,
        "produce": _cmd_produce,
        "send": _cmd_send,
        "receipts": _cmd_receipts,
        "dlq": _cmd_dlq,
        "flows": _cmd_flows,
        "replay": _cmd_operator,
        "status": _cmd_operator,
        "metrics": _cmd_operator,
        "gateway": _cmd_gateway,
    }
    try:
        apply_config_file(args.config)
        return commands[args.command](args)
    except AppLoadError as exc:
        print(f"botmesh: {exc}", file=sys.stderr)
        return Exit.USAGE
    except ConnectionError as exc:
        print(f"botmesh {args.command}: {exc}", file=sys.stderr)
        return Exit.UNREACHABLE
    except (ValueError, LookupError) as exc:
        print(f"botmesh {args.command}: {exc}", file=sys.stderr)
        return Exit.USAGE
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""The ``botmesh`` command line (also ``python -m botmesh``).

    botmesh run --app botmesh.examples.echo_bot:bot [--provider ...] [--journal URL]
                [--chat-id ID] [--records] [--instance-id ID]  the bot in this process, on stdin
    botmesh worker --app botmesh.examples.echo_bot:bot [--provider console|mock|module:attr]
                   [--journal URL] [--instance-id ID] [--bootstrap H:P] [--prefix P]
                   [--data-dir D] [--http-port N] [--partitions N] [--batch-size N]
                   [--guarantee at_least_once|exactly_once]
    botmesh topics create [--prefix P] [--bootstrap H:P] [--partitions N] [--replication N]
    botmesh topics list   [--prefix P] [--bootstrap H:P] [--all]
    botmesh produce [-n 100] [--chats 10] [--text T --chat-id C]  demo traffic or given texts
    botmesh send --chat-id ID --text T [--key K] [--id ID] [--media-url U] [--option K=V]
                                                          a send from outside a handler
    botmesh receipts [--from-beginning] [--limit N]       tail <prefix>.sent
    botmesh dlq list|show|retry|replay|discard [--chat-id C] [--key K] [--reason R]
                [--since T] [--until T] [--dry-run] [--wait S] [--json]  dead letters
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
    botmesh console [--host H] [--port 8470] [--token-file F] [--read-only] [--show-texts]
                                                          the ops console, a web page

The command tree, its options and shell completion are in ``botmesh._commands`` (Click);
this module holds what each command does. Exit statuses (``botmesh._exit``): 0 ok, 1
refused (a precondition, e.g. live members), 2 a usage error, 3 the broker unreachable or
refusing this client, 4 no answer from a chat's owner.

``run`` runs the bot in this process (``botmesh.run``), with stdin as its transport: each
line is one inbound message (plain text to ``--chat-id``, or with ``--records`` an inbound record
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

# the Kafka client loads only in the commands that need them (import cost ~1 s):
# ruff: noqa: PLC0415

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import os
import sys
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from types import SimpleNamespace as Args
from typing import TYPE_CHECKING, Any

from botmesh._dlq_cli import run_dlq, run_flows
from botmesh._exit import Exit, command_of, stop_on_sigterm_until_started
from botmesh.state.errors import AppLoadError, DurabilityError
from botmesh.state.messages import Inbound
from botmesh.state.ports import Provider
from botmesh.topics.catalog import Catalog, check_prefix, prefix_from_env

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


def _bootstrap(args: Args) -> str:
    value: str = args.bootstrap or os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "").strip()
    return value or DEFAULT_BOOTSTRAP


def _catalog(args: Args) -> Catalog:
    prefix = args.prefix if args.prefix else prefix_from_env()
    return Catalog(check_prefix(prefix))


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
        raise ValueError(f"--journal {value!r}: {exc.message}") from None


def _provider_of(args: Args) -> Provider:
    if args.provider is not None:
        return load_provider(args.provider)
    spec = os.environ.get("BOTMESH_PROVIDER", "").strip()
    return load_provider(spec, "BOTMESH_PROVIDER") if spec else load_provider("console")


def fallbacks_of_env() -> dict[str, Provider]:
    """The channels a send's ``Fallback`` may name (``BOTMESH_FALLBACK_PROVIDERS``): a comma
    list of provider specs as ``--provider`` takes them, each ``name=spec`` or a bare
    channel (named by itself): ``twilio,backup=mychannel:provider``."""
    option = "BOTMESH_FALLBACK_PROVIDERS"
    found: dict[str, Provider] = {}
    for item in os.environ.get(option, "").split(","):
        if not item.strip():
            continue
        name, eq, spec = item.partition("=")
        name = name.strip()
        spec = spec.strip() if eq else name
        if not name or not spec:
            raise AppLoadError(f"{option} {item.strip()!r}: expected name=spec or a channel name")
        if name in found:
            raise AppLoadError(f"{option}: the fallback channel {name!r} is named twice")
        found[name] = load_provider(spec, option)
    return found


def _cmd_run(args: Args) -> int:
    from botmesh._bot.bot import Bot
    from botmesh._console import run_console

    bot = load_app(args.app)
    if not isinstance(bot, Bot):
        raise AppLoadError(f"--app {args.app!r}: `botmesh run` runs a botmesh.Bot")
    provider = _provider_of(args)
    journal = _run_journal_arg(args.journal) if args.journal is not None else None
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
            chat=args.chat_id,
            json_lines=args.records,
            instance_id=args.instance_id,
            fallbacks=fallbacks_of_env(),
        )
    )


def _cmd_worker(args: Args) -> int:
    from botmesh.observability import logs, tracing
    from botmesh.streams.config import WorkerConfig, check_worker_journal

    if args.journal is not None:
        check_worker_journal(args.journal, "--journal")
    log_format = logs.log_format(args.log_format)
    stop_on_sigterm_until_started()  # done already when started as python -m botmesh
    bot = load_app(args.app)
    provider = _provider_of(args)
    fallbacks = fallbacks_of_env()
    if args.instance_id is not None and not args.instance_id.strip():
        raise ValueError("--instance-id: must not be empty; leave it out for the default")
    config = WorkerConfig.from_env(
        bootstrap=args.bootstrap,
        prefix=check_prefix(args.prefix) if args.prefix else None,
        data_dir=Path(args.data_dir) if args.data_dir else None,
        journal=args.journal,
        instance_id=args.instance_id,
        http_host=args.http_host,
        http_port=args.http_port,
        partitions=args.partitions,
        batch_size=args.batch_size,
        loglevel=args.loglevel,
        guarantee=args.guarantee,
    )
    logs.setup_logging(config.loglevel, log_format)
    tracing.configure("botmesh-worker")  # after the bot module: a provider it installed counts
    from botmesh.streams.worker.loop import run_worker

    return run_worker(
        bot,
        provider,
        config,
        fallbacks=fallbacks,
        # the record's log context and span: nothing reads them under text lines untraced
        record_scope=logs.record_scope if log_format == "json" or tracing.ENABLED else None,
        journal_written=tracing.journal_write if tracing.ENABLED else None,
    )


def _count(value: int | None, option: str, env: str, default: int) -> int:
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


def _cmd_topics(args: Args) -> int:
    from botmesh.streams.provision import ensure_topics, existing_topics
    from botmesh.topics.catalog import DEFAULT_PARTITIONS

    cat, bootstrap = _catalog(args), _bootstrap(args)
    partitions = _count(args.partitions, "--partitions", "BOTMESH_PARTITIONS", DEFAULT_PARTITIONS)
    if args.action == "create":
        replication = _count(args.replication, "--replication", "BOTMESH_REPLICATION", 1)
        specs = cat.specs_beside(existing_topics(bootstrap), partitions, replication)
        result = ensure_topics(bootstrap, specs)
        shape = {s.name: (s.partitions, s.replication) for s in specs}
        if args.json:
            print(
                json.dumps(
                    {
                        "created": result.created,
                        "existing": result.existing,
                        "mismatched": {
                            n: {"asked": want, "partitions": got}
                            for n, (want, got) in result.mismatched.items()
                        },
                        "topics": {
                            n: {"partitions": p, "replication": r} for n, (p, r) in shape.items()
                        },
                    }
                )
            )
            return 0
        for name in result.created:
            made = shape[name]
            print(f"created  {name} ({made[0]} partitions, replication {made[1]})")
        for name in result.existing:
            print(f"exists   {name}")
        for name, (want, got) in result.mismatched.items():
            print(f"note     {name} has {got} partitions (asked {want}); left as is")
        return 0
    have = existing_topics(bootstrap)
    if args.json:
        rows = [
            {
                "name": spec.name,
                "role": spec.role,
                "cleanup_policy": spec.config.get("cleanup.policy", "delete"),
                "partitions": have.get(spec.name),
            }
            for spec in cat.specs(partitions)
        ]
        print(json.dumps({"prefix": cat.prefix, "topics": rows}))
        return 0
    for spec in cat.specs(partitions):
        state = f"{have[spec.name]} partitions" if spec.name in have else "missing"
        policy = spec.config.get("cleanup.policy", "delete")
        print(f"{spec.name:<50} {spec.role:<10} {policy:<8} {state}")
    return 0


def _cmd_produce(args: Args) -> int:
    from botmesh.streams.ops.tools import demo_records, produce_inbound

    cat, bootstrap = _catalog(args), _bootstrap(args)
    run = args.run_id or f"run{uuid.uuid4().hex[:6]}"
    records = text_records(list(args.text), args.chat_id, run) if args.text else None
    if records is None:
        records = demo_records(args.messages, args.chats, run=run)
    took = asyncio.run(produce_inbound(bootstrap, cat.inbound, records))
    rate = len(records) / took if took > 0 else 0.0
    chats = 1 if args.text else args.chats
    if args.json:
        summary = {"topic": cat.inbound, "messages": len(records), "chats": chats}
        print(json.dumps({**summary, "ids": [r.id for r in records], "seconds": took}))
        return 0
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


def _cmd_send(args: Args) -> int:
    from botmesh.state.messages import Media
    from botmesh.streams.ops.tools import request_send
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
            options=_options(list(args.option)),
            request_id=args.request_id,
        )
    )
    key = args.key if args.key is not None else REQUEST_KEY_PREFIX + request_id
    if args.json:
        where = {"chat_id": args.chat_id, "topic": cat.requests}
        print(json.dumps({"request_id": request_id, "key": key, **where}))
        return 0
    print(f"request {request_id} key {key} (chat {args.chat_id}, on {cat.requests})")
    return 0


def _cmd_receipts(args: Args) -> int:
    from botmesh.streams.ops.tools import tail_receipts

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


def _cmd_dlq(args: Args) -> int:
    return run_dlq(args, _catalog(args), _bootstrap(args))


def _cmd_flows(args: Args) -> int:
    return run_flows(args, _catalog(args), _bootstrap(args))


def _cmd_erase(args: Args) -> int:
    from botmesh._erase_cli import run_erase

    return run_erase(args, _catalog(args), _bootstrap(args))


def _cmd_operator(args: Args) -> int:
    from botmesh import _ops

    run = {"replay": _ops.cmd_replay, "status": _ops.cmd_status, "metrics": _ops.cmd_metrics}
    if args.timeout <= 0:
        raise ValueError(f"--timeout {args.timeout:g}: must be a positive number of seconds")
    return run[args.command](args, _bootstrap(args), _catalog(args))


def _cmd_gateway(args: Args) -> int:
    from botmesh import _gateway
    from botmesh.observability import logs, tracing
    from botmesh.providers.channels import CHANNELS, webhook_from_env

    raw = list(args.channel) or [os.environ.get("BOTMESH_GATEWAY_CHANNELS", "")]
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
        replication=_count(None, "", "BOTMESH_REPLICATION", 1),
    )
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port {args.port}: must be 0-65535")
    logs.setup_logging(args.loglevel, logs.log_format(args.log_format))
    tracing.configure("botmesh-gateway")
    return _gateway.run_gateway(_gateway.Gateway(webhooks, config), args.host, args.port)


def _console_tokens(token_file: str | None) -> Any:
    """The console's tokens: ``--token-file``, else ``BOTMESH_CONSOLE_TOKEN`` (the
    ``_FILE`` form is read into it at start), else none (read-only)."""
    from botmesh.console import Tokens

    env = os.environ.get("BOTMESH_CONSOLE_TOKEN", "")
    if token_file is not None and env.strip():
        raise ValueError(
            "--token-file and BOTMESH_CONSOLE_TOKEN (or BOTMESH_CONSOLE_TOKEN_FILE) are both "
            "set: keep one"
        )
    if token_file is not None:
        return Tokens.from_file(token_file)
    if env.strip():
        return Tokens.parse(env, "BOTMESH_CONSOLE_TOKEN")
    return Tokens()


def _cmd_console(args: Args) -> int:
    from botmesh.console import ConsoleConfig, serve
    from botmesh.observability import logs

    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port {args.port}: must be 0-65535")
    for option, value in (("--timeout", args.timeout), ("--wait", args.wait)):
        if value <= 0:
            raise ValueError(f"{option} {value:g}: must be a positive number of seconds")
    if not args.host.strip():
        raise ValueError("--host: must not be empty (127.0.0.1 serves this host only)")
    config = ConsoleConfig(
        bootstrap=_bootstrap(args),
        prefix=_catalog(args).prefix,
        host=args.host.strip(),
        port=args.port,
        tokens=_console_tokens(args.token_file),
        read_only=args.read_only,
        show_texts=args.show_texts,
        timeout=args.timeout,
        wait=args.wait,
    )
    logs.setup_logging(args.loglevel, logs.log_format(args.log_format))
    return serve(config)


COMMANDS: dict[str, Callable[[Any], int]] = {
    "run": _cmd_run,
    "worker": _cmd_worker,
    "topics": _cmd_topics,
    "produce": _cmd_produce,
    "send": _cmd_send,
    "receipts": _cmd_receipts,
    "dlq": _cmd_dlq,
    "flows": _cmd_flows,
    "erase": _cmd_erase,
    "replay": _cmd_operator,
    "status": _cmd_operator,
    "metrics": _cmd_operator,
    "gateway": _cmd_gateway,
    "console": _cmd_console,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line (``argv``, else ``sys.argv[1:]``); the exit status."""
    import click

    from botmesh._commands import cli

    args = list(sys.argv[1:] if argv is None else argv)
    command = command_of(args)
    if command == "worker":  # as early as can be: a SIGTERM while it starts is a clean stop
        stop_on_sigterm_until_started()
    try:
        status = cli.main(args=args, prog_name="botmesh", standalone_mode=False)
    except click.exceptions.UsageError as exc:
        exc.show()
        return Exit.USAGE
    except click.exceptions.Abort:
        return 130
    except click.exceptions.ClickException as exc:
        exc.show()
        return exc.exit_code
    except AppLoadError as exc:
        print(f"botmesh: {exc}", file=sys.stderr)
        return Exit.USAGE
    except ConnectionError as exc:
        print(f"botmesh {command}: {exc}", file=sys.stderr)
        return Exit.UNREACHABLE
    except DurabilityError as exc:  # a journal that cannot be opened: its message says why
        print(f"botmesh {command}: the journal: {exc}", file=sys.stderr)
        return Exit.REFUSED
    except (ValueError, LookupError) as exc:
        print(f"botmesh {command}: {exc}", file=sys.stderr)
        return Exit.USAGE
    except KeyboardInterrupt:
        return 130
    return status if isinstance(status, int) else 0


if __name__ == "__main__":
    sys.exit(main())

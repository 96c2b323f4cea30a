"""The ``botmesh`` command line (also ``python -m botmesh``): the root group, every command
added to it, and ``main``, the console script.

    botmesh run --app botmesh.examples.echo_bot:bot [--provider ...] [--journal URL]
                [--chat-id ID] [--records] [--instance-id ID]  the bot in this process, on stdin
    botmesh worker --app botmesh.examples.echo_bot:bot [--provider console|mock|module:attr]
                   [--journal URL] [--instance-id ID] [--bootstrap H:P] [--prefix P]
                   [--data-dir D] [--http-port N] [--partitions N] [--batch-size N]
                   [--guarantee at_least_once|exactly_once]
    botmesh topics create [--prefix P] [--bootstrap H:P] [--partitions N] [--replication N]
    botmesh topics list   [--prefix P] [--bootstrap H:P] [--partitions N]
    botmesh produce [-n 100] [--chats 10] [--text T --chat-id C]  demo traffic or given texts
    botmesh send --chat-id ID --text T [--key K] [--id ID] [--media-url U] [--option K=V]
                                                          a send from outside a handler
    botmesh receipts [--from-beginning] [--limit N]       tail <prefix>.sent
    botmesh dlq list|show|retry|replay|discard [--chat-id C] [--key K] [--reason R]
                [--since T] [--until T] [--dry-run] [--wait S] [--json]  dead letters
    botmesh flows restart|drop --chat-id C [--chat-id C2 ...] [--json]
                                                          a chat's flow, by its owner
    botmesh erase --chat-id C [--yes] [--dry-run] [--json]  a chat's journal records
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
    botmesh completion bash|zsh|fish                      the shell completion script

Each command is a module of ``botmesh._cli``. Exit statuses (``botmesh._cli.exit``): 0 ok,
1 refused (a precondition, e.g. live members), 2 a usage error, 3 the broker unreachable or
refusing this client, 4 no answer from a chat's owner. Options default to the environment:
``KAFKA_BOOTSTRAP_SERVERS`` (``127.0.0.1:9092``), ``BOTMESH_TOPIC_PREFIX`` (``botmesh``),
``BOTMESH_DATA_DIR``; ``--config`` (``BOTMESH_CONFIG``) names a configuration file whose
settings apply under the environment's.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import click

from botmesh._cli.broadcast import broadcast
from botmesh._cli.completion import completion
from botmesh._cli.console import console
from botmesh._cli.dlq import dlq
from botmesh._cli.erase import erase
from botmesh._cli.exit import Exit, command_of, stop_on_sigterm_until_started
from botmesh._cli.flows import flows
from botmesh._cli.gateway import gateway
from botmesh._cli.operator import metrics, replay, status
from botmesh._cli.options import CONTEXT
from botmesh._cli.produce import produce
from botmesh._cli.receipts import receipts
from botmesh._cli.run import run
from botmesh._cli.send import send
from botmesh._cli.topics import topics
from botmesh._cli.worker import worker
from botmesh._version import __version__
from botmesh.state.errors import AppLoadError, DurabilityError

__all__ = ["cli", "main"]


@click.group(context_settings=CONTEXT)
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
    from botmesh.settings import apply_config_file  # noqa: PLC0415 - when a command runs

    apply_config_file(config)


for _command in (
    run,
    worker,
    topics,
    produce,
    send,
    broadcast,
    receipts,
    dlq,
    flows,
    erase,
    replay,
    status,
    metrics,
    gateway,
    console,
    completion,
):
    cli.add_command(_command)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line (``argv``, else ``sys.argv[1:]``); the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    command = command_of(args)
    if command == "worker":  # as early as can be: a SIGTERM while it starts is a clean stop
        stop_on_sigterm_until_started()
    try:
        result = cli.main(args=args, prog_name="botmesh", standalone_mode=False)
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
    return result if isinstance(result, int) else 0

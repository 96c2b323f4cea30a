"""``botmesh run``: the bot in this process (``botmesh.run``), with stdin as its transport
(``botmesh._cli.stdin``).

Each line is one inbound message (plain text to ``--chat-id``, or with ``--records`` an
inbound record as on the inbound topic), and the sends go to the provider (``console``
prints them). Its journal defaults to ``file://<data dir>/console.journal``, so a message
handled before is answered from the outbox after a restart, not twice; ``--journal
memory://`` keeps nothing, ``--journal none`` runs without a journal.
"""

# the bot library and the journal's backends load only when the command runs:
# asyncio too, so that --help and shell completion load fast:
# ruff: noqa: PLC0415

from __future__ import annotations

import os
from pathlib import Path

import click

from botmesh._cli.load import fallbacks_of_env, load_app, provider_of
from botmesh._cli.options import CONTEXT
from botmesh.state.errors import AppLoadError, ConfigError

__all__ = ["run"]


@click.command("run", context_settings=CONTEXT)
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
def run(
    *,
    app: str,
    provider: str | None,
    journal: str | None,
    data_dir: str | None,
    chat_id: str,
    records: bool,
    instance_id: str | None,
) -> int:
    """Run a bot in this process, one inbound message per stdin line."""
    import asyncio

    from botmesh._bot.bot import Bot
    from botmesh._cli.stdin import run_stdin

    bot = load_app(app)
    if not isinstance(bot, Bot):
        raise AppLoadError(f"--app {app!r}: `botmesh run` runs a botmesh.Bot")
    return asyncio.run(
        run_stdin(
            bot,
            provider_of(provider),
            journal=_journal(journal, data_dir),
            chat=chat_id,
            json_lines=records,
            instance_id=instance_id,
            fallbacks=fallbacks_of_env(),
        )
    )


def _journal(journal: str | None, data_dir: str | None) -> str | None:
    """The journal URL of ``--journal`` (checked; ``none``: no journal), by default a file
    journal in the data dir (``--data-dir``, else ``BOTMESH_DATA_DIR``), made if missing."""
    from botmesh.state.backends import check_url

    if journal is None:
        env = os.environ.get("BOTMESH_DATA_DIR", "").strip()
        folder = Path(data_dir or env or "botmesh-data").resolve()
        folder.mkdir(parents=True, exist_ok=True)
        return f"file://{folder}/console.journal?append_log=true"
    value = journal.strip()
    if value.lower() == "none":
        return None
    try:
        return check_url(value)
    except ConfigError as exc:
        raise ValueError(f"--journal {value!r}: {exc.message}") from None

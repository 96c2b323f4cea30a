"""``botmesh console``: the ops console (``botmesh.console``), a web page, from the command
line: the group, its lag, a chat's timeline, the dead letters (retry, replay, discard
through their owners, for an operator with a token), a replay's plan."""

# the console's server and Kafka side load only when the command runs (import cost ~1 s):
# ruff: noqa: PLC0415

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import click

from botmesh._cli.options import (
    CONTEXT,
    bootstrap_of,
    catalog_of,
    check_port,
    check_seconds,
    connection_options,
    logging_options,
)

if TYPE_CHECKING:
    from botmesh.console import Tokens

__all__ = ["console"]


@click.command("console", context_settings=CONTEXT)
@connection_options
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
@logging_options
def console(
    *,
    prefix: str,
    bootstrap: str,
    host: str,
    port: int,
    token_file: str | None,
    read_only: bool,
    show_texts: bool,
    timeout: float,
    wait: float,
    loglevel: str,
    log_format: str | None,
) -> int:
    """Serve the ops console, a web page: the group, its lag, a chat's timeline, the dead
    letters (retry, replay, discard through their owners), a replay's plan."""
    from botmesh.console import ConsoleConfig, serve
    from botmesh.observability import logs

    check_port(port)
    check_seconds("--timeout", timeout)
    check_seconds("--wait", wait)
    if not host.strip():
        raise ValueError("--host: must not be empty (127.0.0.1 serves this host only)")
    config = ConsoleConfig(
        bootstrap=bootstrap_of(bootstrap),
        prefix=catalog_of(prefix).prefix,
        host=host.strip(),
        port=port,
        tokens=_tokens(token_file),
        read_only=read_only,
        show_texts=show_texts,
        timeout=timeout,
        wait=wait,
    )
    logs.setup_logging(loglevel, logs.log_format(log_format))
    return serve(config)


def _tokens(token_file: str | None) -> Tokens:
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

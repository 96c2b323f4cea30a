"""``botmesh completion bash|zsh|fish``: the shell completion script of the whole command
line (the root group this command was added to)."""

from __future__ import annotations

import click
from click.shell_completion import get_completion_class

from botmesh._cli.options import CONTEXT

__all__ = ["completion"]


@click.command("completion", context_settings=CONTEXT)
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
@click.pass_context
def completion(ctx: click.Context, *, shell: str) -> None:
    """Print the shell completion script: eval "$(botmesh completion bash)"."""
    complete = get_completion_class(shell)
    assert complete is not None
    root = ctx.find_root().command
    click.echo(complete(root, {}, "botmesh", "_BOTMESH_COMPLETE").source())

"""The ``botmesh`` command line keeps its conventions (``botmesh._cli``): one name per
concept, ``--json`` wherever a command reports, help that names each option's default and
environment variable, ``--version``, shell completion. Read from the command tree itself,
so a new command or option is held to them too."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from botmesh._cli.main import cli
from botmesh._version import __version__

ROOT = Path(__file__).resolve().parent.parent
#: Commands that report (a table, a summary, an id): each takes --json.
REPORTING = {
    "topics create", "topics list", "produce", "send", "send cancel", "send edit",
    "send delete", "broadcast", "broadcast cancel", "dlq list", "dlq show", "dlq retry",
    "dlq replay", "dlq discard", "flows restart", "flows drop", "replay", "status", "metrics",
}  # fmt: skip


def commands(group: click.Group = cli, prefix: str = "") -> Iterator[tuple[str, click.Command]]:
    for name, command in sorted(group.commands.items()):
        path = f"{prefix}{name}"
        if isinstance(command, click.Group):
            if command.invoke_without_command:  # a command too (``send``, ``broadcast``)
                yield path, command
            yield from commands(command, f"{path} ")
        else:
            yield path, command


def options(command: click.Command) -> list[click.Option]:
    return [p for p in command.params if isinstance(p, click.Option)]


def botmesh(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "botmesh", *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_every_option_has_help_naming_its_default_and_environment_variable() -> None:
    for path, command in commands():
        assert command.help, f"{path}: no help"
        for option in options(command):
            assert option.help, f"{path} {option.opts}: no help"
            if option.envvar:
                assert option.show_envvar, f"{path} {option.opts}: shows no env var"
            elif "BOTMESH_" in option.help or "KAFKA_B" in option.help:
                assert "[env var: " in option.help, f"{path} {option.opts}"


def test_one_name_per_concept() -> None:
    for path, command in commands():
        names = {opt for option in options(command) for opt in option.opts}
        assert "--chat" not in names, f"{path}: a chat is --chat-id"
        for option in options(command):
            if "--timeout" in option.opts:
                assert "request to the broker" in (option.help or ""), path
            if "--wait" in option.opts:
                assert "owners to answer" in (option.help or ""), path
        if path in REPORTING:
            assert "--json" in names, f"{path} reports: it takes --json"
    assert {p for p, _ in commands()} >= REPORTING  # the list names real commands


def test_version_and_help() -> None:
    out = botmesh("--version")
    assert (out.returncode, out.stdout.strip()) == (0, f"botmesh {__version__}")
    out = botmesh("dlq", "retry", "--help")
    assert out.returncode == 0
    shown = " ".join(out.stdout.split())  # as wrapped to the terminal
    assert "--chat-id" in shown and "--wait" in shown
    assert "[env var: KAFKA_BOOTSTRAP_SERVERS; default: 127.0.0.1:9092]" in shown


def test_a_bad_option_is_a_usage_error_with_status_2() -> None:
    out = botmesh("status", "--chat", "42")
    # click < 8.2 says "No such option: --chat", later ones "No such option '--chat'."
    assert out.returncode == 2 and re.search(r"No such option(: |\s*')--chat", out.stderr)
    out = botmesh("replay", "--dry-run")
    assert out.returncode == 2
    assert "give one of --from-offset N, --from-time TIME, --to-earliest" in out.stderr


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_shell_completion(shell: str) -> None:
    script = botmesh("completion", shell)
    assert script.returncode == 0 and "_BOTMESH_COMPLETE" in script.stdout
    if shell != "bash":
        return
    words = botmesh(
        env={"_BOTMESH_COMPLETE": "bash_complete", "COMP_WORDS": "botmesh dl", "COMP_CWORD": "1"}
    )
    assert "plain,dlq" in words.stdout.splitlines(), words.stdout
    flags = botmesh(
        env={
            "_BOTMESH_COMPLETE": "bash_complete",
            "COMP_WORDS": "botmesh flows drop --ch",
            "COMP_CWORD": "3",
        }
    )
    assert "plain,--chat-id" in flags.stdout.splitlines(), flags.stdout

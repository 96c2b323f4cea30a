"""``botmesh run``: the in-process runtime with stdin as its transport, and the README's
durable bot, which receives its messages through it."""

from __future__ import annotations

import io
import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from botmesh._cli.stdin import run_stdin
from botmesh.examples.helpdesk import bot as helpdesk
from botmesh.testing import MockProvider
from tests.kill import ROOT


def _run(*args: str, stdin: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "botmesh", "run", *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=False,
    )


def test_the_readme_example_is_the_module_it_runs() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## A durable bot in 20 lines", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None
    module = (ROOT / "botmesh" / "examples" / "helpdesk.py").read_text()
    assert code.group(1) == module[module.index("from botmesh") :]
    assert "Inbound(" not in code.group(1)  # messages come through a runtime


def test_the_readme_bot_through_botmesh_run_answers_once_across_restarts(tmp_path: Path) -> None:
    lines = "my order is late\nand the invoice is wrong\n"
    args = (
        "--app",
        "botmesh.examples.helpdesk:bot",
        "--data-dir",
        str(tmp_path),
        "--chat-id",
        "42",
    )
    first = _run(*args, stdin=lines)
    assert first.returncode == 0, first.stderr
    # the enqueued nudge goes out in the background: its place among the replies varies
    assert sorted(first.stdout.splitlines()) == [
        "[42] Still there?",  # enqueued twice under one explicit key: sent once
        "[42] Thanks, a human will look at it.",
        "[42] Thanks, a human will look at it.",
    ]
    assert (tmp_path / "console.journal").exists()
    again = _run(*args, stdin=lines)  # the same input replayed: answered from the journal
    assert again.returncode == 0, again.stderr
    assert again.stdout == ""
    replayed = "handled before (the same line at the same place); answered from the journal"
    assert again.stderr.splitlines() == [
        f"botmesh run: line 1: duplicate: {replayed}, nothing sent again",
        f"botmesh run: line 2: duplicate: {replayed}, nothing sent again",
    ]


def test_without_a_journal_a_replay_sends_again(tmp_path: Path) -> None:
    args = ("--app", "botmesh.examples.echo_bot:bot", "--journal", "none")
    for _ in range(2):
        out = _run(*args, stdin="hi\n")
        assert out.returncode == 0, out.stderr
        assert out.stdout.splitlines() == ["[console] echo: hi"]


def test_a_bad_journal_or_app_is_refused_before_anything_runs() -> None:
    bad = _run("--app", "botmesh.examples.echo_bot:bot", "--journal", "fil:///x", stdin="hi\n")
    assert bad.returncode == 2 and "unknown journal scheme 'fil://'" in bad.stderr
    assert bad.stdout == ""
    nobot = _run("--app", "botmesh.examples.helpdesk:nobot", stdin="hi\n")
    assert nobot.returncode == 2 and "no attribute 'nobot'" in nobot.stderr


@pytest.mark.parametrize(
    ("line", "expect"),
    [
        ('{"v": 1, "id": "t-1", "chat_id": "7", "text": "hello"}', "echo: hello"),
        ('{"v": 1, "chat_id": "7", "text": "no id"}', "echo: no id"),
    ],
)
async def test_json_lines_are_inbound_records(line: str, expect: str) -> None:
    from botmesh.examples.echo_bot import bot as echo

    provider = MockProvider()
    err = io.StringIO()
    status = await run_stdin(
        echo,
        provider,
        journal="memory://",
        json_lines=True,
        stdin=io.StringIO(line + "\n{bad\n"),
        stderr=err,
    )
    assert [m.text for m in provider.sent] == [expect]
    assert status == 1 and "line 2 skipped: bad-json" in err.getvalue()
    assert helpdesk.bot_id == "helpdesk"


def test_a_line_that_is_not_utf8_is_skipped_with_its_number_and_the_rest_are_handled() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "botmesh", "run", "--journal", "memory://", *_ECHO],
        input=b"hello\ncaf\xe9\nworld\n",
        capture_output=True,
        cwd=ROOT,
        timeout=120,
        check=False,
    )
    assert out.stdout.decode().splitlines() == ["[console] echo: hello", "[console] echo: world"]
    assert out.stderr.decode().splitlines() == [
        "botmesh run: line 2 skipped: not UTF-8 text (byte 0xe9 at column 4); "
        "botmesh run reads UTF-8"
    ]
    assert out.returncode == 1


def test_a_journal_in_a_folder_that_does_not_exist_is_one_line_not_a_traceback(
    tmp_path: Path,
) -> None:
    missing = tmp_path / "no" / "such" / "dir" / "x.journal"
    out = _run(
        "--app", "botmesh.examples.echo_bot:bot", "--journal", missing.as_uri(), stdin="hi\n"
    )
    assert out.returncode == 1
    assert out.stdout == ""
    assert out.stderr.splitlines() == [
        f"botmesh run: the journal: the folder of the journal {missing} does not exist; "
        "create it first"
    ]


_ECHO = ("--app", "botmesh.examples.echo_bot:bot")


class _Terminal:
    """``botmesh run`` on a real pseudo-terminal, as a person types at it."""

    def __init__(self, *args: str) -> None:
        self.master, slave = pty.openpty()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "botmesh", "run", *args],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            cwd=ROOT,
            close_fds=True,
        )
        os.close(slave)
        self.screen = ""

    def wait_for(self, text: str, timeout: float = 60.0) -> None:
        """Read the screen until ``text`` is on it (fails with the screen after ``timeout``)."""
        deadline = time.monotonic() + timeout
        while text not in self.screen:
            left = deadline - time.monotonic()
            assert left > 0, f"{text!r} never appeared; the screen:\n{self.screen}"
            ready, _, _ = select.select([self.master], [], [], left)
            if ready:
                try:
                    chunk = os.read(self.master, 4096)
                except OSError:  # the process ended and closed the terminal
                    chunk = b""
                assert chunk, f"the terminal closed before {text!r}; the screen:\n{self.screen}"
                self.screen += chunk.decode(errors="replace").replace("\r\n", "\n")

    def type(self, line: str) -> None:
        os.write(self.master, line.encode() + b"\n")

    def end(self) -> int:
        os.write(self.master, b"\x04")  # Ctrl-D
        status = self.proc.wait(60)
        os.close(self.master)
        return status


def test_at_a_terminal_a_prompt_asks_and_typed_lines_replay_like_piped_ones(tmp_path: Path) -> None:
    """Getting started, typed: the prompt shows, ``hi`` is answered; a second run where the
    same line is typed again answers it from the journal and sends nothing."""
    args = ("--app", "botmesh.examples.echo_bot:bot", "--data-dir", str(tmp_path))
    first = _Terminal(*args)
    first.wait_for("one message a line, Ctrl-D ends")
    first.wait_for("> ")
    first.type("hi")
    first.wait_for("[console] echo: hi")
    first.wait_for("\n> ")  # asks for the next line
    assert first.end() == 0

    second = _Terminal(*args)
    second.wait_for("> ")
    second.type("hi")
    second.wait_for("botmesh run: line 1: duplicate")
    assert second.end() == 0
    assert "echo: hi" not in second.screen.replace("> hi", "")

"""``botmesh run``: the in-process runtime with stdin as its transport, and the README's
durable bot, which receives its messages through it."""

from __future__ import annotations

import io
import re
import subprocess
import sys
from pathlib import Path

import pytest

from botmesh._console import run_console
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
    assert again.stderr.splitlines() == [
        "botmesh run: line 1: duplicate",
        "botmesh run: line 2: duplicate",
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
    status = await run_console(
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

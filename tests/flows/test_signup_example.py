"""The example sign-up bot (``botmesh/examples/signup_bot.py``), run by ``botmesh run`` on a file
journal in two processes: the second picks the flow up at the pending question."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.kill import ROOT


def _run(tmp_path: Path, stdin: str) -> subprocess.CompletedProcess[str]:
    args = (
        "--app",
        "botmesh.examples.signup_bot:bot",
        "--data-dir",
        str(tmp_path),
        "--chat-id",
        "7",
    )
    return subprocess.run(
        [sys.executable, "-m", "botmesh", "run", *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=False,
    )


def test_the_signup_example_resumes_in_a_new_process(tmp_path: Path) -> None:
    first = _run(tmp_path, "hello\n/signup\nAnn\nnot-an-email\n")
    assert first.returncode == 0, first.stderr
    assert first.stdout.splitlines() == [
        "[7] Send /signup to sign up.",
        "[7] Welcome! What is your name? (/cancel stops)",
        "[7] Thanks Ann. Your email?",
        "[7] That is not an email address; try again.",
    ]
    # the same lines again (duplicates, nothing re-asked), then the rest of the answers,
    # then a sign-up cancelled at its first question
    lines = "hello\n/signup\nAnn\nnot-an-email\nann@example.org\nold\n42\n/signup\n/cancel\n"
    second = _run(tmp_path, lines)
    assert second.returncode == 0, second.stderr
    assert second.stdout.splitlines() == [
        "[7] How old are you?",
        "[7] A number, please (for example 42).",
        "[7] Signed up: Ann <ann@example.org>, 42, plan free.",
        "[7] Welcome! What is your name? (/cancel stops)",
        "[7] Sign-up cancelled. /signup starts again.",
    ]


def test_produce_text_makes_one_message_per_text_in_order() -> None:
    from botmesh._cli.produce import text_records

    records = text_records(["/signup", "Ann"], "7", "r1")
    assert [(r.id, r.chat_id, r.text) for r in records] == [
        ("r1-0", "7", "/signup"),
        ("r1-1", "7", "Ann"),
    ]

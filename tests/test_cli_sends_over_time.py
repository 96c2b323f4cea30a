"""``botmesh send``'s timing options, ``botmesh send cancel`` and ``botmesh broadcast``
refuse bad input before anything is produced: exit status 2 and a message naming the option
and the fix (no broker is needed to be refused; the Kafka side is
tests/kafka/test_sends_over_time.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from botmesh._cli.main import main

UNREACHABLE = ["--bootstrap", "127.0.0.1:9"]  # nothing is produced before the refusal


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["send", "--chat-id", "1", "--text", "x", "--at", "1", "--delay", "5s"],
         "--at or --delay"),
        (["send", "--chat-id", "1", "--text", "x", "--delay", "5"], "--delay: cannot read '5'"),
        (["send", "--chat-id", "1", "--text", "x", "--at", "tomorrow"], "--at 'tomorrow'"),
        (
            ["send", "--chat-id", "1", "--text", "x", "--deliver-within", "5m",
             "--expires-at", "1"],
            "--deliver-within or --expires-at",
        ),
        (
            ["send", "--chat-id", "1", "--text", "x", "--at", "2000000000",
             "--expires-at", "1999999999"],
            "not after the send's time",
        ),
        (["send", "--text", "x"], "--chat-id"),
        (["send", "cancel", "--key", "a#b", "--chat-id", "1"], "must not contain '#'"),
        (["broadcast", "--campaign", "c", "--text", "x"], "--recipients"),
        (["broadcast", "--campaign", "a:b", "--recipients", "-", "--text", "x"], "':'"),
        (["broadcast", "--campaign", "c", "--recipients", "/nonexistent/r.txt", "--text", "x"],
         "No such file"),
    ],
)  # fmt: skip
def test_bad_input_is_refused_with_status_2_naming_it(
    args: list[str], says: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.stdin", _Lines("u1\nu2\n"))
    assert main([*args, *UNREACHABLE]) == 2
    captured = capsys.readouterr()
    assert says in captured.err + captured.out


def test_a_recipients_file_without_a_chat_id_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "r.txt"
    empty.write_text("# nobody yet\n\n")
    args = ["broadcast", "--campaign", "c", "--recipients", str(empty), "--text", "x"]
    assert main([*args, *UNREACHABLE]) == 2
    assert "names no chat id" in capsys.readouterr().err


class _Lines:
    def __init__(self, text: str) -> None:
        self._text = text

    def read(self) -> str:
        return self._text

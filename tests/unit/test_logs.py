"""``botmesh.observability.logs``: the log format setting refused when it is neither
``text`` nor ``json``, JSON lines with the record's context, the same lines from the
libraries' loggers, and no message text logged at ``info`` or above anywhere in the package."""

from __future__ import annotations

import ast
import asyncio
import json
import logging
import os
import re
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from botmesh._cli.main import main
from botmesh.observability import logs
from botmesh.state.messages import Inbound
from botmesh.streams.runner import RawRecord
from botmesh.topics.records import SendRequest

ROOT = Path(__file__).resolve().parents[2]
ISO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


@pytest.fixture
def root_logging() -> Iterator[None]:
    """The root logger's handlers and level, and the warnings' capture, put back after."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield
    finally:
        logging.captureWarnings(False)
        root.handlers[:] = handlers
        root.setLevel(level)


def json_lines(text: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def formatted(record: logging.LogRecord) -> dict[str, object]:
    line = logs.JsonFormatter().format(record)
    assert "\n" not in line
    out = json.loads(line)
    assert isinstance(out, dict)
    return out


def make_record(
    msg: str, *args: object, level: int = logging.INFO, **extra: object
) -> logging.LogRecord:
    record = logging.LogRecord("botmesh.test", level, __file__, 1, msg, args, None)
    record.__dict__.update(extra)
    return record


# -- the setting ----------------------------------------------------------------------------


def test_the_format_is_text_unless_json_is_asked_for() -> None:
    assert logs.log_format(None, {}) == "text"
    assert logs.log_format(None, {"BOTMESH_LOG_FORMAT": " JSON "}) == "json"
    assert logs.log_format("text", {"BOTMESH_LOG_FORMAT": "json"}) == "text"  # the option wins


@pytest.mark.parametrize(
    ("option", "env", "says"),
    [
        (
            None,
            {"BOTMESH_LOG_FORMAT": "xml"},
            "BOTMESH_LOG_FORMAT='xml': must be one of text, json",
        ),
        ("yaml", {}, "--log-format='yaml': must be one of text, json"),
    ],
)
def test_another_format_is_refused_naming_where_it_came_from(
    option: str | None, env: dict[str, str], says: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(says)):
        logs.log_format(option, env)


def test_an_unknown_level_is_refused() -> None:
    says = "log level 'loud' (--loglevel, BOTMESH_LOG_LEVEL): must be one of debug, info"
    with pytest.raises(ValueError, match=re.escape(says)):
        logs.logging_config("loud", "json")


def test_the_worker_refuses_a_bad_format_at_start_with_status_2() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KAFKA_", "BOTMESH_"))}
    out = subprocess.run(
        [sys.executable, "-m", "botmesh", "worker", "--app", "tests.kafka.bot:bot"],
        cwd=ROOT,
        env={**env, "PYTHONPATH": str(ROOT), "BOTMESH_LOG_FORMAT": "xml"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 2, out.stderr
    assert "BOTMESH_LOG_FORMAT='xml': must be one of text, json" in out.stderr


def test_the_gateway_refuses_a_bad_format_at_start_with_status_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SLACK_SIGNING_SECRET", "s")
    monkeypatch.setenv("BOTMESH_LOG_FORMAT", "logfmt")
    assert main(["gateway", "--channel", "slack", "--bootstrap", "127.0.0.1:1"]) == 2
    assert "BOTMESH_LOG_FORMAT='logfmt': must be one of text, json" in capsys.readouterr().err


# -- JSON lines -----------------------------------------------------------------------------


def test_a_json_line_has_its_time_level_logger_and_message() -> None:
    out = formatted(make_record("sent %d of %s", 3, "ü\nnext", level=logging.WARNING))
    assert ISO_UTC.match(str(out["ts"])), out["ts"]
    assert out == {
        "ts": out["ts"],
        "level": "WARNING",
        "logger": "botmesh.test",
        "message": "sent 3 of ü\nnext",
    }


def test_an_exception_comes_as_its_type_and_traceback() -> None:
    try:
        raise KeyError("k")
    except KeyError:
        record = make_record("failed", level=logging.ERROR)
        record.exc_info = sys.exc_info()
    out = formatted(record)
    assert out["exc_type"] == "KeyError"
    assert "Traceback (most recent call last)" in str(out["exc"]) and "KeyError: 'k'" in str(
        out["exc"]
    )


def test_the_context_is_in_every_line_written_inside_it_and_gone_after() -> None:
    with logs.log_context(chat_id="42", topic="p.inbound", partition=3, offset=9):
        with logs.log_context(idempotency_key="m-1:1", message_id="m-1"):
            inner = formatted(make_record("inner"))
        outer = formatted(make_record("outer"))
    after = formatted(make_record("after"))
    assert list(inner)[4:] == [
        "chat_id",
        "message_id",
        "topic",
        "partition",
        "offset",
        "idempotency_key",
    ]
    assert inner["chat_id"] == "42" and inner["idempotency_key"] == "m-1:1"
    assert inner["partition"] == 3 and inner["offset"] == 9
    assert "idempotency_key" not in outer and outer["chat_id"] == "42"
    assert not set(logs.FIELDS) & set(after)


def test_context_fields_can_be_given_as_extra() -> None:
    out = formatted(make_record("x", chat_id="7", offset=12, other="not taken"))
    assert out["chat_id"] == "7" and out["offset"] == 12 and "other" not in out


def test_a_records_scope_gives_its_context_and_each_task_keeps_its_own() -> None:
    def scope(chat: str, offset: int) -> logs.LogContext:
        raw = RawRecord("p.inbound", 1, offset, chat.encode(), b"{}")
        return logs.record_scope(raw, Inbound(id=f"m{offset}", chat_id=chat, text="secret"))

    seen: dict[str, dict[str, object]] = {}

    async def handle(chat: str, offset: int) -> None:
        with scope(chat, offset):
            await asyncio.sleep(0)  # the other chat's record runs meanwhile
            seen[chat] = logs.current_context()

    async def both() -> None:
        await asyncio.gather(handle("A", 1), handle("B", 2))

    asyncio.run(both())
    assert seen["A"] == {
        "chat_id": "A",
        "message_id": "m1",
        "topic": "p.inbound",
        "partition": 1,
        "offset": 1,
    }
    assert seen["B"]["chat_id"] == "B" and seen["B"]["offset"] == 2
    assert logs.current_context() == {}

    request = SendRequest(id="r1", chat_id="A", text="secret", key="order-1")
    raw = RawRecord("p.requests", 0, 4, b"A", b"{}")
    with logs.record_scope(raw, request):
        assert logs.current_context()["idempotency_key"] == "order-1"


def test_setup_logging_writes_json_lines_to_stderr(
    root_logging: None, capsys: pytest.CaptureFixture[str]
) -> None:
    logs.setup_logging("info", "json")
    logging.getLogger("botmesh.x").debug("not at info")
    with logs.log_context(chat_id="c1"):
        logging.getLogger("botmesh.x").info("at info")
    with warnings.catch_warnings():
        warnings.simplefilter("always")  # the suite turns warnings into errors
        warnings.warn("a warning goes through logging", UserWarning, stacklevel=1)
    lines = json_lines(capsys.readouterr().err)
    assert (lines[0]["logger"], lines[0]["message"]) == ("botmesh.x", "at info")
    assert lines[0]["chat_id"] == "c1"
    assert lines[1]["logger"] == "py.warnings" and "a warning goes" in str(lines[1]["message"])


def test_the_text_lines_are_the_gateways_as_before(
    root_logging: None, capsys: pytest.CaptureFixture[str]
) -> None:
    logs.setup_logging("warning", "text")
    logging.getLogger("botmesh.x").info("hidden")
    logging.getLogger("botmesh.x").warning("shown")
    err = capsys.readouterr().err
    assert re.match(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} WARNING botmesh.x: shown$", err.strip())


def test_the_libraries_loggers_write_the_same_json_lines(
    root_logging: None, capfd: pytest.CaptureFixture[str]
) -> None:
    """What the worker and the gateway set up (``setup_logging``, applied again with a new
    dictionary: ``dictConfig`` consumes it) is the root logger's: the loggers of the Kafka
    client library and of botmesh's Kafka clients write JSON, one line each, including a
    logger made before the set-up (not disabled)."""
    logging.getLogger("confluent_kafka")  # made before the set-up
    for _ in range(2):  # a second set-up replaces the handler: no line twice
        logs.setup_logging("info", "json")
    names = ("confluent_kafka", "botmesh.streams", "botmesh.streams.kafka")
    for name in names:
        logging.getLogger(name).info("from %s", name)
    lines = json_lines(capfd.readouterr().err)
    assert [(line["logger"], line["message"]) for line in lines] == [
        (name, f"from {name}") for name in names
    ]
    assert isinstance(logging.getLogger().handlers[0].formatter, logs.JsonFormatter)


# -- nothing a user wrote at info or above --------------------------------------------------

#: Attributes that hold what a user wrote or a secret: never an argument of a log call at
#: info or above (a ``token`` is a fencing token, a number, in the engine's lines).
_TEXTS = {"text", "caption", "body", "payload", "password", "secret", "access_token"}
_LEVELS = {"info", "warning", "error", "exception", "critical"}


def test_no_log_call_at_info_or_above_gets_a_message_text_or_a_secret() -> None:
    found = []
    for file in sorted((ROOT / "botmesh").rglob("*.py")):
        tree = ast.parse(file.read_text())
        for node in ast.walk(tree):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in _LEVELS
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id in {"log", "logger"}
            ):
                continue
            for arg in node.args[1:]:
                for sub in ast.walk(arg):
                    name = sub.attr if isinstance(sub, ast.Attribute) else None
                    if isinstance(sub, ast.Subscript) and isinstance(sub.slice, ast.Constant):
                        name = str(sub.slice.value)
                    if name in _TEXTS:
                        found.append(f"{file.relative_to(ROOT)}:{node.lineno} logs .{name}")
    assert found == [], "log message texts and secrets at debug at most:\n" + "\n".join(found)

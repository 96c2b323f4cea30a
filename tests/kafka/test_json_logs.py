"""A real ``botmesh worker`` with ``BOTMESH_LOG_FORMAT=json`` on a real broker: every line it
writes on stderr is a JSON object (librdkafka's own lines too: the clients hand them to
``botmesh.streams.librdkafka``, never straight to stderr), a line about a
record it handles carries the record's context, and no message text is written at ``info``.

The only lines that are not JSON are the process's own status lines, printed before logging
exists (``botmesh worker: starting``) or when it gives up at start; docs/operating.md says so.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from botmesh.examples.demo import worker_command
from botmesh.state.messages import Inbound
from botmesh.streams.ops.tools import produce_inbound
from botmesh.streams.provision import ensure_topics
from botmesh.topics import Catalog
from tests.kafka.worker import PARTITIONS, STARTING, WAIT_S
from tests.kill import Child

pytestmark = [pytest.mark.kafka]

#: A text no line may show: the handler replies it, the runtime journals it.
SECRET = "secret-text-7d41c9"
#: The worker's own status lines (``print``), not log lines.
STATUS = "botmesh worker: "


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _wait(child: Child, stderr: Path, what: str, *texts: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not any(all(t in line for t in texts) for line in _lines(stderr)):
        if not child.alive():
            pytest.fail(f"the worker exited before {what}:\n" + "\n".join(_lines(stderr)[-40:]))
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} from the worker:\n" + "\n".join(_lines(stderr)[-40:]))
        time.sleep(0.1)


async def test_a_json_worker_writes_one_json_object_a_line_with_the_record_s_context(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    cat = Catalog(topic_prefix)
    ensure_topics(kafka_bootstrap, cat.specs(partitions=PARTITIONS))
    stderr = tmp_path / "stderr.log"
    argv = worker_command(
        "--provider",
        "tests.kafka.bot:provider",
        "--bootstrap",
        kafka_bootstrap,
        "--prefix",
        topic_prefix,
        "--data-dir",
        str(tmp_path / "data"),
        "--partitions",
        str(PARTITIONS),
        "--instance-id",
        f"{topic_prefix}-0",
        "--loglevel",
        "info",
        app="tests.kafka.bot:bot",
    )
    env = {
        "BOTMESH_LOG_FORMAT": "json",
        "BOTMESH_TEST_HANDLED": str(tmp_path / "handled.txt"),
        "BOTMESH_TEST_SENDS": str(tmp_path / "sends.jsonl"),
        "PYTHONUNBUFFERED": "1",
    }
    child = Child(argv, env=env, log=stderr).start()  # stderr apart from stdout
    try:
        _wait(child, stderr, "its start", STARTING)
        records = [
            Inbound(id="plain-1", chat_id="chat-a", text=SECRET),
            Inbound(id="fail-1", chat_id="chat-b", text="fail"),  # the handler raises
        ]
        await produce_inbound(kafka_bootstrap, cat.inbound, records)
        _wait(child, stderr, "the handler's failure", "handler", "fail-1")
        sends = tmp_path / "sends.jsonl"
        deadline = time.monotonic() + WAIT_S
        while SECRET not in (sends.read_text() if sends.exists() else ""):
            assert child.alive() and time.monotonic() < deadline, "no reply to plain-1"
            await asyncio.sleep(0.1)
    finally:
        status = child.stop()
    assert status == 0, "\n".join(_lines(stderr)[-40:])

    text = stderr.read_text()
    lines = [line for line in text.splitlines() if line.strip()]
    logged = [line for line in lines if not line.startswith(STATUS)]
    assert len(logged) > 10, lines
    parsed = []
    for line in logged:
        try:
            parsed.append(json.loads(line))
        except ValueError:
            pytest.fail(f"a stderr line that is not JSON: {line!r}")
    for entry in parsed:
        assert {"ts", "level", "logger", "message"} <= set(entry), entry
        assert entry["ts"].endswith("Z") and "T" in entry["ts"]
    # the worker's own lines about its Kafka side (its runtime, its journal partitions)
    loggers = {e["logger"] for e in parsed}
    assert "botmesh.streams" in loggers, loggers
    # the line about the handled record carries its context
    (failed,) = [e for e in parsed if "fail-1" in e["message"] and "handler" in e["message"]]
    assert failed["level"] == "WARNING"
    assert (failed["chat_id"], failed["message_id"], failed["topic"]) == (
        "chat-b",
        "fail-1",
        cat.inbound,
    )
    assert isinstance(failed["partition"], int) and isinstance(failed["offset"], int)
    # a record's context comes whole (set once a record, by the runner)
    context = ("chat_id", "message_id", "topic", "partition", "offset")
    assert all(all(k in e for k in context) for e in parsed if "chat_id" in e)
    # no message text at info (nor above)
    assert SECRET not in text
    statuses = [line for line in lines if line.startswith(STATUS)]
    assert statuses and all(s.startswith(STARTING) for s in statuses), statuses

"""The ``botmesh`` command line against a real broker, and the worker's refusals of a bad
``--app``, ``--provider`` or ``--journal`` (no broker needed: they come first)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from botmesh.examples.demo import worker_command
from botmesh.topics import Catalog

REPO = Path(__file__).resolve().parents[2]


def botmesh(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "botmesh", *args],
        cwd=REPO,
        env=dict(os.environ, **(env or {})),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize(
    ("app", "words"),
    [
        ("botmesh.examples.echo_bot", "expected 'module:attribute'"),
        ("examples.no_such_bot:bot", "cannot import module 'examples.no_such_bot'"),
        ("botmesh.examples.echo_bot:bott", "has no attribute 'bott'"),
        ("botmesh.examples.echo_bot:echo", "is a function, not a bot"),
    ],
)
def test_bad_app_names_the_module_attribute_and_fix(app: str, words: str) -> None:
    out = botmesh("worker", "--app", app)
    assert out.returncode == 2
    assert words in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize(
    ("args", "env", "words"),
    [
        (["--provider", "icq"], {}, "--provider 'icq': expected one of console, mock, a channel"),
        (["--provider", "telegram"], {}, "--provider 'telegram': TELEGRAM_BOT_TOKEN: not set"),
        (["--provider", "botmesh.examples.echo_bot:bot"], {}, "gave a Bot, not a provider"),
        (["--provider", "examples.nope:p"], {}, "cannot import module 'examples.nope'"),
        (["--provider", "tests.kafka.bot:provider"], {}, "set BOTMESH_TEST_SENDS"),
        ([], {"BOTMESH_PROVIDER": "smtp"}, "BOTMESH_PROVIDER 'smtp': expected one of"),
        (["--journal", "memory://"], {}, "--journal 'memory://': the memory"),
        (["--journal", "none"], {}, "never runs without a journal"),
        (["--journal", "mongodb://x"], {}, "unknown journal scheme 'mongodb://'"),
        (["--journal", "file://relative/j"], {}, "not a file journal URL"),
        ([], {"BOTMESH_JOURNAL": "memory://"}, "BOTMESH_JOURNAL 'memory://': the memory"),
    ],
)
def test_the_worker_refuses_a_bad_provider_or_journal_naming_it(
    args: list[str], env: dict[str, str], words: str
) -> None:
    out = botmesh("worker", "--app", "botmesh.examples.echo_bot:bot", *args, env=env)
    assert out.returncode == 2, out.stderr
    assert words in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.kafka
def test_topics_create_is_idempotent_and_list_shows_them(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    first = botmesh(
        "topics",
        "create",
        "--bootstrap",
        kafka_bootstrap,
        "--prefix",
        topic_prefix,
        "--partitions",
        "2",
    )
    assert first.returncode == 0, first.stderr
    names = Catalog(topic_prefix).names()
    assert sorted(line.split()[1] for line in first.stdout.splitlines()) == sorted(names)
    assert all(line.endswith("(2 partitions, replication 1)") for line in first.stdout.splitlines())
    assert all(line.startswith("created") for line in first.stdout.splitlines())
    again = botmesh(
        "topics",
        "create",
        "--partitions",
        "2",
        env={"KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap, "BOTMESH_TOPIC_PREFIX": topic_prefix},
    )
    assert again.returncode == 0, again.stderr
    assert all(line.startswith("exists") for line in again.stdout.splitlines())
    listed = botmesh("topics", "list", "--bootstrap", kafka_bootstrap, "--prefix", topic_prefix)
    rows = {line.split()[0]: line.split() for line in listed.stdout.splitlines()}
    assert set(rows) == set(names)
    assert rows[f"{topic_prefix}.worker-journal-changelog"][2] == "compact"
    assert all(r[3] == "2" for r in rows.values())


@pytest.mark.kafka
def test_topics_create_takes_partitions_and_replication_from_the_settings(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    """flag > environment > configuration file > default, for the partitions and the
    replication factor; a factor above the cluster's broker count (one here) is refused,
    naming it and the fix, before anything is created."""
    assert not {"BOTMESH_PARTITIONS", "BOTMESH_REPLICATION"} & set(os.environ)
    base = {"KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap}
    config = tmp_path / "botmesh.toml"
    config.write_text("[botmesh]\npartitions = 3\nreplication = 2\n")

    def partitions_of(prefix: str) -> set[str]:
        listed = botmesh("topics", "list", "--prefix", prefix, "--json", env=base)
        return {str(t["partitions"]) for t in json.loads(listed.stdout)["topics"]}

    refused = botmesh(
        "--config", str(config), "topics", "create", "--prefix", topic_prefix, env=base
    )
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "replication factor 2 is more than the 1 broker(s) of the cluster" in refused.stderr
    assert "set --replication (or BOTMESH_REPLICATION) to at most 1" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert partitions_of(topic_prefix) == {"None"}  # nothing created

    env_wins = dict(base, BOTMESH_REPLICATION="1")  # the environment over the file
    made = botmesh(
        "--config", str(config), "topics", "create", "--prefix", topic_prefix, env=env_wins
    )
    assert made.returncode == 0, made.stderr
    inbound = Catalog(topic_prefix).inbound
    assert f"created  {inbound} (3 partitions, replication 1)" in made.stdout.splitlines()
    assert partitions_of(topic_prefix) == {"3"}  # the file's partitions

    second = f"{topic_prefix}-b"  # the environment over the file, the flag over both
    env_partitions = dict(env_wins, BOTMESH_PARTITIONS="2")
    made = botmesh(
        "--config", str(config), "topics", "create", "--prefix", second, env=env_partitions
    )
    assert made.returncode == 0, made.stderr
    assert partitions_of(second) == {"2"}
    third = f"{topic_prefix}-c"
    flagged = ("topics", "create", "--prefix", third, "--partitions", "1", "--replication", "1")
    made = botmesh("--config", str(config), *flagged, env=env_partitions)
    assert made.returncode == 0, made.stderr
    assert partitions_of(third) == {"1"}
    bad = botmesh("topics", "create", "--prefix", third, env=dict(base, BOTMESH_PARTITIONS="x"))
    assert bad.returncode == 2 and "BOTMESH_PARTITIONS='x': must be a whole number >= 1" in (
        bad.stderr
    )


@pytest.mark.kafka
def test_topics_produce_and_send_print_json_with_json(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    where = ("--bootstrap", kafka_bootstrap, "--prefix", topic_prefix)
    created = botmesh("topics", "create", *where, "--partitions", "2", "--json")
    assert created.returncode == 0, created.stderr
    cat = Catalog(topic_prefix)
    assert sorted(json.loads(created.stdout)["created"]) == sorted(cat.names())
    listed = json.loads(botmesh("topics", "list", *where, "--partitions", "2", "--json").stdout)
    assert {t["name"]: t["partitions"] for t in listed["topics"]} == dict.fromkeys(cat.names(), 2)
    produced = botmesh("produce", *where, "--text", "hi", "--chat-id", "c7", "--run", "j", "--json")
    assert json.loads(produced.stdout)["ids"] == ["j-0"], produced.stderr
    sent = botmesh("send", *where, "--chat-id", "c7", "--text", "yo", "--id", "r1", "--json")
    assert json.loads(sent.stdout) == {
        "request_id": "r1",
        "key": "req:r1",
        "chat_id": "c7",
        "topic": cat.requests,
    }, sent.stderr


@pytest.mark.kafka
def test_produce_and_receipts_through_a_worker(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    env = {
        "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "BOTMESH_TOPIC_PREFIX": topic_prefix,
        "BOTMESH_CONSOLE_QUIET": "1",
    }
    assert botmesh("topics", "create", "--partitions", "2", env=env).returncode == 0
    produced = botmesh("produce", "-n", "30", "--chats", "3", "--run", "cli", env=env)
    assert produced.returncode == 0, produced.stderr
    assert "produced 30 messages over 3 chats" in produced.stdout
    with open(tmp_path / "worker.log", "wb") as log:
        proc = subprocess.Popen(
            worker_command(
                "--data-dir",
                str(tmp_path / "data"),
                "--loglevel",
                "warning",
            ),
            cwd=REPO,
            env=dict(os.environ, **env),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        tail = botmesh("receipts", "--from-beginning", "--limit", "30", env=env)
    finally:
        _stop(proc)
    assert tail.returncode == 0, tail.stderr
    receipts = [json.loads(line) for line in tail.stdout.splitlines()]
    assert sorted(r["inbound_id"] for r in receipts) == sorted(f"cli-{i}" for i in range(30))
    assert {r["state"] for r in receipts} == {"sent"}
    assert proc.returncode == 0


@pytest.mark.kafka
def test_a_journal_the_worker_cannot_open_stops_it_with_the_reason(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    env = {"KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap, "BOTMESH_TOPIC_PREFIX": topic_prefix}
    missing = tmp_path / "missing" / "journal"
    out = botmesh(
        "worker",
        "--app",
        "botmesh.examples.echo_bot:bot",
        "--journal",
        f"file://{missing}",
        "--data-dir",
        str(tmp_path / "data"),
        env=env,
    )
    assert out.returncode == 2, out.stderr[-3000:]
    assert f"the folder of the journal {missing} does not exist; create it first" in out.stderr
    assert "Traceback" not in out.stderr


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL if the worker outlives its own stop limit (BOTMESH_STOP_TIMEOUT,
    30 s) by far: never left running into the next test (its status then says so)."""
    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.kafka
def test_worker_http_server_on_loopback_port(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    import time
    import urllib.request

    port = _free_port()
    env = {"KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap, "BOTMESH_TOPIC_PREFIX": topic_prefix}
    with open(tmp_path / "worker.log", "wb") as log:
        proc = subprocess.Popen(
            worker_command(
                "--data-dir",
                str(tmp_path / "data"),
                "--http-port",
                str(port),
                "--partitions",
                "1",
            ),
            cwd=REPO,
            env=dict(os.environ, **env),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        status = None
        deadline = time.monotonic() + 120  # hang guard
        while status is None and proc.poll() is None and time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as resp:
                    status = resp.status
            except OSError:
                time.sleep(0.3)
    finally:
        _stop(proc)
    said = (tmp_path / "worker.log").read_text()
    assert status == 200, said[-2000:]
    assert f"on http://127.0.0.1:{port}" in said
    assert proc.returncode == 0, said[-4000:]


@pytest.mark.kafka
def test_worker_whose_http_port_is_taken_exits_naming_the_setting(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {"KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap, "BOTMESH_TOPIC_PREFIX": topic_prefix}
        done = subprocess.run(
            worker_command("--data-dir", str(tmp_path / "data"), "--http-port", str(port)),
            check=False,
            cwd=REPO,
            env=dict(os.environ, **env),
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"cannot serve /healthz, /readyz and /metrics on 127.0.0.1:{port}" in done.stderr
    assert "set BOTMESH_HTTP_PORT to a free port" in done.stderr
    assert "Traceback" not in done.stderr

"""``botmesh.streams.config``: the worker's settings and its journal rule (no broker)."""

from __future__ import annotations

from pathlib import Path

import pytest

from botmesh.streams.config import WorkerConfig, check_worker_journal, group_instance_id


def test_the_default_journal_is_the_journal_on_kafka(tmp_path: Path) -> None:
    config = WorkerConfig.from_env({"BOTMESH_DATA_DIR": str(tmp_path / "d")})
    assert (config.journal_url, config.kafka_journal) == ("kafka", True)
    for spelled in ("kafka", "kafka://", " Kafka ", "table"):
        assert WorkerConfig.from_env({"BOTMESH_JOURNAL": spelled}).journal_url == "kafka"
    on_file = WorkerConfig.from_env({"BOTMESH_JOURNAL": f"file://{tmp_path}/j"})
    assert (on_file.journal_url, on_file.kafka_journal) == (f"file://{tmp_path}/j", False)


def test_the_journal_comes_from_the_option_then_the_environment() -> None:
    env = {"BOTMESH_JOURNAL": "file:///srv/env-journal"}
    assert WorkerConfig.from_env(env).journal_url == "file:///srv/env-journal"
    # the option wins, and a bad variable it overrides is not even read
    chosen = WorkerConfig.from_env({"BOTMESH_JOURNAL": "memory://"}, journal="file:///srv/j")
    assert chosen.journal_url == "file:///srv/j"
    assert WorkerConfig.from_env({"BOTMESH_JOURNAL": " "}).journal is None  # empty: unset


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("memory://", "the memory journal forgets everything at a restart"),
        ("none", "never runs without a journal"),
        ("", "never runs without a journal"),
        ("mongodb://x", "unknown journal scheme 'mongodb://'"),
        ("file:///j?fsync=maybe", "must be true or false"),
        ("postgresql://bot:s3cret@db/bots?table_prefix=a-b", "postgresql://bot:***@db/bots"),
    ],
)
def test_a_journal_the_worker_cannot_run_on_is_refused_naming_the_source(
    url: str, words: str
) -> None:
    with pytest.raises(ValueError, match=r"^--journal") as refused:
        check_worker_journal(url)
    assert words in str(refused.value)
    assert "s3cret" not in str(refused.value)
    if url.strip():
        with pytest.raises(ValueError, match=r"^BOTMESH_JOURNAL"):
            WorkerConfig.from_env({"BOTMESH_JOURNAL": url})


def test_settings_from_the_environment_are_checked_naming_the_variable() -> None:
    with pytest.raises(ValueError, match="BOTMESH_SESSION_TIMEOUT"):
        WorkerConfig.from_env({"BOTMESH_SESSION_TIMEOUT": "3"})
    with pytest.raises(ValueError, match=r"BOTMESH_BATCH_SIZE=.many."):
        WorkerConfig.from_env({"BOTMESH_BATCH_SIZE": "many"})
    with pytest.raises(ValueError, match="bad topic prefix"):
        WorkerConfig.from_env({}, prefix="no spaces")
    with pytest.raises(ValueError, match=r"^stop timeout \(BOTMESH_STOP_TIMEOUT\) 0s: must be"):
        WorkerConfig.from_env({"BOTMESH_STOP_TIMEOUT": "0"})
    assert WorkerConfig.from_env({}).stop_timeout == 30.0
    assert WorkerConfig.from_env({"BOTMESH_STOP_TIMEOUT": "2.5"}).stop_timeout == 2.5
    with pytest.raises(ValueError, match=r"^topic wait \(BOTMESH_TOPIC_WAIT\) -1s: must be"):
        WorkerConfig.from_env({"BOTMESH_TOPIC_WAIT": "-1"})
    with pytest.raises(ValueError, match=r"^BOTMESH_TOPIC_WAIT='soon' is not a number"):
        WorkerConfig.from_env({"BOTMESH_TOPIC_WAIT": "soon"})
    assert WorkerConfig.from_env({}).topic_wait == 60.0
    assert WorkerConfig.from_env({"BOTMESH_TOPIC_WAIT": "5"}).topic_wait == 5.0
    config = WorkerConfig.from_env(
        {
            "BOTMESH_INSTANCE_ID": "echo-0",
            "BOTMESH_HTTP_PORT": "9464",
            "BOTMESH_HTTP_HOST": "0.0.0.0",
        }
    )
    assert (config.instance_id, config.http_port, config.http_host) == ("echo-0", 9464, "0.0.0.0")
    assert WorkerConfig.from_env({}).http_port is None  # not served unless asked for
    with pytest.raises(ValueError, match=r"^HTTP port \(BOTMESH_HTTP_PORT, --http-port\) 70000"):
        WorkerConfig.from_env({"BOTMESH_HTTP_PORT": "70000"})
    with pytest.raises(ValueError, match=r"^BOTMESH_WEB_PORT is no longer read: .*HTTP_PORT"):
        WorkerConfig.from_env({"BOTMESH_WEB_PORT": "6066"})


def test_the_group_instance_id_is_the_instance_id_in_the_characters_kafka_takes() -> None:
    assert group_instance_id("echo-0") == "echo-0"
    assert group_instance_id("host-a/echo/default") == "host-a_echo_default"
    assert len(group_instance_id("x" * 400)) == 249


def test_the_processing_guarantee_comes_from_the_option_then_the_environment() -> None:
    assert WorkerConfig.from_env({}).guarantee == "at_least_once"
    assert not WorkerConfig.from_env({}).exactly_once
    env = {"BOTMESH_PROCESSING_GUARANTEE": "exactly-once"}
    assert WorkerConfig.from_env(env).exactly_once
    assert not WorkerConfig.from_env(env, guarantee="at_least_once").exactly_once
    with pytest.raises(ValueError, match=r"^BOTMESH_PROCESSING_GUARANTEE 'maybe'"):
        WorkerConfig.from_env({"BOTMESH_PROCESSING_GUARANTEE": "maybe"})
    with pytest.raises(ValueError, match=r"^--guarantee 'twice'"):
        WorkerConfig.from_env({}, guarantee="twice")

"""``make run`` in short: ``python -m botmesh.examples.demo --once``. The echo bot runs on its
default journal, on Kafka, which the demo reads back from the changelog.

Two paths: against the test broker (``KAFKA_BOOTSTRAP_SERVERS`` set), and the newcomer's,
with no broker running and no ``KAFKA_BOOTSTRAP_SERVERS``: the demo starts the checkout's
local Kafka itself and stops it at the end. (``.ci/run`` also runs ``make run`` itself that
way, from the clean clone.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.kafka.broker import free_ports

REPO = Path(__file__).resolve().parents[2]


def _demo(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "botmesh.examples.demo", "--once", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )


@pytest.mark.kafka
def test_demo_once(kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> None:
    env = dict(
        os.environ, KAFKA_BOOTSTRAP_SERVERS=kafka_bootstrap, BOTMESH_TOPIC_PREFIX=topic_prefix
    )
    out = _demo(env, REPO, "--messages", "200", "--chats", "8", "--data-dir", str(tmp_path))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "200/200 receipts, 8 chats, per-chat order OK" in out.stdout
    assert "worker stopped (exit 0)" in out.stdout
    assert out.stdout.count("] sent ") == 200
    changelog = f"{topic_prefix}.worker-journal-changelog"
    assert f"the worker's journal: on Kafka, {changelog}" in out.stdout
    # the warm-up message and the 200: journaled, done, their replies sent
    assert f"demo: journal {changelog}: inbound 201 done; sends 201 sent" in out.stdout


@pytest.mark.kafka
@pytest.mark.slow
def test_demo_starts_and_stops_its_own_broker_when_none_is_set(tmp_path: Path) -> None:
    """No ``KAFKA_BOOTSTRAP_SERVERS``: the demo finds the checkout's ``kafka.sh`` (whatever
    the working directory), starts a broker, runs, and stops it. The broker's ports and data
    dir are moved off 9092 (``KAFKA_PORT``...) only so the test never meets a developer's
    broker; ``.ci/run`` runs ``make run`` on the defaults."""
    port, controller = free_ports(2)
    data = tmp_path / "kafka"
    env = {k: v for k, v in os.environ.items() if k != "KAFKA_BOOTSTRAP_SERVERS"}
    env.pop("BOTMESH_TOPIC_PREFIX", None)
    env.update(
        KAFKA_PORT=str(port), KAFKA_CONTROLLER_PORT=str(controller), KAFKA_DATA_DIR=str(data)
    )
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    out = _demo(env, elsewhere, "--data-dir", str(tmp_path / "demo"))
    pid_file = data / "kafka.pid"
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"demo: starting the local Kafka on 127.0.0.1:{port}" in out.stdout
    assert "300/300 receipts, 12 chats, per-chat order OK" in out.stdout
    assert "demo: journal botmesh.worker-journal-changelog: inbound 301 done; sends 301 sent" in (
        out.stdout
    )
    assert "demo: local Kafka stopped" in out.stdout
    assert not pid_file.exists(), "the broker the demo started is still running"

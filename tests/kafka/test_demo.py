"""``make run`` in short: ``python -m botmesh.examples.demo --once`` against the test broker; the
echo
bot runs on its default journal, on Kafka, which the demo reads back from the changelog."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.kafka
def test_demo_once(kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "botmesh.examples.demo",
            "--once",
            "--messages",
            "200",
            "--chats",
            "8",
            "--data-dir",
            str(tmp_path),
        ],
        cwd=REPO,
        env=dict(
            os.environ, KAFKA_BOOTSTRAP_SERVERS=kafka_bootstrap, BOTMESH_TOPIC_PREFIX=topic_prefix
        ),
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "200/200 receipts, 8 chats, per-chat order OK" in out.stdout
    assert "worker stopped (exit 0)" in out.stdout
    assert out.stdout.count("] sent ") == 200
    changelog = f"{topic_prefix}.worker-journal-changelog"
    assert f"the worker's journal: on Kafka, {changelog}" in out.stdout
    # the warm-up message and the 200: journaled, done, their replies sent
    assert f"demo: journal {changelog}: inbound 201 done; sends 201 sent" in out.stdout

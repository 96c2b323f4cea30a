"""The demo (``make run``) stops at once, before it starts a broker or a worker, when
``--app`` names no bot: exit 2, naming what was given and what ``--app`` takes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("app", "why"),
    [
        ("nosuch_module_x:bot", "ModuleNotFoundError"),
        ("botmesh.examples.echo_bot:nosuch", "AttributeError"),
        ("botmesh.examples.echo_bot:Bot", "is a type, not a bot"),
    ],
)
def test_a_wrong_app_stops_the_demo_naming_it_and_the_fix(app: str, why: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "KAFKA_BOOTSTRAP_SERVERS"}
    out = subprocess.run(
        [sys.executable, "-m", "botmesh.examples.demo", "--app", app],
        cwd=ROOT,
        env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 2, out.stderr
    assert f"--app {app!r}" in out.stderr and why in out.stderr
    assert "module:attribute of a botmesh.Bot" in out.stderr
    assert "kafka.sh" not in out.stdout + out.stderr  # no broker was started

"""On a journal several processes share, the default instance id carries a per-boot suffix
(two processes on one host never share one), also when the journal is given as a URL."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

import botmesh
from botmesh import Bot
from botmesh.testing import MockProvider


@pytest.mark.parametrize(
    "url",
    [
        "sqlite:///{tmp}/bot.db",
        "shared-file:///{tmp}/bot.journal",
        "postgresql://u:p@127.0.0.1:1/db",
        "postgres://u:p@127.0.0.1:1/db",
        "redis://127.0.0.1:1/0",
        "rediss://127.0.0.1:1/0",
    ],
)
def test_a_shared_journal_url_gives_a_per_boot_instance_id(url: str, tmp_path: Path) -> None:
    journal = url.format(tmp=tmp_path)
    one = botmesh.run(Bot("helper"), MockProvider(), journal=journal).instance_id
    two = botmesh.run(Bot("helper"), MockProvider(), journal=journal).instance_id
    base = f"{socket.gethostname()}/helper/default/"
    assert one.startswith(base) and two.startswith(base)
    assert one != two
    given = botmesh.run(Bot("helper"), MockProvider(), journal=journal, instance_id="pod-0")
    assert given.instance_id == "pod-0"


@pytest.mark.parametrize("url", ["memory://", "file:///{tmp}/j"])
def test_a_journal_of_one_process_keeps_the_stable_default(url: str, tmp_path: Path) -> None:
    journal = url.format(tmp=tmp_path)
    app = botmesh.run(Bot("helper"), MockProvider(), journal=journal)
    assert app.instance_id == f"{socket.gethostname()}/helper/default"

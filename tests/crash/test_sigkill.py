"""A real child process killed with SIGKILL, then started again on the same journal."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.backends import BACKENDS
from tests.kill import Child, python

pytestmark = pytest.mark.crash

PERSISTENT = sorted(n for n, c in BACKENDS.items() if c.persistent)


def _kill_at(marker: str, *args: str) -> None:
    with Child(python("-m", "tests.crash.child", *args)) as child:
        child.wait_for(marker)
        child.kill()


def _recover(*args: str) -> dict[str, Any]:
    with Child(python("-m", "tests.crash.child", *args)) as child:
        lines = child.finish()
    summary: dict[str, Any] = json.loads(lines[-1])
    return summary


def test_there_is_a_persistent_backend() -> None:
    assert PERSISTENT, "the SIGKILL tests need a persistent backend in tests/backends.py"


@pytest.mark.parametrize("backend_name", PERSISTENT)
def test_sigkill_in_the_middle_of_a_handler(backend_name: str, tmp_path: Path) -> None:
    args = (backend_name, str(tmp_path / "journal"), str(tmp_path / "sent.log"))
    _kill_at("IN_HANDLER", *args, "hang-in-handler", "skip")
    summary = _recover(*args, "recover", "skip")
    assert (tmp_path / "sent.log").read_text().splitlines() == ["a", "b"]  # "a" not repeated
    assert summary["inbox"] == {"m1": ["done", 2]}
    assert summary["outbox"] == {"m1:1": "sent", "m1:2": "sent"}
    m = summary["metrics"]
    assert (m["inboundReplayed"], m["outboxDeduped"], m["outboxAmbiguous"]) == (1, 1, 0)


@pytest.mark.parametrize("policy", ["skip", "resend"])
@pytest.mark.parametrize("backend_name", PERSISTENT)
def test_sigkill_between_provider_and_record(
    backend_name: str, policy: str, tmp_path: Path
) -> None:
    args = (backend_name, str(tmp_path / "journal"), str(tmp_path / "sent.log"))
    _kill_at("SENT", *args, "hang-after-send", policy)
    summary = _recover(*args, "recover", policy)
    sent = (tmp_path / "sent.log").read_text().splitlines()
    assert summary["metrics"]["outboxAmbiguous"] == 1
    assert summary["inbox"]["m1"][0] == "done"
    if policy == "skip":
        assert sent == ["a", "b"]  # never a duplicate
        assert summary["outbox"] == {"m1:1": "unknown", "m1:2": "sent"}
    else:
        assert sent == ["a", "a", "b"]  # never lost
        assert summary["outbox"] == {"m1:1": "sent", "m1:2": "sent"}

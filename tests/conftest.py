"""Fixtures shared by every suite: ``backend`` runs a test once per journal backend."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests import servers
from tests.backends import BACKENDS, BackendHandle


def pytest_configure(config: pytest.Config) -> None:
    servers.allow_start()  # this process may start the PostgreSQL and Redis of the tests


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    servers.stop_all()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test that runs on a backend needing a server (a ``backend`` param, or a
    ``backend_name`` one) gets that server's marker, so ``-m postgres`` selects it and
    ``-m "not redis"`` leaves it out."""
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is None:
            continue
        for value in callspec.params.values():
            case = BACKENDS.get(value) if isinstance(value, str) else None
            if case is not None and case.server is not None:
                item.add_marker(case.server)


@pytest.fixture(params=sorted(BACKENDS))
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[BackendHandle]:
    """A fresh backend of each registered kind, opened; closed after the test."""
    handle = BackendHandle(BACKENDS[request.param], tmp_path / "journal")
    await handle.open()
    try:
        yield handle
    finally:
        await handle.close()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("botmesh crash matrix")
    group.addoption(
        "--crash-cases",
        default=os.environ.get("BOTMESH_CRASH_CASES", "100"),
        help="seeded random crash cases per backend and ambiguity policy (default 100)",
    )
    group.addoption("--crash-seed", default="20261202", help="seed of the random crash cases")
    group = parser.getgroup("file journal")
    group.addoption(
        "--fuzz-cases",
        type=int,
        default=int(os.environ.get("BOTMESH_FUZZ_CASES", "600")),
        help="corruption fuzzer cases for the file journal (default 600)",
    )
    group.addoption(
        "--fuzz-seed",
        type=int,
        default=int(os.environ["BOTMESH_FUZZ_SEED"]) if "BOTMESH_FUZZ_SEED" in os.environ else None,
        help="seed of the corruption fuzzer's random cases (default: a fixed one)",
    )
    group.addoption(
        "--kill-runs",
        type=int,
        default=int(os.environ.get("BOTMESH_KILL_RUNS", "6")),
        help="SIGKILL runs of a child process writing the file journal (default 6)",
    )

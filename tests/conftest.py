"""Fixtures shared by every suite: ``backend`` runs a test once per journal backend."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.backends import BACKENDS, BackendHandle


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
        default="100",
        help="seeded random crash cases per backend and ambiguity policy (default 100)",
    )
    group.addoption("--crash-seed", default="20261202", help="seed of the random crash cases")

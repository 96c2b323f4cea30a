"""Fixtures shared by every suite: ``backend`` runs a test once per journal backend."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests import servers, soak
from tests.backends import BACKENDS, BackendHandle
from tests.kafka.broker import BrokerUnavailable, acquire_broker


def _parallel_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")  # set by pytest-xdist in its workers


def pytest_configure(config: pytest.Config) -> None:
    if _parallel_worker(config):
        return  # the controller started the servers; their URLs are in our environment
    servers.allow_start()  # this process may start the PostgreSQL and Redis of the tests
    # stopped at the end even when the session ends in an internal error (then
    # pytest_sessionfinish is not called): a server left behind holds its port
    config.add_cleanup(servers.stop_all)
    if config.getoption("numprocesses", None):
        # before the workers start, so that they inherit the URLs and the broker's address
        servers.start_all()
        _share_kafka(config)


def _share_kafka(config: pytest.Config) -> None:
    """The broker of a parallel run: one, found (or started) here for all the workers."""
    if os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "").strip():
        return
    try:
        lease = acquire_broker()
    except BrokerUnavailable:
        return  # each Kafka test then fails, naming why (tests/kafka/conftest.py)
    config.add_cleanup(lease.release)
    os.environ["KAFKA_BOOTSTRAP_SERVERS"] = lease.bootstrap


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test that runs on a backend needing a server (a ``backend`` param, or a
    ``backend_name`` one) gets that server's marker, so ``-m postgres`` selects it and
    ``-m "not redis"`` leaves it out; a test that takes the broker (``kafka_bootstrap``)
    gets ``kafka`` whether or not it says so; then the long tests go first (``_rank``)."""
    for item in items:
        if "kafka_bootstrap" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.kafka)
        callspec = getattr(item, "callspec", None)
        if callspec is None:
            continue
        for value in callspec.params.values():
            case = BACKENDS.get(value) if isinstance(value, str) else None
            if case is not None and case.server is not None:
                item.add_marker(case.server)
    # The long tests first, then those on servers, then the rest (each in its own order): a
    # parallel run (make test) hands tests out one at a time, and a long one handed out last
    # would run alone at the end.
    items.sort(key=_rank)


#: Tests that take seconds to minutes (worker processes, kills, a broker of their own).
_LONG = ("soak", "slow")
_HEAVY = ("kafka", "crash", "postgres", "redis")


def _rank(item: pytest.Item) -> int:
    names = {m.name for m in item.iter_markers()}
    if names.intersection(_LONG) or {"kafka", "crash"} <= names:
        return 0
    return 1 if names.intersection(_HEAVY) else 2


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
        default=os.environ.get("BOTMESH_CRASH_CASES", str(soak.rounds(quick=100, soak=1000))),
        help="seeded random crash cases per backend and ambiguity policy (default 100; "
        "1000 under make soak)",
    )
    group.addoption(
        "--crash-seed",
        default=str(soak.seed(20261202)),
        help="seed of the random crash cases (default 20261202; a new one each pass of make soak)",
    )
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

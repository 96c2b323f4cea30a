"""Options of the file-journal suite. Give the folder so that pytest loads them, or set
the environment variables (``BOTMESH_FUZZ_CASES``, ``BOTMESH_FUZZ_SEED``,
``BOTMESH_KILL_RUNS``), which work with a bare ``pytest`` / ``make test`` too:

pytest tests/file --fuzz-cases=20000   # corruption fuzzer cases (default 600, at least 500)
pytest tests/file --kill-runs=50       # real SIGKILL runs (default 6)
"""

from __future__ import annotations

import os
from collections import Counter

import pytest

#: What the corruption fuzzer saw, by outcome; printed at the end of the run.
FUZZ_OUTCOMES: Counter[str] = Counter()
KILL_OUTCOMES: Counter[str] = Counter()


def pytest_addoption(parser: pytest.Parser) -> None:
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


@pytest.fixture
def fuzz_seed(request: pytest.FixtureRequest) -> int | None:
    seed = request.config.getoption("--fuzz-seed")
    return None if seed is None else int(seed)


@pytest.fixture
def fuzz_cases(request: pytest.FixtureRequest) -> int:
    return int(request.config.getoption("--fuzz-cases"))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if FUZZ_OUTCOMES:
        total = sum(FUZZ_OUTCOMES.values())
        parts = ", ".join(f"{k}: {v}" for k, v in sorted(FUZZ_OUTCOMES.items()))
        terminalreporter.write_line(f"file journal fuzzer: {total} cases ({parts})")
    if KILL_OUTCOMES:
        parts = ", ".join(f"{k}: {v}" for k, v in sorted(KILL_OUTCOMES.items()))
        terminalreporter.write_line(f"file journal SIGKILL runs: {parts}")

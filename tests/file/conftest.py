"""Fixtures of the file-journal suite. Its options live in ``tests/conftest.py`` (pytest
reads options only from the root conftest); the environment variables
``BOTMESH_FUZZ_CASES``, ``BOTMESH_FUZZ_SEED`` and ``BOTMESH_KILL_RUNS`` set their defaults:

pytest tests/file --fuzz-cases=20000   # corruption fuzzer cases (default 600, at least 500)
pytest tests/file --kill-runs=50       # real SIGKILL runs (default 6)
"""

from __future__ import annotations

from collections import Counter

import pytest

#: What the corruption fuzzer saw, by outcome; printed at the end of the run.
FUZZ_OUTCOMES: Counter[str] = Counter()
KILL_OUTCOMES: Counter[str] = Counter()


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

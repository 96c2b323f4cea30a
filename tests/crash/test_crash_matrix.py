"""The crash matrix: every named write × before/after × both ambiguity policies × every
backend, two-crash cases for the writes only recovery makes, then seeded random points.

``--crash-cases=N`` sets the random cases per backend and policy (default 100, so 200 per
backend in ``make test``).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Literal

import pytest

from tests.backends import BACKENDS
from tests.crash.harness import WINDOW, Point, check, run_case

pytestmark = pytest.mark.crash

POLICIES = ["skip", "resend"]
BACKEND_NAMES = sorted(BACKENDS)


async def _labels_of_clean_run(tmp_path: Path) -> list[str]:
    out = await run_case(BACKENDS["memory"], tmp_path / "dry", "skip", [None])
    check(out, "skip")
    return out.labels_a


def _named_points(labels: list[str]) -> list[Point]:
    """Every distinct label at each of its occurrences × before/after."""
    points: list[Point] = []
    seen: dict[str, int] = {}
    for label in labels:
        seen[label] = seen.get(label, 0) + 1
        for when in ("before", "after"):
            points.append(("label", (label, seen[label]), when))
    return points


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("backend_name", BACKEND_NAMES)
async def test_every_named_crash_point(backend_name: str, policy: str, tmp_path: Path) -> None:
    labels = await _labels_of_clean_run(tmp_path)
    points = _named_points(labels)
    assert len(points) >= 40  # the scenario really exercises the journal
    for i, point in enumerate(points):
        out = await run_case(BACKENDS[backend_name], tmp_path / f"n{i}", policy, [point])
        assert len(out.crashes) == 1, point
        check(out, policy)


#: Writes that only a recovering incarnation makes: crash A in the window (or mid-way),
#: then crash B at these, then let C recover.
def _at(label: str, occurrence: int, when: Literal["before", "after"]) -> Point:
    return ("label", (label, occurrence), when)


RECOVERY_POINTS: list[tuple[Point, Point]] = [
    (first, _at(second, 1, when))
    for first, second in (
        (_at("outbox.journal", 1, "after"), "outbox.mark_unknown"),
        (_at("outbox.journal", 1, "after"), "outbox.claim"),
        (_at("inbox.journal", 2, "after"), "inbox.claim"),
        (_at("outbox.journal", 3, "before"), "outbox.wait"),
        (_at("outbox.mark_sent", 2, "before"), "outbox.mark_sent"),
    )
    for when in ("before", "after")
]


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("backend_name", BACKEND_NAMES)
async def test_crashes_during_recovery(backend_name: str, policy: str, tmp_path: Path) -> None:
    for i, (a, b) in enumerate(RECOVERY_POINTS):
        out = await run_case(BACKENDS[backend_name], tmp_path / f"r{i}", policy, [a, b])
        assert len(out.crashes) >= 1
        check(out, policy)


@pytest.mark.soak
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("backend_name", BACKEND_NAMES)
async def test_seeded_random_crash_points(
    backend_name: str, policy: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    cases = int(request.config.getoption("--crash-cases"))
    seed = int(request.config.getoption("--crash-seed"))
    labels = await _labels_of_clean_run(tmp_path)
    rng = random.Random(f"{seed}/{backend_name}/{policy}")
    in_window = crashed = 0
    for i in range(cases):
        points: list[Point | None] = [
            ("commit", rng.randint(1, len(labels)), rng.choice(["before", "after"]))
        ]
        if rng.random() < 0.3:  # a second crash while recovering
            points.append(("commit", rng.randint(1, 25), rng.choice(["before", "after"])))
        out = await run_case(BACKENDS[backend_name], tmp_path / f"x{i}", policy, points)
        try:
            check(out, policy)
        except AssertionError as exc:
            raise AssertionError(f"seed {seed} case {i} points {points}: {exc}") from exc
        crashed += len(out.crashes)
        in_window += sum((c.when, c.label) in WINDOW for c in out.crashes)
    assert crashed >= cases
    assert in_window > 0  # the random points do reach the ambiguous window

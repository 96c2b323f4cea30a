"""The crash matrix on the Kafka worker's journal: every named write × before/after × both
ambiguity policies, and the two-crash cases of recovery, on ``TableKv`` over the worker's
own changelog port on a real broker, under both processing guarantees
(``tests/kafka/journal.py``).

Each incarnation's journal dies as its process would (``abandon``): what it deferred and
never produced is lost, and under ``exactly_once`` so is its open transaction; the next one
is restored from the changelog topic alone. A send whose sent mark died that way is in the
ambiguous window: recovery must find it in flight, and nothing else.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.backends import BackendCase
from tests.crash.harness import Point, check, run_case
from tests.crash.test_crash_matrix import RECOVERY_POINTS, _labels_of_clean_run, _named_points
from tests.kafka.journal import forget, kafka_case
from tests.soak import rounds

pytestmark = [pytest.mark.kafka, pytest.mark.crash]

GUARANTEES = ["at_least_once", "exactly_once"]
POLICIES = ["skip", "resend"]


@pytest.fixture(params=GUARANTEES)
def case(kafka_bootstrap: str, request: pytest.FixtureRequest) -> BackendCase:
    return kafka_case(kafka_bootstrap, request.param)


#: Both guarantees under both ambiguity policies: the guarantee changes which writes a
#: crash loses (under ``exactly_once`` the open transaction too), the policy what recovery
#: does with a send it finds in flight.
NAMED = [(g, p) for g in GUARANTEES for p in POLICIES]


def _spread(points: list[Point], count: int, offset: int) -> list[Point]:
    """``count`` of ``points`` spread evenly over them, from the ``offset``-th on (each
    combination of ``NAMED`` its own share when it is not all of them)."""
    if count >= len(points):
        return points
    chosen = {(offset + (i * len(points)) // count) % len(points) for i in range(count)}
    return [points[i] for i in sorted(chosen)]


@pytest.mark.soak
@pytest.mark.parametrize(("guarantee", "policy"), NAMED)
async def test_every_named_crash_point(
    kafka_bootstrap: str, guarantee: str, policy: str, tmp_path: Path
) -> None:
    """Every point under ``make soak`` (CI's soak pass: its scale's share of them);
    ``make test`` runs every third one, each combination of ``NAMED`` a different third, to
    keep its load (the kill tests it runs beside are timed by the broker)."""
    labels = await _labels_of_clean_run(tmp_path)
    points = _named_points(labels)
    assert len(points) >= 40
    offset = NAMED.index((guarantee, policy))
    points = _spread(points, rounds(quick=len(points) // 3, soak=len(points)), offset)
    lost = 0
    for i, point in enumerate(points):
        # every other point's inbounds fresh (journaled with their turn's first send, not
        # before their handlers), alternating between the combinations: under ``make soak``
        # each point of each guarantee runs both ways (one policy each)
        case = kafka_case(kafka_bootstrap, guarantee, fresh=(i + offset) % 2 == 0)
        out = await run_case(case, tmp_path / f"n{i}", policy, [point])
        forget(kafka_bootstrap, tmp_path / f"n{i}")
        assert len(out.crashes) == 1, point
        check(out, policy)
        lost += sum(1 for keys in out.lost for k in keys if "/out/" in k)
    # the deferred sent marks really are lost at some crash points (so the window the
    # check widens is one the journal makes, not an empty promise)
    assert lost > 0


@pytest.mark.parametrize("policy", POLICIES)
async def test_crashes_during_recovery(
    kafka_bootstrap: str, case: BackendCase, policy: str, tmp_path: Path
) -> None:
    for i, (a, b) in enumerate(RECOVERY_POINTS):
        out = await run_case(case, tmp_path / f"r{i}", policy, [a, b])
        forget(kafka_bootstrap, tmp_path / f"r{i}")
        assert len(out.crashes) >= 1
        check(out, policy)

"""Long loops: a few rounds in ``make test``, many in ``make soak``.

A test with a loop whose length is a matter of confidence, not of coverage (SIGKILL
rounds, fresh starts, random crash cases), takes its count from ``rounds(quick, soak)``
and is marked ``soak``. ``make test`` runs it with the ``quick`` count: every code path
the loop reaches, once or a few times. ``make soak`` (``BOTMESH_SOAK=1``) runs only the
``soak`` tests with the ``soak`` count, pass after pass with a new seed each, until
``SOAK_MINUTES`` have gone by::

    make soak                  # 10 minutes
    make soak SOAK_MINUTES=60  # an hour
    python -m tests.soak --minutes 5 -- tests/kafka/test_kills.py -k random

A pass that fails ends the soak with its status; the seed of each pass is printed
(``BOTMESH_SOAK_PASS``), and ``seed(base)`` gives it to the tests' random moments.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

__all__ = ["SOAK", "rounds", "seed"]

#: True under ``make soak``.
SOAK = os.environ.get("BOTMESH_SOAK") == "1"
_PASS = int(os.environ.get("BOTMESH_SOAK_PASS", "0"))
#: ``BOTMESH_SOAK_SCALE``: the share of each ``soak`` count a pass runs (CI's one pass runs
#: 0.4 of them, to keep its whole run under 30 minutes; ``make soak`` all of them).
_SCALE = float(os.environ.get("BOTMESH_SOAK_SCALE", "1"))


def rounds(quick: int, soak: int) -> int:
    """``soak`` under ``make soak`` (times ``BOTMESH_SOAK_SCALE``, never below ``quick``),
    else ``quick``."""
    return max(quick, round(soak * _SCALE)) if SOAK else quick


def seed(base: int) -> int:
    """A random generator's seed: ``base`` in ``make test`` (a failure is reproduced by
    running the test again), ``base`` plus the pass number under ``make soak``."""
    return base + _PASS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.soak",
        description="Run the soak tests (marker `soak`, their long counts) pass after pass "
        "until MINUTES have gone by; the first failing pass ends it with its status.",
    )
    parser.add_argument("--minutes", type=float, default=10.0, help="how long (default 10)")
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    args = parser.parse_args(argv)
    if args.minutes <= 0:
        parser.error(f"--minutes {args.minutes}: give a number of minutes above 0")
    end = time.monotonic() + args.minutes * 60
    started = time.monotonic()
    passes = 0
    while True:
        passes += 1
        env = dict(os.environ, BOTMESH_SOAK="1", BOTMESH_SOAK_PASS=str(passes))
        print(f"soak: pass {passes} (BOTMESH_SOAK_PASS={passes})", flush=True)
        argv_ = [sys.executable, "-m", "pytest", "-m", "soak", *args.pytest_args]
        status = subprocess.run(argv_, env=env, check=False).returncode
        if status != 0:
            print(f"soak: pass {passes} failed (status {status})", flush=True)
            return status
        if time.monotonic() >= end:
            break
    took = (time.monotonic() - started) / 60
    print(f"soak: {passes} passes in {took:.1f} min, every one passed", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""``python -m botmesh.topics.schemas [--check]``: regenerate the JSON Schema files from the
structs.

With ``--check`` nothing is written: exit status 1 lists the files that are out of step.
"""

from __future__ import annotations

import argparse
import sys

from botmesh.topics.schemas import stale, write


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m botmesh.topics.schemas",
        description="Regenerate botmesh/topics/schemas/*.json from the structs.",
    )
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if a file is out of step"
    )
    args = parser.parse_args(argv)
    if args.check:
        out = stale()
        for p in out:
            print(
                f"{p} is out of step with botmesh.state.messages; run `make schemas`",
                file=sys.stderr,
            )
        return 1 if out else 0
    for p in write():
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

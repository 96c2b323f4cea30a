"""Imports point down: ``state`` and ``providers`` never load Kafka or Faust, nor our other
packages; ``topics`` loads nothing of ours."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

KAFKA = ("faust", "aiokafka", "confluent_kafka", "mode", "rocksdict")


def _loaded_after(module: str) -> set[str]:
    code = (
        "import json, sys; before = set(sys.modules); "
        f"import {module}; "
        "print(json.dumps(sorted(set(sys.modules) - before)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(json.loads(out.stdout))


def _tops(modules: set[str]) -> set[str]:
    return {m.split(".")[0] for m in modules}


@pytest.mark.parametrize(
    "module",
    [
        "state",
        "state.durability",
        "state.sweeper",
        "state.config",
        "state.backends",
        "state.backends.file",
        "providers",
        "botmesh.testing",
    ],
)
def test_no_kafka_or_faust(module: str) -> None:
    tops = _tops(_loaded_after(module))
    assert not tops & set(KAFKA), sorted(tops & set(KAFKA))


@pytest.mark.parametrize("module", ["state", "state.durability", "state.backends"])
def test_state_imports_nothing_of_ours_but_itself(module: str) -> None:
    tops = _tops(_loaded_after(module))
    assert not tops & {"botmesh", "streams", "topics", "providers"}


def test_providers_import_only_state() -> None:
    tops = _tops(_loaded_after("providers"))
    assert not tops & {"botmesh", "streams", "topics"}


def test_url_backends_load_lazily() -> None:
    loaded = _loaded_after("state.backends")
    assert "state.backends.file" not in loaded and "state.backends.urls" not in loaded

"""``topics`` is pure data (no Kafka client, nothing of ours); ``streams`` never loads ``botmesh``;
``botmesh`` itself loads no Kafka until a CLI command needs it."""

from __future__ import annotations

import json
import subprocess
import sys

KAFKA = {"faust", "aiokafka", "confluent_kafka", "mode", "rocksdict"}


def _tops_after(module: str) -> set[str]:
    code = (
        "import json, sys; before = set(sys.modules); "
        f"import {module}; "
        "print(json.dumps(sorted({m.split('.')[0] for m in set(sys.modules) - before})))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(json.loads(out.stdout))


def test_topics_loads_no_kafka_and_nothing_of_ours() -> None:
    tops = _tops_after("topics")
    assert not tops & (KAFKA | {"botmesh", "streams", "state", "providers"}), sorted(tops)


def test_streams_never_loads_botmesh() -> None:
    for module in ("streams.worker", "streams.runner", "streams.tools", "streams.provision"):
        assert "botmesh" not in _tops_after(module), module


def test_botmesh_cli_loads_kafka_lazily() -> None:
    assert not _tops_after("botmesh.cli") & KAFKA

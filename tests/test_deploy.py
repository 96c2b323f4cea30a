"""docker-compose.yml and the Dockerfile cannot run here (no Docker engine), so these tests
keep them in step with the code: the same Kafka release, the environment the worker reads,
an app that loads, every package copied into the image, a journal that survives the
container (in its volume)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped]

from botmesh._cli import load_app
from botmesh.streams.config import WorkerConfig

ROOT = Path(__file__).resolve().parent.parent


def compose() -> dict[str, Any]:
    data = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert isinstance(data, dict)
    return data


def test_compose_has_kafka_and_worker() -> None:
    services = compose()["services"]
    assert set(services) >= {"kafka", "worker"}
    assert services["worker"]["depends_on"]["kafka"]["condition"] == "service_healthy"


def test_compose_kafka_is_the_release_we_test() -> None:
    script = (ROOT / "deploy/kafka/kafka.sh").read_text()
    pinned = re.search(r'KAFKA_VERSION="\$\{KAFKA_VERSION:-([0-9.]+)\}"', script)
    assert pinned is not None
    image = compose()["services"]["kafka"]["image"]
    assert image == f"apache/kafka:{pinned.group(1)}"
    env = compose()["services"]["kafka"]["environment"]
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"  # KRaft, no ZooKeeper


def test_compose_worker_environment_is_what_the_worker_reads() -> None:
    env = {k: str(v) for k, v in compose()["services"]["worker"]["environment"].items()}
    source = "".join(
        (ROOT / f).read_text()
        for f in ("botmesh/streams/config.py", "botmesh/topics/catalog.py", "botmesh/_cli.py")
    )
    for name in env:
        assert f'"{name}"' in source, f"{name} is set in docker-compose.yml but never read"
    config = WorkerConfig.from_env(env)
    assert config.bootstrap == env["KAFKA_BOOTSTRAP_SERVERS"]
    assert config.prefix == env["BOTMESH_TOPIC_PREFIX"]
    assert str(config.data_dir) == env["BOTMESH_DATA_DIR"]
    assert config.partitions == int(env["BOTMESH_PARTITIONS"])
    assert config.instance_id == env["BOTMESH_INSTANCE_ID"]


def test_the_worker_journal_lives_in_the_data_volume() -> None:
    worker = compose()["services"]["worker"]
    data_dir = str(worker["environment"]["BOTMESH_DATA_DIR"])
    assert f"worker-data:{data_dir}" in worker["volumes"]
    assert "BOTMESH_JOURNAL" not in worker["environment"]  # the default: the journal on Kafka
    config = WorkerConfig.from_env({k: str(v) for k, v in worker["environment"].items()})
    assert config.kafka_journal  # its RocksDB copy (and Faust's files) in the data dir
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert f"BOTMESH_DATA_DIR={data_dir}" in dockerfile
    assert f'VOLUME ["{data_dir}"]' in dockerfile


def test_worker_command_loads_and_matches_the_image() -> None:
    command = compose()["services"]["worker"]["command"]
    assert command[:2] == ["botmesh", "worker"]
    app = command[command.index("--app") + 1]
    assert hasattr(load_app(app), "bind")
    dockerfile = (ROOT / "Dockerfile").read_text()
    cmd = re.search(r"^CMD (\[.*\])$", dockerfile, re.MULTILINE)
    assert cmd is not None and yaml.safe_load(cmd.group(1)) == command
    copied = {shlex.split(line)[1] for line in dockerfile.splitlines() if line.startswith("COPY ")}
    assert "botmesh" in copied, "the Dockerfile does not copy botmesh/"
    # the one package holds everything, the default app's module included
    assert app.startswith("botmesh."), app

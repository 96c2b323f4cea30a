"""docker-compose.yml and the Dockerfile cannot run here (no Docker engine), so these tests
keep them in step with the code: the same Kafka release, the environment the worker reads,
an app that loads, every package copied into the image, a journal that survives the
container (in its volume), health checks that ask the routes and ports the worker and the
gateway serve, and a `monitoring` profile whose Prometheus and Grafana find their files."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped]

from botmesh._cli.load import load_app
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
    files = [ROOT / "botmesh/streams/config.py", ROOT / "botmesh/topics/catalog.py"]
    source = "".join(f.read_text() for f in [*files, *(ROOT / "botmesh/_cli").glob("*.py")])
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


# -- the gateway, the health checks and the monitoring profile --------------------------------

_DEFAULTED = re.compile(r"^\$\{(\w+):-([^}]*)\}$")


def service_env(name: str) -> dict[str, str]:
    """A service's environment as compose gives it with nothing exported (``${X:-d}``: d)."""
    env = {}
    for key, value in compose()["services"][name]["environment"].items():
        text = str(value)
        defaulted = _DEFAULTED.match(text)
        assert "$" not in text or defaulted, f"{key}: {text} has no default"
        env[key] = defaulted.group(2) if defaulted else text
    return env


def checked_url(name: str) -> tuple[int, str]:
    """Port and path the service's health check asks, and that the check is valid Python."""
    test = compose()["services"][name]["healthcheck"]["test"]
    assert test[:3] == ["CMD", "python", "-c"], test  # the image has no curl
    compile(test[3], f"{name} healthcheck", "exec")
    url = re.search(r"http://127\.0\.0\.1:(\d+)(/\w+)", test[3])
    assert url is not None, test
    return int(url.group(1)), url.group(2)


def test_the_worker_serves_health_and_metrics_where_its_check_asks() -> None:
    env = service_env("worker")
    config = WorkerConfig.from_env(env)
    assert config.http_host == "0.0.0.0" and config.http_port is not None
    assert checked_url("worker") == (config.http_port, "/readyz")
    assert "BOTMESH_WEB_PORT" not in compose()["services"]["worker"]["environment"]
    # the compose stop outlasts the worker's own stop limit
    grace = compose()["services"]["worker"]["stop_grace_period"]
    assert int(grace.removesuffix("s")) > config.stop_timeout


def test_the_gateway_runs_the_channels_it_names_and_is_checked() -> None:
    from botmesh._gateway import Gateway, GatewayConfig
    from botmesh.providers.channels import webhook_from_env

    gateway = compose()["services"]["gateway"]
    assert gateway["depends_on"]["kafka"]["condition"] == "service_healthy"
    command = gateway["command"]
    assert command[:2] == ["botmesh", "gateway"]
    port = int(command[command.index("--port") + 1])
    assert command[command.index("--host") + 1] == "0.0.0.0"
    env = service_env("gateway")
    channels = env["BOTMESH_GATEWAY_CHANNELS"].split(",")
    hooks = {c: webhook_from_env(c, env) for c in channels}  # each has its secret
    app = Gateway(hooks, GatewayConfig(bootstrap=env["KAFKA_BOOTSTRAP_SERVERS"])).app()
    routes = {r.resource.canonical for r in app.router.routes() if r.resource is not None}
    assert {"/healthz", "/readyz", "/metrics"} | {f"/{c}" for c in channels} <= routes
    assert checked_url("gateway") == (port, "/readyz")
    assert f"127.0.0.1:{port}:{port}" in gateway["ports"]


def test_every_published_port_is_on_loopback_only() -> None:
    published = 0
    for name, service in compose()["services"].items():
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} to the network"
            published += 1
    assert published >= 5


def _mounts(service: dict[str, Any]) -> dict[str, Path]:
    """Bind mounts of the repository's files: container path -> the file or folder here."""
    out = {}
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith("./"):
            assert (ROOT / source).exists(), f"{source} is mounted but does not exist"
            out[target] = ROOT / source
    return out


def test_the_monitoring_profile_scrapes_both_and_loads_the_alerts() -> None:
    services = compose()["services"]
    profiled = {n for n, s in services.items() if s.get("profiles")}
    assert profiled == {"prometheus", "grafana"}
    assert all(services[n]["profiles"] == ["monitoring"] for n in profiled)
    mounts = _mounts(services["prometheus"])
    config_dir = mounts["/etc/prometheus"]  # where the image reads prometheus.yml
    config = yaml.safe_load((config_dir / "prometheus.yml").read_text())
    for rules in config["rule_files"]:
        assert (config_dir / rules).is_file(), rules  # relative to the config file
    assert "alerts.yml" in config["rule_files"]
    targets = {
        job["job_name"]: [t for c in job["static_configs"] for t in c["targets"]]
        for job in config["scrape_configs"]
    }
    worker_port = WorkerConfig.from_env(service_env("worker")).http_port
    command = services["gateway"]["command"]
    gateway_port = command[command.index("--port") + 1]
    assert targets == {
        "botmesh-worker": [f"worker:{worker_port}"],
        "botmesh-gateway": [f"gateway:{gateway_port}"],
    }
    assert all(
        job.get("metrics_path", "/metrics") == "/metrics" for job in config["scrape_configs"]
    )


def test_grafana_finds_its_data_source_and_the_dashboard() -> None:
    grafana = compose()["services"]["grafana"]
    mounts = _mounts(grafana)
    provisioning = mounts["/etc/grafana/provisioning"]
    [source] = yaml.safe_load((provisioning / "datasources/prometheus.yml").read_text())[
        "datasources"
    ]
    assert source["type"] == "prometheus"
    assert source["url"] == "http://prometheus:9090"
    assert "9090:9090" in " ".join(compose()["services"]["prometheus"]["ports"])
    [provider] = yaml.safe_load((provisioning / "dashboards/botmesh.yml").read_text())["providers"]
    folder = provider["options"]["path"]
    dashboards = [t for t, p in mounts.items() if t.startswith(folder + "/")]
    assert dashboards and all(mounts[t].suffix == ".json" for t in dashboards)
    assert mounts[dashboards[0]] == ROOT / "deploy/grafana/botmesh-dashboard.json"

"""The Kubernetes manifests (deploy/k8s), the alert rules (deploy/prometheus/alerts.yml) and
the Grafana dashboard (deploy/grafana) cannot run here (no cluster, no Prometheus), so these
tests hold them to the code: what a kubelet would need (probes on ports the process listens
on, at routes it serves; selectors that select), settings that exist, a grace period longer
than the worker's own stop limit, and PromQL that names only metrics the processes export.

The base is rendered as ``kubectl apply -k`` would render it: ``render`` reads each
kustomization, loads its resources and components and applies its ``namespace``. It knows
only the fields our kustomizations use and refuses any other, so a new transformer (labels,
images, patches) fails here until ``render`` learns it rather than being silently skipped.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]

from botmesh._cli.load import load_app
from botmesh._gateway import DEFAULT_REQUEST_TIMEOUT, Gateway, GatewayConfig
from botmesh.observability.http import HealthServer, Readiness
from botmesh.observability.metrics import metric_names
from botmesh.providers.channels import CHANNELS, webhook_from_env
from botmesh.settings import SETTINGS
from botmesh.streams.config import WorkerConfig

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "deploy/k8s"
COMPONENT = K8S / "components/servicemonitor"
ALERTS = ROOT / "deploy/prometheus/alerts.yml"
DASHBOARD = ROOT / "deploy/grafana/botmesh-dashboard.json"

Doc = dict[str, Any]

#: The worker's routes (botmesh.observability.http); held to the server by a test below.
WORKER_ROUTES = frozenset({"/healthz", "/readyz", "/metrics"})
_CLUSTER_SCOPED = frozenset({"Namespace", "ClusterRole", "ClusterRoleBinding"})
_KUSTOMIZE_FIELDS = frozenset({"apiVersion", "kind", "namespace", "resources", "components"})
_METRIC = re.compile(r"(?<![\w])botmesh_[a-z_]+")


# -- rendering ------------------------------------------------------------------------------


def _docs(path: Path) -> list[Doc]:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    assert all(isinstance(d, dict) for d in docs), path
    return docs


def _kustomization(directory: Path) -> Doc:
    [doc] = _docs(directory / "kustomization.yaml")
    return doc


def build(kustomization: Doc, root: Path, *, kind: str = "Kustomization") -> list[Doc]:
    """The resources ``kustomization`` (in directory ``root``) renders to."""
    assert kustomization.get("kind") == kind, f"{root}: a {kind} expected"
    unknown = set(kustomization) - _KUSTOMIZE_FIELDS
    assert not unknown, f"{root}: render() does not apply {sorted(unknown)}: teach it"
    out: list[Doc] = []
    for entry in kustomization.get("resources", []):
        path = root / entry
        if path.is_dir():
            out += build(_kustomization(path), path)
        else:
            out += _docs(path)
    for entry in kustomization.get("components", []):
        path = root / entry
        out += build(_kustomization(path), path, kind="Component")
    namespace = kustomization.get("namespace")
    if namespace:
        for doc in out:
            if doc["kind"] == "Namespace":
                doc["metadata"]["name"] = namespace  # kustomize renames it too
            elif doc["kind"] not in _CLUSTER_SCOPED:
                doc["metadata"]["namespace"] = namespace
    ids = [(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]) for d in out]
    assert len(ids) == len(set(ids)), f"{root}: a resource twice: {sorted(ids)}"
    return out


def render_base() -> list[Doc]:
    return build(_kustomization(K8S), K8S)


def render_monitored() -> list[Doc]:
    """An overlay of the base with the servicemonitor component (k8s README's example)."""
    overlay = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "namespace": _kustomization(K8S)["namespace"],
        "resources": [str(K8S)],
        "components": [str(COMPONENT)],
    }
    return build(overlay, ROOT)


def one(docs: list[Doc], kind: str, name: str | None = None) -> Doc:
    found = [d for d in docs if d["kind"] == kind and name in (None, d["metadata"]["name"])]
    assert len(found) == 1, f"{kind} {name or ''}: {len(found)} found"
    return found[0]


def workloads(docs: list[Doc]) -> list[Doc]:
    return [d for d in docs if d["kind"] in ("StatefulSet", "Deployment")]


def pod_labels(workload: Doc) -> dict[str, str]:
    labels: dict[str, str] = workload["spec"]["template"]["metadata"]["labels"]
    return labels


def selects(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def secret_example() -> list[Doc]:
    return _docs(K8S / "secret.example.yaml")


def resolved_env(container: Doc, docs: list[Doc]) -> dict[str, str]:
    """The container's environment as the kubelet builds it: every envFrom source in
    order (Secrets from secret.example.yaml), then ``env`` on top; a ``valueFrom`` entry
    is left as ``<fieldRef ...>``."""
    secrets = {d["metadata"]["name"]: d for d in secret_example()}
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            env.update(one(docs, "ConfigMap", source["configMapRef"]["name"])["data"])
        else:
            ref = source["secretRef"]
            assert ref["name"] in secrets or ref.get("optional"), (
                f"Secret {ref['name']} is required but secret.example.yaml does not show it"
            )
            if ref["name"] in secrets:
                env.update(secrets[ref["name"]].get("stringData", {}))
    for entry in container.get("env", []):
        if "value" in entry:
            env[entry["name"]] = str(entry["value"])
        else:
            env[entry["name"]] = f"<{entry['valueFrom']}>"
    return {k: str(v) for k, v in env.items()}


def containers(docs: list[Doc]) -> Iterator[tuple[Doc, Doc]]:
    for workload in workloads(docs):
        for container in workload["spec"]["template"]["spec"]["containers"]:
            yield workload, container


def command(container: Doc) -> list[str]:
    return [*container.get("command", []), *container.get("args", [])]


def option(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def listens_on(container: Doc, env: Mapping[str, str]) -> tuple[str, int]:
    """Where the container's process serves HTTP: the worker from its settings, the
    gateway from its options."""
    argv = command(container)
    assert argv[0] == "botmesh", argv
    if argv[1] == "worker":
        config = WorkerConfig.from_env(_worker_env(env))
        assert config.http_port is not None, "BOTMESH_HTTP_PORT unset: no /healthz to probe"
        return config.http_host, config.http_port
    assert argv[1] == "gateway", f"a container runs {argv[:2]}: which port does it serve?"
    host, port = option(argv, "--host"), option(argv, "--port")
    assert host is not None and port is not None, argv
    return host, int(port)


def _worker_env(env: Mapping[str, str]) -> dict[str, str]:
    """The env with the pod's name for a fieldRef, as in pod botmesh-worker-0."""
    return {k: ("botmesh-worker-0" if v.startswith("<") else v) for k, v in env.items()}


def container_port(container: Doc, port: str | int) -> int:
    ports = container.get("ports", [])
    if isinstance(port, str):
        named = [p["containerPort"] for p in ports if p.get("name") == port]
        assert named, f"{container['name']}: no containerPort named {port!r}"
        return int(named[0])
    assert port in [p["containerPort"] for p in ports], f"{container['name']}: {port} undeclared"
    return port


def probes(container: Doc) -> dict[str, Doc]:
    kinds = ("startupProbe", "livenessProbe", "readinessProbe")
    return {k: container[k]["httpGet"] for k in kinds if k in container}


def _known_setting(name: str) -> bool:
    by_env = {s.env: s for s in SETTINGS}
    if name in by_env:
        return True
    base = name.removesuffix("_FILE")
    return base != name and base in by_env and by_env[base].secret


def metrics_in(expr: str) -> set[str]:
    return set(_METRIC.findall(expr))


def balanced(expr: str) -> bool:
    depth: list[str] = []
    pairs = {")": "(", "]": "[", "}": "{"}
    for char in re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr):
        if char in "([{":
            depth.append(char)
        elif char in pairs and (not depth or depth.pop() != pairs[char]):
            return False
    return not depth


# -- the renderer itself ----------------------------------------------------------------------


def test_render_refuses_what_it_cannot_apply(tmp_path: Path) -> None:
    (tmp_path / "cm.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n")
    base = {"apiVersion": "v1beta1", "kind": "Kustomization", "resources": ["cm.yaml"]}
    assert build({**base, "namespace": "n"}, tmp_path)[0]["metadata"]["namespace"] == "n"
    with pytest.raises(AssertionError, match="does not apply"):
        build({**base, "commonLabels": {"a": "b"}}, tmp_path)
    with pytest.raises(AssertionError, match="a resource twice"):
        build({**base, "resources": ["cm.yaml", "cm.yaml"]}, tmp_path)


# -- the base -----------------------------------------------------------------------------------


def test_the_base_lists_every_manifest_and_no_secret() -> None:
    listed = set(_kustomization(K8S)["resources"])
    present = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert present - listed == {"secret.example.yaml"}, "list it in kustomization.yaml"
    docs = render_base()
    assert not [d for d in docs if d["kind"] == "Secret"], "no Secret in the base: the user's"
    namespace = _kustomization(K8S)["namespace"]
    assert one(docs, "Namespace")["metadata"]["name"] == namespace
    for doc in docs:
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == namespace, doc["metadata"]["name"]
    assert {(d["kind"], d["metadata"]["name"]) for d in workloads(docs)} == {
        ("StatefulSet", "botmesh-worker"),
        ("Deployment", "botmesh-gateway"),
    }


def test_every_workload_selects_its_own_pods_and_its_service_them() -> None:
    docs = render_base()
    for workload in workloads(docs):
        selector = workload["spec"]["selector"]["matchLabels"]
        assert selects(selector, pod_labels(workload)), workload["metadata"]["name"]
        others = [w for w in workloads(docs) if w is not workload]
        assert not any(selects(selector, pod_labels(w)) for w in others)
    for service in (d for d in docs if d["kind"] == "Service"):
        chosen = [w for w in workloads(docs) if selects(service["spec"]["selector"], pod_labels(w))]
        assert len(chosen) == 1, f"Service {service['metadata']['name']} selects {len(chosen)}"
        [container] = chosen[0]["spec"]["template"]["spec"]["containers"]
        for port in service["spec"]["ports"]:
            container_port(container, port.get("targetPort", port["port"]))
    statefulset = one(docs, "StatefulSet")
    governing = one(docs, "Service", statefulset["spec"]["serviceName"])
    assert governing["spec"]["clusterIP"] == "None", "a StatefulSet's Service is headless"
    assert selects(governing["spec"]["selector"], pod_labels(statefulset))
    # not-ready workers stay listed, so Prometheus still scrapes botmesh_worker_ready 0
    assert governing["spec"]["publishNotReadyAddresses"] is True


def test_the_disruption_budget_takes_one_worker_at_a_time() -> None:
    docs = render_base()
    pdb = one(docs, "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1
    chosen = [
        w for w in workloads(docs) if selects(pdb["spec"]["selector"]["matchLabels"], pod_labels(w))
    ]
    assert [w["kind"] for w in chosen] == ["StatefulSet"]


def test_probes_reach_the_port_the_process_listens_on() -> None:
    docs = render_base()
    seen = 0
    for workload, container in containers(docs):
        env = resolved_env(container, docs)
        host, port = listens_on(container, env)
        assert host == "0.0.0.0", f"{container['name']} listens on {host}: the kubelet cannot"
        declared = [p["containerPort"] for p in container["ports"]]
        assert port in declared, f"{container['name']} listens on {port}, declares {declared}"
        found = probes(container)
        assert {"livenessProbe", "readinessProbe"} <= set(found), workload["metadata"]["name"]
        for kind, probe in found.items():
            assert container_port(container, probe["port"]) == port, (container["name"], kind)
            seen += 1
    assert seen >= 4


def test_the_probes_ask_routes_the_code_serves() -> None:
    docs = render_base()
    worker = one(docs, "StatefulSet")["spec"]["template"]["spec"]["containers"][0]
    gateway = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    served = {"worker": WORKER_ROUTES, "gateway": gateway_routes(gateway, docs)}
    for name, container in (("worker", worker), ("gateway", gateway)):
        paths = {kind: probe["path"] for kind, probe in probes(container).items()}
        assert set(paths.values()) <= served[name], (name, paths)
        assert paths["readinessProbe"] == "/readyz" and paths["livenessProbe"] == "/healthz"


def gateway_routes(container: Doc, docs: list[Doc]) -> set[str]:
    """The routes of the gateway the container runs, built from its own environment (so the
    example Secret must hold each configured channel's webhook secret)."""
    env = resolved_env(container, docs)
    channels = [c.strip() for c in env["BOTMESH_GATEWAY_CHANNELS"].split(",") if c.strip()]
    assert channels and set(channels) <= set(CHANNELS), channels
    hooks = {name: webhook_from_env(name, env) for name in channels}
    app = Gateway(hooks, GatewayConfig(bootstrap=env["KAFKA_BOOTSTRAP_SERVERS"])).app()
    routes = {r.resource.canonical for r in app.router.routes() if r.resource is not None}
    assert {f"/{c}" for c in channels} <= routes
    return routes


def test_the_gateway_serves_health_readiness_and_metrics() -> None:
    docs = render_base()
    [(_, gateway)] = [(w, c) for w, c in containers(docs) if w["kind"] == "Deployment"]
    assert {"/healthz", "/readyz", "/metrics"} <= gateway_routes(gateway, docs)


def test_the_worker_routes_are_those_of_its_server() -> None:
    app = HealthServer("0.0.0.0", 0, lambda: Readiness(False, "starting"), lambda: b"").app()
    assert {r.resource.canonical for r in app.router.routes() if r.resource} == WORKER_ROUTES


def test_every_variable_the_manifests_set_is_a_setting() -> None:
    docs = render_base()
    names: set[str] = set()
    for doc in docs:
        if doc["kind"] == "ConfigMap":
            names |= set(doc["data"])
    for _, container in containers(docs):
        names |= {e["name"] for e in container.get("env", [])}
    for secret in secret_example():
        names |= {k for k in secret.get("stringData", {}) if k.isupper()}
    assert {"BOTMESH_HTTP_PORT", "KAFKA_SASL_PASSWORD", "BOTMESH_INSTANCE_ID"} <= names
    unknown = sorted(n for n in names if not _known_setting(n))
    assert not unknown, f"not in botmesh/settings.py: {unknown}"


def test_the_worker_settings_are_valid_and_consistent() -> None:
    docs = render_base()
    statefulset = one(docs, "StatefulSet")
    pod = statefulset["spec"]["template"]["spec"]
    [container] = pod["containers"]
    env = resolved_env(container, docs)
    config = WorkerConfig.from_env(_worker_env(env))  # refuses what the worker would
    # the kubelet's SIGKILL comes after the worker's own stop limit (default 30 s)
    assert pod["terminationGracePeriodSeconds"] > config.stop_timeout
    argv = command(container)
    assert argv[:2] == ["botmesh", "worker"]
    assert hasattr(load_app(option(argv, "--app") or ""), "bind")
    dockerfile = (ROOT / "Dockerfile").read_text()
    uid = re.search(r"--uid (\d+)", dockerfile)
    assert uid is not None and pod["securityContext"]["runAsUser"] == int(uid.group(1))


def test_the_instance_id_is_the_pod_name() -> None:
    docs = render_base()
    [container] = one(docs, "StatefulSet")["spec"]["template"]["spec"]["containers"]
    [entry] = [e for e in container["env"] if e["name"] == "BOTMESH_INSTANCE_ID"]
    assert entry["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert "value" not in entry


def test_the_journal_is_on_the_pods_own_volume() -> None:
    docs = render_base()
    statefulset = one(docs, "StatefulSet")
    [container] = statefulset["spec"]["template"]["spec"]["containers"]
    data_dir = WorkerConfig.from_env(_worker_env(resolved_env(container, docs))).data_dir
    [mount] = [m for m in container["volumeMounts"] if Path(m["mountPath"]) == data_dir]
    claims = {c["metadata"]["name"] for c in statefulset["spec"]["volumeClaimTemplates"]}
    assert mount["name"] in claims, "the data dir must be on a volumeClaimTemplate"
    pod_volumes = {v["name"] for v in statefulset["spec"]["template"]["spec"].get("volumes", [])}
    assert mount["name"] not in pod_volumes
    assert f"BOTMESH_DATA_DIR={data_dir}" in (ROOT / "Dockerfile").read_text()


def test_the_kafka_credentials_come_from_a_secret() -> None:
    docs = render_base()
    secrets = {s.env for s in SETTINGS if s.secret}
    for doc in docs:
        if doc["kind"] == "ConfigMap":
            assert not set(doc["data"]) & secrets, "a secret in a ConfigMap"
            kafka = {k for k in doc["data"] if k.startswith("KAFKA_")}
            assert kafka == {"KAFKA_BOOTSTRAP_SERVERS"}, "security settings go in the Secret"
    for _, container in containers(docs):
        assert not {e["name"] for e in container.get("env", [])} & secrets
        refs = [s["secretRef"] for s in container["envFrom"] if "secretRef" in s]
        assert "botmesh-kafka" in [r["name"] for r in refs], container["name"]
    [example] = [s for s in secret_example() if s["metadata"]["name"] == "botmesh-kafka"]
    assert {
        "KAFKA_SECURITY_PROTOCOL",
        "KAFKA_SASL_MECHANISM",
        "KAFKA_SASL_USERNAME",
        "KAFKA_SASL_PASSWORD",
    } <= set(example["stringData"])
    # placeholders only: every secret value of the example says to replace it
    for secret in secret_example():
        for key, value in secret.get("stringData", {}).items():
            if key in secrets or not key.isupper():
                assert "REPLACE-ME" in str(value), f"{key}: a placeholder, please"


def test_the_gateway_stops_within_its_grace_period() -> None:
    docs = render_base()
    deployment = one(docs, "Deployment")
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    timeout = float(option(command(container), "--request-timeout") or DEFAULT_REQUEST_TIMEOUT)
    # botmesh._gateway.serving: requests in flight get request_timeout + 5 s at a stop
    assert deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > timeout + 5


# -- the servicemonitor component -----------------------------------------------------------------


def test_the_service_monitors_scrape_ports_the_services_name() -> None:
    docs = render_monitored()
    base = render_base()
    assert len(docs) == len(base) + len(
        build(_kustomization(COMPONENT), COMPONENT, kind="Component")
    )
    services = [d for d in docs if d["kind"] == "Service"]
    monitors = [d for d in docs if d["kind"] == "ServiceMonitor"]
    assert len(monitors) == 2
    scraped: set[str] = set()
    for monitor in monitors:
        assert monitor["metadata"]["namespace"] == _kustomization(K8S)["namespace"]
        selector = monitor["spec"]["selector"]["matchLabels"]
        [service] = [s for s in services if selects(selector, s["metadata"]["labels"])]
        names = {p["name"] for p in service["spec"]["ports"]}
        for endpoint in monitor["spec"]["endpoints"]:
            assert endpoint["port"] in names, (monitor["metadata"]["name"], endpoint["port"])
            assert endpoint["path"] == "/metrics"
        scraped.add(service["metadata"]["name"])
    assert scraped == {"botmesh-worker", "botmesh-gateway"}
    # the job label (the Service's name) is the one prometheus.yml and the alerts use
    compose_jobs = {
        job["job_name"]
        for job in yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())[
            "scrape_configs"
        ]
    }
    assert scraped == compose_jobs


def test_the_prometheus_rule_is_alerts_yml() -> None:
    rule = one(render_monitored(), "PrometheusRule")
    assert rule["spec"] == yaml.safe_load(ALERTS.read_text()), "edit both, or copy alerts.yml"


# -- alerts and dashboard ---------------------------------------------------------------------


def alert_rules() -> list[Doc]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def test_every_alert_names_exported_metrics_and_says_what_to_do() -> None:
    exported = metric_names()
    used: set[str] = set()
    rules = alert_rules()
    names = [r["alert"] for r in rules]
    assert len(names) == len(set(names)), names
    for rule in rules:
        expr = rule["expr"]
        assert balanced(expr), rule["alert"]
        found = metrics_in(expr)
        assert found or re.search(r"\bup\{", expr), f"{rule['alert']}: no metric in {expr!r}"
        assert found <= exported, f"{rule['alert']}: not exported: {sorted(found - exported)}"
        used |= found
        notes = rule["annotations"]
        assert notes["summary"].strip() and len(notes["description"].split()) >= 20, rule["alert"]
        assert rule["labels"]["severity"] in ("warning", "critical")
    assert {
        "botmesh_dead_letters_total",
        "botmesh_outbox_ambiguous_total",
        "botmesh_consumer_lag",
        "botmesh_stale_leases_total",
        "botmesh_worker_ready",
    } <= used
    [not_ready] = [r for r in rules if "botmesh_worker_ready" in r["expr"]]
    assert re.search(r"botmesh_worker_ready\s*==\s*0", not_ready["expr"])
    assert not_ready["for"] == "5m"


def dashboard() -> Doc:
    data = json.loads(DASHBOARD.read_text())
    assert isinstance(data, dict)
    return data


def dashboard_exprs(data: Doc) -> list[str]:
    exprs = [t["expr"] for p in data["panels"] for t in p.get("targets", [])]
    for var in data["templating"]["list"]:
        query = var.get("query")
        if isinstance(query, dict):
            exprs.append(query["query"])
    return exprs


def test_the_dashboard_loads_and_every_panel_has_a_target() -> None:
    data = dashboard()
    assert data["schemaVersion"] >= 39 and data["uid"] and data["title"]
    panels = [p for p in data["panels"] if p["type"] != "row"]
    assert len(panels) >= 12
    ids = [p["id"] for p in data["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in data["templating"]["list"]}
    cells: set[tuple[int, int]] = set()
    for panel in data["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        area = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not area & cells, f"{panel['title']} overlaps another panel"
        cells |= area
        if panel["type"] == "row":
            continue
        assert panel["targets"], f"{panel['title']}: no target"
        for target in panel["targets"]:
            assert target["expr"].strip() and balanced(target["expr"]), panel["title"]
            for var in re.findall(r"\$(?!__)(\w+)", target["expr"]):
                assert var in variables, f"{panel['title']}: ${var} is no variable"
        assert panel["datasource"]["uid"] == "${datasource}" and "datasource" in variables


def test_the_dashboard_shows_every_exported_metric_and_no_other() -> None:
    exported = metric_names()
    used: set[str] = set()
    for expr in dashboard_exprs(dashboard()):
        used |= metrics_in(expr)
    assert used <= exported, f"not exported: {sorted(used - exported)}"
    shown = {n for n in exported if not n.endswith(("_created", "_sum", "_count"))}
    assert shown - used == set(), "add a panel for these"
    # each histogram as its p50 and p99
    exprs = dashboard_exprs(dashboard())
    for histogram in (n for n in exported if n.endswith("_bucket")):
        for q in ("0.5", "0.99"):
            quantile = f"histogram_quantile({q},"
            assert any(e.startswith(quantile) and histogram in e for e in exprs), (histogram, q)


def test_metric_extraction_sees_through_promql() -> None:
    expr = (
        "histogram_quantile(0.99, sum by (le) "
        '(rate(botmesh_handler_seconds_bucket{job="botmesh-worker"}[5m])))'
    )
    assert metrics_in(expr) == {"botmesh_handler_seconds_bucket"}
    assert metrics_in("rate(xbotmesh_y[1m])") == set()
    assert balanced(expr) and not balanced("sum(rate(x[5m])")


def test_the_compose_services_set_only_settings() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    names: set[str] = set()
    for name in ("worker", "gateway"):
        names |= set(compose["services"][name]["environment"])
    assert {"BOTMESH_HTTP_PORT", "BOTMESH_GATEWAY_CHANNELS"} <= names
    assert sorted(n for n in names if not _known_setting(n)) == []


def test_the_readme_shows_how_to_apply_it() -> None:
    readme = (K8S / "README.md").read_text()
    assert "kubectl apply -k deploy/k8s" in readme
    for name in ("secret.example.yaml", "BOTMESH_PARTITIONS", "terminationGracePeriodSeconds"):
        assert name in readme, name


def test_the_operating_page_explains_every_metric_and_alert() -> None:
    page = (ROOT / "docs/operating.md").read_text()
    scrape = page[page.index("## What to scrape") : page.index("## Alerts")]
    families = {
        n.removesuffix("_bucket")
        for n in metric_names()
        if not n.endswith(("_created", "_sum", "_count"))
    }
    documented = metrics_in(scrape)
    assert families - documented == set(), "explain these in docs/operating.md"
    assert documented - families == set(), "docs/operating.md names metrics nobody exports"
    headings = set(re.findall(r"^### (\w+)$", page, re.MULTILINE))
    assert {r["alert"] for r in alert_rules()} == headings
    assert "\n## Traces\n" in page and "traceparent" in page  # how to read a trace

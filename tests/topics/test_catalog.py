"""The topic catalog: names from one prefix, specs per role (no broker)."""

from __future__ import annotations

import pytest

from botmesh.topics import RETRY_TIERS, Catalog, prefix_from_env


def test_names_derive_from_the_prefix() -> None:
    cat = Catalog("acme.prod")
    assert cat.inbound == "acme.prod.inbound"
    assert cat.sent == "acme.prod.sent"
    assert cat.inbound_dlq == "acme.prod.inbound.dlq"
    assert cat.requests == "acme.prod.requests"
    assert cat.requests_dlq == "acme.prod.requests.dlq"
    assert cat.outbox_dlq == "acme.prod.outbox.dlq"
    assert cat.retries == tuple(
        f"acme.prod.outbox.retry.{t}" for t in ("1s", "5s", "30s", "1m", "5m", "10m")
    )
    assert (cat.control, cat.control_results) == ("acme.prod.control", "acme.prod.control.results")
    assert cat.app_id == cat.group == "acme.prod.worker"
    assert cat.changelog("journal") == "acme.prod.worker-journal-changelog"
    assert cat.metrics == "acme.prod.metrics"


def test_default_prefix_and_env() -> None:
    assert Catalog().inbound == "botmesh.inbound"
    assert prefix_from_env({}) == "botmesh"
    assert prefix_from_env({"BOTMESH_TOPIC_PREFIX": " t1 "}) == "t1"


@pytest.mark.parametrize("bad", ["", "has space", ".dot", "a/b", "x" * 201])
def test_bad_prefix_is_refused_with_the_fix(bad: str) -> None:
    with pytest.raises(ValueError, match="bad topic prefix"):
        Catalog(bad)


def test_unknown_retry_tier() -> None:
    with pytest.raises(ValueError, match="use one of 1s, 5s, 30s, 1m, 5m, 10m"):
        Catalog().retry("2h")


def test_specs_cover_every_topic_with_policies() -> None:
    specs = {s.name: s for s in Catalog("p").specs(partitions=6, replication=3)}
    assert len(specs) == 6 + len(RETRY_TIERS) + 3 + 1 + 1
    assert all(s.partitions == 6 and s.replication == 3 for s in specs.values())
    assert all(s.config["min.insync.replicas"] == "2" for s in specs.values())
    changelogs = [s for s in specs.values() if s.role == "changelog"]
    assert {s.name for s in changelogs} == {"p.worker-journal-changelog"}
    assert all(s.compacted for s in changelogs)
    assert specs["p.metrics"].role == "metrics" and specs["p.metrics"].compacted
    assert not specs["p.inbound"].compacted
    dlq = int(specs["p.inbound.dlq"].config["retention.ms"])
    assert dlq > int(specs["p.inbound"].config["retention.ms"])
    assert dlq == int(specs["p.outbox.dlq"].config["retention.ms"]) >= 30 * 24 * 3600 * 1000
    assert dlq == int(specs["p.requests.dlq"].config["retention.ms"])
    requests = specs["p.requests"]
    assert requests.role == "requests" and not requests.compacted
    assert requests.config["retention.ms"] == specs["p.inbound"].config["retention.ms"]
    assert specs["p.control"].role == "control" and specs["p.control.results"].role == "results"
    assert [s.name for s in specs.values() if s.role == "dlq"] == [
        "p.inbound.dlq",
        "p.requests.dlq",
        "p.outbox.dlq",
    ]


def test_single_replica_specs_allow_one_in_sync_replica() -> None:
    assert all(s.config["min.insync.replicas"] == "1" for s in Catalog().specs(replication=1))


@pytest.mark.parametrize(("partitions", "replication"), [(0, 1), (1, 0)])
def test_bad_counts(partitions: int, replication: int) -> None:
    with pytest.raises(ValueError, match="must be >= 1"):
        Catalog().specs(partitions, replication)


def test_a_requests_topic_beside_an_existing_inbound_gets_its_partition_count() -> None:
    cat = Catalog("p")
    beside = {s.name: s.partitions for s in cat.specs_beside({"p.inbound": 3}, partitions=8)}
    follow = {"p.requests", "p.control", "p.statuses", *cat.retries}
    assert {beside[n] for n in follow} == {3}
    assert beside["p.sent"] == 8  # only requests, control, statuses and tiers follow it
    both = {"p.inbound": 3, "p.requests": 5}  # left as they are (the worker refuses them)
    again = {s.name: s.partitions for s in cat.specs_beside(both, partitions=8)}
    assert {again[n] for n in follow - {"p.requests"}} == {3}
    assert {p for n, p in again.items() if n not in follow - {"p.requests"}} == {8}
    assert cat.specs_beside({}, partitions=6) == cat.specs(6)

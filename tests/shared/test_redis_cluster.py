"""The Redis journal on a real three-node Redis Cluster: a scope's keys share one slot (so
each commit's Lua script runs on one node), scopes spread over the nodes, reads across
scopes visit every node, the crash matrix's named points hold, and a commit that would
span two scopes is refused naming the rule."""

from __future__ import annotations

from pathlib import Path

import pytest
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot

from botmesh.state.backends import open_backend
from botmesh.state.backends.redis import RedisKv
from botmesh.state.errors import JournalUnavailableError
from botmesh.state.kv import DurableKv, Put
from tests import servers
from tests.backends import BACKENDS, BackendCase, namespace
from tests.crash.harness import check, run_case
from tests.crash.test_crash_matrix import _named_points

pytestmark = pytest.mark.redis


@pytest.fixture
def url() -> str:
    return servers.redis_cluster_url()


async def test_one_slot_per_scope_and_scopes_spread_over_the_nodes(url: str) -> None:
    kv = await open_backend(url.replace("?", "?prefix=spread&"))
    assert isinstance(kv, RedisKv)
    scopes = [f"bot:{i}" for i in range(12)]
    for s in scopes:
        await kv.commit([Put(f"{s}/in/m1", {}, expect=0, due=1.0), Put(f"{s}/out/k", {}, expect=0)])
    # a prefix without a scope reads every node
    assert len(await kv.range("due", "", 10.0, limit=100)) == 12
    assert len(await kv.scan("bot:")) == 24
    await kv.close()
    client = RedisCluster.from_url(url.split("?", maxsplit=1)[0])
    try:
        await client.initialize()
        owners = set()
        for s in scopes:
            names = [f"spread:{{durable:{s}}}:{part}" for part in ("e", "due")]
            slots = {key_slot(n.encode()) for n in names}
            assert len(slots) == 1  # one scope, one slot
            node = client.get_node_from_key(names[0])
            assert node is not None
            owners.add(node.port)
            assert await client.exists(*names) == 2
        assert len(owners) > 1  # the scopes are spread over the nodes
    finally:
        await client.aclose()


async def test_a_commit_across_scopes_is_refused_naming_the_rule(url: str) -> None:
    kv = await open_backend(url.replace("?", "?prefix=cross&"))
    try:
        with pytest.raises(JournalUnavailableError, match="one scope"):
            await kv.commit([Put(f"a{i}/k", {}, expect=0) for i in range(8)])
        assert await kv.scan("") == []  # nothing applied
    finally:
        await kv.close()


async def _cluster(path: Path) -> DurableKv:
    from botmesh.state.backends.redis import open_redis_kv

    return await open_redis_kv(
        servers.redis_cluster_url().split("?")[0],
        prefix=namespace(path).rstrip("_"),
        cluster=True,
    )


CLUSTER = BackendCase("redis-cluster", _cluster, persistent=True, server="redis")


@pytest.mark.parametrize("policy", ["skip", "resend"])
async def test_every_named_crash_point_on_a_cluster(url: str, policy: str, tmp_path: Path) -> None:
    dry = await run_case(BACKENDS["memory"], tmp_path / "dry", "skip", [None])
    points = _named_points(dry.labels_a)
    assert len(points) >= 40
    for i, point in enumerate(points):
        out = await run_case(CLUSTER, tmp_path / f"n{i}", policy, [point])
        assert len(out.crashes) == 1, point
        check(out, policy)

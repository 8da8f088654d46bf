"""The admission scripts on the real 3-master Redis Cluster: every key the
Python SDK computes hashes to the slot the server says (so each admit.lua
or adjust.lua call touches one slot, as Redis Cluster requires), and the
shared vectors give the same decisions there as on one Redis — including
requests whose rules live on different masters, which are all or nothing
(a refusal in one slot refunds what the others debited)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
from redis.cluster import ClusterNode, RedisCluster

from sluice_metering.admission import AsyncLimiter, Limiter, key_slot

from test_vectors import CASES, rules, run_async, run_sync


def nodes(addrs: list[str]) -> list[ClusterNode]:
    return [ClusterNode(h, int(p)) for h, _, p in (a.rpartition(":") for a in addrs)]


@pytest.fixture
def rc(cluster_addrs: list[str]) -> Iterator[RedisCluster]:
    c = RedisCluster(startup_nodes=nodes(cluster_addrs), socket_timeout=5)
    yield c
    c.close()


@pytest.fixture
def cprefix(rc: RedisCluster) -> Iterator[str]:
    """A key prefix of the test's own; its keys are deleted on every master."""
    p = f"sluice:pytest:cluster_{uuid.uuid4().hex[:12]}:"
    yield p
    for k in list(rc.scan_iter(match=p + "*", count=1000)):
        rc.delete(k)


def check_keys(rc: RedisCluster, prefix: str, case: dict[str, Any]) -> set[str]:
    """Every key the case left: its slot is the server's; returns the
    masters holding them."""
    keys = [k.decode() for k in rc.scan_iter(match=prefix + "*", count=1000)]
    assert keys, "the case left no keys"
    for k in keys:
        assert key_slot(k) == rc.cluster_keyslot(k), k
    for k in case.get("keys", []):
        assert rc.exists(prefix + k) == 1, k
    return {rc.get_node_from_key(k).name for k in keys}


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_vectors_on_cluster_sync(case: dict[str, Any], rc: RedisCluster, cprefix: str) -> None:
    run_sync(Limiter(rc, rules(case), prefix=cprefix, max_wait=5), case)
    check_keys(rc, cprefix, case)


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_vectors_on_cluster_async(case: dict[str, Any], rc: RedisCluster, cluster_addrs: list[str], cprefix: str) -> None:
    async def run() -> None:
        client = redis.asyncio.RedisCluster(startup_nodes=[redis.asyncio.cluster.ClusterNode(n.host, n.port)
                                                           for n in nodes(cluster_addrs)])
        try:
            await run_async(AsyncLimiter(client, rules(case), prefix=cprefix, max_wait=5), case)
        finally:
            await client.aclose()

    asyncio.run(run())
    check_keys(rc, cprefix, case)


def test_policy_request_spans_masters(rc: RedisCluster, cprefix: str) -> None:
    # The policy case's refusals in one slot (steps 3, 6, 8) are only
    # right if the other slots' debits were refunded: check its keys do sit
    # on more than one master, so that case proves it on the cluster.
    case = next(c for c in CASES if "policy" in c)
    run_sync(Limiter(rc, rules(case), prefix=cprefix, max_wait=5), case)
    assert len(check_keys(rc, cprefix, case)) >= 2

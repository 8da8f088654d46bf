"""Test support: the real Redis of scripts/services.sh (SLUICE_REDIS_ADDR)
and its 3-master Redis Cluster (SLUICE_REDIS_CLUSTER_ADDRS), a key prefix
of each test's own, and the repository's root.

A service that cannot be reached skips the test on a developer's machine
and fails it when CI=true, as the Go tests do (platform/itest)."""

from __future__ import annotations

import os
import pathlib
import socket
import uuid
from collections.abc import Iterator

import pytest
import redis

ROOT = pathlib.Path(__file__).resolve().parents[3]


def require(service: str, hostport: str) -> None:
    host, _, port = hostport.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=2).close()
    except OSError as e:
        msg = f"{service} is not reachable at {hostport} ({e}); start it with `scripts/services.sh up {service}`"
        if os.environ.get("CI") == "true":
            pytest.fail(msg)
        pytest.skip(msg)


@pytest.fixture
def redis_addr() -> str:
    addr = os.environ.get("SLUICE_REDIS_ADDR", "127.0.0.1:16379")
    require("redis", addr)
    return addr


@pytest.fixture
def rdb(redis_addr: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(f"redis://{redis_addr}/0", socket_timeout=5)
    yield c
    c.close()


@pytest.fixture
def prefix(request: pytest.FixtureRequest, rdb: redis.Redis) -> Iterator[str]:
    """A key prefix of this test's own; its keys are deleted at the end."""
    name = "".join(ch if ch.isalnum() else "_" for ch in request.node.name.lower())[:40]
    p = f"sluice:pytest:{name}_{uuid.uuid4().hex[:8]}:"
    yield p
    for k in rdb.scan_iter(match=p + "*", count=1000):
        rdb.delete(k)


@pytest.fixture
def cluster_addrs() -> list[str]:
    """The seeds of the real Redis Cluster, as platform/itest.RedisCluster
    reads them (`scripts/services.sh up redis-cluster`)."""
    addrs = os.environ.get("SLUICE_REDIS_CLUSTER_ADDRS", "127.0.0.1:17001,127.0.0.1:17002,127.0.0.1:17003").split(",")
    for a in addrs:
        require("redis-cluster", a)
    return addrs

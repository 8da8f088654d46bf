"""Admission while Redis does not answer: each tenant's fail mode decides,
and what was decided locally reaches Redis once it answers again. Redis is
reached through a TCP proxy the test cuts and restores."""

from __future__ import annotations

import asyncio
import copy
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import redis
import redis.asyncio

from sluice_metering.admission import PATH_LOCAL, PATH_REDIS, PATH_UNAVAILABLE, AsyncLimiter, Limiter, Request, Rules


class Proxy:
    """Forwards 127.0.0.1:<port> to target until cut (connections dropped,
    new ones refused by closing them at once)."""

    def __init__(self, target: str) -> None:
        host, _, port = target.rpartition(":")
        self.target = (host, int(port))
        self.cut = threading.Event()
        self.conns: list[socket.socket] = []
        self.ln = socket.create_server(("127.0.0.1", 0))
        self.addr = f"127.0.0.1:{self.ln.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                c, _ = self.ln.accept()
            except OSError:
                return
            if self.cut.is_set():
                c.close()
                continue
            u = socket.create_connection(self.target)
            self.conns += [c, u]
            for a, b in ((c, u), (u, c)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        for s in (a, b):
            try:
                s.close()
            except OSError:
                pass

    def cut_now(self) -> None:
        self.cut.set()
        for s in self.conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.conns = []

    def restore(self) -> None:
        self.cut.clear()

    def close(self) -> None:
        self.cut_now()
        self.ln.close()


@pytest.fixture
def proxy(redis_addr: str) -> Iterator[Proxy]:
    p = Proxy(redis_addr)
    yield p
    p.close()


RULES = {"tenants": {"strict": {"rules": [{"name": "rpm", "unit": "requests", "algorithm": "sliding_window", "limit": 100, "window_ms": 60000}], "fail_mode": "closed"}},
         "default": {"rules": [{"name": "tpm", "unit": "total_tokens", "algorithm": "sliding_window", "limit": 100, "window_ms": 60000}]}}


def test_fail_modes_and_reconciliation(rdb: redis.Redis, proxy: Proxy, prefix: str) -> None:
    lim = Limiter(redis.Redis.from_url(f"redis://{proxy.addr}/0", socket_timeout=0.2, socket_connect_timeout=0.2),
                  Rules.from_dict(RULES), prefix=prefix, max_wait=0.2, gateway_count=2, probe_interval=0.05)
    key = prefix + "{t:acme:tpm}:sliding_window:total_tokens"
    t = lim.admit(Request(tenant="acme", model="m", id="r-1", prompt_tokens=10))
    assert t.decision.path == PATH_REDIS and t.allowed
    t_copy = copy.copy(t)

    proxy.cut_now()
    # acme fails open: a local limit of 100 / 2 gateways, started from
    # Redis's last word (90 left, so 45 here).
    t2 = lim.admit(Request(tenant="acme", model="m", id="r-2", prompt_tokens=30))
    assert t2.decision.path == PATH_LOCAL and t2.allowed and lim.down
    t3 = lim.admit(Request(tenant="acme", model="m", id="r-3", prompt_tokens=30))
    assert t3.decision.path == PATH_LOCAL and not t3.allowed and t3.decision.rule == "tpm" and t3.decision.available == 15
    # strict fails closed: 503, naming no rule.
    t4 = lim.admit(Request(tenant="strict", model="m"))
    assert t4.decision.path == PATH_UNAVAILABLE and t4.decision.status == 503 and t4.decision.rule == ""
    assert "fails closed" in t4.decision.message
    # Settlements wait for Redis, with their ids.
    lim.settle(t, 10, 5)   # +5, remote ticket: deferred with marker r-1
    lim.settle(t2, 30, 2)  # +2 on the local limiter
    assert lim.pending() == 2

    proxy.restore()
    deadline = time.monotonic() + 10
    local = 0
    while True:  # the next admission after probe_interval finds Redis again
        t5 = lim.admit(Request(tenant="acme", model="m", prompt_tokens=1))
        if t5.decision.path == PATH_REDIS:
            break
        local += t5.decision.path == PATH_LOCAL and t5.allowed
        assert time.monotonic() < deadline, "Redis not found again"
    assert lim.pending() == 0
    # Redis counts r-1's 10 + 5 settled, r-2's 30 + 2 decided locally and
    # reconciled, the admissions made locally while waiting for the probe,
    # and the last one.
    used = sum(int(v) for v in rdb.hvals(key))
    assert used == 10 + 5 + 30 + 2 + local + 1
    assert rdb.exists(key + ":settled:r-1") == 1
    # A retried settlement (a copy of the ticket) applies nothing twice.
    lim.settle(t_copy, 10, 5)
    assert sum(int(v) for v in rdb.hvals(key)) == used


def test_async_limiter_bounds_a_redis_that_never_answers() -> None:
    # A server that takes the connection and the commands and says nothing:
    # the asyncio Limiter gives up after max_wait and each tenant's fail
    # mode decides, instead of holding the request.
    ln = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                c, _ = ln.accept()
            except OSError:
                return
            held.append(c)

    threading.Thread(target=accept, daemon=True).start()

    async def run() -> None:
        client = redis.asyncio.Redis(host="127.0.0.1", port=ln.getsockname()[1])
        lim = AsyncLimiter(client, Rules.from_dict(RULES), prefix="sluice:pytest:silent:", max_wait=0.1)
        for tenant, path, allowed in (("acme", PATH_LOCAL, True), ("strict", PATH_UNAVAILABLE, False)):
            start = time.monotonic()
            t = await lim.admit(Request(tenant=tenant, model="m", prompt_tokens=1))
            took = time.monotonic() - start
            assert (t.decision.path, t.allowed) == (path, allowed), tenant
            assert took < 2, f"{tenant}: admission took {took:.2f}s with max_wait 0.1s"
        assert lim.down

    try:
        asyncio.run(run())
    finally:
        ln.close()
        for c in held:
            c.close()

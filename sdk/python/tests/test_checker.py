"""The flag Checker against the real Redis, flags written as the enforcer
writes them (docs/flags.md)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis

from sluice_metering import flags as fl
from sluice_metering.checker import PROBE, REFUSED, REFUSED_STALE, Checker, refusal


def eventually(what: str, cond, within: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + within
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {within}s: {what}")
        time.sleep(0.02)


def write(rdb: redis.Redis, layout: fl.Layout, tenant: str, version: int, fields: dict[str, fl.Flag]) -> None:
    """One enforcer write: the whole hash, the version, the announcement."""
    p = rdb.pipeline(transaction=True)
    p.delete(layout.tenant_key(tenant))
    p.hset(layout.tenant_key(tenant), mapping={fl.VERSION_FIELD: str(version), **{k: fl.encode(f) for k, f in fields.items()}})
    p.pexpire(layout.tenant_key(tenant), 60_000)
    p.set(layout.version_key(), version)
    p.execute()
    rdb.publish(layout.channel(), fl.format_change(tenant, version))


@pytest.fixture
def started(rdb: redis.Redis, prefix: str) -> Iterator[tuple[Checker, fl.Layout]]:
    layout = fl.Layout(prefix)
    rdb.set(layout.heartbeat_key(), "1", px=60_000)
    c = Checker(rdb, key_prefix=prefix, max_staleness=2).start()
    assert c.wait_synced(10)
    yield c, layout
    c.close()


def test_a_quota_flag_refuses_and_is_answered_as_the_go_middleware_does(rdb: redis.Redis, started) -> None:  # type: ignore[no-untyped-def]
    c, layout = started
    now_ms = int(time.time() * 1000)
    f = fl.Flag("open", "quota", "hourly_tokens", "hour", until_ms=now_ms + 60_000, limit=1000, used=1050,
                resets_at_ms=now_ms + 1_800_000, reason="INC-42 internal")
    write(rdb, layout, "acme", 1, {"*": f})
    eventually("the flag seen", lambda: not c.check("acme", "gpt-4o").allowed)
    d = c.check("acme", "gpt-4o", "key-1")
    assert d.outcome == REFUSED and d.scope == "*" and d.flag is not None and d.flag.quota == "hourly_tokens"
    assert c.check("other", "gpt-4o").allowed
    r = refusal(d, "acme", "gpt-4o")
    assert r.status == 429
    assert r.body["error"]["code"] == "insufficient_quota"
    assert r.message.startswith("Tenant acme has reached its hourly_tokens limit on all models: used at least 1050 of 1000 this hour; it resets at ")
    assert "INC-42" not in str(r.body), "the reason is the operator's note, never shown to the client"
    assert r.headers["x-ratelimit-limit-tokens"] == "1000" and r.headers["x-ratelimit-remaining-tokens"] == "0"
    assert 1790 <= int(r.headers["Retry-After"]) <= 1800
    # The flag is lifted: the next version holds no flags.
    write(rdb, layout, "acme", 2, {})
    eventually("the flag lifted", lambda: c.check("acme", "gpt-4o").allowed)


def test_a_soft_flag_refuses_nothing(rdb: redis.Redis, started) -> None:  # type: ignore[no-untyped-def]
    c, layout = started
    now_ms = int(time.time() * 1000)
    soft = fl.Flag("soft", "quota", "monthly_tokens", "month", until_ms=now_ms + 60_000, limit=1000, used=1200, resets_at_ms=now_ms + 60_000)
    write(rdb, layout, "acme", 1, {"*": soft, "gpt-4o": fl.Flag("throttle", "rate", "tokens_per_minute", until_ms=now_ms + 60_000)})
    eventually("the flags seen", lambda: c.tenants() == 1)
    d = c.check("acme", "gpt-4o-mini", "key-1")
    assert d.allowed and d.outcome != PROBE and d.flag is None
    assert not c.check("acme", "gpt-4o").allowed, "a refusing flag beside a soft one still refuses"


def test_half_open_lets_its_probes_through_once_across_resyncs(rdb: redis.Redis, started) -> None:  # type: ignore[no-untyped-def]
    c, layout = started
    f = fl.Flag("half_open", "error_ratio", until_ms=int(time.time() * 1000) + 60_000, probes=2)
    write(rdb, layout, "acme", 1, {"gpt-4o": f})
    eventually("the flag seen", lambda: c.tenants() == 1)
    assert [c.check("acme", "gpt-4o").outcome for _ in range(3)] == [PROBE, PROBE, REFUSED]
    # The enforcer rewrites the same breaker (until moves on): no new probes.
    write(rdb, layout, "acme", 2, {"gpt-4o": fl.Flag("half_open", "error_ratio", until_ms=int(time.time() * 1000) + 61_000, probes=2)})
    n = c.resyncs
    rdb.publish(layout.channel(), fl.format_change(fl.FAILMODE_TENANT, 3))  # forces a resync
    eventually("a resync", lambda: c.resyncs > n)
    assert c.check("acme", "gpt-4o").outcome == REFUSED


def test_stale_view_follows_fail_modes_and_keeps_blacklists(rdb: redis.Redis, prefix: str) -> None:
    layout = fl.Layout(prefix)
    rdb.hset(layout.failmode_key(), mapping={"strict": "closed", "*": "open"})
    now_ms = int(time.time() * 1000)
    write(rdb, layout, "leaky", 1, {"@key:k-9": fl.Flag("blacklist", "blacklist", until_ms=now_ms + 500)})
    c = Checker(rdb, key_prefix=prefix, max_staleness=0.3, resync_interval=1).start()
    try:
        assert c.wait_synced(10)
        # No enforcer beats: the view goes stale.
        eventually("stale", c.stale)
        assert c.check("strict", "gpt-4o").outcome == REFUSED_STALE
        assert c.check("relaxed", "gpt-4o").allowed
        r = refusal(c.check("strict", "m"), "strict", "m")
        assert r.status == 503 and r.headers["Retry-After"] == "5"
        # The blacklist outlives its until (and its hash) while stale.
        rdb.delete(layout.tenant_key("leaky"))
        eventually("past the flag's until", lambda: time.time() * 1000 > now_ms + 500)
        n = c.resyncs
        eventually("a resync without the hash", lambda: c.resyncs > n, within=5)
        d = c.check("leaky", "gpt-4o", "k-9")
        assert d.outcome == REFUSED and d.flag is not None and d.flag.state == "blacklist"
        assert refusal(d, "leaky", "gpt-4o").status == 403
        # A beat makes the view fresh: strict is served again.
        rdb.publish(layout.channel(), f"{fl.HEARTBEAT_TENANT} {now_ms}")
        eventually("fresh", lambda: c.check("strict", "gpt-4o").allowed, within=5)
    finally:
        c.close()


def test_a_tombstone_reads_as_no_flags_and_versions_only_grow(rdb: redis.Redis, started) -> None:  # type: ignore[no-untyped-def]
    """The enforcer fences its writes by version (docs/flags.md,
    "Versions"): a lifted tenant keeps its hash with ``@v`` alone for a
    while, and a new leader whose clock is behind the old one's still
    writes higher versions. The Checker reads the tombstone as "no flags",
    on an announcement and on a resync, and keeps the newest view."""
    c, layout = started
    now_ms = int(time.time() * 1000)
    ahead_us = (now_ms + 3_600_000) * 1000  # the previous leader's clock ran an hour ahead
    f = fl.Flag("open", "quota", "daily_tokens", "day", until_ms=now_ms + 60_000, limit=1000, used=1000)
    write(rdb, layout, "acme", ahead_us, {"gpt-4o": f})
    eventually("the earlier leader's flag seen", lambda: not c.check("acme", "gpt-4o").allowed)
    # The new leader's first write is granted a version above it.
    write(rdb, layout, "acme", ahead_us + 1, {"gpt-4o": f, "claude": f})
    eventually("the new leader's flag seen", lambda: not c.check("acme", "claude").allowed)
    # Lifted: the tombstone, announced.
    write(rdb, layout, "acme", ahead_us + 2, {})
    assert rdb.hgetall(layout.tenant_key("acme")) == {fl.VERSION_FIELD.encode(): str(ahead_us + 2).encode()}
    eventually("the tombstone lifts the tenant", lambda: c.check("acme", "gpt-4o").allowed and c.tenants() == 0)
    # Flagged again, then a tombstone nobody announced: the resync lifts it.
    write(rdb, layout, "acme", ahead_us + 3, {"gpt-4o": f})
    eventually("flagged again", lambda: not c.check("acme", "gpt-4o").allowed)
    rdb.hset(layout.tenant_key("acme"), mapping={fl.VERSION_FIELD: str(ahead_us + 4)})
    rdb.hdel(layout.tenant_key("acme"), "gpt-4o")
    n = c.resyncs
    rdb.publish(layout.channel(), fl.format_change(fl.FAILMODE_TENANT, ahead_us + 5))  # forces a resync
    eventually("a resync", lambda: c.resyncs > n)
    assert c.check("acme", "gpt-4o").allowed and c.tenants() == 0


def test_a_stale_view_drops_a_quota_flag_flag_ttl_after_the_last_beat(rdb: redis.Redis, prefix: str) -> None:
    """The enforcer writes a quota flag's own end as its until (an hour
    ahead here) and renews nothing else: once it is gone, a traffic flag
    lapses flag_ttl (read from ``<prefix>ttl``: 3 s) after its last sign of
    life, so a dead enforcer blocks no one longer (docs/flags.md)."""
    layout = fl.Layout(prefix)
    until = int(time.time() * 1000) + 3_600_000
    write(rdb, layout, "initech", 1, {"*": fl.Flag("open", "quota", quota="monthly_tokens", until_ms=until, resets_at_ms=until)})
    rdb.set(layout.ttl_key(), "3000")
    rdb.set(layout.heartbeat_key(), "1", px=500)  # the enforcer's last beat
    c = Checker(rdb, key_prefix=prefix, max_staleness=0.3, resync_interval=1).start()
    try:
        assert c.wait_synced(10)
        started = time.monotonic()
        assert c.check("initech", "gpt-4o").outcome == REFUSED
        eventually("stale", c.stale)
        eventually("the quota flag lapsed", lambda: c.check("initech", "gpt-4o").allowed)
        assert time.monotonic() - started >= 3 - 0.5 - 0.3, "lapsed before flag_ttl after the last beat"
        assert c.check("initech", "gpt-4o").stale
    finally:
        c.close()


def test_a_fresh_view_keeps_a_quota_flag_to_its_until(rdb: redis.Redis, started) -> None:  # type: ignore[no-untyped-def]
    c, layout = started
    until = int(time.time() * 1000) + 3_600_000
    write(rdb, layout, "initech", 1, {"*": fl.Flag("open", "quota", quota="monthly_tokens", until_ms=until, resets_at_ms=until)})
    eventually("the flag loaded", lambda: not c.check("initech", "gpt-4o").allowed)
    c._flag_ttl = 0.001  # the stale-view lapse must not touch a fresh view
    d = c.check("initech", "gpt-4o")
    assert d.outcome == REFUSED and not d.stale


def test_flag_ttl_values_out_of_bounds_are_refused() -> None:
    assert fl.parse_ttl("60000") == 60.0
    for bad in ("12", "soon", "86400001"):
        with pytest.raises(fl.FlagError):
            fl.parse_ttl(bad)

"""sdk/go/admission/testdata/vectors.json, the admission vectors the Go SDK
runs too (TestSharedVectors), against the real Redis, with the sync and
the asyncio Limiter. A case with "policy" takes its rules from that file
of policy/testdata, read by sluice_metering.policy (Go reads what the Go policy
package makes of it)."""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

import pytest
import redis
import redis.asyncio

from sluice_metering import policy, ratelimit
from sluice_metering.admission import AsyncLimiter, Decision, Limiter, Request, Rules, Ticket

from conftest import ROOT

CASES = json.loads((ROOT / "sdk" / "go" / "admission" / "testdata" / "vectors.json").read_text())["cases"]


def check(step: int, d: Decision, e: dict[str, Any]) -> None:
    where = f"step {step} ({d.message})"
    assert d.allowed == e["allowed"], where
    for k, got in (("rule", d.rule), ("scope", d.scope.as_dict()), ("unit", d.unit), ("algorithm", d.algorithm),
                   ("limit", d.limit), ("requested", d.requested), ("available", d.available), ("too_large", d.never)):
        if k in e:
            assert got == e[k], f"{where}: {k}"
    if "retry_after_ms" in e:
        lo, hi = e["retry_after_ms"]
        assert lo <= d.retry_after_ms <= hi, f"{where}: retry after {d.retry_after_ms}ms"
    if "message" in e:
        assert d.message == e["message"].replace("{retry}", ratelimit.format_reset_ms(d.retry_after_ms)), where
        assert d.error_body()["error"]["message"] == d.message
    for k, h in (("requests", d.requests), ("tokens", d.tokens)):
        if k in e:
            assert [h.limit, h.remaining] == [e[k]["limit"], e[k]["remaining"]], f"{where}: {k} headroom"


def rules(case: dict[str, Any]) -> Rules:
    if "policy" in case:
        return policy.load(ROOT / "policy" / "testdata" / case["policy"]).admission_rules()
    return Rules.from_dict(case["rules"])


def request(a: dict[str, Any]) -> Request:
    return Request(**{"priority": "normal", **a})


def run_sync(lim: Limiter, case: dict[str, Any]) -> None:
    """Run the case's steps on lim, checking each expected decision."""
    tickets: dict[str, Ticket] = {}
    originals: dict[str, Ticket] = {}
    for i, s in enumerate(case["steps"]):
        if "admit" in s:
            t = lim.admit(request(s["admit"]))
            if "as" in s:
                tickets[s["as"]], originals[s["as"]] = t, copy.copy(t)
            if "expect" in s:
                check(i, t.decision, s["expect"])
        else:
            t = copy.copy(originals[s["settle"]]) if s.get("copy") else tickets[s["settle"]]
            lim.settle(t, s["prompt_tokens"], s["completion_tokens"])
    assert not lim.down


async def run_async(lim: AsyncLimiter, case: dict[str, Any]) -> None:
    """run_sync for the asyncio Limiter."""
    tickets: dict[str, Ticket] = {}
    originals: dict[str, Ticket] = {}
    for i, s in enumerate(case["steps"]):
        if "admit" in s:
            t = await lim.admit(request(s["admit"]))
            if "as" in s:
                tickets[s["as"]], originals[s["as"]] = t, copy.copy(t)
            if "expect" in s:
                check(i, t.decision, s["expect"])
        else:
            t = copy.copy(originals[s["settle"]]) if s.get("copy") else tickets[s["settle"]]
            await lim.settle(t, s["prompt_tokens"], s["completion_tokens"])
    assert not lim.down


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_vectors_sync(case: dict[str, Any], rdb: redis.Redis, redis_addr: str, prefix: str) -> None:
    run_sync(Limiter(redis.Redis.from_url(f"redis://{redis_addr}/0", socket_timeout=2), rules(case), prefix=prefix,
                     max_wait=2), case)
    for k in case.get("keys", []):
        assert rdb.exists(prefix + k) == 1, k


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_vectors_async(case: dict[str, Any], rdb: redis.Redis, redis_addr: str, prefix: str) -> None:
    async def run() -> None:
        client = redis.asyncio.Redis.from_url(f"redis://{redis_addr}/0")
        await run_async(AsyncLimiter(client, rules(case), prefix=prefix, max_wait=2), case)
        await client.aclose()

    asyncio.run(run())
    for k in case.get("keys", []):
        assert rdb.exists(prefix + k) == 1, k

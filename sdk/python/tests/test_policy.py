"""sluice_metering.policy: the policy file's admission rules are the Go ones, rule
for rule (policy/testdata/admission.rules.json, pinned by Go's
TestAdmissionRulesGolden), and a broken file names every bad field."""

from __future__ import annotations

import json

import pytest

from sluice_metering import policy

from conftest import ROOT

TESTDATA = ROOT / "policy" / "testdata"
GOLDEN = json.loads((TESTDATA / "admission.rules.json").read_text())["files"]


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_rules_equal_go(name: str) -> None:
    p = policy.load(TESTDATA / name)
    assert p.admission_rules().to_dict() == GOLDEN[name]["admission"]
    assert p.soft_limit_rules().to_dict() == GOLDEN[name]["soft"]


def test_deploy_policies_load() -> None:
    # Every policy the repository ships parses in Python too.
    for f in sorted((ROOT / "deploy").rglob("policy*.yaml")):
        policy.load(f).admission_rules()


def test_unnamed_tenant_gets_defaults() -> None:
    p = policy.load(TESTDATA / "admission.yaml")
    assert p.tenant_ids() == ["acme", "bob"]
    rules = p.admission_rules()
    assert "carol" not in rules.tenants
    assert [r.name for r in rules.default.rules] == ["legacy-rpm", "quota:tokens_per_minute"]


def test_problems_name_each_field() -> None:
    text = """
limits:
  a: {unit: bytes, sliding_window: {length: 1m, limit: 10}}
  b: {unit: requests, token_bucket: {rate: 0}}
  c: {unit: requests}
  "quota:x": {unit: requests, sliding_window: {limit: 1}}
  d: {unit: requests, sliding_window: {length: 1x, limit: 1}, colour: red}
  e: {unit: total_tokens, scope: {user: "*"}, period: {every: month, limit: 1000000}}
  f: {unit: cost, scope: {key: "*"}, sliding_window: {length: 1h, limit: 5}}
  g: {unit: requests, scope: {session: "*"}, sliding_window: {length: 1h, limit: 5}}
  h: {unit: total_tokens, scope: {key: "*"}, period: {every: once, limit: 1000, expires_at: "2026-12-04T18:00:00Z"}}
plans:
  pro: {plan: free}
defaults:
  burst_multiplier: 500
  models:
    "*": {tokens_per_minute: -1}
  limits:
    t: {scope: {tenant: "*"}, unit: requests, sliding_window: {limit: 1}}
tenants:
  acme: {plan: gold, fail_mode: sometimes}
"""
    with pytest.raises(policy.PolicyError) as e:
        policy.parse(text, "bad.yaml")
    got = "\n".join(e.value.problems)
    for want in ["bad.yaml: limits.a.unit: 'bytes' is not one of requests",
                 "limits.b.token_bucket.rate: rate 0 is outside (0, 1e+12]",
                 "limits.c: needs token_bucket {rate, per, burst} or sliding_window {length, limit}",
                 'limits.quota:x: names starting with "quota:" are reserved',
                 "limits.d.sliding_window.length: invalid duration '1x'",
                 "limits.d.colour: unknown field",
                 "limits.e.period: calendar period limits, and one-off budgets (every: once with expires_at), are enforced "
                 "by the Go SDK and sluice gateway only",
                 "limits.h.period: calendar period limits, and one-off budgets",
                 "limits.f.unit: limits counting cost are enforced by the Go SDK and sluice gateway only",
                 "limits.g.scope.session: limits scoped by session are enforced by the Go SDK and sluice gateway only",
                 "plans.pro.plan: a plan cannot take another plan",
                 "defaults.burst_multiplier: 500 is outside 1..100",
                 "defaults.models.*.tokens_per_minute: -1 is outside 0..",
                 "defaults.limits.t.scope.tenant: a tenant's, plan's or the defaults' limits count per tenant already",
                 "tenants.acme.plan: plan 'gold' is not defined under plans (defined: pro)",
                 "tenants.acme.fail_mode: 'sometimes' is not one of open, closed"]:
        assert want in got, f"missing {want!r} in:\n{got}"


def test_count_of_token_quotas_is_validated_like_go() -> None:
    ok = policy.parse('tenants:\n  acme:\n    models:\n      "*": {monthly_tokens: 10, count: billed}\n', "ok.yaml")
    assert ok is not None
    with pytest.raises(policy.PolicyError) as e:
        policy.parse('tenants:\n  acme:\n    models:\n      "*": {monthly_tokens: 10, count: weighted}\n', "bad.yaml")
    assert "tenants.acme.models.*.count: 'weighted' is not one of total, billed" in "\n".join(e.value.problems)


@pytest.mark.parametrize("s,ns", [("1m", 60 * 10**9), ("1h30m", 5400 * 10**9), ("1.5s", 1_500_000_000), ("500ms", 500_000_000),
                                  ("0", 0), ("2h45m0.5s", (9900 * 10**9) + 500_000_000), ("1µs", 1000), ("-1s", -10**9)])
def test_parse_duration_is_gos(s: str, ns: int) -> None:
    assert policy.parse_duration(s) == ns


@pytest.mark.parametrize("s", ["", "1", "m", "1.s.", "1d", "+"])
def test_parse_duration_rejects(s: str) -> None:
    with pytest.raises(ValueError):
        policy.parse_duration(s)


def test_a_limits_wait_is_accepted_and_refuses_at_once() -> None:
    """wait: lets classes wait in the Go SDK; here the rule loads and refuses
    without waiting, the safe side."""
    p = policy.parse("""
limits:
  rpm: {unit: requests, sliding_window: {length: 1m, limit: 10}, wait: {low: 30s}}
""", "wait.yaml")
    assert [r.name for r in p.admission_rules().shared] == ["rpm"]

"""The policy file's admission rules: the Go policy package's
``Policy.AdmissionRules`` and ``Policy.SoftLimitRules`` for Python.

The policy is one YAML file (policy/testdata/example.yaml; the Go package
doc of ``policy`` is the reference) that the Go services, the Go SDK's
gateways and this SDK all read. ``load`` reads the sections admission
depends on — ``limits``, ``plans``, ``defaults`` and ``tenants`` (their
``plan``, ``fail_mode``, ``mode``, ``burst_multiplier``, ``models`` and
``limits``) — and merges them exactly as Go does:

- layers: built-in, then ``defaults``, then ``plans.<plan>`` (the tenant's
  ``plan:``, else the defaults' ``plan:``), then the tenant;
- ``limits.<name>`` merges field by field over the inherited limit of the
  same name (``scope`` replaces whole; a ``token_bucket`` or
  ``sliding_window`` block merges with an inherited block of the same
  algorithm and replaces one of the other); ``{disabled: true}`` drops it;
- ``models.<key>`` merges quota by quota (0 removes an inherited quota);
- a bucket without ``burst`` gets ``ceil(rate x burst_multiplier)`` of the
  tenant it belongs to (1 at top level); its rate becomes units per second;
- each tenant's hard ``tokens_per_minute`` and ``requests_per_minute``
  quotas become one-minute sliding windows named ``quota:<quota>`` (plus
  ``:<model>`` and ``scope.model`` for a per-model quota); soft ones go to
  ``soft_limit_rules`` as ``soft:<quota>``, which never refuse.

The rules and their names are the Go ones, rule for rule:
policy/testdata/admission.rules.json is checked against both
(``TestAdmissionRulesGolden`` in Go, tests/test_policy.py here), and the
shared vectors (sdk/go/admission/testdata/vectors.json) run a case whose
rules come from policy/testdata/admission.yaml in both languages.

The other sections (prices, channels, alert tiers, breakers, budgets,
upstreams, fallbacks, timezones, priorities) are not admission's and are
not checked here beyond their names: validate a file with the Go services
(or ``go test ./policy``) before you deploy it, since Go rejects problems
this loader does not look for. Problems this loader finds are reported all
at once, each with its field path, in one ``PolicyError``.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any

import yaml

from .admission import (DIMS, MAX_LIMIT, MAX_NAME_BYTES, MAX_RATE, MAX_RESERVE, MAX_VALUE_LEN, MAX_WINDOW_MS, Rule, Rules,
                        Scope, TenantRules)

QUOTA_RULE_PREFIX = "quota:"
SOFT_RULE_PREFIX = "soft:"
ALL_MODELS = "*"
MAX_BURST = 100.0
MAX_QUOTA_TOKENS = 1 << 50
_MINUTE_MS = 60_000
_NS_PER_MS = 1_000_000
_TENANT_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")
_UNITS = ("requests", "prompt_tokens", "completion_tokens", "total_tokens")
_QUOTAS = ("monthly_tokens", "daily_tokens", "hourly_tokens", "tokens_per_minute", "requests_per_minute")
# The fields Go's decoder knows (it rejects any other); only some matter here.
_TOP_FIELDS = {"defaults", "plans", "tenants", "limits", "prices", "upstreams", "fallbacks", "channels",
               "price_catalog", "prices_file", "unpriced_price"}
_TENANT_FIELDS = {"plan", "timezone", "mode", "fail_mode", "alert_tiers", "channels", "priority", "burst_multiplier",
                  "max_models", "budget", "models", "limits", "breakers", "unpriced", "organization", "week_start",
                  "billing_day"}
# count: what the entry's token quotas count (total or billed-equivalent
# tokens); the aggregator counts them, this SDK only validates it.
_MODEL_FIELDS = set(_QUOTAS) | {"mode", "count"}
# wait: classes that may wait for a refusing limit — this SDK refuses at once
# (the safe side); period: calendar limits, which this SDK cannot enforce, so
# a policy with one is refused rather than applied without it.
_LIMIT_FIELDS = {"scope", "unit", "token_bucket", "sliding_window", "exact", "reserve", "disabled", "wait", "period"}
_BUCKET_FIELDS = {"rate", "per", "burst"}
_WINDOW_FIELDS = {"length", "limit"}
_SECOND_NS = 1_000_000_000
_MAX_WINDOW_NS = MAX_WINDOW_MS * _NS_PER_MS


class PolicyError(ValueError):
    """Every problem found in a policy file, each as ``file: field: what``."""

    def __init__(self, filename: str, problems: list[str]) -> None:
        self.problems = [f"{filename}: {p}" for p in problems]
        super().__init__(f"policy: {len(problems)} problem(s):\n  " + "\n  ".join(self.problems))


_DURATION_UNITS = {"ns": 1, "us": 1_000, "µs": 1_000, "μs": 1_000, "ms": 1_000_000, "s": _SECOND_NS,
                   "m": 60 * _SECOND_NS, "h": 3600 * _SECOND_NS}
_DURATION_PART = re.compile(r"(\d*)(?:\.(\d*))?(ns|us|µs|μs|ms|s|m|h)")


def parse_duration(s: str) -> int:
    """Go's time.ParseDuration, in nanoseconds ("1m", "1h30m", "1.5s")."""
    orig, neg = s, False
    if s[:1] in "+-" and s:
        neg, s = s[0] == "-", s[1:]
    if s == "0":
        return 0
    if not s:
        raise ValueError(f"invalid duration {orig!r}")
    total, pos = Decimal(0), 0
    while pos < len(s):
        m = _DURATION_PART.match(s, pos)
        if not m or (m.group(1) == "" and not m.group(2)):
            raise ValueError(f"invalid duration {orig!r} (use Go's syntax, e.g. 1m, 1h30m, 1.5s)")
        total += Decimal(f"{m.group(1) or 0}.{m.group(2) or 0}") * _DURATION_UNITS[m.group(3)]
        pos = m.end()
    ns = int(total)  # Go truncates the fraction of a nanosecond
    if ns > (1 << 63) - 1:
        raise ValueError(f"invalid duration {orig!r} (out of range)")
    return -ns if neg else ns


@dataclass
class _Limit:
    # A limit after merging, as Go's policy.Limit: per and length in ns.
    name: str
    scope: Scope = Scope()
    unit: str = ""
    algorithm: str = ""
    rate: float = 0.0
    per_ns: int = 0
    burst: int = 0
    burst_set: bool = False
    length_ns: int = 0
    max: int = 0
    exact: bool = False
    reserve: float = 0.0

    def rule(self, burst_multiplier: float) -> Rule:
        if self.algorithm == "token_bucket":
            # Go: Rate / Per.Seconds(), Per.Seconds() = whole seconds + the
            # rest / 1e9, so the float is the same bit for bit.
            sec, nsec = divmod(self.per_ns, _SECOND_NS)
            limit = self.burst if self.burst_set else int(math.ceil(self.rate * max(burst_multiplier, 1.0)))
            return Rule(name=self.name, unit=self.unit, algorithm=self.algorithm, limit=limit,
                        rate=self.rate / (float(sec) + float(nsec) / 1e9), scope=self.scope, exact=self.exact,
                        reserve=self.reserve)
        return Rule(name=self.name, unit=self.unit, algorithm=self.algorithm, limit=self.max,
                    window_ms=self.length_ns // _NS_PER_MS, scope=self.scope, exact=self.exact, reserve=self.reserve)


@dataclass
class _Tenant:
    fail_mode: str = "open"
    mode: str = "hard"
    burst_multiplier: float = 1.0
    models: dict[str, dict[str, Any]] = field(default_factory=dict)  # quota -> int, "mode" -> str
    limits: dict[str, _Limit] = field(default_factory=dict)

    def copy(self) -> _Tenant:
        return replace(self, models={k: dict(v) for k, v in self.models.items()}, limits=dict(self.limits))

    def mode_for(self, model: str) -> str:
        return str(self.models.get(model, {}).get("mode") or self.mode)

    def limit_list(self) -> list[_Limit]:
        return _sorted_limits(self.limits)

    def admission_rules(self) -> TenantRules:
        rules = [lim.rule(self.burst_multiplier) for lim in self.limit_list()]
        return TenantRules(rules + self.quota_rules("hard", QUOTA_RULE_PREFIX), self.fail_mode)

    def quota_rules(self, mode: str, prefix: str) -> list[Rule]:
        out: list[Rule] = []
        for m in sorted(self.models):
            q = self.models[m]
            if self.mode_for(m) != mode:
                continue
            for name, unit in (("tokens_per_minute", "total_tokens"), ("requests_per_minute", "requests")):
                limit = int(q.get(name, 0))
                if limit <= 0:
                    continue
                rname, scope = prefix + name, Scope()
                if m != ALL_MODELS:
                    rname, scope = rname + ":" + m, Scope(model=m)
                out.append(Rule(name=rname, unit=unit, algorithm="sliding_window", limit=limit, window_ms=_MINUTE_MS,
                                scope=scope))
        return out


def _sorted_limits(m: dict[str, _Limit]) -> list[_Limit]:
    # Go's sortedLimits: global scopes first, then by name.
    return sorted(m.values(), key=lambda lim: (lim.scope != Scope(), lim.name))


class Policy:
    """The admission side of a parsed policy file. Immutable once built."""

    def __init__(self, source: str, shared: list[_Limit], tenants: dict[str, _Tenant], default: _Tenant) -> None:
        self.source = source
        self._shared = shared
        self._tenants = tenants
        self._default = default

    def tenant_ids(self) -> list[str]:
        """The tenants the file names, sorted."""
        return sorted(self._tenants)

    def admission_rules(self) -> Rules:
        """The rules gateways enforce before each call (Go:
        Policy.AdmissionRules): the top-level limits, and per tenant (and
        for tenants the file does not name, the defaults) its limits and
        hard one-minute quotas, with its fail mode."""
        rs = Rules([lim.rule(1.0) for lim in self._shared],
                   {t: x.admission_rules() for t, x in self._tenants.items()}, self._default.admission_rules())
        rs.validate()
        return rs

    def soft_limit_rules(self) -> Rules:
        """Each tenant's soft one-minute quotas as rules named
        ``soft:<quota>[:<model>]`` (Go: Policy.SoftLimitRules). They never
        refuse a request: a gateway that checks them serves a tenant past
        one with a cheaper model instead. Every tenant fails open on them."""
        rs = Rules([], {t: TenantRules(x.quota_rules("soft", SOFT_RULE_PREFIX), "open") for t, x in self._tenants.items()},
                   TenantRules(self._default.quota_rules("soft", SOFT_RULE_PREFIX), "open"))
        rs.validate()
        return rs


def load(path: str | os.PathLike[str]) -> Policy:
    """Read and parse the policy file at path."""
    with open(path, encoding="utf-8") as f:
        return parse(f.read(), os.fspath(path))


def parse(text: str, filename: str = "policy") -> Policy:
    """Parse a policy document; filename is used in error messages only.
    Raises PolicyError listing every problem found."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise PolicyError(filename, [f"not valid YAML: {e}"]) from None
    v = _Validator()
    raw = v.mapping("", raw if raw is not None else {}, _TOP_FIELDS)
    builtin = _Tenant()
    raw_defaults = v.mapping("defaults", raw.get("defaults"), _TENANT_FIELDS)
    defaults = v.tenant("defaults", {k: x for k, x in raw_defaults.items() if k != "plan"}, builtin)
    plans: dict[str, _Tenant] = {}
    raw_plans = v.mapping("plans", raw.get("plans"), None)
    for name in sorted(raw_plans):
        rp = v.mapping("plans." + name, raw_plans[name], _TENANT_FIELDS)
        if not _TENANT_ID.match(name):
            v.fail("plans." + name, f"plan name must match {_TENANT_ID.pattern}")
        if rp.get("plan"):
            v.fail(f"plans.{name}.plan", "a plan cannot take another plan")
            rp = {k: x for k, x in rp.items() if k != "plan"}
        plans[name] = v.tenant("plans." + name, rp, defaults)
    eff = defaults
    if raw_defaults.get("plan"):
        eff = v.plan("defaults.plan", str(raw_defaults["plan"]), plans, defaults)
    shared = _sorted_limits(v.limits("limits", raw.get("limits"), {}, tenant_level=False))
    tenants: dict[str, _Tenant] = {}
    raw_tenants = v.mapping("tenants", raw.get("tenants"), None)
    for tid in sorted(raw_tenants):
        if not _TENANT_ID.match(tid):
            v.fail("tenants." + tid, f"tenant id must match {_TENANT_ID.pattern}")
            continue
        rt = v.mapping("tenants." + tid, raw_tenants[tid], _TENANT_FIELDS)
        base = eff
        if rt.get("plan"):
            base = v.plan(f"tenants.{tid}.plan", str(rt["plan"]), plans, eff)
        tenants[tid] = v.tenant("tenants." + tid, rt, base)
    if v.problems:
        raise PolicyError(filename, v.problems)
    return Policy(filename, shared, tenants, eff)


class _Validator:
    def __init__(self) -> None:
        self.problems: list[str] = []

    def fail(self, path: str, msg: str) -> None:
        self.problems.append(f"{path}: {msg}")

    def mapping(self, path: str, x: Any, known: set[str] | None) -> dict[str, Any]:
        if x is None:
            return {}
        if not isinstance(x, dict):
            self.fail(path or "(document)", "must be a mapping")
            return {}
        out = {str(k): val for k, val in x.items()}  # YAML may read a key such as 123 as a number; Go reads a string
        if known is not None:
            for k in sorted(set(out) - known):
                self.fail(f"{path}.{k}" if path else k, f"unknown field (known: {', '.join(sorted(known))})")
        return out

    def integer(self, path: str, x: Any) -> int | None:
        if isinstance(x, bool) or not isinstance(x, int):
            self.fail(path, f"{x!r} is not an integer")
            return None
        return x

    def number(self, path: str, x: Any) -> float | None:
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            self.fail(path, f"{x!r} is not a number")
            return None
        return float(x)

    def boolean(self, path: str, x: Any) -> bool:
        if not isinstance(x, bool):
            self.fail(path, f"{x!r} is not true or false")
            return False
        return x

    def duration(self, path: str, x: Any) -> int | None:
        if not isinstance(x, str):
            self.fail(path, f"{x!r} is not a duration (write it with a unit, e.g. 1m, 1h, 500ms)")
            return None
        try:
            return parse_duration(x)
        except ValueError as e:
            self.fail(path, str(e))
            return None

    def plan(self, path: str, name: str, plans: dict[str, _Tenant], fallback: _Tenant) -> _Tenant:
        if name in plans:
            return plans[name]
        defined = f" (defined: {', '.join(sorted(plans))})" if plans else " (there is no plans section)"
        self.fail(path, f"plan {name!r} is not defined under plans{defined}")
        return fallback

    def mode(self, path: str, x: Any) -> str:
        if x in ("hard", "soft"):
            return str(x)
        self.fail(path, f"{x!r} is not one of hard, soft")
        return "hard"

    def tenant(self, path: str, raw: dict[str, Any], base: _Tenant) -> _Tenant:
        t = base.copy()
        if raw.get("mode"):
            t.mode = self.mode(path + ".mode", raw["mode"])
        if raw.get("fail_mode"):
            if raw["fail_mode"] in ("open", "closed"):
                t.fail_mode = str(raw["fail_mode"])
            else:
                self.fail(path + ".fail_mode", f"{raw['fail_mode']!r} is not one of open, closed")
        if raw.get("burst_multiplier") is not None:
            bm = self.number(path + ".burst_multiplier", raw["burst_multiplier"])
            if bm is not None:
                if not 1 <= bm <= MAX_BURST:
                    self.fail(path + ".burst_multiplier", f"{bm:g} is outside 1..{MAX_BURST:g}")
                t.burst_multiplier = bm
        models = self.mapping(path + ".models", raw.get("models"), None)
        for model, rq in models.items():
            mp = f"{path}.models.{model}"
            if not 1 <= len(model) <= 128:
                self.fail(mp, "model name must be 1..128 bytes")
            q = dict(base.models.get(model, {}))
            for k, x in self.mapping(mp, rq, _MODEL_FIELDS).items():
                if k == "mode":
                    if x:
                        q["mode"] = self.mode(mp + ".mode", x)
                    continue
                if k == "count":
                    if x not in ("", None, "total", "billed"):
                        self.fail(mp + ".count", f"{x!r} is not one of total, billed")
                    continue
                n = self.integer(f"{mp}.{k}", x)
                if n is None:
                    continue
                if not 0 <= n <= MAX_QUOTA_TOKENS:
                    self.fail(f"{mp}.{k}", f"{n} is outside 0..{MAX_QUOTA_TOKENS} (0 removes the quota, also one inherited from defaults)")
                q[k] = n
            t.models[model] = q
        t.limits = self.limits(path + ".limits", raw.get("limits"), base.limits, tenant_level=True)
        return t

    def limits(self, path: str, raw: Any, base: dict[str, _Limit], tenant_level: bool) -> dict[str, _Limit]:
        out = dict(base)
        rawm = self.mapping(path, raw, None)
        for name in sorted(rawm):
            lp = f"{path}.{name}"
            rl = self.mapping(lp, rawm[name], _LIMIT_FIELDS)
            if not 1 <= len(name.encode()) <= MAX_NAME_BYTES:
                self.fail(lp, f"limit name must be 1..{MAX_NAME_BYTES} bytes")
            if name.startswith(QUOTA_RULE_PREFIX):
                self.fail(lp, f'names starting with "{QUOTA_RULE_PREFIX}" are reserved for the rules derived from '
                              "tokens_per_minute and requests_per_minute")
            if rl.get("period") is not None:
                self.fail(lp + ".period", "calendar period limits, and one-off budgets (every: once with expires_at), are "
                                          "enforced by the Go SDK and sluice gateway only; this SDK would admit without "
                                          "them (use a sliding_window here)")
            if rl.get("disabled") is not None and self.boolean(lp + ".disabled", rl["disabled"]):
                out.pop(name, None)
                continue
            inherited = name in out
            lim = replace(out[name], name=name) if inherited else _Limit(name=name)
            if rl.get("scope") is not None:
                lim.scope = self.scope(lp + ".scope", rl["scope"], tenant_level)
            if rl.get("unit") == "cost":
                self.fail(lp + ".unit", "limits counting cost are enforced by the Go SDK and sluice gateway only, which "
                                        "price calls; this SDK would admit without them")
            elif rl.get("unit"):
                if rl["unit"] not in _UNITS:
                    self.fail(lp + ".unit", f"{rl['unit']!r} is not one of requests, prompt_tokens, completion_tokens, total_tokens")
                lim.unit = str(rl["unit"])
            elif not inherited:
                self.fail(lp + ".unit", "is required (requests, prompt_tokens, completion_tokens or total_tokens)")
            tb, sw = rl.get("token_bucket"), rl.get("sliding_window")
            if tb is not None and sw is not None:
                self.fail(lp, "set token_bucket or sliding_window, not both")
            elif tb is not None:
                b = self.mapping(lp + ".token_bucket", tb, _BUCKET_FIELDS)
                lim = self.switch_algorithm(lp + ".token_bucket", lim, "token_bucket", b, "rate",
                                            "is required (units per per, per defaulting to 1s)",
                                            length_ns=0, max=0, rate=0.0, per_ns=_SECOND_NS, burst=0, burst_set=False)
                if b.get("rate") is not None:
                    lim.rate = self.number(lp + ".token_bucket.rate", b["rate"]) or 0.0
                if b.get("per") is not None:
                    lim.per_ns = self.duration(lp + ".token_bucket.per", b["per"]) or 0
                if b.get("burst") is not None:
                    lim.burst, lim.burst_set = self.integer(lp + ".token_bucket.burst", b["burst"]) or 0, True
            elif sw is not None:
                w = self.mapping(lp + ".sliding_window", sw, _WINDOW_FIELDS)
                lim = self.switch_algorithm(lp + ".sliding_window", lim, "sliding_window", w, "limit",
                                            "is required (most units in any length; 0 refuses every request)",
                                            rate=0.0, per_ns=0, burst=0, burst_set=False, length_ns=60 * _SECOND_NS, max=0)
                if w.get("length") is not None:
                    lim.length_ns = self.duration(lp + ".sliding_window.length", w["length"]) or 0
                if w.get("limit") is not None:
                    lim.max = self.integer(lp + ".sliding_window.limit", w["limit"]) or 0
            if rl.get("exact") is not None:
                lim.exact = self.boolean(lp + ".exact", rl["exact"])
            if rl.get("reserve") is not None:
                lim.reserve = self.number(lp + ".reserve", rl["reserve"]) or 0.0
            self.check_limit(lp, lim)
            out[name] = lim
        return out

    def switch_algorithm(self, path: str, lim: _Limit, algorithm: str, section: dict[str, Any], required: str,
                         why: str, **fresh: Any) -> _Limit:
        """lim counted by algorithm, whose settings (at path) are section.
        A limit that already is one keeps its parameters for section to
        override; one that changes algorithm (a new limit, or an override of
        an inherited one) must set required, and starts from fresh: the old
        algorithm's parameters dropped, the new one's at their defaults."""
        if lim.algorithm == algorithm:
            return lim
        if section.get(required) is None:
            self.fail(f"{path}.{required}", why)
        return replace(lim, algorithm=algorithm, **fresh)

    def scope(self, path: str, raw: Any, tenant_level: bool) -> Scope:
        if raw == "global":
            return Scope()
        if not isinstance(raw, dict):
            self.fail(path, f"{raw!r} is not global or a mapping of {', '.join(DIMS)}")
            return Scope()
        dims: dict[str, str] = {}
        for d in sorted(str(k) for k in raw):
            val = raw[d]
            val = "" if val is None else str(val)
            dp = f"{path}.{d}"
            if d == "global":
                if len(raw) > 1:
                    self.fail(dp, "global cannot be combined with other dimensions (leave them out for one global counter)")
                continue
            if d in ("session", "organization"):
                self.fail(dp, f"limits scoped by {d} are enforced by the Go SDK and sluice gateway only; "
                              "this SDK would admit without them")
                continue
            if d not in DIMS:
                self.fail(dp, f"unknown dimension (use global, {', '.join(DIMS)})")
                continue
            if val == "":
                self.fail(dp, 'needs a value, or "*" for one counter per value')
                continue
            if len(val.encode()) > MAX_VALUE_LEN:
                self.fail(dp, f"value is longer than {MAX_VALUE_LEN} bytes")
            if d == "tenant" and tenant_level:
                self.fail(dp, "a tenant's, plan's or the defaults' limits count per tenant already; scope.tenant "
                              "belongs in the top-level limits")
            dims[d] = val
        return Scope(**dims)

    def check_limit(self, lp: str, lim: _Limit) -> None:
        if lim.algorithm == "token_bucket":
            if not 0 < lim.rate <= MAX_RATE:
                self.fail(lp + ".token_bucket.rate", f"rate {lim.rate:g} is outside (0, {MAX_RATE:g}] (units per per)")
            if not _NS_PER_MS <= lim.per_ns <= _MAX_WINDOW_NS:
                self.fail(lp + ".token_bucket.per", "per is outside 1ms..744h0m0s")
            if lim.burst_set and not 0 <= lim.burst <= MAX_LIMIT:
                self.fail(lp + ".token_bucket.burst", f"burst {lim.burst} is outside 0..{MAX_LIMIT}")
            if not lim.burst_set and lim.rate * MAX_BURST > MAX_LIMIT:
                self.fail(lp + ".token_bucket.rate", f"rate {lim.rate:g} times burst_multiplier may exceed {MAX_LIMIT}; set burst")
        elif lim.algorithm == "sliding_window":
            if not _NS_PER_MS <= lim.length_ns <= _MAX_WINDOW_NS:
                self.fail(lp + ".sliding_window.length", "length is outside 1ms..744h0m0s")
            elif lim.length_ns % _NS_PER_MS:
                # Python rules count windows in milliseconds.
                self.fail(lp + ".sliding_window.length", "must be a whole number of milliseconds")
            if not 0 <= lim.max <= MAX_LIMIT:
                self.fail(lp + ".sliding_window.limit", f"limit {lim.max} is outside 0..{MAX_LIMIT}")
        else:
            self.fail(lp, "needs token_bucket {rate, per, burst} or sliding_window {length, limit}")
        if not 0 <= lim.reserve <= MAX_RESERVE:
            self.fail(lp + ".reserve", f"{lim.reserve:g} is outside 0..{MAX_RESERVE} (the share only critical and high "
                                       "priority requests may use)")

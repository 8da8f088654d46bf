"""Admission: may this request go upstream now, by the limits that apply?

The same counters as the Go SDK (sdk/go/admission): the same Redis keys,
and the very same Lua scripts, read from ``sdk/go/admission/scripts`` (the
package's ``scripts`` directory is a link to it). docs/admission.md is the
contract. Every rule that applies to a request is checked in one
``admit.lua`` call, all or nothing; ``settle`` corrects the estimate with
the real usage, once per request id (a marker key), with ``adjust.lua``.

What this SDK leaves out of the Go Limiter: local leases and the refusal
cache (every admission is decided by Redis, like a Go rule with
``exact: true``), so its admissions cost one Redis round trip each.

When Redis fails or does not answer within ``max_wait``, each tenant's
fail mode decides: ``closed`` refuses (HTTP 503); ``open`` admits by an
in-memory limiter enforcing the same rules with limits and rates divided by
``gateway_count``, starting from what Redis last said. Its debits, and
settlements Redis could not take, are kept (at most ``max_pending``) and
sent with ``adjust.lua`` once Redis answers again (probed at most every
``probe_interval`` by the next admission), settlements with their request
id, so nothing is applied twice.

Decisions name the refusing rule exactly as the Go SDK does (rule, scope,
unit, algorithm, limit, window or rate, requested, available,
retry-after), and ``Decision.message`` is the Go message, word for word.
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field, replace
from importlib import resources
from typing import Any, Generic, TypeVar, Union

import redis
import redis.asyncio

from . import ratelimit

DEFAULT_PREFIX = "sluice:adm:"
UNITS = ("requests", "prompt_tokens", "completion_tokens", "total_tokens")
ALGORITHMS = ("token_bucket", "sliding_window")
DIMS = ("upstream", "tenant", "model", "user", "key", "endpoint")
EACH = "*"
GRANULES = 60
MAX_LIMIT = 1 << 50
MAX_WINDOW_MS = 31 * 24 * 3600 * 1000
MAX_RATE = 1e12
MAX_RESERVE = 0.9
MAX_NAME_BYTES = 128
MAX_VALUE_LEN = 256
MAX_RULES_PER_REQUEST = 64

PATH_NONE, PATH_REDIS, PATH_LOCAL, PATH_UNAVAILABLE = "none", "redis", "local", "unavailable"


def script(name: str) -> str:
    """The text of a shared Lua script ("admit.lua" or "adjust.lua")."""
    return (resources.files("sluice_metering") / "scripts" / name).read_text(encoding="utf-8")


class BacklogFull(Exception):
    """Redis is unreachable and the pending corrections are full: the
    ticket stays unsettled and settle may be called again."""


@dataclass(frozen=True)
class Scope:
    """Which requests a rule counts together: a dimension left empty is not
    part of the scope, "*" counts each value apart, any other value
    restricts the rule to it. In a Decision: the refusing instance's values."""

    upstream: str = ""
    tenant: str = ""
    model: str = ""
    user: str = ""
    key: str = ""
    endpoint: str = ""

    def values(self) -> tuple[str, ...]:
        return (self.upstream, self.tenant, self.model, self.user, self.key, self.endpoint)

    def as_dict(self) -> dict[str, str]:
        return {d: v for d, v in zip(DIMS, self.values()) if v}

    def __str__(self) -> str:
        parts = [f"{d}={v}" for d, v in zip(DIMS, self.values()) if v]
        return ", ".join(parts) if parts else "global"


@dataclass(frozen=True)
class Rule:
    """One admission limit. ``limit`` is a window's most units per
    ``window_ms``, or a bucket's burst; ``rate`` a bucket's refill in units
    per second. ``exact`` is accepted for the Go SDK's sake (this SDK runs
    every rule exact); ``reserve`` keeps a share of the limit for critical
    and high priority requests."""

    name: str
    unit: str
    algorithm: str
    limit: int
    window_ms: int = 0
    rate: float = 0.0
    scope: Scope = Scope()
    exact: bool = False
    reserve: float = 0.0

    def problems(self) -> list[str]:
        p: list[str] = []

        def bad(f: str, msg: str) -> None:
            p.append(f'rule "{self.name}": {f}: {msg}')

        if not 1 <= len(self.name.encode()) <= MAX_NAME_BYTES:
            bad("name", f"must be 1..{MAX_NAME_BYTES} bytes")
        if self.unit not in UNITS:
            bad("unit", "must be requests, prompt_tokens, completion_tokens or total_tokens")
        if not 0 <= self.limit <= MAX_LIMIT:
            bad("limit", f"{self.limit} is outside 0..{MAX_LIMIT}")
        if self.algorithm == "token_bucket":
            if not 0 < self.rate <= MAX_RATE:
                bad("rate", f"{self.rate} is outside (0, {MAX_RATE:g}] units per second")
        elif self.algorithm == "sliding_window":
            if not 1 <= self.window_ms <= MAX_WINDOW_MS:
                bad("window", f"{self.window_ms}ms is outside 1ms..{MAX_WINDOW_MS}ms")
        else:
            bad("algorithm", "must be token_bucket or sliding_window")
        if not 0 <= self.reserve <= MAX_RESERVE:
            bad("reserve", f"{self.reserve} is outside 0..{MAX_RESERVE}")
        for d, v in zip(DIMS, self.scope.values()):
            if len(v.encode()) > MAX_VALUE_LEN:
                bad("scope." + d, f"value is longer than {MAX_VALUE_LEN} bytes")
        return p

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Rule:
        """A rule from its JSON form (the shared test vectors' format):
        {"name", "scope": {dim: value}, "unit", "algorithm", "limit",
        "window_ms" | "rate_per_second", "exact", "reserve"}."""
        unknown = set(d) - {"name", "scope", "unit", "algorithm", "limit", "window_ms", "rate_per_second", "exact", "reserve"}
        if unknown:
            raise ValueError(f"rule {d.get('name')!r}: unknown fields {sorted(unknown)}")
        sc = d.get("scope") or {}
        bad = set(sc) - set(DIMS)
        if bad:
            raise ValueError(f"rule {d.get('name')!r}: scope: unknown dimensions {sorted(bad)}")
        return cls(name=str(d.get("name", "")), unit=str(d.get("unit", "")), algorithm=str(d.get("algorithm", "")),
                   limit=int(d.get("limit", 0)), window_ms=int(d.get("window_ms", 0)),
                   rate=float(d.get("rate_per_second", 0.0)), scope=Scope(**sc), exact=bool(d.get("exact", False)),
                   reserve=float(d.get("reserve", 0.0)))

    def to_dict(self) -> dict[str, Any]:
        """The rule's JSON form, the inverse of from_dict."""
        d: dict[str, Any] = {"name": self.name, "scope": self.scope.as_dict(), "unit": self.unit,
                             "algorithm": self.algorithm, "limit": self.limit}
        if self.algorithm == "sliding_window":
            d["window_ms"] = self.window_ms
        else:
            d["rate_per_second"] = self.rate
        d["exact"], d["reserve"] = self.exact, self.reserve
        return d


@dataclass
class TenantRules:
    """One tenant's rules and fail mode ("open" when empty)."""

    rules: list[Rule] = field(default_factory=list)
    fail_mode: str = ""


@dataclass
class Rules:
    """Everything a Limiter enforces: ``shared`` rules no tenant owns,
    checked first and in order, then the tenant's own (``tenants[id]``, else
    ``default``), each tenant with counters of its own."""

    shared: list[Rule] = field(default_factory=list)
    tenants: dict[str, TenantRules] = field(default_factory=dict)
    default: TenantRules = field(default_factory=TenantRules)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Rules:
        """Rules from their JSON form: {"shared": [rule...], "tenants":
        {id: {"rules": [...], "fail_mode"}}, "default": {...}}."""

        def tr(x: dict[str, Any] | None) -> TenantRules:
            x = x or {}
            return TenantRules([Rule.from_dict(r) for r in x.get("rules") or []], str(x.get("fail_mode", "")))

        rs = cls([Rule.from_dict(r) for r in d.get("shared") or []],
                 {t: tr(x) for t, x in (d.get("tenants") or {}).items()}, tr(d.get("default")))
        rs.validate()
        return rs

    @classmethod
    def from_json(cls, text: str) -> Rules:
        return cls.from_dict(json.loads(text))

    def to_dict(self) -> dict[str, Any]:
        """The rules' JSON form, the inverse of from_dict."""

        def tr(x: TenantRules) -> dict[str, Any]:
            return {"rules": [r.to_dict() for r in x.rules], "fail_mode": x.fail_mode}

        return {"shared": [r.to_dict() for r in self.shared], "tenants": {t: tr(x) for t, x in sorted(self.tenants.items())},
                "default": tr(self.default)}

    def validate(self) -> None:
        """Raise ValueError naming every bad field and the limit it breaks."""
        p: list[str] = []

        def check(where: str, rules: list[Rule], tenant: str) -> None:
            seen: set[str] = set()
            for r in rules:
                p.extend(f"{where}: {x}" for x in r.problems())
                if r.name in seen:
                    p.append(f'{where}: rule "{r.name}": name is used twice')
                seen.add(r.name)
                if tenant and r.scope.tenant and r.scope.tenant != tenant:
                    p.append(f'{where}: rule "{r.name}": scope.tenant: "{r.scope.tenant}" in the rules of tenant "{tenant}" (the tenant is implied)')

        check("shared", self.shared, "")
        for t, x in self.tenants.items():
            check("tenant " + t, x.rules, t)
            if x.fail_mode not in ("", "open", "closed"):
                p.append(f'tenant {t}: fail mode "{x.fail_mode}" is not open or closed')
        check("default", self.default.rules, "*")
        if self.default.fail_mode not in ("", "open", "closed"):
            p.append(f'default: fail mode "{self.default.fail_mode}" is not open or closed')
        if p:
            raise ValueError("admission: " + "; ".join(p))


@dataclass
class Request:
    """What admission needs to know about a call before it is made.

    ``id`` makes settlement idempotent (use the usage event's id); the token
    counts are the estimates debited now and corrected by settle;
    ``upstream`` empty means the model."""

    tenant: str
    model: str = ""
    user: str = ""
    key: str = ""
    endpoint: str = ""
    upstream: str = ""
    id: str = ""
    priority: str = "normal"
    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass(frozen=True)
class Headroom:
    """What one rule had left (limit 0: no rule of this kind applied)."""

    limit: int = 0
    remaining: int = 0
    reset_ms: int = 0


@dataclass(frozen=True)
class Decision:
    """The outcome of an admission; a refusal names the rule exactly."""

    allowed: bool
    path: str = PATH_NONE
    rule: str = ""
    scope: Scope = Scope()
    unit: str = ""
    algorithm: str = ""
    limit: int = 0
    window_ms: int = 0
    rate: float = 0.0
    requested: int = 0
    available: int = 0
    retry_after_ms: int = 0
    # never: the request asks more than the rule's limit and never fits.
    never: bool = False
    cause: str = ""
    requests: Headroom = Headroom()
    tokens: Headroom = Headroom()

    @property
    def status(self) -> int:
        """429 for a rule's refusal, 503 when Redis was unreachable and the
        tenant fails closed (200 when allowed)."""
        if self.allowed:
            return 200
        return 503 if self.path == PATH_UNAVAILABLE else 429

    @property
    def message(self) -> str:
        """The Go SDK's message for this refusal, word for word."""
        if self.allowed:
            return ""
        if self.path == PATH_UNAVAILABLE:
            return ("Usage limits cannot be checked right now (the rate-limit store did not answer in time) "
                    "and this tenant fails closed; retry later.")
        if self.algorithm == "sliding_window":
            per = f"{self.limit} {self.unit} per {ratelimit.go_duration(self.window_ms * 1_000_000)}"
        else:
            per = f"{self.limit} {self.unit} burst, refilling {ratelimit.go_float(self.rate)} per second"
        if self.never:
            return f"Request too large for rule {self.rule} ({self.scope}): limit {per}, requested {self.requested}."
        return (f"Rate limit reached for rule {self.rule} ({self.scope}): limit {per}, available {self.available}, "
                f"requested {self.requested}. Please try again in {ratelimit.format_reset_ms(self.retry_after_ms)}.")

    def detail(self) -> dict[str, Any]:
        """The "sluice" member of the error body: the rule's numbers."""
        det: dict[str, Any] = {"kind": "admission", "rule": self.rule, "scope": self.scope.as_dict(), "unit": self.unit,
                               "algorithm": self.algorithm, "limit": self.limit}
        if self.algorithm == "sliding_window":
            det["window_seconds"] = self.window_ms / 1000
        elif self.rate:
            det["rate_per_second"] = self.rate
        det["requested"], det["available"] = self.requested, self.available
        if not self.never:
            det["retry_after_seconds"] = ratelimit.retry_after(self.retry_after_ms / 1000)
        else:
            det["too_large"] = True
        return det

    def error_body(self) -> dict[str, Any]:
        """The OpenAI error body of this refusal (Go: admission.Error)."""
        if self.path == PATH_UNAVAILABLE:
            return ratelimit.error_body(self.message, "service_unavailable", "admission_unavailable")
        typ = ratelimit.TYPE_REQUESTS if self.unit == "requests" else ratelimit.TYPE_TOKENS
        return ratelimit.error_body(self.message, typ, ratelimit.CODE_RATE_LIMIT_EXCEEDED, self.detail())

    def headers(self) -> dict[str, str]:
        """The x-ratelimit-* trios (and Retry-After on a refusal)."""
        h: dict[str, str] = {}
        for unit, hr, own in (("requests", self.requests, self.unit == "requests"),
                              ("tokens", self.tokens, self.unit in UNITS[1:])):
            if hr.limit > 0 or (own and self.rule):
                h.update(ratelimit.headers(unit, hr.limit, hr.remaining, hr.reset_ms / 1000))
        if not self.allowed:
            if self.path == PATH_UNAVAILABLE:
                h["Retry-After"] = "1"
            elif not self.never:
                h["Retry-After"] = str(ratelimit.retry_after(max(self.retry_after_ms, 1000) / 1000))
        return h


# -- compiled rules and instances ---------------------------------------------


@dataclass(frozen=True)
class _Compiled:
    rule: Rule
    shared: bool
    kind: str
    gran: int  # window granule ms; 0 for a bucket
    per_ms: float
    args: tuple[str, str, str, str]  # kind, limit, rate, granule as the scripts read them

    def floor(self, priority: str) -> int:
        r = self.rule
        if r.reserve == 0 or priority in ("critical", "high"):
            return 0
        return math.ceil(r.reserve * r.limit)

    def applies(self, req: Request) -> bool:
        s = self.rule.scope
        return (_match(s.upstream, req.upstream or req.model) and (not self.shared or _match(s.tenant, req.tenant))
                and _match(s.model, req.model) and _match(s.user, req.user) and _match(s.key, req.key)
                and _match(s.endpoint, req.endpoint))


def _compile(r: Rule, shared: bool) -> _Compiled:
    if not shared:
        r = replace(r, scope=replace(r.scope, tenant=""))
    if r.algorithm == "token_bucket":
        per_ms = r.rate / 1000
        return _Compiled(r, shared, "b", 0, per_ms, ("b", str(r.limit), repr(per_ms), "0"))
    gran = max(r.window_ms // GRANULES, 1)
    return _Compiled(r, shared, "w", gran, 0.0, ("w", str(r.limit), str(r.window_ms), str(gran)))


def _match(rule: str, v: str) -> bool:
    if rule == "":
        return True
    if rule == EACH:
        return v != ""
    return rule == v


_ESC = {c: f"%{ord(c):02X}" for c in "%|=:{}"}


def _escape(v: str) -> str:
    return "".join(_ESC.get(c, c) for c in v)


def instance_key(prefix: str, c: _Compiled, s: Scope) -> str:
    """The Redis key of one rule instance (docs/admission.md, "Keys")."""
    b = [prefix, "{", "s:" if c.shared else "t:" + _escape(s.tenant) + ":", _escape(c.rule.name)]
    for i, (d, rv, v) in enumerate(zip(DIMS, c.rule.scope.values(), s.values())):
        if rv == "" or (not c.shared and i == 1):
            continue
        b.append(f"|{d}={_escape(v)}")
    b.append(f"}}:{c.rule.algorithm}:{c.rule.unit}")
    return "".join(b)


def key_slot(key: str) -> int:
    """The Redis Cluster slot of key (CRC16/XMODEM of its hash tag)."""
    i = key.find("{")
    if i >= 0:
        j = key.find("}", i + 1)
        if j > i + 1:
            key = key[i + 1:j]
    crc = 0
    for byte in key.encode():
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else (crc << 1)
            crc &= 0xFFFF
    return crc % 16384


@dataclass
class _Instance:
    c: _Compiled
    key: str
    scope: Scope
    slot: int


def _need(unit: str, prompt: int, completion: int) -> int:
    if unit == "requests":
        return 1
    n = prompt if unit == "prompt_tokens" else completion if unit == "completion_tokens" else prompt + completion
    return max(n, 1)


def _actual(unit: str, prompt: int, completion: int) -> int:
    if unit == "requests":
        return 1
    return prompt if unit == "prompt_tokens" else completion if unit == "completion_tokens" else prompt + completion


@dataclass
class Ticket:
    """An admission's Decision and what settle needs. Settle it once the
    call is over; settling twice applies nothing twice."""

    decision: Decision
    id: str = ""
    insts: list[_Instance] = field(default_factory=list)
    needs: list[int] = field(default_factory=list)
    local: list[bool] = field(default_factory=list)
    at_ms: int = 0
    settled: bool = False

    @property
    def allowed(self) -> bool:
        return self.decision.allowed


@dataclass
class _Call:
    keys: list[str]
    args: list[Any]
    idx: list[int]


@dataclass
class _Local:
    """The fail-open limiter of one instance: its limits divided by the
    gateway count, started from Redis's last word."""

    tokens: float
    last: float
    win: dict[int, int] = field(default_factory=dict)


Client = Union[redis.Redis, redis.RedisCluster]
AsyncClient = Union[redis.asyncio.Redis, redis.asyncio.RedisCluster]


class _Core:
    """Everything but the I/O, shared by Limiter and AsyncLimiter."""

    def __init__(self, rules: Rules | None, *, prefix: str, cluster: bool, max_wait: float, gateway_count: int,
                 settle_ttl: float, probe_interval: float, max_pending: int, max_instances: int) -> None:
        problems = []
        if max_wait <= 0:
            problems.append(f"max_wait {max_wait}s must be positive")
        if gateway_count < 1:
            problems.append(f"gateway_count {gateway_count} must be at least 1")
        if settle_ttl < 1:
            problems.append(f"settle_ttl {settle_ttl}s must be at least 1s")
        if probe_interval <= 0 or max_pending < 1 or max_instances < 1:
            problems.append("probe_interval must be positive, max_pending and max_instances at least 1")
        if not prefix or "{" in prefix or "}" in prefix:
            problems.append(f'prefix "{prefix}" must be non-empty and hold no braces (they would change the hash tag)')
        if problems:
            raise ValueError("admission: " + "; ".join(problems))
        self.prefix, self.cluster, self.max_wait = prefix, cluster, max_wait
        self.gateways, self.settle_ttl_ms, self.probe_interval = gateway_count, int(settle_ttl * 1000), probe_interval
        self.max_pending, self.max_instances = max_pending, max_instances
        self.down = False
        self.cause = ""
        self.last_probe = 0.0
        # Redis's last word per instance key (remaining), for headers and
        # for the fail-open limiter's start; bounded LRU.
        self.remaining: OrderedDict[str, int] = OrderedDict()
        self.locals: OrderedDict[str, _Local] = OrderedDict()
        # Corrections waiting for Redis: merged debits per instance key
        # (no marker), and settlements by request id (with a marker).
        self.debits: dict[str, tuple[_Instance, int]] = {}
        self.settles: dict[str, list[tuple[_Instance, int, int]]] = {}
        self.dropped = 0
        # Guards the local limiters and the pending corrections (a Limiter
        # is shared by threads); never held across a Redis call.
        self.lock = threading.Lock()
        self.set_rules(rules or Rules())

    def set_rules(self, rules: Rules) -> None:
        """Replace the rules (a policy reload); counters in Redis carry over
        for rules whose name, scope, algorithm and unit did not change."""
        rules.validate()
        self.shared = [_compile(r, True) for r in rules.shared]
        self.tenants = {t: ([_compile(r, False) for r in x.rules], x.fail_mode or "open") for t, x in rules.tenants.items()}
        self.default = ([_compile(r, False) for r in rules.default.rules], rules.default.fail_mode or "open")

    def plan(self, req: Request) -> tuple[list[_Instance], str]:
        if req.prompt_tokens < 0 or req.completion_tokens < 0:
            raise ValueError(f"admission: estimated tokens must not be negative (prompt {req.prompt_tokens}, "
                             f"completion {req.completion_tokens})")
        own, fail_mode = self.tenants.get(req.tenant, self.default)
        cs = [c for c in self.shared if c.applies(req)] + [c for c in own if c.applies(req)]
        if len(cs) > MAX_RULES_PER_REQUEST:
            raise ValueError(f"admission: {len(cs)} rules apply to this request, at most {MAX_RULES_PER_REQUEST} may")
        out = []
        for c in cs:
            s = c.rule.scope
            vals = dict(zip(DIMS, s.values()))
            reqv = {"upstream": req.upstream or req.model, "tenant": req.tenant, "model": req.model, "user": req.user,
                    "key": req.key, "endpoint": req.endpoint}
            for d in DIMS:
                if vals[d] == EACH:
                    vals[d] = reqv[d]
            if not c.shared:
                vals["tenant"] = req.tenant
            sc = Scope(**vals)
            k = instance_key(self.prefix, c, sc)
            out.append(_Instance(c, k, sc, key_slot(k) if self.cluster else 0))
        return out, fail_mode

    def admit_calls(self, insts: list[_Instance], needs: list[int], req: Request) -> list[_Call]:
        groups: dict[int, _Call] = {}
        for i, (inst, nd) in enumerate(zip(insts, needs)):
            g = groups.setdefault(inst.slot, _Call([], [0], []))
            g.keys.append(inst.key)
            g.args.extend([*inst.c.args, nd, 0, inst.c.floor(req.priority)])
            g.idx.append(i)
        for g in groups.values():
            g.args[0] = len(g.keys)
        return list(groups.values())

    def interpret(self, t: Ticket, calls: list[_Call], replies: list[Any]) -> list[tuple[_Instance, int, int]]:
        """Fill t.decision from admit.lua's replies; returns the refunds due
        to groups that debited when another refused (Redis Cluster)."""
        refused, avail, retry, now_ms = -1, 0, 0, 0
        rows: list[list[int]] = []
        for call, r in zip(calls, replies):
            r = [int(x) for x in r]
            if len(r) < 2 or (r[0] == 1 and len(r) != 2 + 3 * len(call.idx)) or (r[0] == 0 and len(r) != 5):
                raise redis.ResponseError(f"admit.lua replied {r}")
            rows.append(r)
            now_ms = now_ms or r[1]
            if r[0] == 0:
                pos = call.idx[r[2] - 1]
                if refused < 0 or pos < refused:
                    refused, avail, retry = pos, r[3], r[4]
        if refused >= 0:
            back = []
            for call, r in zip(calls, rows):
                if r[0] != 1:
                    continue
                for j, pos in enumerate(call.idx):
                    inst = t.insts[pos]
                    at = r[1] // inst.c.gran if inst.c.gran else -1
                    back.append((inst, -(t.needs[pos] + r[3 + 3 * j]), at))
            t.decision = self.refuse(PATH_REDIS, t.insts[refused], t.needs[refused], avail, retry, retry < 0)
            return back
        rq, tk = Headroom(), Headroom()
        for call, r in zip(calls, rows):
            for j, pos in enumerate(call.idx):
                inst = t.insts[pos]
                h = Headroom(inst.c.rule.limit, min(r[2 + 3 * j], inst.c.rule.limit), r[4 + 3 * j])
                self.note(inst.key, r[2 + 3 * j])
                if inst.c.rule.unit == "requests":
                    rq = _tighter(rq, h)
                else:
                    tk = _tighter(tk, h)
        t.at_ms = now_ms
        t.decision = Decision(True, PATH_REDIS, requests=rq, tokens=tk)
        return []

    def note(self, key: str, remaining: int) -> None:
        self.remaining[key] = remaining
        self.remaining.move_to_end(key)
        while len(self.remaining) > self.max_instances:
            self.remaining.popitem(last=False)

    def refuse(self, path: str, inst: _Instance, need: int, avail: int, retry_ms: int, never: bool, cause: str = "") -> Decision:
        r = inst.c.rule
        h = Headroom(r.limit, avail, max(retry_ms, 0))
        return Decision(False, path, r.name, inst.scope, r.unit, r.algorithm, r.limit, r.window_ms, r.rate, need, avail,
                        0 if never else max(retry_ms, 0), never, cause,
                        requests=h if r.unit == "requests" else Headroom(), tokens=h if r.unit != "requests" else Headroom())

    # -- fail modes -------------------------------------------------------

    def mark_down(self, err: BaseException) -> None:
        self.cause = f"admission: redis: {err or type(err).__name__}"
        self.down = True
        self.last_probe = time.monotonic()

    def probe_due(self) -> bool:
        return self.down and time.monotonic() - self.last_probe >= self.probe_interval

    def fail_mode(self, t: Ticket, fail_mode: str) -> None:
        if fail_mode == "closed":
            t.decision = Decision(False, PATH_UNAVAILABLE, cause=self.cause)
            return
        now = time.monotonic()
        taken: list[int] = []
        for i, (inst, nd) in enumerate(zip(t.insts, t.needs)):
            ok, avail, retry_ms = self.local_take(inst, nd, now)
            if ok:
                taken.append(i)
                continue
            for j in taken:
                self.local_adjust(t.insts[j], -t.needs[j], now)
            t.decision = self.refuse(PATH_LOCAL, inst, nd, avail, retry_ms, False, self.cause)
            return
        t.local = [True] * len(t.insts)
        rq, tk = Headroom(), Headroom()
        for inst in t.insts:
            h = Headroom(inst.c.rule.limit, self.remaining.get(inst.key, inst.c.rule.limit))
            if inst.c.rule.unit == "requests":
                rq = _tighter(rq, h)
            else:
                tk = _tighter(tk, h)
        t.decision = Decision(True, PATH_LOCAL, cause=self.cause, requests=rq, tokens=tk)

    def _local(self, inst: _Instance, now: float) -> tuple[_Local, int, float]:
        r = inst.c.rule
        limit = -(-r.limit // self.gateways)
        per_s = r.rate / self.gateways
        st = self.locals.get(inst.key)
        if st is None:
            st = _Local(float(limit), now)
            rem = self.remaining.get(inst.key)
            if rem is not None:
                st.tokens = float(-(-rem // self.gateways))
                if inst.c.gran:
                    st.win[self._gran(inst, now)] = max(limit - int(st.tokens), 0)
            self.locals[inst.key] = st
            while len(self.locals) > self.max_instances:
                self.locals.popitem(last=False)
        return st, limit, per_s

    @staticmethod
    def _gran(inst: _Instance, now: float) -> int:
        return int(now * 1000) // inst.c.gran

    def local_take(self, inst: _Instance, n: int, now: float) -> tuple[bool, int, int]:
        with self.lock:
            return self._local_take(inst, n, now)

    def _local_take(self, inst: _Instance, n: int, now: float) -> tuple[bool, int, int]:
        st, limit, per_s = self._local(inst, now)
        if not inst.c.gran:
            st.tokens = min(float(limit), st.tokens + (now - st.last) * per_s)
            st.last = now
            if n > st.tokens:
                retry = math.ceil((n - st.tokens) / per_s * 1000) if n <= limit else 0
                return False, int(max(st.tokens, 0)), retry
            st.tokens -= n
        else:
            g = self._gran(inst, now)
            oldest = (int(now * 1000) - inst.c.rule.window_ms) // inst.c.gran
            for k in [k for k in st.win if k < oldest]:
                del st.win[k]
            used = sum(st.win.values())
            if used + n > limit:
                first = min(st.win) if st.win else g
                retry = max((first + 1) * inst.c.gran + inst.c.rule.window_ms - int(now * 1000), 0)
                return False, max(limit - used, 0), retry
            st.win[g] = st.win.get(g, 0) + n
        self._add_debit(inst, n)
        return True, 0, 0

    def local_adjust(self, inst: _Instance, delta: int, now: float) -> None:
        with self.lock:
            self._local_adjust(inst, delta, now)

    def _local_adjust(self, inst: _Instance, delta: int, now: float) -> None:
        st, limit, _ = self._local(inst, now)
        if not inst.c.gran:
            st.tokens = min(float(limit), st.tokens - delta)
        else:
            g = self._gran(inst, now)
            st.win[g] = max(st.win.get(g, 0) + delta, 0)
        self._add_debit(inst, delta)

    def add_debit(self, inst: _Instance, delta: int) -> None:
        with self.lock:
            self._add_debit(inst, delta)

    def _add_debit(self, inst: _Instance, delta: int) -> None:
        cur = self.debits.get(inst.key)
        if cur is None and self.pending_len() >= self.max_pending:
            self.dropped += 1
            return
        self.debits[inst.key] = (inst, (cur[1] if cur else 0) + delta)

    def pending_len(self) -> int:
        return len(self.debits) + sum(len(v) for v in self.settles.values())

    # -- settlement -------------------------------------------------------

    def settle_plan(self, t: Ticket, prompt: int, completion: int) -> list[tuple[_Instance, int, int]] | None:
        if not t.decision.allowed or t.settled or not t.insts:
            return None
        t.settled = True
        prompt, completion = max(prompt, 0), max(completion, 0)
        remote = []
        now = time.monotonic()
        for i, inst in enumerate(t.insts):
            d = _actual(inst.c.rule.unit, prompt, completion) - t.needs[i]
            if d == 0:
                continue
            if t.local and t.local[i]:
                self.local_adjust(inst, d, now)
            else:
                remote.append((inst, d, t.at_ms // inst.c.gran if inst.c.gran else -1))
        if remote and not t.id:
            t.id = uuid.uuid4().hex
        return remote

    def defer_settle(self, t: Ticket, remote: list[tuple[_Instance, int, int]]) -> None:
        with self.lock:
            self._defer_settle(t, remote)

    def _defer_settle(self, t: Ticket, remote: list[tuple[_Instance, int, int]]) -> None:
        if self.pending_len() + len(remote) > self.max_pending:
            t.settled = False
            raise BacklogFull("admission: Redis is unreachable and the pending corrections are full")
        self.settles[t.id] = remote

    def settle_calls(self, rid: str, remote: list[tuple[_Instance, int, int]]) -> list[_Call]:
        groups: dict[int, _Call] = {}
        for inst, d, at in remote:
            g = groups.get(inst.slot)
            if g is None:
                # The marker shares the hash tag of the group's first key.
                g = groups[inst.slot] = _Call([inst.key + ":settled:" + rid], [self.settle_ttl_ms, 0], [])
            g.keys.append(inst.key)
            g.args.extend([*inst.c.args, d, at])
        for g in groups.values():
            g.args[1] = len(g.keys) - 1
        return list(groups.values())

    def adjust_calls(self, items: list[tuple[_Instance, int, int]]) -> list[_Call]:
        groups: dict[int, _Call] = {}
        for inst, d, at in items:
            if d == 0:
                continue
            g = groups.setdefault(inst.slot, _Call([], [0, 0], []))
            g.keys.append(inst.key)
            g.args.extend([*inst.c.args, d, at])
        for g in groups.values():
            g.args[1] = len(g.keys)
        return list(groups.values())

    def take_pending(self) -> tuple[list[tuple[_Instance, int, int]], dict[str, list[tuple[_Instance, int, int]]]]:
        """What Redis missed: the merged local debits (sent without a
        marker) and the deferred settlements (with theirs), taken out of
        the queue; give_back puts them back if Redis does not take them."""
        with self.lock:
            debits = [(inst, d, -1) for inst, d in self.debits.values()]
            self.debits = {}
            settles, self.settles = self.settles, {}
            return debits, settles

    def give_back(self, debits: list[tuple[_Instance, int, int]], settles: dict[str, list[tuple[_Instance, int, int]]]) -> None:
        for inst, d, _ in debits:
            self.add_debit(inst, d)
        with self.lock:
            for rid, remote in settles.items():
                self.settles.setdefault(rid, remote)

    def recovered(self) -> None:
        with self.lock:
            self.down = False
            self.locals.clear()  # the next outage starts again from Redis's word


    # -- the steps both Limiters take around their Redis calls --------------

    def start(self, req: Request) -> tuple[Ticket, str]:
        insts, fail_mode = self.plan(req)
        return Ticket(Decision(True, PATH_NONE), req.id, insts,
                      [_need(i.c.rule.unit, req.prompt_tokens, req.completion_tokens) for i in insts]), fail_mode

    def admit_failed(self, e: Exception, t: Ticket, fail_mode: str) -> Ticket:
        if not _redis_failure(e):
            raise e
        self.mark_down(e)
        self.fail_mode(t, fail_mode)
        return t

    def refund_failed(self, e: Exception, back: list[tuple[_Instance, int, int]]) -> None:
        if not _redis_failure(e):
            raise e
        for inst, d, _ in back:
            self.add_debit(inst, d)

    def settle_failed(self, e: Exception, t: Ticket, remote: list[tuple[_Instance, int, int]]) -> None:
        if not _redis_failure(e):
            raise e
        self.mark_down(e)
        self.defer_settle(t, remote)

    def probe_failed(self, e: Exception) -> None:
        if not _redis_failure(e):
            raise e

    def reconcile_failed(self, e: Exception, debits: list[tuple[_Instance, int, int]],
                         settles: dict[str, list[tuple[_Instance, int, int]]], done: set[str]) -> None:
        if not _redis_failure(e):
            raise e
        self.give_back(debits, {k: v for k, v in settles.items() if k not in done})


_T = TypeVar("_T")


@dataclass(frozen=True)
class _Step:
    """One Redis step of a flow: a script over calls (bounded by max_wait
    unless bound is False), or, with script None, a ping."""

    script: Any = None
    calls: list[_Call] = field(default_factory=list)
    bound: bool = True


_PING = _Step()

# A flow is what one operation does, written once for Limiter and
# AsyncLimiter: a generator that yields each Redis step, is sent the step's
# replies or thrown what it raised, and returns the operation's result.
# Limiter drives flows with blocking calls, AsyncLimiter with awaits.
_Flow = Generator[_Step, Any, _T]


class _Run(Generic[_T]):
    """A flow being driven, what both drivers share: iterating gives each
    step of the flow, after which the driver sets reply, or error to what
    the step raised; result is the flow's once the iteration ends."""

    def __init__(self, flow: _Flow[_T]) -> None:
        self._flow = flow
        self.reply: Any = None
        self.error: Exception | None = None
        self.result: _T

    def __iter__(self) -> Iterator[_Step]:
        while True:
            reply, err = self.reply, self.error
            self.reply, self.error = None, None
            try:
                step = self._flow.send(reply) if err is None else self._flow.throw(err)
            except StopIteration as done:
                self.result = done.value
                return
            yield step


class _LimiterBase:
    """What Limiter and AsyncLimiter share apart from how they call Redis."""

    def __init__(self, client: Any, rules: Rules | None, cluster: bool, **opts: Any) -> None:
        self._core = _Core(rules, cluster=cluster, **opts)
        self._rdb = client
        self._admit = client.register_script(script("admit.lua"))
        self._adjust = client.register_script(script("adjust.lua"))

    def set_rules(self, rules: Rules) -> None:
        """Replace the rules (a policy reload); counters in Redis carry over
        for rules whose name, scope, algorithm and unit did not change."""
        self._core.set_rules(rules)

    @property
    def down(self) -> bool:
        """Whether Redis is considered unreachable (fail modes apply)."""
        return self._core.down

    def pending(self) -> int:
        """Corrections waiting for Redis."""
        return self._core.pending_len()

    def _recover_flow(self) -> _Flow[None]:
        # A probe, then the pending corrections, unbounded: they are sent
        # off the request's path.
        core = self._core
        core.last_probe = time.monotonic()
        try:
            yield _PING
        except Exception as e:  # noqa: BLE001 - stays down until a probe succeeds
            return core.probe_failed(e)
        debits, settles = core.take_pending()
        done: set[str] = set()
        try:
            yield _Step(self._adjust, core.adjust_calls(debits), bound=False)
            debits = []
            for rid, remote in settles.items():
                yield _Step(self._adjust, core.settle_calls(rid, remote), bound=False)
                done.add(rid)
        except Exception as e:  # noqa: BLE001
            return core.reconcile_failed(e, debits, settles, done)
        core.recovered()

    def _admit_flow(self, req: Request) -> _Flow[Ticket]:
        core = self._core
        t, fail_mode = core.start(req)
        if not t.insts:
            return t
        if core.probe_due():
            yield from self._recover_flow()
        if core.down:
            core.fail_mode(t, fail_mode)
            return t
        calls = core.admit_calls(t.insts, t.needs, req)
        try:
            back = core.interpret(t, calls, (yield _Step(self._admit, calls)))
        except Exception as e:  # noqa: BLE001
            return core.admit_failed(e, t, fail_mode)
        if back:
            try:
                yield _Step(self._adjust, core.adjust_calls(back))
            except Exception as e:  # noqa: BLE001
                core.refund_failed(e, back)
        return t

    def _settle_flow(self, t: Ticket, prompt_tokens: int, completion_tokens: int) -> _Flow[None]:
        core = self._core
        remote = core.settle_plan(t, prompt_tokens, completion_tokens)
        if not remote:
            return
        if core.down:
            return core.defer_settle(t, remote)
        try:
            yield _Step(self._adjust, core.settle_calls(t.id, remote))
        except Exception as e:  # noqa: BLE001
            core.settle_failed(e, t, remote)

    def _flush_flow(self) -> _Flow[bool]:
        if self._core.pending_len():
            self._core.down = True
            yield from self._recover_flow()
        return self._core.pending_len() == 0


def _tighter(cur: Headroom, h: Headroom) -> Headroom:
    if cur.limit == 0 or h.remaining * cur.limit < cur.remaining * h.limit:
        return h
    return cur


# asyncio.timeout (Python 3.11+) bounds an await without a task of its own.
_timeout: Any = getattr(asyncio, "timeout", None)


def _redis_failure(e: BaseException) -> bool:
    # Connection trouble and timeouts mean "unreachable"; a script error
    # (a bug, a wrong reply) also is, so requests keep being decided.
    return isinstance(e, (redis.RedisError, OSError, asyncio.TimeoutError, TimeoutError))


class Limiter(_LimiterBase):
    """Admission for threaded code, on a redis-py client (``redis.Redis`` or
    ``redis.RedisCluster``). Give the client ``socket_timeout=max_wait`` (see
    ``client``) so a slow Redis cannot hold a request past the bound."""

    def __init__(self, client: Client, rules: Rules | None = None, *, prefix: str = DEFAULT_PREFIX,
                 max_wait: float = 0.05, gateway_count: int = 1, settle_ttl: float = 600.0,
                 probe_interval: float = 0.05, max_pending: int = 100_000, max_instances: int = 100_000) -> None:
        super().__init__(client, rules, isinstance(client, redis.RedisCluster), prefix=prefix, max_wait=max_wait,
                         gateway_count=gateway_count, settle_ttl=settle_ttl, probe_interval=probe_interval,
                         max_pending=max_pending, max_instances=max_instances)

    def _run(self, step: _Step) -> Any:
        if step.script is None:
            return self._rdb.ping()
        return [step.script(keys=c.keys, args=c.args) for c in step.calls]

    def _drive(self, flow: _Flow[_T]) -> _T:
        run = _Run(flow)
        for step in run:
            try:
                run.reply = self._run(step)
            except Exception as e:  # noqa: BLE001 - the flow decides
                run.error = e
        return run.result

    def admit(self, req: Request) -> Ticket:
        """Decide whether req may go upstream; a refusal is a Decision with
        allowed False. Raises ValueError for a request it cannot judge."""
        return self._drive(self._admit_flow(req))

    def settle(self, t: Ticket, prompt_tokens: int, completion_tokens: int) -> None:
        """Charge or refund the difference between the estimate and what the
        call spent, once. Raises BacklogFull when Redis is unreachable and
        the pending corrections are full."""
        self._drive(self._settle_flow(t, prompt_tokens, completion_tokens))

    def flush(self) -> bool:
        """Send pending corrections now; True when none is left."""
        return self._drive(self._flush_flow())


class AsyncLimiter(_LimiterBase):
    """Admission for asyncio code, on ``redis.asyncio.Redis`` (or its
    RedisCluster); each call waits at most ``max_wait`` for Redis."""

    def __init__(self, client: AsyncClient, rules: Rules | None = None, *, prefix: str = DEFAULT_PREFIX,
                 max_wait: float = 0.05, gateway_count: int = 1, settle_ttl: float = 600.0,
                 probe_interval: float = 0.05, max_pending: int = 100_000, max_instances: int = 100_000) -> None:
        super().__init__(client, rules, isinstance(client, redis.asyncio.RedisCluster), prefix=prefix,
                         max_wait=max_wait, gateway_count=gateway_count, settle_ttl=settle_ttl,
                         probe_interval=probe_interval, max_pending=max_pending, max_instances=max_instances)

    async def _run(self, step: _Step) -> Any:
        # The common case, one Redis (or one slot), is awaited directly and
        # bounded by asyncio.timeout where there is one (3.11+): gather and
        # wait_for each wrap the call in a task, which the hook in LiteLLM
        # paid on every request.
        s, calls = step.script, step.calls
        if s is None:
            return await asyncio.wait_for(self._rdb.ping(), self._core.max_wait)

        async def all_calls() -> list[Any]:
            if len(calls) == 1:
                return [await s(keys=calls[0].keys, args=calls[0].args)]
            return list(await asyncio.gather(*(s(keys=c.keys, args=c.args) for c in calls)))

        if not step.bound:
            return await all_calls()
        if _timeout is not None:
            async with _timeout(self._core.max_wait):
                return await all_calls()
        return await asyncio.wait_for(all_calls(), self._core.max_wait)

    async def _drive(self, flow: _Flow[_T]) -> _T:
        run = _Run(flow)
        for step in run:
            try:
                run.reply = await self._run(step)
            except Exception as e:  # noqa: BLE001 - the flow decides
                run.error = e
        return run.result

    async def admit(self, req: Request) -> Ticket:
        """See Limiter.admit."""
        return await self._drive(self._admit_flow(req))

    async def settle(self, t: Ticket, prompt_tokens: int, completion_tokens: int) -> None:
        """See Limiter.settle."""
        await self._drive(self._settle_flow(t, prompt_tokens, completion_tokens))

    async def flush(self) -> bool:
        """See Limiter.flush."""
        return await self._drive(self._flush_flow())


def client(url: str, max_wait: float = 0.05) -> redis.Redis:
    """A redis-py client whose calls give up after max_wait, as Limiter
    needs (``redis://host:port/0``)."""
    return redis.Redis.from_url(url, socket_timeout=max_wait, socket_connect_timeout=max(max_wait, 0.5))


def async_client(url: str) -> redis.asyncio.Redis:
    """A redis.asyncio client for AsyncLimiter and the LiteLLM hook."""
    return redis.asyncio.Redis.from_url(url, socket_connect_timeout=0.5)

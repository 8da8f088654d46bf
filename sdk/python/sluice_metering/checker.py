"""The flag Checker: every enforcement flag in memory, checked per request
without a network call; the contract is docs/flags.md and the Go Checker
(sdk/go/checker) is the reference.

A background thread subscribes to ``<prefix>changes``, resyncs everything
on start, after every (re)subscription and every ``resync_interval``,
refetches the tenants announced as changed, and tracks the enforcer's
heartbeat (announcements, and the heartbeat key polled every
``max_staleness / 4``). While the view is older than ``max_staleness`` each
tenant follows its fail mode from ``<prefix>failmode`` (its field, else
``*``, else ``default_fail_mode``): ``open`` keeps serving with the flags
still known, ``closed`` refuses. Manual breakers and blacklists stay in
force past their ``until`` while the view is stale, and also when a resync
during staleness finds their hash gone; traffic breakers lapse at their
``until``, and while the view is stale also flag_ttl after the enforcer's
last sign of life (the enforcer writes each flag's own end as ``until``, a
quota's period end, and renews nothing a dead enforcer would stop; flag_ttl
is read from ``<prefix>ttl`` at every resync, 60 s until then). Before the
first resync the Checker counts as fresh for ``max_staleness`` after it
started (everything allowed), then as stale with the default fail mode;
``synced`` reports the first resync.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import redis

from . import flags as fl
from . import ratelimit

log = logging.getLogger("sluice_metering.checker")

ALLOWED, PROBE, REFUSED, REFUSED_STALE = "allowed", "probe", "refused", "refused_stale"


@dataclass
class _Entry:
    flag: fl.Flag
    scope: str
    sticky: bool
    # A half-open breaker's probes left here: a one-element list, shared
    # with the entry a rebuild replaces it with (same breaker), so a
    # resync does not hand out a fresh set of probes.
    probes: list[int] | None = None

    def live(self, now_ms: int, stale: bool, lapsed: bool) -> bool:
        """In force at now_ms; lapsed: the view has been stale for flag_ttl
        since the enforcer's last sign of life, which ends traffic flags."""
        if stale and self.sticky:
            return True
        u = self.flag.until_ms
        return (u == 0 or now_ms < u) and not lapsed


@dataclass
class _View:
    version: int = 0
    models: dict[str, _Entry] = field(default_factory=dict)
    keys: dict[str, _Entry] = field(default_factory=dict)

    def empty(self) -> bool:
        return not self.models and not self.keys


@dataclass(frozen=True)
class FlagDecision:
    """The answer to one check: the outcome, the flag that refused (or let a
    probe through) and the field it sits on (a model, "*", "@key:<id>")."""

    outcome: str = ALLOWED
    flag: fl.Flag | None = None
    scope: str = ""
    stale: bool = False

    @property
    def allowed(self) -> bool:
        return self.outcome in (ALLOWED, PROBE)

    def retry_after(self, now: float | None = None) -> float:
        """Seconds a refused client should wait: to resets_at, else the
        flag's hint, else to until; 0 when unknown."""
        f = self.flag
        if f is None:
            return 0.0
        now_ms = (time.time() if now is None else now) * 1000
        if f.resets_at_ms:
            at = f.resets_at_ms
        elif f.retry_after_ms > 0:
            return f.retry_after_ms / 1000
        elif f.until_ms:
            at = f.until_ms
        else:
            return 0.0
        return max(0.0, (at - now_ms) / 1000)


class Checker:
    """Answers ``check`` from memory; ``start`` runs the background sync."""

    def __init__(
        self,
        client: redis.Redis | redis.RedisCluster,
        *,
        key_prefix: str = fl.DEFAULT_PREFIX,
        max_staleness: float = 10.0,
        resync_interval: float = 30.0,
        default_fail_mode: str = "open",
        max_pending: int = 10_000,
    ) -> None:
        problems = []
        if max_staleness < 0.1:
            problems.append(f"max_staleness: {max_staleness}s is below the minimum 0.1s")
        if resync_interval < 1:
            problems.append(f"resync_interval: {resync_interval}s is below the minimum 1s")
        if default_fail_mode not in ("open", "closed"):
            problems.append(f'default_fail_mode: "{default_fail_mode}" must be open or closed')
        if not 1 <= max_pending <= 1_000_000:
            problems.append(f"max_pending: {max_pending} is outside 1..1000000")
        if not 1 <= len(key_prefix) <= 200:
            problems.append(f'key_prefix: "{key_prefix}" must be 1..200 bytes')
        if problems:
            raise ValueError("checker: " + "; ".join(problems))
        self._rdb = client
        self._layout = fl.Layout(key_prefix)
        self._max_staleness, self._resync_every = max_staleness, resync_interval
        self._default_fm, self._max_pending = default_fail_mode, max_pending
        self._views: dict[str, _View] = {}
        self._fail_modes: dict[str, str] = {}
        self._last_fresh = time.monotonic()
        self._flag_ttl = fl.DEFAULT_FLAG_TTL
        self._was_stale = False
        self._synced = threading.Event()
        self._lock = threading.Lock()  # writers of _views
        self._probe_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.resyncs = 0

    # -- the request path -------------------------------------------------

    def stale(self) -> bool:
        """Whether the view is older than max_staleness."""
        return time.monotonic() - self._last_fresh > self._max_staleness

    def synced(self) -> bool:
        """Whether a full resync has completed."""
        return self._synced.is_set()

    def wait_synced(self, timeout: float) -> bool:
        """Wait for the first full resync; False when timeout passed."""
        return self._synced.wait(timeout)

    def fail_mode(self, tenant: str) -> str:
        m = self._fail_modes
        return m.get(tenant) or m.get(fl.ALL_MODELS) or self._default_fm

    def check(self, tenant: str, model: str, api_key_id: str = "") -> FlagDecision:
        """May tenant call model now with API key api_key_id? From memory.

        Every scope the request matches (its key, its model, "*") counts and
        any refusal wins (a blacklist is named first); a request goes
        through a half-open breaker only if every matching flag is half-open
        and each has a probe left here, and it spends one of each.
        """
        stale = self.stale()
        if stale and self.fail_mode(tenant) == "closed":
            return FlagDecision(REFUSED_STALE, stale=True)
        v = self._views.get(tenant)
        if v is None:
            return FlagDecision(stale=stale)
        now_ms = int(time.time() * 1000)
        lapsed = stale and time.monotonic() - self._last_fresh >= self._flag_ttl
        live: list[_Entry] = []
        # A soft flag (a soft quota past its limit) refuses nothing.
        if api_key_id:
            e = v.keys.get(api_key_id)
            if e is not None and e.flag.state != "soft" and e.live(now_ms, stale, lapsed):
                live.append(e)
        for scope in (model, fl.ALL_MODELS):
            e = v.models.get(scope)
            if e is not None and e.flag.state != "soft" and e.live(now_ms, stale, lapsed) and e not in live:
                live.append(e)
        if not live:
            return FlagDecision(stale=stale)
        refuse: _Entry | None = None
        for e in live:
            if e.flag.state != "half_open" and (refuse is None or e.flag.state == "blacklist" and refuse.flag.state != "blacklist"):
                refuse = e
        if refuse is not None:
            return FlagDecision(REFUSED, refuse.flag, refuse.scope, stale)
        with self._probe_lock:
            for i, e in enumerate(live):
                assert e.probes is not None
                if e.probes[0] <= 0:
                    for t in live[:i]:
                        assert t.probes is not None
                        t.probes[0] += 1
                    return FlagDecision(REFUSED, e.flag, e.scope, stale)
                e.probes[0] -= 1
        return FlagDecision(PROBE, live[0].flag, live[0].scope, stale)

    def tenants(self) -> int:
        """How many tenants have flags in memory."""
        return len(self._views)

    # -- background sync --------------------------------------------------

    def start(self) -> Checker:
        """Start the background sync thread (idempotent); returns self."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="sluice-checker", daemon=True)
            self._thread.start()
        return self

    def close(self) -> None:
        """Stop the background sync."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        log.info("checker: starting; until the first resync no flag and no fail mode is known "
                 "(allowed for %.1fs, then every tenant fails %s)", self._max_staleness, self._default_fm)
        retry = 0.1
        while not self._stop.is_set():
            try:
                self._follow()
                retry = 0.1
            except redis.RedisError as e:
                log.warning("checker: Redis: %s; resubscribing in %.1fs", e, retry)
                self._stop.wait(retry)
                retry = min(retry * 2, 5.0)

    def _follow(self) -> None:
        ps = self._rdb.pubsub(ignore_subscribe_messages=False)  # type: ignore[no-untyped-call]  # redis-py leaves it unannotated
        try:
            ps.subscribe(self._layout.channel())
            next_resync = time.monotonic() + self._resync_every
            next_beat = time.monotonic() + self._max_staleness / 4
            pending: set[str] = set()
            while not self._stop.is_set():
                m = ps.get_message(timeout=0.05)
                need_resync = False
                while m is not None:
                    need_resync = self._collect(m, pending) or need_resync
                    m = ps.get_message(timeout=0)
                now = time.monotonic()
                if need_resync or len(pending) > self._max_pending or now >= next_resync:
                    pending.clear()
                    self._resync()
                    next_resync = now + self._resync_every
                elif pending:
                    try:
                        self._apply(self._fetch(list(pending)), 0, full=False)
                    except redis.RedisError as e:
                        log.warning("checker: refetch of %d tenants failed; the next resync repairs it: %s", len(pending), e)
                    pending.clear()
                if now >= next_beat:
                    next_beat = now + self._max_staleness / 4
                    if self._rdb.exists(self._layout.heartbeat_key()) == 1:
                        self._fresh()
                self._note_stale()
        finally:
            try:
                ps.close()
            except redis.RedisError:
                pass

    def _collect(self, m: dict[str, Any], pending: set[str]) -> bool:
        if m.get("type") == "subscribe":
            return True  # anything before the subscription may be lost
        if m.get("type") != "message":
            return False
        data = m.get("data")
        if isinstance(data, bytes):
            data = data.decode("utf-8", "replace")
        try:
            tenant, _ = fl.parse_change(str(data))
        except fl.FlagError as e:
            log.warning("checker: ignoring malformed change message: %s", e)
            return False
        if tenant == fl.HEARTBEAT_TENANT:
            self._fresh()
            return False
        if tenant == fl.FAILMODE_TENANT:
            return True
        pending.add(tenant)
        return False

    def _fresh(self) -> None:
        self._last_fresh = time.monotonic()
        self._note_stale()

    def _note_stale(self) -> None:
        s = self.stale()
        if s != self._was_stale:
            self._was_stale = s
            if s:
                log.warning("checker: view is stale (no enforcer heartbeat); each tenant's fail mode applies, "
                            "blacklists and manual breakers stay in force")
            else:
                log.info("checker: view is fresh again")

    def _scan_tenants(self) -> list[str]:
        seen: dict[str, None] = {}
        # On a cluster, redis-py's scan_iter covers every primary.
        for k in self._rdb.scan_iter(match=self._layout.tenant_pattern(), count=1000):
            key = k.decode() if isinstance(k, bytes) else str(k)
            t = self._layout.tenant_from_key(key)
            if t is not None:
                seen[t] = None
        return list(seen)

    def _fetch(self, tenants: list[str]) -> dict[str, _View | None]:
        out: dict[str, _View | None] = {}
        for i in range(0, len(tenants), 500):
            batch = tenants[i:i + 500]
            p = self._rdb.pipeline(transaction=False)
            for t in batch:
                p.hgetall(self._layout.tenant_key(t))
            for t, h in zip(batch, p.execute()):
                out[t] = self._build(t, h)
        return out

    def _build(self, tenant: str, h: dict[Any, Any]) -> _View | None:
        v = _View()
        for k, val in h.items():
            k = k.decode() if isinstance(k, bytes) else str(k)
            val = val.decode("utf-8", "replace") if isinstance(val, bytes) else str(val)
            if k == fl.VERSION_FIELD:
                try:
                    v.version = int(val)
                except ValueError:
                    pass
                continue
            try:
                f = fl.decode(val)
            except fl.FlagError as e:
                log.warning("checker: skipping undecodable flag (tenant %s, field %s): %s", tenant, k, e)
                continue
            entry = _Entry(f, k, sticky=f.kind in ("manual", "blacklist") or f.state == "blacklist",
                           probes=[f.probes] if f.state == "half_open" else None)
            if k.startswith(fl.KEY_FIELD_PREFIX) and len(k) > len(fl.KEY_FIELD_PREFIX):
                v.keys[k[len(fl.KEY_FIELD_PREFIX):]] = entry
            else:
                v.models[k] = entry
        return None if v.empty() else v

    def _resync(self) -> None:
        try:
            raw = self._rdb.get(self._layout.version_key())
            v0 = int(raw) if raw is not None else 0
            fm = self._rdb.hgetall(self._layout.failmode_key())
            modes = {}
            for t, m in fm.items():
                t = t.decode() if isinstance(t, bytes) else str(t)
                m = m.decode() if isinstance(m, bytes) else str(m)
                if m in ("open", "closed"):
                    modes[t] = m
            self._read_flag_ttl()
            updates = self._fetch(self._scan_tenants())
            self._fail_modes = modes
            # Liveness first: operator flags Redis no longer holds are kept
            # only while the view is stale.
            if self._rdb.exists(self._layout.heartbeat_key()) == 1:
                self._fresh()
            self._apply(updates, v0, full=True)
        except redis.RedisError as e:
            log.warning("checker: resync failed; serving the previous view: %s", e)
            raise
        self.resyncs += 1
        if not self._synced.is_set():
            self._synced.set()
            log.info("checker: first resync done; %d tenants with flags", len(self._views))

    def _read_flag_ttl(self) -> None:
        """The enforcer's flag_ttl; no key (an older enforcer) or a bad
        value keeps the one the Checker had."""
        raw = self._rdb.get(self._layout.ttl_key())
        if raw is None:
            return
        try:
            self._flag_ttl = fl.parse_ttl(raw.decode() if isinstance(raw, bytes) else str(raw))
        except fl.FlagError as e:
            log.warning("checker: ignoring the enforcer's flag ttl, keeping %.1fs: %s", self._flag_ttl, e)

    def _apply(self, updates: dict[str, _View | None], keep_newer_than: int, full: bool) -> None:
        with self._lock:
            stale = self.stale()
            # A full resync builds a new dict and swaps it in. A refetch
            # changes a few tenants in place (one item assignment or pop
            # at a time, each atomic for the readers in check): copying
            # every tenant for each refetch cost O(flagged tenants) per
            # announcement burst, seconds of CPU per enforcer refresh at
            # a million flagged tenants (bench/README.md, "Growth curves").
            nxt = dict(self._views) if full else self._views
            if full:
                for t, cur in self._views.items():
                    if t not in updates and cur.version <= keep_newer_than:
                        kept = _keep_sticky(cur, None) if stale else None
                        if kept is None:
                            del nxt[t]
                        else:
                            nxt[t] = kept
            for t, v in updates.items():
                prev = nxt.get(t)
                if stale and prev is not None:
                    v = _keep_sticky(prev, v)
                if v is None or v.empty():
                    nxt.pop(t, None)
                    continue
                if prev is not None and prev.version > v.version:
                    continue  # a newer read already landed
                if prev is not None:
                    _inherit_probes(prev, v)
                nxt[t] = v
            self._views = nxt


def _inherit_probes(prev: _View, nxt: _View) -> None:
    pairs = [(prev.models.get(s), e) for s, e in nxt.models.items()] + [(prev.keys.get(k), e) for k, e in nxt.keys.items()]
    for p, e in pairs:
        if p is not None and e.probes is not None and p.probes is not None and p.flag.same_breaker(e.flag):
            e.probes = p.probes


def _keep_sticky(prev: _View, nxt: _View | None) -> _View | None:
    models = {s: e for s, e in prev.models.items() if e.sticky and (nxt is None or s not in nxt.models)}
    keys = {k: e for k, e in prev.keys.items() if e.sticky and (nxt is None or k not in nxt.keys)}
    if not models and not keys:
        return nxt
    v = _View(version=prev.version)
    if nxt is not None:
        v.version = max(v.version, nxt.version)
        v.models.update(nxt.models)
        v.keys.update(nxt.keys)
    v.models.update(models)
    v.keys.update(keys)
    return v


# -- answering a refusal (the Go middleware's formats) ------------------------

_BREAKER_TEXT = {
    "error_ratio": "too many upstream calls are failing",
    "slow_call": "too many upstream calls are slow",
    "manual": "an operator has paused them",
}


def _quota_unit(quota: str) -> str:
    if quota == "requests_per_minute":
        return "requests"
    if quota.endswith("_tokens") or quota == "tokens_per_minute":
        return "tokens"
    return ""


@dataclass(frozen=True)
class Refusal:
    """An HTTP refusal: status, OpenAI error body, headers (Retry-After and
    the x-ratelimit trio where they apply)."""

    status: int
    body: dict[str, Any]
    headers: dict[str, str]

    @property
    def message(self) -> str:
        return str(self.body["error"]["message"])


def refusal(d: FlagDecision, tenant: str, model: str, now: float | None = None) -> Refusal:
    """The answer the Go middleware gives for a refused FlagDecision: 429 for
    a quota or rate flag, 403 for a blacklist, 503 for other breakers and
    for a stale view of a tenant that fails closed. The message names the
    tenant, the quota and its numbers, never the flag's reason."""
    now = time.time() if now is None else now
    f = d.flag
    hdrs: dict[str, str] = {}
    if f is None:
        body = ratelimit.error_body(f"usage limits for tenant {tenant} cannot be verified right now and this tenant "
                                    "fails closed; retry later", "service_unavailable", "sluice_unavailable")
        return Refusal(503, body, {"Retry-After": "5"})
    status = 429 if f.kind in ("quota", "rate") else 403 if f.kind == "blacklist" else 503
    retry = d.retry_after(now)
    detail: dict[str, Any] = {"kind": f.kind, "state": f.state}
    for k, v in (("scope", d.scope), ("quota", f.quota), ("period", f.period)):
        if v:
            detail[k] = v
    if f.used:
        detail["used"] = f.used
    if f.limit:
        detail["limit"] = f.limit
    if f.resets_at_ms:
        detail["resets_at"] = _rfc3339(f.resets_at_ms)
    if retry > 0 and status != 403:
        detail["retry_after_seconds"] = ratelimit.retry_after(retry)
    unit = _quota_unit(f.quota)
    if f.kind == "quota":
        typ = code = ratelimit.CODE_INSUFFICIENT_QUOTA
    elif f.kind == "rate":
        typ, code = ("requests" if unit == "requests" else "tokens"), ratelimit.CODE_RATE_LIMIT_EXCEEDED
    elif f.kind == "blacklist":
        typ, code = "permission_denied", "blacklisted"
    else:
        typ, code = "service_unavailable", "breaker_" + f.kind
    if unit and f.limit > 0 and f.kind in ("quota", "rate"):
        reset = (f.resets_at_ms / 1000 - now) if f.resets_at_ms else retry
        hdrs.update(ratelimit.headers(unit, math.ceil(f.limit), int(max(0.0, math.floor(f.limit - f.used))), reset))
    if status != 403 and retry > 0:
        hdrs["Retry-After"] = str(ratelimit.retry_after(retry))
    body = ratelimit.error_body(_message(d, tenant, retry), typ, code, detail)
    return Refusal(status, body, hdrs)


def _num(v: float) -> str:
    return ratelimit.go_float(v)


def _rfc3339(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _message(d: FlagDecision, tenant: str, retry: float) -> str:
    f = d.flag
    assert f is not None
    on = "all models"
    if d.scope and d.scope != fl.ALL_MODELS:
        if d.scope.startswith(fl.KEY_FIELD_PREFIX) and len(d.scope) > len(fl.KEY_FIELD_PREFIX):
            on = "API key " + d.scope[len(fl.KEY_FIELD_PREFIX):]
        else:
            on = "model " + d.scope
    if f.kind in ("quota", "rate"):
        s = f"Tenant {tenant} has reached its {f.quota} limit on {on}"
        if f.limit > 0 or f.used > 0:
            # The flag's used is the count when the enforcer wrote it (the
            # crossing); calls in flight then add to it.
            s += f": used at least {_num(f.used)} of {_num(f.limit)}"
        if f.period:
            s += " this " + f.period
        if f.resets_at_ms:
            s += f"; it resets at {_rfc3339(f.resets_at_ms)}"
        if retry > 0:
            s += f" (retry after {math.ceil(retry)}s)"
        return s + "."
    if f.kind == "blacklist":
        return f"Tenant {tenant} is blocked on {on}; contact the operator of this service."
    s = f"Requests of tenant {tenant} to {on} are paused: {_BREAKER_TEXT.get(f.kind, 'a breaker is open')}"
    if retry > 0:
        s += f"; retry after {math.ceil(retry)}s"
    return s + "."

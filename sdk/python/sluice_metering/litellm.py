"""Sluice in the LiteLLM proxy: a CustomLogger hook.

Before each call (``async_pre_call_hook``) it checks the tenant's flags
(the Checker, from memory) and admission (one ``admit.lua`` call, the
estimate debited) and refuses with LiteLLM's own rate-limit error
(``ProxyRateLimitError``, a 429 whose message names the flag's quota or the
admission rule, as the Go middleware words it), a 403 for a blacklist or a
503 for a breaker or a tenant that fails closed; a refusal is metered as a
``rejected`` usage event. After each call (``async_log_success_event`` /
``async_log_failure_event``) it emits the usage event (tenant, model,
prompt, completion and cached tokens, cost, latency, outcome) and settles
the admission with the real usage.

The tenant is, in order: the key's metadata ``sluice_tenant``, the key's
team (``team_id``), and, only with ``SLUICE_TRUST_REQUEST_TENANT=1``, the
request's ``metadata.sluice_tenant`` (a client can write any value there).
A request with none is refused (403) unless ``SLUICE_DEFAULT_TENANT`` names one.

Configuration is read from the environment when the proxy imports
``sluice_metering.litellm`` (``litellm_settings: callbacks: sluice_metering.litellm.proxy_handler``):

- ``SLUICE_INGEST_URL``, ``SLUICE_INGEST_API_KEY`` or ``SLUICE_INGEST_API_KEY_FILE``;
- ``SLUICE_REDIS_URL`` (``redis://127.0.0.1:6379/0``);
- ``SLUICE_FLAGS_PREFIX`` (``sluice:flags:``), ``SLUICE_FAIL_MODE`` (default
  fail mode of the Checker, ``open``), ``SLUICE_MAX_STALENESS`` (seconds);
- ``SLUICE_POLICY_FILE`` (the policy YAML the Go services read; its
  admission rules, as sluice_metering.policy makes them) or
  ``SLUICE_ADMISSION_RULES_FILE`` (the rules as JSON, sluice_metering.admission.Rules);
  neither: no admission; ``SLUICE_ADMISSION_PREFIX`` (``sluice:adm:``),
  ``SLUICE_ADMISSION_MAX_WAIT`` (seconds, 0.05), ``SLUICE_GATEWAY_COUNT``;
- ``SLUICE_COMPLETION_ESTIMATE`` (completion tokens debited when the request
  sets no max_tokens, 256), ``SLUICE_GATEWAY_NAME``, ``SLUICE_DEFAULT_TENANT``,
  ``SLUICE_TRUST_REQUEST_TENANT``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

import redis
import redis.asyncio
from fastapi import HTTPException
from litellm.integrations.custom_logger import CustomLogger
from litellm.proxy.common_utils.proxy_rate_limit_error import ProxyRateLimitError

from . import admission, policy
from .checker import Checker, refusal
from .emitter import Emitter
from .event import UsageEvent, new_id

log = logging.getLogger("sluice_metering.litellm")

_ENDPOINTS = {
    "acompletion": "/v1/chat/completions", "completion": "/v1/chat/completions",
    "atext_completion": "/v1/completions", "text_completion": "/v1/completions",
    "aembedding": "/v1/embeddings", "embedding": "/v1/embeddings",
    "aresponses": "/v1/responses", "responses": "/v1/responses",
}


@dataclass
class Settings:
    """The hook's configuration (see the module documentation)."""

    ingest_url: str = ""
    ingest_api_key: str = ""
    redis_url: str = "redis://127.0.0.1:6379/0"
    flags_prefix: str = "sluice:flags:"
    fail_mode: str = "open"
    max_staleness: float = 10.0
    rules: admission.Rules | None = None
    admission_prefix: str = admission.DEFAULT_PREFIX
    admission_max_wait: float = 0.05
    gateway_count: int = 1
    completion_estimate: int = 256
    gateway_name: str = "litellm"
    default_tenant: str = ""
    trust_request_tenant: bool = False

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Settings:
        e = dict(os.environ if env is None else env)
        s = cls()
        s.ingest_url = e.get("SLUICE_INGEST_URL", "")
        s.ingest_api_key = e.get("SLUICE_INGEST_API_KEY", "")
        if not s.ingest_api_key and e.get("SLUICE_INGEST_API_KEY_FILE"):
            with open(e["SLUICE_INGEST_API_KEY_FILE"], encoding="utf-8") as f:
                s.ingest_api_key = f.read().strip()
        s.redis_url = e.get("SLUICE_REDIS_URL", s.redis_url)
        s.flags_prefix = e.get("SLUICE_FLAGS_PREFIX", s.flags_prefix)
        s.fail_mode = e.get("SLUICE_FAIL_MODE", s.fail_mode)
        s.max_staleness = float(e.get("SLUICE_MAX_STALENESS", s.max_staleness))
        if e.get("SLUICE_POLICY_FILE") and e.get("SLUICE_ADMISSION_RULES_FILE"):
            raise ValueError("sluice_metering.litellm: set SLUICE_POLICY_FILE or SLUICE_ADMISSION_RULES_FILE, not both")
        if e.get("SLUICE_POLICY_FILE"):
            s.rules = policy.load(e["SLUICE_POLICY_FILE"]).admission_rules()
        if e.get("SLUICE_ADMISSION_RULES_FILE"):
            with open(e["SLUICE_ADMISSION_RULES_FILE"], encoding="utf-8") as f:
                s.rules = admission.Rules.from_json(f.read())
        s.admission_prefix = e.get("SLUICE_ADMISSION_PREFIX", s.admission_prefix)
        s.admission_max_wait = float(e.get("SLUICE_ADMISSION_MAX_WAIT", s.admission_max_wait))
        s.gateway_count = int(e.get("SLUICE_GATEWAY_COUNT", s.gateway_count))
        s.completion_estimate = int(e.get("SLUICE_COMPLETION_ESTIMATE", s.completion_estimate))
        s.gateway_name = e.get("SLUICE_GATEWAY_NAME", s.gateway_name)
        s.default_tenant = e.get("SLUICE_DEFAULT_TENANT", "")
        s.trust_request_tenant = e.get("SLUICE_TRUST_REQUEST_TENANT", "") in ("1", "true")
        if not s.ingest_url:
            raise ValueError("sluice_metering.litellm: SLUICE_INGEST_URL (ingest's base URL) is required")
        return s


def estimate_prompt(data: dict[str, Any]) -> int:
    """A cheap upper-leaning estimate of the prompt's tokens: a token per 4
    characters of the messages' text plus 4 per message. Settlement
    corrects it with the provider's count."""
    msgs = data.get("messages")
    if isinstance(msgs, list):
        chars = 0
        for m in msgs:
            c = m.get("content") if isinstance(m, dict) else None
            if isinstance(c, str):
                chars += len(c)
            elif c is not None:
                chars += len(json.dumps(c))
        return math.ceil(chars / 4) + 4 * len(msgs)
    for k in ("prompt", "input"):
        if k in data:
            v = data[k]
            return math.ceil(len(v if isinstance(v, str) else json.dumps(v)) / 4)
    return 1


class SluiceHook(CustomLogger):
    """The LiteLLM hook; ``proxy_handler`` is the instance the proxy loads."""

    def __init__(self, settings: Settings) -> None:
        super().__init__()
        self.s = settings
        self.emitter = Emitter(settings.ingest_url, settings.ingest_api_key, flush_interval=0.1)
        self.checker = Checker(redis.Redis.from_url(settings.redis_url), key_prefix=settings.flags_prefix,
                               default_fail_mode=settings.fail_mode, max_staleness=settings.max_staleness).start()
        self.limiter: admission.AsyncLimiter | None = None
        if settings.rules is not None:
            self.limiter = admission.AsyncLimiter(redis.asyncio.Redis.from_url(settings.redis_url, socket_connect_timeout=0.5),
                                                  settings.rules, prefix=settings.admission_prefix,
                                                  max_wait=settings.admission_max_wait, gateway_count=settings.gateway_count)
        # Tickets of calls in flight, by the id the pre-call hook put in the
        # request's metadata; bounded (oldest dropped: its settlement is
        # then lost, the estimate stays debited).
        self._tickets: OrderedDict[str, tuple[admission.Ticket, float]] = OrderedDict()
        self._max_tickets = 100_000

    # -- who is calling ---------------------------------------------------

    def tenant(self, key: Any, data: dict[str, Any]) -> str:
        km = getattr(key, "metadata", None) or {}
        if isinstance(km, dict) and km.get("sluice_tenant"):
            return str(km["sluice_tenant"])
        team = getattr(key, "team_id", None)
        if team:
            return str(team)
        if self.s.trust_request_tenant:
            md = data.get("metadata") or {}
            if isinstance(md, dict) and md.get("sluice_tenant"):
                return str(md["sluice_tenant"])
        return self.s.default_tenant

    @staticmethod
    def key_id(key: Any) -> str:
        alias = getattr(key, "key_alias", None)
        if alias:
            return str(alias)
        token = getattr(key, "token", None) or ""
        return str(token)[:16]

    # -- before the call --------------------------------------------------

    async def async_pre_call_hook(self, user_api_key_dict: Any, cache: Any, data: dict[str, Any], call_type: Any) -> dict[str, Any]:
        model = str(data.get("model") or "")
        tenant = self.tenant(user_api_key_dict, data)
        key_id = self.key_id(user_api_key_dict)
        endpoint = _ENDPOINTS.get(str(call_type), "")
        if not tenant:
            raise HTTPException(status_code=403, detail="Sluice: this key names no tenant (set the key's team, or metadata.sluice_tenant)")
        rid = new_id()
        md = data.setdefault("metadata", {})
        md["sluice_request_id"], md["sluice_tenant_resolved"] = rid, tenant
        d = self.checker.check(tenant, model, key_id)
        if not d.allowed:
            r = refusal(d, tenant, model)
            self._reject(rid, tenant, model, key_id, endpoint, r.status)
            if d.flag is not None and d.flag.reason:
                log.info("sluice: refused tenant %s on %s (%s)", tenant, d.scope, d.flag.reason)
            self._raise(r.status, r.message, r.headers, model)
        if self.limiter is None:
            return data
        prompt = estimate_prompt(data)
        completion = int(data.get("max_completion_tokens") or data.get("max_tokens") or self.s.completion_estimate)
        if endpoint == "/v1/embeddings":
            completion = 0
        user = str(data.get("user") or "")
        t = await self.limiter.admit(admission.Request(tenant=tenant, model=model, user=user, key=key_id, endpoint=endpoint,
                                                       id=rid, prompt_tokens=prompt, completion_tokens=completion))
        if not t.allowed:
            self._reject(rid, tenant, model, key_id, endpoint, t.decision.status)
            self._raise(t.decision.status, t.decision.message, t.decision.headers(), model)
        self._tickets[rid] = (t, time.monotonic())
        while len(self._tickets) > self._max_tickets:
            self._tickets.popitem(last=False)
        return data

    def _raise(self, status: int, message: str, headers: dict[str, str], model: str) -> None:
        if status == 429:
            raise ProxyRateLimitError(detail=message, headers=headers, model=model)
        raise HTTPException(status_code=status, detail=message, headers=headers or None)

    def _reject(self, rid: str, tenant: str, model: str, key_id: str, endpoint: str, status: int) -> None:
        self._emit(UsageEvent(id=rid, tenant=tenant, model=model or "unknown", prompt_tokens=0, completion_tokens=0,
                              api_key_id=key_id, endpoint=endpoint, status=status, outcome="rejected",
                              gateway=self.s.gateway_name))

    def _emit(self, ev: UsageEvent) -> None:
        try:
            self.emitter.emit(ev)
        except Exception as e:  # noqa: BLE001 - metering never fails a call; the Emitter counts drops
            log.error("sluice: usage event %s not emitted: %s", ev.id, e)

    # -- after the call ---------------------------------------------------

    async def async_log_success_event(self, kwargs: dict[str, Any], response_obj: Any, start_time: Any, end_time: Any) -> None:
        await self._after(kwargs, response_obj, start_time, end_time, ok=True)

    async def async_log_failure_event(self, kwargs: dict[str, Any], response_obj: Any, start_time: Any, end_time: Any) -> None:
        await self._after(kwargs, response_obj, start_time, end_time, ok=False)

    async def _after(self, kwargs: dict[str, Any], response_obj: Any, start_time: Any, end_time: Any, ok: bool) -> None:
        slo = kwargs.get("standard_logging_object") or {}
        md = (kwargs.get("litellm_params") or {}).get("metadata") or {}
        rid = md.get("sluice_request_id") or (slo.get("metadata") or {}).get("requester_metadata", {}).get("sluice_request_id")
        tenant = md.get("sluice_tenant_resolved")
        if not rid or not tenant:
            return  # not a call the pre-call hook saw (e.g. a health check)
        prompt = int(slo.get("prompt_tokens") or 0) if ok else 0
        completion = int(slo.get("completion_tokens") or 0) if ok else 0
        cached = _cached_tokens(response_obj) if ok else 0
        entry = self._tickets.pop(rid, None)
        if entry is not None and self.limiter is not None:
            try:
                await self.limiter.settle(entry[0], prompt, completion)
            except admission.BacklogFull as e:
                log.error("sluice: settlement of %s not recorded: %s", rid, e)
        status = 200
        if not ok:
            exc = kwargs.get("exception")
            status = int(getattr(exc, "status_code", 0) or 500)
            if not 100 <= status <= 599:
                status = 500
        latency = _latency_ms(start_time, end_time)
        attrs = {}
        cost = slo.get("response_cost")
        if isinstance(cost, (int, float)) and cost > 0:
            # 12 significant digits, never an exponent: "0.00000555".
            attrs["cost_usd"] = format(Decimal(f"{float(cost):.12g}"), "f")
        md_key = md.get("user_api_key_alias") or (md.get("user_api_key_hash") or "")[:16]
        self._emit(UsageEvent(id=rid, tenant=str(tenant), model=str(slo.get("model_group") or kwargs.get("model") or "unknown"),
                              prompt_tokens=prompt, completion_tokens=completion, cached_tokens=min(cached, prompt),
                              api_key_id=str(md_key), provider=str(slo.get("custom_llm_provider") or ""),
                              endpoint=_ENDPOINTS.get(str(slo.get("call_type") or ""), ""), status=status,
                              outcome="ok" if ok else "error", latency_ms=min(latency, 3_600_000),
                              user=str(slo.get("end_user") or "")[:256], gateway=self.s.gateway_name, attributes=attrs))


def _cached_tokens(resp: Any) -> int:
    usage = getattr(resp, "usage", None)
    details = getattr(usage, "prompt_tokens_details", None)
    n = getattr(details, "cached_tokens", None)
    return int(n) if isinstance(n, int) and n > 0 else 0


def _latency_ms(start: Any, end: Any) -> int:
    if isinstance(start, datetime) and isinstance(end, datetime):
        return max(0, int((end - start).total_seconds() * 1000))
    if isinstance(start, (int, float)) and isinstance(end, (int, float)):
        return max(0, int((end - start) * 1000))
    return 0


def _from_env() -> SluiceHook | None:
    try:
        return SluiceHook(Settings.from_env())
    except ValueError as e:
        # Imported outside a configured proxy (docs, type checks): no hook.
        log.warning("%s; sluice_metering.litellm.proxy_handler is None", e)
        return None


proxy_handler = _from_env()

__all__ = ["Settings", "SluiceHook", "estimate_prompt", "proxy_handler"]

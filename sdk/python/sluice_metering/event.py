"""Usage event v1: what one finished LLM request spent.

The Go package ``schemas`` is the authoritative definition (its ``Validate``
and the JSON Schema in ``schemas/jsonschema/usage-event.v1.json``); this
module mirrors its fields, limits and rules so that a Python gateway finds
a bad event when it is built, not when ingest refuses it.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

# Limits of usage event v1 (schemas/limits.go).
MAX_ID_LEN = 128
MAX_TENANT_LEN = 64
MAX_MODEL_LEN = 128
MAX_TOKENS_PER_EVENT = 1_000_000_000
MAX_LATENCY_MS = 3_600_000
MAX_STRING_LEN = 256
MAX_ATTRIBUTES = 32
MAX_ATTRIBUTE_KEY_LEN = 64
MAX_ATTRIBUTE_VALUE_LEN = 256

OUTCOMES = ("ok", "error", "timeout", "rejected")
PRIORITIES = ("critical", "high", "normal", "low")

_ID = re.compile(r"[!-~]{1,128}")
_TENANT = re.compile(r"[A-Za-z0-9._:-]{1,64}")
_MODEL = re.compile(r"[ -~]{1,128}")
_ATTR_KEY = re.compile(r"[!-~]{1,64}")
_MIN_TIME = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MAX_TIME = datetime(2105, 12, 31, 23, 59, 59, tzinfo=timezone.utc)


class ValidationError(ValueError):
    """An event that ingest would refuse; ``problems`` names each field."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("invalid usage event: " + "; ".join(problems))
        self.problems = problems


def new_id() -> str:
    """A fresh event id (a UUID4): unique per request, stable across retries."""
    return str(uuid.uuid4())


def _now() -> datetime:
    return datetime.now(timezone.utc)


try:  # opentelemetry-api is optional: without it, events carry no trace context.
    from opentelemetry import trace as _otel_trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    _W3C: TraceContextTextMapPropagator | None = TraceContextTextMapPropagator()
except ImportError:  # pragma: no cover - exercised only without the package
    _W3C = None

TRACE_PARENT = "traceparent"
"""The attribute (and Kafka record header) carrying an event's W3C trace
context, as the Go SDK's traceprop writes it (docs/tracing.md)."""


def stamp_trace(attributes: dict[str, str]) -> dict[str, str]:
    """Return attributes with the W3C context (traceparent, tracestate) of
    the OpenTelemetry span current in the caller, so that ingest, the
    aggregator and the enforcer continue the caller's trace
    (docs/tracing.md). Returns attributes itself, unchanged, when
    opentelemetry-api is not installed, no valid span is current, or they
    already carry a traceparent; otherwise a copy."""
    if _W3C is None or TRACE_PARENT in attributes:
        return attributes
    if not _otel_trace.get_current_span().get_span_context().is_valid:
        return attributes
    out = dict(attributes)
    _W3C.inject(out)
    return out


@dataclass
class UsageEvent:
    """One usage event v1. Required: tenant, model, prompt and completion
    tokens; ``id`` and ``time`` default to a fresh UUID and now. Zero values
    of the optional fields mean "not reported" and are left out of the JSON.
    """

    tenant: str
    model: str
    prompt_tokens: int
    completion_tokens: int
    id: str = field(default_factory=new_id)
    time: datetime = field(default_factory=_now)
    user: str = ""
    api_key_id: str = ""
    provider: str = ""
    endpoint: str = ""
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0
    status: int = 0
    outcome: str = ""
    latency_ms: int = 0
    priority: str = ""
    session_id: str = ""
    estimated: bool = False
    gateway: str = ""
    attributes: dict[str, str] = field(default_factory=dict)

    def validate(self) -> None:
        """Raise ValidationError naming every field that breaks a rule of v1."""
        p: list[str] = []

        def text_bytes(v: str) -> int:
            return len(v.encode("utf-8"))

        if not _ID.fullmatch(self.id or ""):
            p.append(f"id: must be 1 to {MAX_ID_LEN} bytes of printable ASCII without spaces")
        if self.time.tzinfo is None:
            p.append("time: must carry a time zone (use UTC)")
        elif not (_MIN_TIME <= self.time <= _MAX_TIME):
            p.append("time: must be between 1970-01-01T00:00:00Z and 2105-12-31T23:59:59Z")
        if not _TENANT.fullmatch(self.tenant or ""):
            p.append(f"tenant: must be 1 to {MAX_TENANT_LEN} bytes of [A-Za-z0-9._:-]")
        if not _MODEL.fullmatch(self.model or ""):
            p.append(f"model: must be 1 to {MAX_MODEL_LEN} bytes of printable ASCII")
        elif self.model == "*" or self.model.startswith("@"):
            p.append('model: "*" and names beginning with "@" are reserved')
        ok: set[str] = set()
        for name in ("prompt_tokens", "completion_tokens", "cached_tokens", "cache_write_tokens", "reasoning_tokens"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_TOKENS_PER_EVENT:
                p.append(f"{name}: must be an integer from 0 to {MAX_TOKENS_PER_EVENT}")
            else:
                ok.add(name)
        # Cache reads and writes are both part of the prompt, reasoning part of the completion.
        if {"cached_tokens", "prompt_tokens"} <= ok and self.cached_tokens > self.prompt_tokens:
            p.append("cached_tokens: must not exceed prompt_tokens")
        elif {"cached_tokens", "prompt_tokens", "cache_write_tokens"} <= ok and \
                self.cached_tokens + self.cache_write_tokens > self.prompt_tokens:
            p.append("cache_write_tokens: cached_tokens + cache_write_tokens must not exceed prompt_tokens")
        if {"reasoning_tokens", "completion_tokens"} <= ok and self.reasoning_tokens > self.completion_tokens:
            p.append("reasoning_tokens: must not exceed completion_tokens")
        if self.status != 0 and not 100 <= self.status <= 599:
            p.append("status: must be 0 (unknown) or 100 to 599")
        if self.outcome and self.outcome not in OUTCOMES:
            p.append(f"outcome: must be one of {', '.join(OUTCOMES)}")
        if not 0 <= self.latency_ms <= MAX_LATENCY_MS:
            p.append(f"latency_ms: must be 0 to {MAX_LATENCY_MS}")
        if self.priority and self.priority not in PRIORITIES:
            p.append(f"priority: must be one of {', '.join(PRIORITIES)}")
        for name in ("user", "api_key_id", "provider", "endpoint", "session_id", "gateway"):
            if text_bytes(getattr(self, name)) > MAX_STRING_LEN:
                p.append(f"{name}: longer than {MAX_STRING_LEN} bytes")
        if len(self.attributes) > MAX_ATTRIBUTES:
            p.append(f"attributes: more than {MAX_ATTRIBUTES} entries")
        for k, v in self.attributes.items():
            if not _ATTR_KEY.fullmatch(k):
                p.append(f"attributes: key {k[:64]!r} must be 1 to {MAX_ATTRIBUTE_KEY_LEN} bytes of printable ASCII without spaces")
            if text_bytes(v) > MAX_ATTRIBUTE_VALUE_LEN:
                p.append(f"attributes.{k[:64]}: value longer than {MAX_ATTRIBUTE_VALUE_LEN} bytes")
        if p:
            raise ValidationError(p)

    def to_dict(self) -> dict[str, Any]:
        """The event's JSON object, optional zero values left out."""
        t = self.time.astimezone(timezone.utc)
        out: dict[str, Any] = {
            "id": self.id,
            "time": t.strftime("%Y-%m-%dT%H:%M:%S") + (f".{t.microsecond:06d}" if t.microsecond else "") + "Z",
            "tenant": self.tenant,
            "model": self.model,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
        }
        for name in ("user", "api_key_id", "provider", "endpoint", "cached_tokens", "cache_write_tokens",
                     "reasoning_tokens", "status", "outcome",
                     "latency_ms", "priority", "session_id", "estimated", "gateway"):
            v = getattr(self, name)
            if v:
                out[name] = v
        if self.attributes:
            out["attributes"] = dict(self.attributes)
        return out

    def to_json(self) -> bytes:
        """The event encoded as ingest reads it."""
        return json.dumps(self.to_dict(), separators=(",", ":"), ensure_ascii=False).encode("utf-8")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> UsageEvent:
        """An event from its JSON object (the inverse of to_dict)."""
        known = {k: v for k, v in d.items() if k != "time"}
        ev = cls(**known)
        if "time" in d:
            ev.time = datetime.fromisoformat(str(d["time"]).replace("Z", "+00:00"))
        return ev

"""OpenAI's rate-limit formats, as the Go package sdk/go/ratelimit writes
them: the x-ratelimit-* header trios (reset as a duration in Go's syntax
rounded up to the millisecond, never a Unix time), Retry-After in whole
seconds (at least 1) and the error body
``{"error": {"message", "type", "param": null, "code", "sluice"?}}``.
"""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Any

CODE_RATE_LIMIT_EXCEEDED = "rate_limit_exceeded"
TYPE_REQUESTS = "requests"
TYPE_TOKENS = "tokens"
CODE_INSUFFICIENT_QUOTA = "insufficient_quota"

_NS = {"ns": 1, "µs": 1_000, "ms": 1_000_000, "s": 1_000_000_000}


def _frac(v: int, unit: int) -> str:
    # v/unit with the fraction's trailing zeros trimmed (Go's fmtFrac).
    whole, rest = divmod(v, unit)
    if rest == 0:
        return str(whole)
    digits = len(str(unit)) - 1
    return f"{whole}.{rest:0{digits}d}".rstrip("0")


def go_duration(ns: int) -> str:
    """Go's time.Duration.String of ns nanoseconds ("1m0s", "1.5s", "12ms")."""
    if ns == 0:
        return "0s"
    sign = "-" if ns < 0 else ""
    u = abs(ns)
    if u < 1_000:
        return f"{sign}{u}ns"
    if u < 1_000_000:
        return f"{sign}{_frac(u, 1_000)}µs"
    if u < 1_000_000_000:
        return f"{sign}{_frac(u, 1_000_000)}ms"
    secs = _frac(u % 60_000_000_000, 1_000_000_000) + "s"
    mins_total = u // 60_000_000_000
    if mins_total == 0:
        return sign + secs
    hours, mins = divmod(mins_total, 60)
    if hours == 0:
        return f"{sign}{mins}m{secs}"
    return f"{sign}{hours}h{mins}m{secs}"


def format_reset(seconds: float) -> str:
    """The time until a limit resets, rounded up to the millisecond, in Go's
    duration syntax ("12ms", "1s", "6m0s"); zero or less is "0s"."""
    if seconds <= 0:
        return "0s"
    ms = math.ceil(round(seconds * 1000, 6))
    return go_duration(ms * 1_000_000)


def format_reset_ms(ms: int) -> str:
    """format_reset of a whole number of milliseconds."""
    return "0s" if ms <= 0 else go_duration(ms * 1_000_000)


def retry_after(seconds: float) -> int:
    """Retry-After in whole seconds, rounded up, at least 1."""
    return max(1, math.ceil(round(seconds, 9)))


def go_float(v: float) -> str:
    """Go's strconv.FormatFloat(v, 'f', -1, 64): the shortest digits that
    read back as v, never an exponent."""
    s = repr(float(v))
    if "e" in s or "E" in s:
        s = format(Decimal(s), "f")
    if s.endswith(".0"):
        s = s[:-2]
    return s


def headers(unit: str, limit: int, remaining: int, reset_seconds: float) -> dict[str, str]:
    """One trio of OpenAI rate-limit headers; unit is "requests" or "tokens"."""
    return {
        f"x-ratelimit-limit-{unit}": str(limit),
        f"x-ratelimit-remaining-{unit}": str(max(0, remaining)),
        f"x-ratelimit-reset-{unit}": format_reset(reset_seconds),
    }


def error_body(message: str, type_: str, code: str, sluice: dict[str, Any] | None = None) -> dict[str, Any]:
    """An OpenAI error body, with the limit's numbers in "sluice" if given."""
    e: dict[str, Any] = {"message": message, "type": type_, "param": None, "code": code}
    if sluice is not None:
        e["sluice"] = sluice
    return {"error": e}

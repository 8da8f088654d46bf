"""The Redis layout of enforcement flags (docs/flags.md; Go: sdk/go/flags).

Keys under a prefix (``sluice:flags:`` by default): ``{<tenant>}`` a hash of
the tenant's flags, ``version``, ``changes`` (pub/sub), ``heartbeat``,
``failmode`` and ``ttl`` (the enforcer's flag_ttl in ms). A flag value is 12 ``;``-separated elements, the reason last.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

DEFAULT_PREFIX = "sluice:flags:"
VERSION_FIELD = "@v"
KEY_FIELD_PREFIX = "@key:"
ALL_MODELS = "*"
HEARTBEAT_TENANT = "@heartbeat"
FAILMODE_TENANT = "@failmode"
# The enforcer's default flag_ttl, in seconds: what a reader assumes until
# it read the ``ttl`` key (docs/flags.md, "Heartbeat and staleness").
DEFAULT_FLAG_TTL = 60.0

STATES = ("open", "half_open", "blacklist", "throttle", "soft")  # soft refuses nothing (docs/flags.md)
KINDS = ("quota", "rate", "error_ratio", "slow_call", "manual", "blacklist")


@dataclass(frozen=True)
class Layout:
    """The key names under one prefix."""

    prefix: str = DEFAULT_PREFIX

    def tenant_key(self, tenant: str) -> str:
        return f"{self.prefix}{{{tenant}}}"

    def tenant_pattern(self) -> str:
        return self.prefix + "{*"

    def version_key(self) -> str:
        return self.prefix + "version"

    def channel(self) -> str:
        return self.prefix + "changes"

    def heartbeat_key(self) -> str:
        return self.prefix + "heartbeat"

    def failmode_key(self) -> str:
        return self.prefix + "failmode"

    def ttl_key(self) -> str:
        return self.prefix + "ttl"

    def tenant_from_key(self, key: str) -> str | None:
        head = self.prefix + "{"
        if key.startswith(head) and key.endswith("}") and len(key) > len(head) + 1:
            return key[len(head):-1]
        return None


@dataclass(frozen=True)
class Flag:
    """One enforcement decision. Times are unix milliseconds (0 = none)."""

    state: str
    kind: str
    quota: str = ""
    period: str = ""
    until_ms: int = 0
    retry_after_ms: int = 0
    limit: float = 0.0
    used: float = 0.0
    resets_at_ms: int = 0
    probes: int = 0
    # The operator's internal note: log it, never show it to end users.
    reason: str = ""

    def same_breaker(self, other: Flag) -> bool:
        """Equal apart from until and retry_after, which every rewrite moves."""
        return replace(self, until_ms=0, retry_after_ms=0) == replace(other, until_ms=0, retry_after_ms=0)


def _fmt_num(v: float) -> str:
    # Go's strconv.FormatFloat(v, 'g', -1, 64) for the values flags carry.
    if v == int(v) and abs(v) < 1e21:
        s = str(int(v))
        return s if len(s) <= 21 else repr(v)
    return repr(v)


def encode(f: Flag) -> str:
    """The compact value (format 1) the enforcer writes."""
    parts = ["1", f.state, f.kind, f.quota, f.period, str(f.until_ms), str(f.retry_after_ms),
             _fmt_num(f.limit), _fmt_num(f.used), str(f.resets_at_ms), str(f.probes), f.reason]
    return ";".join(parts)


class FlagError(ValueError):
    """A flag value this reader cannot use; the message names the element."""


def decode(v: str) -> Flag:
    """Parse a flag value; raises FlagError naming every bad element."""
    p = v.split(";", 11)
    if len(p) != 12:
        raise FlagError(f"flag value has {len(p)} elements, want 12")
    if p[0] != "1":
        raise FlagError(f'flag value format "{p[0]}" is not "1"')
    errs = []
    if p[1] not in STATES:
        errs.append(f'state: "{p[1]}" is not open, half_open, blacklist, throttle or soft')
    if p[2] not in KINDS:
        errs.append(f'kind: "{p[2]}" is unknown')

    def nonneg(i: int, name: str) -> int:
        try:
            n = int(p[i])
        except ValueError:
            n = -1
        if n < 0:
            errs.append(f'{name}: "{p[i]}" is not a non-negative integer')
            return 0
        return n

    def num(i: int, name: str) -> float:
        try:
            return float(p[i])
        except ValueError:
            errs.append(f'{name}: "{p[i]}" is not a number')
            return 0.0

    f = Flag(state=p[1], kind=p[2], quota=p[3], period=p[4], until_ms=nonneg(5, "until"),
             retry_after_ms=nonneg(6, "retry_after"), limit=num(7, "limit"), used=num(8, "used"),
             resets_at_ms=nonneg(9, "resets_at"), probes=nonneg(10, "probes"), reason=p[11])
    if errs:
        raise FlagError("; ".join(errs))
    return f


def parse_ttl(v: str) -> float:
    """The ``ttl`` key's value (whole milliseconds, 3 s to 24 h, the
    enforcer's bounds for flag_ttl) in seconds."""
    try:
        ms = int(v)
    except ValueError:
        raise FlagError(f'flag ttl "{v}": not a whole number of milliseconds') from None
    if not 3_000 <= ms <= 86_400_000:
        raise FlagError(f"flag ttl {ms}ms: outside 3s..24h")
    return ms / 1000


def parse_change(msg: str) -> tuple[str, int]:
    """Parse an announcement ``<tenant> <number>``."""
    t, sep, v = msg.partition(" ")
    if not sep or not t:
        raise FlagError(f'change message "{msg}" is not "<tenant> <version>"')
    try:
        return t, int(v)
    except ValueError:
        raise FlagError(f'change message "{msg}": version is not an integer') from None


def format_change(tenant: str, version: int) -> str:
    """The announcement of tenant's new version."""
    return f"{tenant} {version}"

"""Usage events: the Go schema's example events are valid here too, and bad
fields are named."""

from __future__ import annotations

import json
import re

import pytest

from sluice_metering.event import UsageEvent, ValidationError

from conftest import ROOT


@pytest.mark.parametrize("name", ["event-full.json", "event-minimal.json", "event-typical.json"])
def test_the_schemas_examples_are_valid(name: str) -> None:
    d = json.loads((ROOT / "schemas" / "testdata" / name).read_text())
    t = d.get("time", "")
    m = re.fullmatch(r"(.*\.)(\d+)(.*)", t)
    if m:  # Python keeps microseconds: cut the example's nanoseconds
        d["time"] = m.group(1) + m.group(2)[:6] + m.group(3)
    ev = UsageEvent.from_dict(d)
    ev.validate()
    back = ev.to_dict()
    for k, v in d.items():
        if k != "time" and v not in (None, False, 0, ""):
            assert back[k] == v, k


def test_every_bad_field_is_named() -> None:
    ev = UsageEvent(id="has space", tenant="acme/eu", model="*", prompt_tokens=5, completion_tokens=-1, cached_tokens=6,
                    status=42, outcome="fine", attributes={"bad key": "v"})
    with pytest.raises(ValidationError) as e:
        ev.validate()
    fields = {p.split(":")[0] for p in e.value.problems}
    assert fields == {"id", "tenant", "model", "completion_tokens", "cached_tokens", "status", "outcome", "attributes"}


def test_token_types_are_parts_of_prompt_and_completion() -> None:
    ev = UsageEvent(tenant="acme", model="claude", prompt_tokens=1200, completion_tokens=350, cached_tokens=700,
                    cache_write_tokens=500, reasoning_tokens=350)
    ev.validate()
    assert ev.to_dict()["cache_write_tokens"] == 500 and ev.to_dict()["reasoning_tokens"] == 350
    ev.cache_write_tokens, ev.reasoning_tokens = 501, 351
    with pytest.raises(ValidationError) as e:
        ev.validate()
    assert {p.split(":")[0] for p in e.value.problems} == {"cache_write_tokens", "reasoning_tokens"}

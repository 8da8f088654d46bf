"""Provider usage: the Go SDK's vectors read the same here, token type by
token type, and what cannot be read is refused."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sluice_metering.usage import Usage, from_response

from conftest import ROOT

VECTORS = json.loads((ROOT / "sdk" / "go" / "providerusage" / "testdata" / "vectors.json").read_text())


@pytest.mark.parametrize("v", VECTORS, ids=[v["name"] for v in VECTORS])
def test_vectors_read_every_token_type(v: dict[str, Any]) -> None:
    got = from_response(v["dialect"], v["response"])
    want = None if v["usage"] is None else Usage(**v["usage"])
    assert got == want


def test_what_cannot_be_read_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown dialect 'cohere'"):
        from_response("cohere", {"usage": {}})
    with pytest.raises(ValueError, match="input_tokens must be an integer"):
        from_response("anthropic", {"usage": {"input_tokens": "many"}})

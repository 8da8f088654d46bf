"""Provider usage: what an LLM provider says a call used, in Sluice's token types.

The Go SDK's ``providerusage`` package reads the same way, and both are
checked against ``sdk/go/providerusage/testdata/vectors.json``, so that a
gateway built on this SDK meters OpenAI (and Azure OpenAI), Anthropic and
Gemini answers exactly as ``sluice gateway`` does: the prompt counts its
cached and cache-write parts, the completion its reasoning part.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

DIALECTS = ("openai", "azure", "anthropic", "gemini")


@dataclass(frozen=True)
class Usage:
    """The token types of one call (the usage event's fields)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0


def _n(block: dict[str, Any], name: str) -> int:
    v = block.get(name)
    if v is None:
        return 0
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"usage: {name} must be an integer, not {v!r}")
    return v


def _detail(block: dict[str, Any], details: str, name: str) -> int:
    d = block.get(details)
    return _n(d, name) if isinstance(d, dict) else 0


def _openai(u: dict[str, Any]) -> Usage:
    # Chat, completions and embeddings say prompt/completion; the
    # Responses API says input/output.
    return Usage(
        prompt_tokens=_n(u, "prompt_tokens") + _n(u, "input_tokens"),
        completion_tokens=_n(u, "completion_tokens") + _n(u, "output_tokens"),
        cached_tokens=_detail(u, "prompt_tokens_details", "cached_tokens") + _detail(u, "input_tokens_details", "cached_tokens"),
        reasoning_tokens=(_detail(u, "completion_tokens_details", "reasoning_tokens")
                          + _detail(u, "output_tokens_details", "reasoning_tokens")),
    )


def _anthropic(u: dict[str, Any]) -> Usage:
    # input_tokens leaves the cache out: the prompt billed is all three.
    read, write = _n(u, "cache_read_input_tokens"), _n(u, "cache_creation_input_tokens")
    return Usage(prompt_tokens=_n(u, "input_tokens") + read + write, completion_tokens=_n(u, "output_tokens"),
                 cached_tokens=read, cache_write_tokens=write)


def _gemini(u: dict[str, Any]) -> Usage:
    # promptTokenCount includes the cached content; thoughts are billed as
    # output beside the candidates, a tool's results as input.
    thoughts = _n(u, "thoughtsTokenCount")
    return Usage(prompt_tokens=_n(u, "promptTokenCount") + _n(u, "toolUsePromptTokenCount"),
                 completion_tokens=_n(u, "candidatesTokenCount") + thoughts,
                 cached_tokens=_n(u, "cachedContentTokenCount"), reasoning_tokens=thoughts)


def from_response(dialect: str, body: dict[str, Any]) -> Optional[Usage]:
    """The usage a whole (not streamed) answer of ``dialect`` reports, or
    None when it reports none (count the tokens yourself then). Raises
    ValueError for an unknown dialect or a usage block of the wrong shape."""
    if dialect not in DIALECTS:
        raise ValueError(f"usage: unknown dialect {dialect!r} (want openai, azure, anthropic or gemini)")
    block = body.get("usageMetadata" if dialect == "gemini" else "usage")
    if block is None:
        return None
    if not isinstance(block, dict):
        raise ValueError(f"usage: the usage block must be an object, not {block!r}")
    if dialect == "anthropic":
        return _anthropic(block)
    if dialect == "gemini":
        return _gemini(block)
    return _openai(block)

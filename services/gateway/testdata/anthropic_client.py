"""Anthropic's official Python client, unchanged, against sluice gateway.

Prints, as JSON, the usage the client saw for each call (keyed by the
x-request-id sent), how many text deltas it read of the stream it cut, the
token count count_tokens answered, and the error a refused call raised.
Environment: GW_URL, GW_REFUSING_URL (a gateway whose flags refuse every
tenant) and SLUICE_KEY (a tenant key of both).
"""

import json
import os

import anthropic

LONG = "z" * 12000


def main() -> None:
    key = os.environ["SLUICE_KEY"]
    client = anthropic.Anthropic(base_url=os.environ["GW_URL"], api_key=key, max_retries=0)
    out: dict = {"usage": {}}

    def rid(name: str) -> dict:
        return {"x-request-id": name}

    m = client.messages.create(model="claude-sonnet-4-5", max_tokens=12,
                               messages=[{"role": "user", "content": "hello there"}], extra_headers=rid("py-plain"))
    out["usage"]["py-plain"] = m.usage.model_dump()
    m = client.messages.create(model="claude-sonnet-4-5", max_tokens=20,
                               system=[{"type": "text", "text": LONG, "cache_control": {"type": "ephemeral"}}],
                               messages=[{"role": "user", "content": "and now?"}], extra_headers=rid("py-cached"))
    out["usage"]["py-cached"] = m.usage.model_dump()
    with client.messages.stream(model="claude-haiku-4-5", max_tokens=9,
                                system=[{"type": "text", "text": LONG, "cache_control": {"type": "ephemeral"}}],
                                messages=[{"role": "user", "content": "stream it"}], extra_headers=rid("py-stream")) as s:
        out["text"] = "".join(s.text_stream)
        out["usage"]["py-stream"] = s.get_final_message().usage.model_dump()
    deltas = 0
    with client.messages.stream(model="claude-sonnet-4-5", max_tokens=30,
                                messages=[{"role": "user", "content": "a long answer, please"}],
                                extra_headers=rid("py-cut")) as s:
        for ev in s:
            if ev.type == "content_block_delta":
                deltas += 1
                if deltas == 3:
                    break  # leaving the block closes the stream: the client cuts it
    out["cut_deltas"] = deltas
    out["count_tokens"] = client.messages.count_tokens(
        model="claude-sonnet-4-5", messages=[{"role": "user", "content": "hello there"}]).input_tokens

    refusing = anthropic.Anthropic(base_url=os.environ["GW_REFUSING_URL"], api_key=key, max_retries=0)
    try:
        refusing.messages.create(model="claude-sonnet-4-5", max_tokens=5,
                                 messages=[{"role": "user", "content": "x"}])
        out["refused"] = None
    except anthropic.RateLimitError as e:
        body = e.body if isinstance(e.body, dict) else {}
        out["refused"] = {"status": e.status_code, "type": body.get("error", {}).get("type"),
                          "message": body.get("error", {}).get("message"),
                          "retry_after": e.response.headers.get("retry-after")}
    print(json.dumps(out))


if __name__ == "__main__":
    main()

"""Google's google-genai client, unchanged, against sluice gateway.

Prints, as JSON, the usage metadata the client saw for each call (keyed by
the x-request-id sent), the streamed text, how many chunks it read of the
stream it cut, the token count countTokens answered, and the error a
refused call raised. Environment: GW_URL,
GW_REFUSING_URL (a gateway whose flags refuse every tenant) and SLUICE_KEY
(a tenant key of both).
"""

import json
import os

from google import genai
from google.genai import errors, types

USAGE_FIELDS = {
    "prompt_token_count": "promptTokenCount",
    "candidates_token_count": "candidatesTokenCount",
    "cached_content_token_count": "cachedContentTokenCount",
    "thoughts_token_count": "thoughtsTokenCount",
    "total_token_count": "totalTokenCount",
}


def client_of(url: str, key: str) -> genai.Client:
    # One attempt: a retried refusal would be a second call to meter.
    return genai.Client(api_key=key, http_options=types.HttpOptions(
        base_url=url, retry_options=types.HttpRetryOptions(attempts=1)))


def config(request_id: str, **kw: object) -> types.GenerateContentConfig:
    return types.GenerateContentConfig(
        http_options=types.HttpOptions(headers={"x-request-id": request_id}), **kw)


def usage(meta: types.GenerateContentResponseUsageMetadata) -> dict:
    return {wire: getattr(meta, attr) or 0 for attr, wire in USAGE_FIELDS.items()}


def main() -> None:
    key = os.environ["SLUICE_KEY"]
    client = client_of(os.environ["GW_URL"], key)
    out: dict = {"usage": {}}

    r = client.models.generate_content(model="gemini-2.5-flash", contents="hello there",
                                       config=config("py-plain", max_output_tokens=12))
    out["usage"]["py-plain"] = usage(r.usage_metadata)
    r = client.models.generate_content(
        model="gemini-2.5-pro", contents="and now?",
        config=config("py-cached", max_output_tokens=20, system_instruction="be brief",
                      cached_content="cachedContents/abc",
                      thinking_config=types.ThinkingConfig(thinking_budget=128)))
    out["usage"]["py-cached"] = usage(r.usage_metadata)
    text, last = "", None
    for chunk in client.models.generate_content_stream(
            model="gemini-2.5-flash", contents="stream it",
            config=config("py-stream", max_output_tokens=9,
                          thinking_config=types.ThinkingConfig(thinking_budget=64))):
        text += chunk.text or ""
        last = chunk.usage_metadata or last
    out["text"] = text
    out["usage"]["py-stream"] = usage(last)
    chunks = 0
    stream = client.models.generate_content_stream(
        model="gemini-2.5-flash", contents="a long answer, please",
        config=config("py-cut", max_output_tokens=30))
    for _ in stream:
        chunks += 1
        if chunks == 3:
            break
    stream.close()  # closing the generator closes its response: the client cuts the stream
    out["cut_chunks"] = chunks
    out["count_tokens"] = client.models.count_tokens(model="gemini-2.5-flash", contents="hello there").total_tokens

    refusing = client_of(os.environ["GW_REFUSING_URL"], key)
    try:
        refusing.models.generate_content(model="gemini-2.5-flash", contents="x")
        out["refused"] = None
    except errors.ClientError as e:
        headers = getattr(getattr(e, "response", None), "headers", None) or {}
        out["refused"] = {"client_error": True, "code": e.code, "status": e.status, "message": e.message,
                          "retry_after": headers.get("retry-after")}
    print(json.dumps(out))


if __name__ == "__main__":
    main()

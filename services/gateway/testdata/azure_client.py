"""The openai client's Azure mode (AzureOpenAI), unchanged, against sluice gateway.

Prints, as JSON, the usage the client saw for each call (keyed by the
x-request-id sent) and the error a refused call raised. Environment:
GW_URL, GW_REFUSING_URL (a gateway whose flags refuse every tenant) and
SLUICE_KEY (a tenant key of both).
"""

import json
import os

import openai


def main() -> None:
    key = os.environ["SLUICE_KEY"]
    client = openai.AzureOpenAI(azure_endpoint=os.environ["GW_URL"], api_key=key, api_version="2024-10-21", max_retries=0)
    out: dict = {"usage": {}}
    r = client.chat.completions.create(model="gpt-4o", max_tokens=7, messages=[{"role": "user", "content": "hi there"}],
                                       extra_headers={"x-request-id": "az-py-plain"})
    out["usage"]["az-py-plain"] = [r.usage.prompt_tokens, r.usage.completion_tokens]
    stream = client.chat.completions.create(model="gpt-4o", max_tokens=5, stream=True, stream_options={"include_usage": True},
                                            messages=[{"role": "user", "content": "stream"}],
                                            extra_headers={"x-request-id": "az-py-stream"})
    for chunk in stream:
        if chunk.usage is not None:
            out["usage"]["az-py-stream"] = [chunk.usage.prompt_tokens, chunk.usage.completion_tokens]
    e = client.embeddings.create(model="text-embedding-3-small", input=["alpha", "beta gamma"],
                                 extra_headers={"x-request-id": "az-py-embed"})
    out["usage"]["az-py-embed"] = [e.usage.prompt_tokens, 0]

    refusing = openai.AzureOpenAI(azure_endpoint=os.environ["GW_REFUSING_URL"], api_key=key, api_version="2024-10-21",
                                  max_retries=0)
    try:
        refusing.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}])
        out["refused"] = None
    except openai.RateLimitError as err:
        out["refused"] = {"status": err.status_code, "message": str(err.message),
                          "retry_after": err.response.headers.get("retry-after")}
    print(json.dumps(out))


if __name__ == "__main__":
    main()

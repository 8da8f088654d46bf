"""Drives the LiteLLM proxy (with the Sluice hook) with the official OpenAI
Python client. Run by e2e/litellm_test.go with OPENAI_BASE_URL (the
proxy's /v1). Prints one JSON object: the usage the client saw for every
call of tenant ll-acme, the calls ll-capped made before LiteLLM refused it
and the refusal (status, message), and the refusal of ll-flagged."""

import json
import os

import openai

base = os.environ["OPENAI_BASE_URL"]
out = {"acme": [], "capped_allowed": 0, "capped": None, "flagged": None}
messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say something short."}]

acme = openai.OpenAI(base_url=base, api_key="sk-ll-acme", max_retries=0)
for i, model in enumerate(["gpt-4o-mini", "gpt-4o", "gpt-4o-mini"]):
    r = acme.chat.completions.create(model=model, messages=messages, max_tokens=5 + i)
    out["acme"].append({"prompt": r.usage.prompt_tokens, "completion": r.usage.completion_tokens})

capped = openai.OpenAI(base_url=base, api_key="sk-ll-capped", max_retries=0)
for _ in range(50):
    try:
        capped.chat.completions.create(model="gpt-4o-mini", messages=messages, max_tokens=20)
        out["capped_allowed"] += 1
    except openai.RateLimitError as e:
        out["capped"] = {"status": e.status_code, "message": str(e)}
        break

flagged = openai.OpenAI(base_url=base, api_key="sk-ll-flagged", max_retries=0)
try:
    flagged.chat.completions.create(model="gpt-4o-mini", messages=messages, max_tokens=5)
except openai.RateLimitError as e:
    out["flagged"] = {"status": e.status_code, "message": str(e)}

print(json.dumps(out))

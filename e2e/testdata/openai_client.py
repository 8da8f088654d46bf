"""Drives `sluice gateway` with the official OpenAI Python client.

Run by e2e/openai_test.go with OPENAI_BASE_URL (the gateway's /v1),
SLUICE_KEY (a tenant key) and SLUICE_CAPPED_KEY (a key of a tenant the
flags refuse). Each call carries its own x-request-id, which the usage
event keeps as attribute request_id (its id is the gateway's); the script prints, as one JSON object, what the client
saw for every call (the usage where the client received one) so that the
test can compare it with what Sluice stored. A failed check exits 1 with
the reason.
"""

import json
import os
import sys
import time

import openai

results = {"calls": {}}


def check(cond, msg):
    if not cond:
        print("CHECK FAILED: " + msg, file=sys.stderr)
        sys.exit(1)


def usage_of(u):
    """The usage block as the client parsed it, in one shape."""
    if u is None:
        return None
    prompt = getattr(u, "prompt_tokens", None)
    if prompt is None:
        prompt = u.input_tokens
    completion = getattr(u, "completion_tokens", None)
    if completion is None:
        completion = getattr(u, "output_tokens", 0) or 0
    return {"prompt": prompt, "completion": completion}


def record(rid, usage, **extra):
    results["calls"][rid] = dict(usage=usage, **extra)


def hdr(rid):
    return {"X-Request-Id": rid}


client = openai.OpenAI(base_url=os.environ["OPENAI_BASE_URL"], api_key=os.environ["SLUICE_KEY"], max_retries=0)
messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say something short."}]

# Chat, not streamed.
r = client.chat.completions.create(model="gpt-4o", messages=messages, max_tokens=12, extra_headers=hdr("py-chat"))
check(r.choices[0].message.content, "chat: no content")
check(r.usage.completion_tokens == 12, "chat: usage %r" % r.usage)
record("py-chat", usage_of(r.usage))

# Chat streamed, asking for usage: the last chunk carries it.
text, usage, chunks = "", None, 0
for chunk in client.chat.completions.create(model="gpt-4o-mini", messages=messages, max_tokens=9, stream=True,
                                            stream_options={"include_usage": True}, extra_headers=hdr("py-stream-usage")):
    chunks += 1
    if chunk.usage is not None:
        usage = usage_of(chunk.usage)
    for c in chunk.choices:
        text += c.delta.content or ""
check(usage is not None and usage["completion"] == 9, "stream with include_usage: usage %r" % usage)
check(text.strip(), "stream with include_usage: no text")
record("py-stream-usage", usage, chunks=chunks)

# Chat streamed without asking: the client must see no usage at all (the
# gateway asked the provider for it and removed it).
text, seen = "", []
for chunk in client.chat.completions.create(model="gpt-4o-mini", messages=messages, max_tokens=7, stream=True,
                                            extra_headers=hdr("py-stream-plain")):
    if chunk.usage is not None:
        seen.append(chunk.usage)
    for c in chunk.choices:
        text += c.delta.content or ""
check(not seen, "stream without include_usage: the client received usage %r" % seen)
check(text.strip(), "stream without include_usage: no text")
record("py-stream-plain", None, max_tokens=7, contents=[m["content"] for m in messages])

# Tools: the model calls the function, the tool's result gets an answer.
tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
ask = [{"role": "user", "content": "What is the weather in Paris?"}]
r = client.chat.completions.create(model="gpt-4o", messages=ask, tools=tools, max_tokens=20, extra_headers=hdr("py-tool-call"))
call = r.choices[0].message.tool_calls[0]
check(r.choices[0].finish_reason == "tool_calls" and call.function.name == "get_weather", "tools: %r" % r.choices[0])
check(json.loads(call.function.arguments).get("city") == "Paris", "tools: arguments %r" % call.function.arguments)
record("py-tool-call", usage_of(r.usage))
follow = ask + [r.choices[0].message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature_c": 18})}]
r = client.chat.completions.create(model="gpt-4o", messages=follow, tools=tools, max_tokens=15, extra_headers=hdr("py-tool-answer"))
check(r.choices[0].message.content, "tools: no answer after the tool result")
record("py-tool-answer", usage_of(r.usage))

# Tool call streamed: the arguments arrive in pieces.
args, name = "", None
for chunk in client.chat.completions.create(model="gpt-4o", messages=ask, tools=tools, stream=True,
                                            stream_options={"include_usage": True}, extra_headers=hdr("py-tool-stream")):
    if chunk.usage is not None:
        usage = usage_of(chunk.usage)
    for c in chunk.choices:
        for tc in c.delta.tool_calls or []:
            name = name or tc.function.name
            args += tc.function.arguments or ""
check(name == "get_weather" and json.loads(args) == {"city": "Paris"}, "streamed tool call: %r %r" % (name, args))
record("py-tool-stream", usage)

# Embeddings (the client asks for base64 and decodes it).
e = client.embeddings.create(model="text-embedding-3-small", input=["alpha", "beta gamma delta"], extra_headers=hdr("py-embed"))
check(len(e.data) == 2 and len(e.data[0].embedding) == 8, "embeddings: %r" % e.data)
record("py-embed", {"prompt": e.usage.prompt_tokens, "completion": 0})

# Legacy completions.
c = client.completions.create(model="gpt-3.5-turbo-instruct", prompt="Once upon a time", max_tokens=5, extra_headers=hdr("py-legacy"))
check(c.choices[0].text, "completions: no text")
record("py-legacy", usage_of(c.usage))

# The Responses API, plain and streamed.
resp = client.responses.create(model="gpt-4o", input="Write a haiku about meters.", max_output_tokens=16, extra_headers=hdr("py-responses"))
check(resp.output_text, "responses: no output_text")
record("py-responses", usage_of(resp.usage))
usage, deltas = None, ""
for ev in client.responses.create(model="o3-mini", input="Think, then answer.", max_output_tokens=10, stream=True,
                                  extra_headers=hdr("py-responses-stream")):
    if ev.type == "response.output_text.delta":
        deltas += ev.delta
    if ev.type == "response.completed":
        usage = usage_of(ev.response.usage)
        results["reasoning"] = ev.response.usage.output_tokens_details.reasoning_tokens
check(usage is not None and deltas.strip(), "streamed responses: usage %r, text %r" % (usage, deltas))
record("py-responses-stream", usage)

# The models this key may use.
results["models"] = sorted(m.id for m in client.models.list())

# A refused tenant: a RateLimitError naming the limit, after the client
# retried once, waiting as long as Retry-After said.
capped = openai.OpenAI(base_url=os.environ["OPENAI_BASE_URL"], api_key=os.environ["SLUICE_CAPPED_KEY"], max_retries=1)
start = time.monotonic()
try:
    capped.chat.completions.create(model="gpt-4o", messages=messages, max_tokens=5)
    check(False, "the capped tenant was served")
except openai.RateLimitError as err:
    results["refused"] = {"status": err.status_code, "message": err.message, "body": err.body,
                          "retry_after": err.response.headers.get("retry-after"), "elapsed": time.monotonic() - start}

print(json.dumps(results))

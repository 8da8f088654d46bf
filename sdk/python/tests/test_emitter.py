"""The Emitter reads ingest's answers as the Go Emitter does. A local HTTP
server plays ingest and answers what each test scripts."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from sluice_metering.emitter import AsyncEmitter, BufferFull, Emitter
from sluice_metering.event import UsageEvent


class FakeIngest:
    """Answers each POST /v1/events with the next scripted (status, body,
    headers), then 202; records every batch it was sent and when."""

    def __init__(self) -> None:
        self.script: list[tuple[int, dict[str, Any], dict[str, str]]] = []
        self.batches: list[tuple[float, list[dict[str, Any]]]] = []
        self.auth: list[str] = []
        self.lock = threading.Lock()
        fake = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with fake.lock:
                    fake.batches.append((time.monotonic(), body))
                    fake.auth.append(self.headers.get("Authorization", ""))
                    status, ans, hdrs = fake.script.pop(0) if fake.script else (202, {}, {})
                if callable(ans):
                    ans = ans(body)
                raw = json.dumps(ans).encode()
                self.send_response(status)
                for k, v in hdrs.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *args: Any) -> None:
                pass

        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}"

    def ids(self) -> list[str]:
        with self.lock:
            return [e["id"] for _, b in self.batches for e in b]


@pytest.fixture
def ingest() -> Iterator[FakeIngest]:
    f = FakeIngest()
    yield f
    f.srv.shutdown()


def ev(i: int) -> UsageEvent:
    return UsageEvent(id=f"e-{i}", tenant="acme", model="gpt-4o", prompt_tokens=10, completion_tokens=i)


def test_batches_with_the_key_and_acknowledges_on_202(ingest: FakeIngest) -> None:
    e = Emitter(ingest.url, "sk-ingest", batch_size=10, flush_interval=5)
    for i in range(25):
        e.emit(ev(i))
    e.flush(timeout=10)
    assert sorted(ingest.ids()) == sorted(f"e-{i}" for i in range(25))
    assert [len(b) for _, b in ingest.batches] == [10, 10, 5]
    assert set(ingest.auth) == {"Bearer sk-ingest"}
    assert ingest.batches[0][1][0] == {"id": "e-0", "time": ingest.batches[0][1][0]["time"], "tenant": "acme",
                                       "model": "gpt-4o", "prompt_tokens": 10, "completion_tokens": 0}
    e.close()
    assert e.stats().delivered == 25


def test_207_rejections_are_dropped_and_the_rest_acknowledged(ingest: FakeIngest) -> None:
    ingest.script.append((207, {"rejected": [{"index": 1, "errors": [{"field": "model", "reason": "is reserved"}]}]}, {}))
    e = Emitter(ingest.url, batch_size=3)
    for i in range(3):
        e.emit(ev(i))
    e.flush(timeout=10)
    e.close()
    s = e.stats()
    assert len(ingest.batches) == 1
    assert s.dropped == {"rejected": 1} and s.delivered == 2


def test_503_is_retried_after_retry_after(ingest: FakeIngest) -> None:
    ingest.script.append((503, {"error": "broker unavailable"}, {"Retry-After": "1"}))
    e = Emitter(ingest.url, batch_size=2, min_backoff=0.01, max_backoff=0.02)
    e.emit(ev(1))
    e.emit(ev(2))
    e.flush(timeout=10)
    e.close()
    (t1, b1), (t2, b2) = ingest.batches
    assert b1 == b2, "the retry resends the same events (ingest deduplicates by id)"
    assert t2 - t1 >= 1.0, "Retry-After was not honoured"
    assert e.stats().retries == 1


def test_413_splits_the_batch_and_drops_only_an_event_too_large_alone(ingest: FakeIngest) -> None:
    ingest.script += [(413, {"error": "too large"}, {}), (413, {"error": "too large"}, {})]
    e = Emitter(ingest.url, batch_size=4)
    for i in range(4):
        e.emit(ev(i))
    e.flush(timeout=10)
    e.close()
    sizes = [len(b) for _, b in ingest.batches]
    assert sizes[:2] == [4, 2], sizes  # the batch, then its first half (refused again)
    assert sorted(ingest.ids()[-4:]) != []  # halves of the halves follow
    assert e.stats().splits == 2
    assert e.stats().delivered == 4 and not e.stats().dropped


def test_other_4xx_refuses_the_batch(ingest: FakeIngest) -> None:
    ingest.script.append((415, {"error": "unsupported media type"}, {}))
    e = Emitter(ingest.url, batch_size=2)
    e.emit(ev(1))
    e.emit(ev(2))
    e.flush(timeout=10)
    e.close()
    assert e.stats().dropped == {"refused": 2} and len(ingest.batches) == 1


def test_a_full_buffer_drops_the_newest_and_close_counts_the_undelivered() -> None:
    e = Emitter("http://127.0.0.1:1", max_buffered_events=3, batch_size=3, flush_interval=0.05,
                min_backoff=0.01, max_backoff=0.05)
    for i in range(3):
        e.emit(ev(i))
    with pytest.raises(BufferFull):
        e.emit(ev(3))
    with pytest.raises(RuntimeError, match="3 events were not delivered"):
        e.close(timeout=0.3)
    s = e.stats()
    assert s.dropped == {"buffer_full": 1, "closed": 3}


def test_invalid_event_names_the_field() -> None:
    e = Emitter("http://127.0.0.1:1")
    with pytest.raises(ValueError, match="model"):
        e.emit(UsageEvent(tenant="acme", model="@v", prompt_tokens=1, completion_tokens=1))
    e.close(timeout=0.1)


def test_async_emitter(ingest: FakeIngest) -> None:
    async def run() -> None:
        e = AsyncEmitter(ingest.url, batch_size=100)
        for i in range(5):
            e.emit(ev(i))
        await e.flush(timeout=10)
        await e.close()

    asyncio.run(run())
    assert len(ingest.ids()) == 5


def test_events_carry_the_callers_trace(ingest: FakeIngest) -> None:
    """An event emitted inside an OpenTelemetry span carries the span's W3C
    context (attribute traceparent), which ingest puts on its Kafka record;
    one emitted outside any span carries none, and one that has a
    traceparent keeps it."""
    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    sc = SpanContext(trace_id=0x4BF92F3577B34DA6A3CE929D0E0E4736, span_id=0x00F067AA0BA902B7, is_remote=False,
                     trace_flags=TraceFlags(TraceFlags.SAMPLED))
    e = Emitter(ingest.url, "sk-ingest", batch_size=10, flush_interval=5)
    own = ev(3)
    own.attributes = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    with trace.use_span(NonRecordingSpan(sc)):
        e.emit(ev(1))
        e.emit(own)
    e.emit(ev(2))
    e.flush(timeout=10)
    sent = {x["id"]: x for _, b in ingest.batches for x in b}
    assert sent["e-1"]["attributes"] == {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
    assert "attributes" not in sent["e-2"]
    assert sent["e-3"]["attributes"] == {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    e.close()

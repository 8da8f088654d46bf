"""The Emitter: usage events to Sluice's ingest API in the background.

It follows the Go SDK's ``sdk/go/emitter``: ``emit`` never blocks the
request path; events are batched (``batch_size`` events or every
``flush_interval``); a failed batch is retried with exponential back-off
and full jitter, honouring ``Retry-After``; ``flush`` and ``close`` deliver
what is buffered. Memory is bounded by ``max_buffered_events`` and
``max_buffered_bytes`` (waiting events plus the batch being sent); when the
buffer is full the new event is dropped (drop newest) and ``emit`` raises
BufferFull, because blocking would stall the gateway behind Sluice and
dropping the oldest would punish the events that waited longest. Every drop
is counted in ``stats`` and logged (at most once per second).

How ingest's answers are read (as the Go HTTPSender does):

- 202: every event was acknowledged;
- 207, or 400/403 with per-event rejections: those events are refused for
  good (dropped, counted as rejected), the rest acknowledged;
- 413: the batch is too large as a whole: it is split in halves, down to
  single events; only an event refused on its own is dropped;
- 401, 408, 429, 5xx and network errors: retried, honouring Retry-After
  (401 because a key rotation in progress heals it);
- any other 2xx or 3xx: retried, since only 202 and 207 acknowledge events
  (ingest deduplicates the retry);
- any other 4xx: the batch is refused (dropped, counted).

The Emitter delivers on one background thread; AsyncEmitter gives asyncio
code the same Emitter with awaitable flush and close, so the event loop
never waits for ingest.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import random
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from .event import UsageEvent, stamp_trace

log = logging.getLogger("sluice_metering.emitter")


class BufferFull(Exception):
    """The event was dropped: the buffer is full (counted in stats)."""


class Closed(Exception):
    """The Emitter was closed."""


@dataclass
class Rejection:
    """An event the receiver refused and will refuse again."""

    index: int
    reason: str


class RetryableError(Exception):
    """Some events were not acknowledged and may be sent again."""

    def __init__(self, msg: str, after: float = 0.0) -> None:
        super().__init__(msg)
        self.after = after


class PermanentError(Exception):
    """The batch can never be delivered as it is: its events are dropped."""


class TooLargeError(Exception):
    """The receiver refused the batch for its size (413): split it."""


class Sender(Protocol):
    """Delivers one batch of encoded events.

    Returns the events refused for good and acknowledges the others; raises
    RetryableError, PermanentError or TooLargeError as described on them
    (any other exception is retried).
    """

    def send(self, events: list[bytes], timeout: float) -> list[Rejection]: ...


class HTTPSender:
    """Posts batches to ingest's ``POST /v1/events`` as a JSON array."""

    def __init__(self, url: str, api_key: str = "", use_gzip: bool = False) -> None:
        self.url = url.rstrip("/") + "/v1/events"
        self.api_key = api_key
        self.use_gzip = use_gzip

    def send(self, events: list[bytes], timeout: float) -> list[Rejection]:
        body = b"[" + b",".join(events) + b"]"
        headers = {"Content-Type": "application/json"}
        if self.use_gzip:
            body = gzip.compress(body)
            headers["Content-Encoding"] = "gzip"
        if self.api_key:
            headers["Authorization"] = "Bearer " + self.api_key
        req = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                code, raw, retry_after = resp.status, resp.read(16 << 20), resp.headers.get("Retry-After", "")
        except urllib.error.HTTPError as e:
            code, raw, retry_after = e.code, e.read(16 << 20), e.headers.get("Retry-After", "")
        except (OSError, urllib.error.URLError) as e:
            raise RetryableError(f"sending to ingest: {e}") from e
        return _read_answer(code, raw, retry_after, len(events), len(body))


def _read_answer(code: int, raw: bytes, retry_after: str, n: int, size: int) -> list[Rejection]:
    try:
        ans = json.loads(raw) if raw else {}
    except ValueError:
        ans = {}  # a proxy's HTML error page is judged by its status alone
    if not isinstance(ans, dict):
        ans = {}
    rejected: list[Rejection] = []
    for r in ans.get("rejected") or []:
        i = r.get("index", -1) if isinstance(r, dict) else -1
        if not isinstance(i, int) or not 0 <= i < n:
            continue
        reason = "rejected"
        errs = r.get("errors") or []
        if errs and isinstance(errs[0], dict):
            f, why = errs[0].get("field", ""), errs[0].get("reason", "")
            reason = (f + ": " if f else "") + why
        rejected.append(Rejection(i, reason))
    err = str(ans.get("error", ""))
    if code in (202, 207):
        return rejected
    if code in (400, 403) and rejected:
        return rejected
    if code == 413:
        raise TooLargeError(f"ingest answered 413 for {n} events ({size} bytes): {err}")
    after = _retry_after(retry_after)
    if code < 400:
        raise RetryableError(f"ingest answered {code}, which does not acknowledge events (only 202 and 207 do)", after)
    if code in (401, 408, 429) or code >= 500:
        raise RetryableError(f"ingest answered {code}: {err}", after)
    raise PermanentError(f"ingest answered {code}: {err}")


def _retry_after(h: str) -> float:
    try:
        n = int(h.strip())
    except ValueError:
        return 0.0
    return float(n) if 0 < n < 3600 else 0.0


def backoff(attempt: int, lo: float, hi: float) -> float:
    """Full jitter: uniform in [0, min(hi, lo * 2**attempt))."""
    ceil = hi if attempt >= 32 else min(hi, lo * (1 << attempt))
    return random.uniform(0, ceil) if ceil > 0 else 0.0


@dataclass
class Stats:
    """What an Emitter did since it was made."""

    emitted: int = 0
    delivered: int = 0
    retries: int = 0
    splits: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    buffered: int = 0


@dataclass
class _Entry:
    data: bytes
    id: str


class Emitter:
    """Buffers events and delivers them on a background thread. Thread-safe.

    ``url`` is ingest's base URL (``sender`` replaces the HTTP sender). Close
    it on shutdown: ``close`` delivers what is buffered within its timeout.
    """

    def __init__(
        self,
        url: str = "",
        api_key: str = "",
        *,
        sender: Sender | None = None,
        max_buffered_events: int = 100_000,
        max_buffered_bytes: int = 64 << 20,
        batch_size: int = 1000,
        flush_interval: float = 0.2,
        send_timeout: float = 30.0,
        min_backoff: float = 0.1,
        max_backoff: float = 30.0,
        use_gzip: bool = False,
    ) -> None:
        problems = []
        if max_buffered_events < 1:
            problems.append(f"max_buffered_events {max_buffered_events} must be at least 1")
        if not 1 <= batch_size <= max(max_buffered_events, 1):
            problems.append(f"batch_size {batch_size} is outside 1..max_buffered_events ({max_buffered_events})")
        if max_buffered_bytes < 4096:
            problems.append(f"max_buffered_bytes {max_buffered_bytes} is below the minimum 4096")
        if flush_interval <= 0 or send_timeout <= 0 or min_backoff < 0 or max_backoff < min_backoff:
            problems.append("flush_interval and send_timeout must be positive and max_backoff at least min_backoff")
        if sender is None and not url:
            problems.append("url (ingest's base URL) or sender is required")
        if problems:
            raise ValueError("emitter: " + "; ".join(problems))
        self._sender: Sender = sender or HTTPSender(url, api_key, use_gzip)
        self._max_events, self._max_bytes, self._batch = max_buffered_events, max_buffered_bytes, batch_size
        self._interval, self._timeout = flush_interval, send_timeout
        self._min_backoff, self._max_backoff = min_backoff, max_backoff
        self._cv = threading.Condition()
        self._queue: deque[_Entry] = deque()
        self._bytes = 0  # waiting events plus the in-flight batch
        self._inflight = 0
        self._emitted = 0  # accepted by emit, ever
        self._settled = 0  # delivered or dropped after acceptance, ever
        self._closed = False
        self._stopping = False
        self._wake = False
        self._stats = Stats()
        self._drop_logged = 0.0
        self._drop_pending = 0
        self._thread = threading.Thread(target=self._loop, name="sluice-emitter", daemon=True)
        self._thread.start()

    def emit(self, ev: UsageEvent) -> None:
        """Validate ev and buffer it for delivery; never blocks.

        Raises ValidationError for an invalid event, BufferFull when the
        event was dropped because the buffer is full, Closed after close.
        An event emitted while an OpenTelemetry span is current (and
        opentelemetry-api installed) gets its trace context in
        ``ev.attributes`` (event.stamp_trace), unless it has one already.
        """
        ev.attributes = stamp_trace(ev.attributes)
        try:
            ev.validate()
        except Exception:
            self._count_drop("invalid", 1)
            raise
        data = ev.to_json()
        with self._cv:
            if self._closed:
                raise Closed("emitter: closed")
            if len(self._queue) + self._inflight >= self._max_events or self._bytes + len(data) > self._max_bytes:
                self._count_drop("buffer_full", 1)
                self._log_drop()
                raise BufferFull("emitter: buffer full; event dropped (policy: drop newest)")
            self._queue.append(_Entry(data, ev.id))
            self._bytes += len(data)
            self._emitted += 1
            self._stats.emitted += 1
            if len(self._queue) >= self._batch:
                self._wake = True
                self._cv.notify_all()

    def flush(self, timeout: float | None = None) -> None:
        """Send everything buffered now and wait until it was delivered (or
        dropped as refused). Raises TimeoutError, saying how many events are
        still undelivered, when timeout (seconds) passes first; they stay
        buffered."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cv:
            target = self._emitted
            while self._settled < target:
                self._wake = True
                self._cv.notify_all()
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"emitter: flush: {self._emitted - self._settled} events not yet delivered")
                self._cv.wait(left if left is not None else 1.0)

    def close(self, timeout: float = 10.0) -> None:
        """Stop accepting events, deliver what is buffered within timeout,
        then stop. Events still undelivered are dropped, counted as
        "closed" and logged, and close raises an error saying how many."""
        with self._cv:
            if self._closed:
                already = True
            else:
                already, self._closed = False, True
        if already:
            self._thread.join()
            return
        err: Exception | None = None
        try:
            self.flush(timeout)
        except TimeoutError as e:
            err = e
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        self._thread.join(timeout=max(self._timeout, 1.0))
        with self._cv:
            lost = len(self._queue) + self._inflight
            self._queue.clear()
            self._settled += lost
            self._bytes = 0
        if lost:
            self._count_drop("closed", lost)
            log.error("emitter closed with %d undelivered usage events; they are lost (%s)", lost, err)
            raise RuntimeError(f"emitter: close: {lost} events were not delivered: {err}")

    def stats(self) -> Stats:
        """A copy of the counts so far."""
        with self._cv:
            s = Stats(self._stats.emitted, self._stats.delivered, self._stats.retries, self._stats.splits,
                      dict(self._stats.dropped), len(self._queue) + self._inflight)
        return s

    # -- the background thread -------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._cv:
                if not self._wake and not self._stopping:
                    self._cv.wait(self._interval)
                self._wake = False
                if self._stopping:
                    return
            while True:
                batch = self._take()
                if not batch:
                    break
                if not self._deliver(batch):
                    return

    def _take(self) -> list[_Entry]:
        with self._cv:
            n = min(len(self._queue), self._batch)
            batch = [self._queue.popleft() for _ in range(n)]
            self._inflight = n
            return batch

    def _deliver(self, batch: list[_Entry]) -> bool:
        """Send batch until every event was acknowledged or refused. Returns
        False when the Emitter stops first (the rest goes back to the queue
        for close to count)."""
        pending = batch
        attempt = 0
        while True:
            rejected: list[Rejection] = []
            try:
                rejected = self._sender.send([e.data for e in pending], self._timeout)
                err: Exception | None = None
            except Exception as e:  # classified below; anything unknown is retried
                err = e
            if rejected:
                self._count_drop("rejected", len(rejected))
                log.error("Sluice rejected %d usage events; they are dropped (first: %s)", len(rejected), rejected[0].reason)
            if err is None:
                self._settle(pending, len(pending) - len(rejected))
                return True
            if isinstance(err, TooLargeError) and len(pending) > 1:
                half = len(pending) // 2
                with self._cv:
                    self._stats.splits += 1
                log.warning("Sluice refused a batch of %d usage events as too large; sending it in halves", len(pending))
                return self._deliver(pending[:half]) and self._deliver(pending[half:])
            if isinstance(err, TooLargeError):
                self._count_drop("too_large", len(pending))
                log.error("Sluice refused a single usage event as too large; it is dropped (id %s): %s", pending[0].id, err)
                self._settle(pending, 0)
                return True
            if isinstance(err, PermanentError):
                self._count_drop("refused", len(pending) - len(rejected))
                log.error("Sluice refused a batch of %d usage events; they are dropped: %s", len(pending), err)
                self._settle(pending, 0)
                return True
            skip = {r.index for r in rejected}
            retry = [e for i, e in enumerate(pending) if i not in skip]
            self._settle([e for i, e in enumerate(pending) if i in skip], 0)
            pending = retry
            wait = max(backoff(attempt, self._min_backoff, self._max_backoff), getattr(err, "after", 0.0))
            attempt += 1
            with self._cv:
                self._stats.retries += 1
            log.warning("sending %d usage events failed; retrying in %.3fs (attempt %d): %s", len(pending), wait, attempt, err)
            with self._cv:
                end = time.monotonic() + wait
                while not self._stopping and time.monotonic() < end:
                    self._cv.wait(end - time.monotonic())
                if self._stopping:
                    self._queue.extendleft(reversed(pending))
                    self._inflight = 0
                    return False

    def _settle(self, entries: list[_Entry], delivered: int) -> None:
        with self._cv:
            self._settled += len(entries)
            self._inflight -= len(entries)
            self._bytes -= sum(len(e.data) for e in entries)
            self._stats.delivered += delivered
            self._cv.notify_all()

    def _count_drop(self, reason: str, n: int) -> None:
        d = self._stats.dropped
        d[reason] = d.get(reason, 0) + n

    def _log_drop(self) -> None:
        self._drop_pending += 1
        now = time.monotonic()
        if now - self._drop_logged >= 1.0:
            log.error("emitter buffer full: dropped %d usage events (policy: drop newest)", self._drop_pending)
            self._drop_logged, self._drop_pending = now, 0


class AsyncEmitter:
    """The Emitter for asyncio code: ``emit`` is the same non-blocking call;
    ``flush`` and ``close`` are awaitable and wait on a worker thread, so
    the event loop never waits for ingest."""

    def __init__(self, url: str = "", api_key: str = "", **kwargs: object) -> None:
        self._e = Emitter(url, api_key, **kwargs)  # type: ignore[arg-type]

    def emit(self, ev: UsageEvent) -> None:
        """See Emitter.emit."""
        self._e.emit(ev)

    async def flush(self, timeout: float | None = None) -> None:
        """See Emitter.flush."""
        await asyncio.to_thread(self._e.flush, timeout)

    async def close(self, timeout: float = 10.0) -> None:
        """See Emitter.close."""
        await asyncio.to_thread(self._e.close, timeout)

    def stats(self) -> Stats:
        """See Emitter.stats."""
        return self._e.stats()

"""The dynamic batcher: gathers faces from every stream on one GPU into swap calls of 1 to `max_batch`.

Each stream's swap stage submits one request per frame (that frame's faces) with a deadline: the time
by which the frame should be encoded to stay inside its stream's latency budget. A batch goes out when

- it is full (`max_batch` faces are waiting for the same backend), or
- every stream that could still add to it is already waiting (`sources`: a stream waits for its
  requests before it sends more, so then nothing more can come; with one stream on a device, this
  spares each of its frames the whole `max_wait`), or
- the oldest waiting request has waited `max_wait` seconds, or
- waiting any longer would make the most urgent request miss its deadline (the expected run time of a
  batch, measured, is subtracted from the deadline).

What goes into a batch: the request with the earliest deadline decides the backend, then each other
stream waiting on that backend gets one slot in deadline order before any stream gets a second one
(so a stream with a backlog cannot crowd out a stream with one frame waiting), then the remaining
room goes by deadline. Batches run one at a time in the GPU's executor thread: one set of backends per
GPU, never called concurrently. With `max_in_flight` above 1, the next batch is handed to that
thread while one runs, so that it starts without a trip back through the loop; with
`one_per_stream`, a batch takes one request of each stream (the face analysis: a stream's frames are
tracked one after another, each batch after the last).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import Counter
from collections.abc import Callable, Collection, Hashable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

RunBatch = Callable[[Hashable, list[Any]], Sequence[Any]]
"""Runs one batch (blocking, in the executor): gets the backend key and the requests' payloads in
batch order; returns one result per payload (an Exception instance fails only that request)."""

BatchObserver = Callable[["BatchRecord"], None]
"""Told about every batch after it ran (for metrics)."""


@dataclass(frozen=True)
class BatchRecord:
    """What one batch was: for metrics and tests."""

    key: Hashable
    """Swap backend (or other key) the batch ran on."""
    streams: tuple[str, ...]
    """Stream of each request, in batch order."""
    faces: int
    """Faces in the batch (the swap call's batch size)."""
    deadlines: tuple[float, ...]
    """Each request's deadline, in batch order."""
    waited: float
    """Seconds the oldest request in the batch waited before the batch started."""
    seconds: float
    """Run time of the batch."""
    late: int
    """Requests whose deadline had passed when the batch finished."""


def batch_weight(faces: int) -> int:
    """A frame's share of a swap batch: its faces, and 1 for a frame without any (it still takes a
    slot of the batch). The one count of the batcher, the swap thread's shares and a stream's drain."""
    return max(1, faces)


@dataclass
class _Request:
    stream_id: str
    key: Hashable
    faces: int
    deadline: float
    payload: Any
    enqueued: float
    seq: int
    future: asyncio.Future[Any] = field(repr=False)


class DynamicBatcher:
    """Batches swap requests from many streams for one device's swap backends. Start it in a loop."""

    def __init__(self, run: RunBatch, *, max_batch: int = 4, max_wait: float = 0.004,
                 executor: Executor | None = None, observer: BatchObserver | None = None,
                 name: str = "batcher", sources: Callable[[], Collection[str]] | None = None,
                 max_in_flight: int = 1, one_per_stream: bool = False) -> None:
        if not 1 <= max_batch <= 64:
            raise ValueError(f"max_batch must be 1..64, got {max_batch}")
        if not 1 <= max_in_flight <= 8:
            raise ValueError(f"max_in_flight must be 1..8, got {max_in_flight}")
        if max_wait < 0:
            raise ValueError(f"max_wait must be >= 0 seconds, got {max_wait}")
        self._run = run
        self.max_batch = max_batch
        self.max_wait = max_wait
        self._executor = executor
        self._observer = observer
        self.name = name
        self._sources = sources
        """The ids of the streams that may submit (None: unknown, so a batch waits out `max_wait`)."""
        self.max_in_flight = max_in_flight
        self.one_per_stream = one_per_stream
        self._in_flight: set[asyncio.Task[None]] = set()
        self._pending: list[_Request] = []
        self._seq = itertools.count()
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        # Expected run time of a batch per backend (an exponential average of what was measured):
        # how early before a deadline a batch must start.
        self._run_estimate: dict[Hashable, float] = {}
        self.batches = 0
        self.sizes: Counter[int] = Counter()
        """Batch size (faces) -> how many batches had it."""
        self.late = 0
        """Requests finished after their deadline."""

    # -- life cycle -----------------------------------------------------------------------------

    def start(self) -> None:
        """Start dispatching, in the running loop."""
        if self._task is None:
            self._wake = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._loop(), name=self.name)

    async def close(self) -> None:
        """Stop dispatching; waiting requests fail with CancelledError."""
        # The dispatching loop first: a batch in flight that is cancelled below wakes it, and it
        # would send the waiting requests out as a new batch.
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        for t in list(self._in_flight):
            t.cancel()
        await asyncio.gather(*self._in_flight, return_exceptions=True)
        for r in self._pending:
            r.future.cancel()
        self._pending.clear()

    def pending(self) -> int:
        """Requests waiting for a batch."""
        return len(self._pending)

    # -- submitting -----------------------------------------------------------------------------

    async def submit(self, stream_id: str, key: Hashable, faces: int, deadline: float,
                     payload: Any) -> Any:
        """Queue one frame's faces for backend `key`; returns its result once its batch has run.

        `deadline` is in the loop's clock (`loop.time()`). Cancelling the caller withdraws the
        request if its batch has not started.
        """
        if self._task is None or self._wake is None:
            raise RuntimeError("DynamicBatcher.submit before start()")
        loop = asyncio.get_running_loop()
        req = _Request(stream_id, key, batch_weight(faces), deadline, payload, loop.time(),
                       next(self._seq), loop.create_future())
        self._pending.append(req)
        self._wake.set()
        return await req.future

    # -- dispatching ----------------------------------------------------------------------------

    def _ready_at(self) -> float:
        """Loop time at which a batch must go out (<= now: go now)."""
        head = min(self._pending, key=lambda r: (r.deadline, r.seq))
        same = [r for r in self._pending if r.key == head.key]
        # One request of a stream per batch (`one_per_stream`): a stream's later ones do not fill it.
        fill = sum({r.stream_id: r.faces for r in same}.values()) if self.one_per_stream else sum(r.faces for r in same)
        if fill >= self.max_batch:
            return float("-inf")
        if self._sources is not None:
            sources = self._sources()
            if sources and set(sources) <= {r.stream_id for r in self._pending}:
                return float("-inf")
        oldest = min(r.enqueued for r in same)
        return min(oldest + self.max_wait, head.deadline - self._run_estimate.get(head.key, 0.0))

    def select(self) -> list[_Request]:
        """Take the next batch out of the waiting requests (see the module docstring)."""
        head = min(self._pending, key=lambda r: (r.deadline, r.seq))
        same = sorted((r for r in self._pending if r.key == head.key), key=lambda r: (r.deadline, r.seq))
        batch = [head]
        faces = head.faces
        streams = {head.stream_id}
        # First pass: one slot per waiting stream, by deadline. Second pass: the rest by deadline.
        for first_pass in (True,) if self.one_per_stream else (True, False):
            for r in same:
                if r in batch or (first_pass and r.stream_id in streams):
                    continue
                if faces + r.faces > self.max_batch:
                    continue
                batch.append(r)
                streams.add(r.stream_id)
                faces += r.faces
        for r in batch:
            self._pending.remove(r)
        return batch

    async def _loop(self) -> None:
        assert self._wake is not None
        loop = asyncio.get_running_loop()
        while True:
            self._pending = [r for r in self._pending if not r.future.done()]  # withdrawn requests
            if not self._pending or len(self._in_flight) >= self.max_in_flight:
                self._wake.clear()
                await self._wake.wait()
                continue
            delay = self._ready_at() - loop.time()
            if delay > 0:
                self._wake.clear()
                try:
                    # A new request may fill the batch (or be more urgent) before the timer runs out.
                    await asyncio.wait_for(self._wake.wait(), delay)
                except TimeoutError:
                    pass
                continue
            batch = self.select()
            if self.max_in_flight == 1:
                await self._dispatch(loop, batch)
                continue
            # Handed to the executor now, behind the batch that runs (its thread runs them in
            # turn); the loop comes back here for the next one.
            task = loop.create_task(self._dispatch(loop, batch), name=f"{self.name}-batch")
            self._in_flight.add(task)
            task.add_done_callback(self._landed)

    def _landed(self, task: asyncio.Task[None]) -> None:
        """A batch in flight came back: room for the next one."""
        self._in_flight.discard(task)
        if not task.cancelled() and task.exception() is not None:
            # `_dispatch` answers its requests with a runner's failure; what gets here is a fault
            # of the batcher's own, which nobody awaits.
            log.error("%s: a batch failed outside its runner", self.name, exc_info=task.exception())
        if self._wake is not None:
            self._wake.set()

    async def _dispatch(self, loop: asyncio.AbstractEventLoop, batch: list[_Request]) -> None:
        key = batch[0].key
        t0 = loop.time()
        started: list[float] = []

        def run(payloads: list[Any]) -> Sequence[Any]:
            # When the executor took it up: a batch handed over while another ran (`max_in_flight`)
            # waited for that one in the executor's queue, which is not its run time.
            started.append(time.monotonic())
            return self._run(key, payloads)

        try:
            results = await loop.run_in_executor(self._executor, run, [r.payload for r in batch])
            if len(results) != len(batch):
                raise RuntimeError(f"batch runner returned {len(results)} results for "
                                   f"{len(batch)} requests")
        except asyncio.CancelledError:
            for r in batch:
                r.future.cancel()
            raise
        except Exception as e:  # the backend failed: every request of this batch fails with it
            log.exception("%s: batch on %s failed", self.name, key)
            results = [e] * len(batch)
        t1 = loop.time()
        if self.max_in_flight > 1 and started:
            t0 = max(t0, started[0])  # the loop's clock is time.monotonic() (asyncio's default)
        took = t1 - t0
        prev = self._run_estimate.get(key)
        self._run_estimate[key] = took if prev is None else 0.8 * prev + 0.2 * took
        faces = sum(r.faces for r in batch)
        late = sum(1 for r in batch if r.deadline < t1)
        self.batches += 1
        self.sizes[faces] += 1
        self.late += late
        for r, res in zip(batch, results):
            if r.future.done():
                continue
            if isinstance(res, BaseException):
                r.future.set_exception(res)
            else:
                r.future.set_result(res)
        if self._observer is not None:
            self._observer(BatchRecord(key, tuple(r.stream_id for r in batch), faces,
                                       tuple(r.deadline for r in batch),
                                       t0 - min(r.enqueued for r in batch), took, late))

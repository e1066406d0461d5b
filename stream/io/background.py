"""Encoder calls on a thread of their own, so that x264 runs while the next frame is analysed.

On a CPU-only machine the file and live loops spend about as long in x264 (and its RGB -> YUV
conversion) as in face analysis plus the swap. PyAV releases the GIL while FFmpeg converts and
encodes, so handing the writes to one background thread lets the two overlap on two cores: the loop
analyses and swaps frame N+1 while frame N is encoded.

The calls run one at a time, in the order they were submitted (audio stays interleaved with video as
the loop wrote it). At most `depth` calls wait: a loop faster than its encoder blocks rather than
queue frames without bound (a live loop's input pump then drops frames, as it would without the
thread). A call that raises stops the thread; the error is raised again in the submitting thread at
its next `submit` or at `close`.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

_STOP = object()


class BackgroundCalls:
    """Runs submitted calls in order on one daemon thread. Use as a context manager, or call
    `close` (drain and join) or `abandon` (drop what waits and join)."""

    def __init__(self, *, depth: int = 2, name: str = "encoder") -> None:
        if depth < 1:
            raise ValueError(f"depth must be at least 1, got {depth}")
        self._q: queue.Queue[Any] = queue.Queue(maxsize=depth)
        self._error: BaseException | None = None
        self._abandoned = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._q.get()
            if item is _STOP:
                return
            if self._error is not None or self._abandoned.is_set():
                continue  # after a failure or an abandon: drain without running, so submit never blocks
            fn, args = item
            try:
                fn(*args)
            except BaseException as e:  # raised again in the submitting thread
                self._error = e

    def _raise(self) -> None:
        if self._error is not None:
            e, self._error = self._error, None
            raise e

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        """Queue `fn(*args)`; blocks while `depth` calls wait. Raises the error of an earlier call."""
        self._raise()
        if not self._thread.is_alive():
            raise RuntimeError("BackgroundCalls.submit after close")
        self._q.put((fn, args))

    def close(self) -> None:
        """Run every queued call, stop the thread, and raise the first error a call raised."""
        if self._thread.is_alive():
            self._q.put(_STOP)
            self._thread.join()
        self._raise()

    def abandon(self) -> None:
        """Stop after the call now running (if any); queued calls are dropped, errors forgotten.
        For a loop that is failing anyway: its own error is the one to report."""
        self._abandoned.set()
        if self._thread.is_alive():
            self._q.put(_STOP)
            self._thread.join()
        self._error = None

    def __enter__(self) -> BackgroundCalls:
        return self

    def __exit__(self, exc_type: Any, *_exc: Any) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abandon()


_END = object()

HOLD = object()
"""What a `ReadAhead` source yields after its last item to keep its resources open until the
consumer closes the reader: the consumer sees the end at once, and the source's teardown (its
code after this yield, run by GeneratorExit) happens inside `ReadAhead.close`, not beside the
consumer's last items. NVDEC's release holds the GIL for about 100 ms; run at the end of the input,
it stalled a file job's last frame by 160-265 ms on the H200."""


class ReadAhead:
    """Iterates `source` on a thread of its own, up to `depth` items ahead of the consumer.

    For an input whose next item costs host time that does not hold the GIL (NVDEC's decode call,
    1.6 ms a 1080p frame on the H200 machine, holds it for 0.03 ms): the consumer works on item N
    while item N+1 is produced. `depth` also bounds how far the producer may run ahead, which a
    ring of reusable buffers relies on: a producer that takes one of `n` slots per item may run
    `n - 2` items ahead of a consumer that gives a slot back while it handles the next item.

    The source is created, iterated and closed in the producer thread (`make` builds it there, so
    that thread-bound state, such as a decoder's CUDA stream, lives there). An error in the source is
    raised in the consumer at the item where it happened; `close` (also after an error, and on an
    early stop) stops the producer and joins it. A source that yields `HOLD` after its last item is
    closed only then (see HOLD): its consumer must call `close`, or the source stays open."""

    def __init__(self, make: Callable[[], Any], *, depth: int = 2, name: str = "read-ahead") -> None:
        if depth < 1:
            raise ValueError(f"depth must be at least 1, got {depth}")
        self._q: queue.Queue[Any] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._done = False
        self._thread = threading.Thread(target=self._run, args=(make,), name=name, daemon=True)
        self._thread.start()

    def _put(self, item: Any) -> bool:
        """Queue `item` unless the consumer stopped; False once it has."""
        while not self._stop.is_set():
            try:
                self._q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self, make: Callable[[], Any]) -> None:
        source = None
        try:
            source = make()
            for item in source:
                if item is HOLD:
                    # The consumer gets the end now; the source stays open until `close`.
                    if self._put(_END):
                        self._stop.wait()
                    break
                if not self._put(item):
                    break
            else:
                self._put(_END)
        except BaseException as e:  # handed to the consumer, raised there
            self._put(_Failed(e))
        finally:
            close = getattr(source, "close", None)
            if close is not None:
                try:
                    close()  # a generator's `finally` (its decoder, its file) runs here, in its thread
                except Exception:  # noqa: BLE001 - the consumer has its items; a release that fails is logged
                    # After HOLD the consumer has seen the end, so there is no item to raise this at.
                    log.exception("%s: releasing the source failed", threading.current_thread().name)

    def __iter__(self) -> ReadAhead:
        return self

    def __next__(self) -> Any:
        if self._done:
            raise StopIteration
        item = self._q.get()
        if item is _END:
            self._done = True
            raise StopIteration
        if isinstance(item, _Failed):
            self._done = True
            raise item.error
        return item

    def close(self) -> None:
        self._done = True
        self._stop.set()
        while self._thread.is_alive():
            try:  # unblock a producer waiting on a full queue
                self._q.get(timeout=0.1)
            except queue.Empty:
                pass
        self._thread.join()


class _Failed:
    def __init__(self, error: BaseException) -> None:
        self.error = error

"""Rings of reusable buffers whose reuse is ordered by events: the double buffering between host and GPU.

A slot is handed out for writing only once the asynchronous work that last read it has finished, so
the copy of frame n can run while frame n+1 is being prepared (or computed), and a producer that
runs ahead is held back instead of overwriting a buffer still in flight (back-pressure). Slots go
round in order, so frames leave in the order they came.

The ring knows nothing about CUDA: an event is anything with `synchronize()` and a `done` property (CuPy
events on the GPU; `HostEvent` on the CPU, which the tests use with a worker thread standing in for a
copy engine).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

T = TypeVar("T")


class EventLike(Protocol):
    """What a CuPy event offers: `done` (has the marked work finished?) and `synchronize()`."""

    @property
    def done(self) -> bool: ...

    def synchronize(self) -> None: ...


class HostEvent:
    """A CPU event: set when the work it marks is done (a `threading.Event` with CUDA's method names)."""

    def __init__(self, done: bool = False) -> None:
        self._ev = threading.Event()
        if done:
            self._ev.set()

    def record_done(self) -> None:
        self._ev.set()

    def synchronize(self) -> None:
        self._ev.wait()

    @property
    def done(self) -> bool:
        return self._ev.is_set()


@dataclass
class Slot(Generic[T]):
    """One buffer of a ring, the event that guards its reuse, and what it currently holds."""

    index: int
    buffer: T
    event: EventLike | None = None
    """Marks the end of the last asynchronous work that reads or writes `buffer`."""
    tag: Any = None
    """The caller's label for the contents (e.g. the frame's pts), for ordering checks."""
    waits: int = field(default=0)
    """How many times acquiring this slot had to wait for its event (back-pressure seen)."""


class Ring(Generic[T]):
    """`n` buffers used round-robin; `acquire` blocks until the next one is free."""

    def __init__(self, n: int, make_buffer: Callable[[int], T]) -> None:
        if n < 2:
            raise ValueError(f"a ring needs at least 2 slots to overlap work, got {n}")
        self.slots: list[Slot[T]] = [Slot(i, make_buffer(i)) for i in range(n)]
        self._next = 0
        self.acquired = 0
        self.stalls = 0
        """Acquisitions that had to wait: the consumer side was the bottleneck."""

    def acquire(self, tag: Any = None) -> Slot[T]:
        """The next slot in order, once the work last recorded on it has finished."""
        slot = self.slots[self._next]
        self._next = (self._next + 1) % len(self.slots)
        if slot.event is not None and not slot.event.done:
            self.stalls += 1
            slot.waits += 1
            slot.event.synchronize()
        slot.event = None
        slot.tag = tag
        self.acquired += 1
        return slot

    def release(self, slot: Slot[T], event: EventLike) -> None:
        """Mark `slot` busy until `event`: it will not be handed out again before that."""
        slot.event = event

    def drain(self) -> None:
        """Wait for every outstanding event (end of stream)."""
        for slot in self.slots:
            if slot.event is not None:
                slot.event.synchronize()

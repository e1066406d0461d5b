"""The live queue between two stages of one stream: bounded, never blocks the producer.

A live stream must not build up latency. When the consumer falls behind, `put` drops the oldest
waiting item (the one that would be the most out of date by the time it came out) and counts it.
Items leave in the order they came in, and an item whose pts is not after the last one accepted is
refused and counted too: once a later frame has been let through, an earlier one can never be shown.

The queue belongs to one asyncio loop; producers in other threads hand items over with
`loop.call_soon_threadsafe(queue.put, item)`.

It depends on nothing else of the package: the runtime's streams (`runtime.stream`) and the WebRTC
tracks (`live.webrtc`) both use it, and `live` never imports `runtime`.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class QueueClosed(Exception):
    """`get` on a queue that was closed and is empty: the stream is ending."""


class DropOldestQueue(Generic[T]):
    """A bounded FIFO for one asyncio loop: a full queue drops its oldest item to take a new one."""

    def __init__(self, maxsize: int, *, pts_of: Callable[[T], int | None] | None = None,
                 name: str = "queue") -> None:
        if maxsize < 1:
            raise ValueError(f"queue '{name}': maxsize must be at least 1, got {maxsize}")
        self.maxsize = maxsize
        self.name = name
        self._pts_of = pts_of
        self._items: deque[T] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._closed = False
        self._last_pts: int | None = None
        self.put_count = 0
        """Items offered to the queue."""
        self.dropped = 0
        """Items dropped because the queue was full (the oldest waiting ones)."""
        self.refused = 0
        """Items refused because the queue had been closed."""
        self.out_of_order = 0
        """Items refused because their pts was not after the last accepted one."""

    def qsize(self) -> int:
        return len(self._items)

    @property
    def closed(self) -> bool:
        return self._closed

    def put(self, item: T) -> T | None:
        """Add `item`; returns the item dropped to make room (or the refused item), else None."""
        if self._closed:
            # A frame that arrives while the stream stops: refused, and counted so that every frame
            # read is either encoded or counted as dropped.
            self.refused += 1
            return item
        self.put_count += 1
        if self._pts_of is not None:
            pts = self._pts_of(item)
            if pts is not None:
                if self._last_pts is not None and pts <= self._last_pts:
                    self.out_of_order += 1
                    return item
                self._last_pts = pts
        dropped = None
        if len(self._items) >= self.maxsize:
            dropped = self._items.popleft()
            self.dropped += 1
        self._items.append(item)
        self._wake()
        return dropped

    def get_nowait(self) -> T:
        if self._items:
            return self._items.popleft()
        if self._closed:
            raise QueueClosed(self.name)
        raise asyncio.QueueEmpty

    async def get(self) -> T:
        """The oldest waiting item; waits for one. Raises QueueClosed once closed and drained."""
        while not self._items:
            if self._closed:
                raise QueueClosed(self.name)
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._items.popleft()

    async def wait_for_items(self, n: int, seconds: float, weight: Callable[[T], int] | None = None) -> None:
        """Wait until `n` items wait (or items of `n` in `weight` together), the queue is closed, or
        `seconds` have passed (one consumer: the same that calls `get`). Takes nothing: `drain` does."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while self._weight(weight) < n and not self._closed:
            left = deadline - loop.time()
            if left <= 0:
                return
            self._waiter = loop.create_future()
            timer = loop.call_later(left, self._wake)
            try:
                await self._waiter
            finally:
                timer.cancel()
                self._waiter = None

    def _weight(self, weight: Callable[[T], int] | None) -> int:
        return len(self._items) if weight is None else sum(weight(i) for i in self._items)

    def drain(self, limit: int, weight: Callable[[T], int] | None = None) -> list[T]:
        """Waiting items, oldest first, without waiting: up to `limit` of them, or (with `weight`)
        those that fit in `limit` together, up to the first that does not."""
        out: list[T] = []
        used = 0
        while self._items:
            w = 1 if weight is None else weight(self._items[0])
            if used + w > limit:
                break
            out.append(self._items.popleft())
            used += w
        return out

    def close(self) -> None:
        """No more items: `get` returns what is left, then raises QueueClosed."""
        self._closed = True
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

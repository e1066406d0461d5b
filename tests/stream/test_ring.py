"""The double-buffer ring on the CPU: order, back-pressure, nothing lost or duplicated.

A worker thread stands in for a copy engine: it "copies" each slot's buffer after a random delay
and then signals the slot's event, exactly as a CUDA event would complete.
"""

from __future__ import annotations

import queue
import random
import threading
import time

import numpy as np
import pytest

from swapstream.gpu.ring import HostEvent, Ring


def copy_engine(jobs: "queue.Queue[tuple | None]", out: list[int], delay: float) -> None:
    while True:
        job = jobs.get()
        if job is None:
            return
        src, event = job
        time.sleep(random.uniform(0, delay))
        out.append(int(src[0]))  # the "device copy" reads the slot's contents now
        event.record_done()


@pytest.mark.parametrize("slots", [2, 3])
def test_ring_keeps_order_and_loses_nothing(slots: int) -> None:
    ring = Ring(slots, lambda _i: np.zeros(4, np.int64))
    jobs: queue.Queue = queue.Queue()
    seen: list[int] = []
    worker = threading.Thread(target=copy_engine, args=(jobs, seen, 0.002))
    worker.start()
    n = 400
    for i in range(n):
        slot = ring.acquire(tag=i)
        # If the ring handed out a slot still being copied, the copy would read a later frame.
        slot.buffer[:] = i
        ev = HostEvent()
        ring.release(slot, ev)
        jobs.put((slot.buffer, ev))
    ring.drain()
    jobs.put(None)
    worker.join()
    assert seen == list(range(n))  # in order, none lost, none duplicated, none overwritten early
    assert ring.acquired == n


def test_ring_applies_back_pressure_to_a_fast_producer() -> None:
    ring = Ring(2, lambda _i: np.zeros(1))
    slow = HostEvent()
    first = ring.acquire()
    ring.release(first, slow)
    second = ring.acquire()
    ring.release(second, HostEvent(done=True))
    got = []

    def producer() -> None:
        got.append(ring.acquire())  # slot 0 again: must wait for `slow`

    t = threading.Thread(target=producer)
    t.start()
    time.sleep(0.05)
    assert not got and t.is_alive()  # held back while the copy is in flight
    slow.record_done()
    t.join(timeout=2)
    assert got and got[0] is first
    assert ring.stalls == 1


def test_ring_needs_two_slots() -> None:
    with pytest.raises(ValueError, match="at least 2"):
        Ring(1, lambda _i: None)

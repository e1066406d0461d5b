"""The live drop policy: a full queue drops its oldest item, counts it, and frames leave in pts order."""

from __future__ import annotations

import asyncio
import threading

import pytest

from swapstream.queues import DropOldestQueue, QueueClosed


def test_full_queue_drops_the_oldest_and_counts_it() -> None:
    q: DropOldestQueue[int] = DropOldestQueue(3, pts_of=lambda x: x)
    dropped = [q.put(i) for i in range(10)]
    assert dropped == [None, None, None, 0, 1, 2, 3, 4, 5, 6]
    assert q.dropped == 7 and q.put_count == 10 and q.qsize() == 3
    assert q.drain(10) == [7, 8, 9]  # the newest survive, in order


def test_a_frame_older_than_one_already_accepted_is_refused() -> None:
    q: DropOldestQueue[int] = DropOldestQueue(8, pts_of=lambda x: x)
    for p in (0, 1, 5, 3, 5, 6):
        q.put(p)
    assert q.drain(10) == [0, 1, 5, 6]
    assert q.out_of_order == 2


def test_slow_consumer_fed_from_a_thread_gets_increasing_pts_and_every_loss_is_counted() -> None:
    """A producer thread at full speed, a consumer that is slower: what comes out is strictly
    increasing, and frames in = frames out + dropped."""

    async def main() -> tuple[list[int], DropOldestQueue[int]]:
        loop = asyncio.get_running_loop()
        q: DropOldestQueue[int] = DropOldestQueue(2, pts_of=lambda x: x)

        def produce() -> None:
            for i in range(300):
                loop.call_soon_threadsafe(q.put, i)
                if i % 10 == 0:
                    threading.Event().wait(0.002)
            loop.call_soon_threadsafe(q.close)

        threading.Thread(target=produce).start()
        out: list[int] = []
        while True:
            try:
                out.append(await q.get())
            except QueueClosed:
                break
            await asyncio.sleep(0.001)  # slower than the producer
        return out, q

    out, q = asyncio.run(main())
    assert out == sorted(out) and len(set(out)) == len(out)
    assert out[-1] == 299  # the newest frame always gets through
    assert len(out) + q.dropped == 300 and q.dropped > 0


def test_close_lets_the_consumer_finish_what_is_waiting() -> None:
    async def main() -> list[int]:
        q: DropOldestQueue[int] = DropOldestQueue(4)
        q.put(1)
        q.put(2)
        q.close()
        assert q.put(3) == 3  # refused after close
        assert q.refused == 1 and q.dropped == 0  # and counted, apart from the live policy's drops
        got = [await q.get(), await q.get()]
        with pytest.raises(QueueClosed):
            await q.get()
        return got

    assert asyncio.run(main()) == [1, 2]


def test_size_must_be_positive() -> None:
    with pytest.raises(ValueError, match="queue 'in': maxsize must be at least 1, got 0"):
        DropOldestQueue(0, name="in")


def test_waiting_for_items_ends_when_enough_wait_when_closed_or_when_time_is_up() -> None:
    """`wait_for_items` (a file's swap batch): returns once `n` items wait, at a close, or after its
    time, and takes nothing."""

    async def main() -> list[float]:
        loop = asyncio.get_running_loop()
        took = []
        q: DropOldestQueue[int] = DropOldestQueue(8)
        for i in range(2):
            loop.call_later(0.02 * (i + 1), q.put, i)
        t = loop.time()
        await q.wait_for_items(2, 5.0)
        took.append(loop.time() - t)
        assert q.drain(8) == [0, 1]
        t = loop.time()
        await q.wait_for_items(3, 0.1)  # nothing comes: the time is up
        took.append(loop.time() - t)
        q.put(5)
        loop.call_later(0.03, q.close)
        t = loop.time()
        await q.wait_for_items(3, 5.0)
        took.append(loop.time() - t)
        assert q.drain(8) == [5]
        with pytest.raises(QueueClosed):
            await q.get()
        return took

    took = asyncio.run(main())
    # Upper bounds with room for a loaded CI machine; each is far below the 5 s the wait allowed.
    assert 0.03 <= took[0] < 1.0 and 0.09 <= took[1] < 1.0 and 0.02 <= took[2] < 1.0, took


def test_weighted_waiting_and_draining_count_what_each_item_weighs() -> None:
    """With a weight (a frame's faces, for a file's swap batch): the wait ends once the items weigh
    enough together, and `drain` takes them in order up to the first that does not fit."""

    async def main() -> list[list[int]]:
        loop = asyncio.get_running_loop()
        q: DropOldestQueue[int] = DropOldestQueue(8)
        q.put(2)
        loop.call_later(0.02, q.put, 1)
        loop.call_later(0.5, q.put, 3)
        await q.wait_for_items(3, 5.0, weight=lambda x: x)  # 2, then 2 + 1: enough at the second
        assert q.qsize() == 2  # it did not wait for the third item
        got = [q.drain(3, weight=lambda x: x)]  # 2 + 1 fit in 3
        await q.wait_for_items(1, 5.0, weight=lambda x: x)
        got.append(q.drain(2, weight=lambda x: x))  # 3 does not fit in 2: nothing, it stays
        got.append(q.drain(3, weight=lambda x: x))
        return got

    assert asyncio.run(main()) == [[2, 1], [], [3]]

"""stream/io/background.py: the encoder thread of the file and live loops keeps the calls' order,
bounds what waits, and hands its errors back to the loop."""

from __future__ import annotations

import threading
from collections.abc import Iterator
import time

import pytest

from swapstream.io.background import BackgroundCalls


def test_calls_run_in_order_on_another_thread() -> None:
    seen: list[tuple[int, str]] = []
    with BackgroundCalls(depth=2) as bg:
        for i in range(50):
            bg.submit(lambda i=i: seen.append((i, threading.current_thread().name)))
    assert [i for i, _ in seen] == list(range(50))
    assert {name for _, name in seen} == {"encoder"}


def test_submit_blocks_while_depth_calls_wait() -> None:
    gate = threading.Event()
    bg = BackgroundCalls(depth=1)
    bg.submit(gate.wait)          # running
    bg.submit(lambda: None)       # waiting: the queue is full now
    t0 = time.monotonic()
    threading.Timer(0.3, gate.set).start()
    bg.submit(lambda: None)       # blocks until the first call returns
    assert time.monotonic() - t0 >= 0.25
    bg.close()


def test_an_error_is_raised_in_the_submitting_thread() -> None:
    ran: list[int] = []

    def boom() -> None:
        raise OSError("output gone")

    bg = BackgroundCalls(depth=4)
    bg.submit(boom)
    bg.submit(ran.append, 1)  # after a failure, queued calls are not run
    with pytest.raises(OSError, match="output gone"):
        bg.close()
    assert ran == []


def test_error_at_next_submit() -> None:
    def boom() -> None:
        raise ValueError("bad frame")

    bg = BackgroundCalls(depth=1)
    bg.submit(boom)
    time.sleep(0.2)
    with pytest.raises(ValueError, match="bad frame"):
        bg.submit(lambda: None)
    bg.abandon()


def test_leaving_with_an_error_drops_queued_calls() -> None:
    ran: list[int] = []
    gate = threading.Event()
    with pytest.raises(KeyError):
        with BackgroundCalls(depth=4) as bg:
            bg.submit(gate.wait, 5.0)
            bg.submit(ran.append, 1)
            threading.Timer(0.2, gate.set).start()
            raise KeyError("the loop failed")
    assert ran == []


def test_read_ahead_keeps_order_and_bounds_how_far_it_runs() -> None:
    from swapstream.io.background import ReadAhead

    produced: list[int] = []
    consumed: list[int] = []
    threads: set[str] = set()

    def source() -> Iterator[int]:
        threads.add(threading.current_thread().name)
        for i in range(50):
            produced.append(i)
            yield i

    ahead = ReadAhead(source, depth=2, name="reader")
    for item in ahead:
        time.sleep(0.002)  # a consumer slower than its producer
        # Queued (2) and the one the producer holds while it waits: never more ahead than that.
        assert len(produced) - 1 - item <= 3
        consumed.append(item)
    ahead.close()
    assert consumed == list(range(50)) and threads == {"reader"}


def test_read_ahead_raises_the_sources_error_where_it_happened() -> None:
    from swapstream.io.background import ReadAhead

    def source() -> Iterator[int]:
        yield 1
        yield 2
        raise ValueError("corrupt packet")

    ahead = ReadAhead(source)
    got = []
    with pytest.raises(ValueError, match="corrupt packet"):
        for item in ahead:
            got.append(item)
    ahead.close()
    assert got == [1, 2]


def test_read_ahead_stopped_early_closes_its_source_in_its_thread() -> None:
    from swapstream.io.background import ReadAhead

    closed_in: list[str] = []

    def source() -> Iterator[int]:
        try:
            for i in range(10_000):
                yield i
        finally:  # the decoder and the file are released by the thread that used them
            closed_in.append(threading.current_thread().name)

    ahead = ReadAhead(source, depth=2, name="reader")
    assert next(ahead) == 0
    ahead.close()
    assert closed_in == ["reader"]
    with pytest.raises(StopIteration):
        next(ahead)


def test_read_ahead_holds_a_source_open_until_closed() -> None:
    """A source that yields HOLD after its last item: the consumer sees the end at once, and the
    source's teardown waits for `close` (a decoder's release would otherwise run beside the
    consumer's last frames), then runs in the reader's thread."""
    from swapstream.io.background import HOLD, ReadAhead

    closed_in: list[str] = []

    def source() -> Iterator[object]:
        try:
            yield from range(5)
            yield HOLD
            yield 99  # never reached: HOLD is the end
        finally:
            closed_in.append(threading.current_thread().name)

    ahead = ReadAhead(source, depth=2, name="reader")
    assert list(ahead) == [0, 1, 2, 3, 4]
    time.sleep(0.2)  # room for a producer that wrongly went on to tear the source down
    assert closed_in == []
    ahead.close()
    assert closed_in == ["reader"]

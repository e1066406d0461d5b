"""The dynamic batcher on a real asyncio loop and a real executor thread: batch sizes, the maximum
wait, earliest-deadline-first and fairness between streams.

Timings are checked with slack: other test processes share these 2 cores."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Hashable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from swapstream.runtime.batcher import BatchRecord, DynamicBatcher


class Recorder:
    """A batch runner that records what it was given; `gate` holds the worker to build a backlog."""

    def __init__(self) -> None:
        self.calls: list[tuple[Hashable, list[Any]]] = []
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self, key: Hashable, payloads: list[Any]) -> list[Any]:
        self.gate.wait(10)
        self.calls.append((key, list(payloads)))
        return [("done", p) for p in payloads]


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_a_lone_request_waits_max_wait_then_goes_alone() -> None:
    async def main() -> tuple[float, list[BatchRecord]]:
        rec = Recorder()
        seen: list[BatchRecord] = []
        with ThreadPoolExecutor(1) as pool:
            b = DynamicBatcher(rec, max_batch=4, max_wait=0.08, executor=pool, observer=seen.append)
            b.start()
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            res = await b.submit("a", "mesh", 1, t0 + 10.0, "f0")
            took = loop.time() - t0
            await b.close()
        assert res == ("done", "f0")
        return took, seen

    took, seen = run(main())
    assert [r.faces for r in seen] == [1]
    # It waited for company up to max_wait (80 ms), not much longer.
    assert 0.075 <= took < 0.3, took
    assert seen[0].waited >= 0.075


def test_a_batch_goes_at_once_when_every_stream_that_could_add_to_it_is_waiting() -> None:
    """`sources`: one stream on the device goes without the wait; of two, the first waits for the
    second (up to max_wait), and both go together as soon as it comes."""
    async def main() -> tuple[float, float, list[BatchRecord]]:
        rec = Recorder()
        seen: list[BatchRecord] = []
        streams = {"a"}
        with ThreadPoolExecutor(1) as pool:
            b = DynamicBatcher(rec, max_batch=4, max_wait=2.0, executor=pool, observer=seen.append,
                               sources=lambda: streams)
            b.start()
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            await b.submit("a", "mesh", 1, t0 + 10.0, "f0")
            alone = loop.time() - t0
            streams.add("b")
            t0 = loop.time()
            first = asyncio.ensure_future(b.submit("a", "mesh", 1, t0 + 10.0, "f1"))
            await asyncio.sleep(0.3)
            assert not first.done()  # "b" may still come: it waits (max_wait is 2 s)
            await b.submit("b", "mesh", 1, t0 + 10.0, "g1")
            await first
            pair = loop.time() - t0
            await b.close()
        return alone, pair, seen

    alone, pair, seen = run(main())
    assert alone < 0.5, alone  # not the 2 s max_wait
    assert 0.3 <= pair < 1.2, pair
    assert [r.streams for r in seen] == [("a",), ("a", "b")]


def test_a_full_batch_goes_at_once_and_never_exceeds_max_batch() -> None:
    async def main() -> tuple[float, Recorder, list[BatchRecord]]:
        rec = Recorder()
        seen: list[BatchRecord] = []
        with ThreadPoolExecutor(1) as pool:
            b = DynamicBatcher(rec, max_batch=4, max_wait=5.0, executor=pool, observer=seen.append)
            b.start()
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            # Four one-face frames from four streams: full at once, no reason to wait 5 s.
            await asyncio.gather(*(b.submit(f"s{i}", "mesh", 1, t0 + 10, i) for i in range(4)))
            took = loop.time() - t0
            # Then 2-face frames: two of them fill a batch of 4; a third must go in the next one.
            rec.gate.clear()
            blocker = asyncio.ensure_future(b.submit("x", "mesh", 4, t0 + 1, "block"))
            await asyncio.sleep(0.05)
            jobs = [asyncio.ensure_future(b.submit(f"t{i}", "mesh", 2, t0 + 10 + i, i)) for i in range(3)]
            await asyncio.sleep(0.05)
            rec.gate.set()
            await blocker
            # The third 2-face frame is alone now: it goes after max_wait unless told otherwise;
            # a later request with a near deadline makes it go early (checked in its own test).
            b.max_wait = 0.01
            await asyncio.gather(*jobs)
            await b.close()
        return took, rec, seen

    took, rec, seen = run(main())
    assert took < 1.0, took
    assert [r.faces for r in seen] == [4, 4, 4, 2]
    assert all(r.faces <= 4 for r in seen)
    assert sorted(rec.calls[0][1]) == [0, 1, 2, 3]
    assert rec.calls[2][1] == [0, 1] and rec.calls[3][1] == [2]  # by deadline


def test_earliest_deadline_goes_first() -> None:
    async def main() -> list[Any]:
        rec = Recorder()
        with ThreadPoolExecutor(1) as pool:
            b = DynamicBatcher(rec, max_batch=1, max_wait=0.0, executor=pool)
            b.start()
            loop = asyncio.get_running_loop()
            now = loop.time()
            rec.gate.clear()  # the worker is busy: a backlog builds up
            first = asyncio.ensure_future(b.submit("busy", "mesh", 1, now, "busy"))
            await asyncio.sleep(0.05)
            deadlines = [0.9, 0.2, 0.5, 0.1, 0.7, 0.3]
            jobs = [asyncio.ensure_future(b.submit(f"s{i}", "mesh", 1, now + d, d))
                    for i, d in enumerate(deadlines)]
            await asyncio.sleep(0.05)
            rec.gate.set()
            await asyncio.gather(first, *jobs)
            await b.close()
        return [c[1][0] for c in rec.calls]

    order = run(main())
    assert order == ["busy", 0.1, 0.2, 0.3, 0.5, 0.7, 0.9]


def test_a_near_deadline_sends_a_partial_batch_before_max_wait() -> None:
    async def main() -> float:
        rec = Recorder()
        with ThreadPoolExecutor(1) as pool:
            b = DynamicBatcher(rec, max_batch=4, max_wait=2.0, executor=pool)
            b.start()
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            await b.submit("a", "mesh", 1, t0 + 0.05, "urgent")
            took = loop.time() - t0
            await b.close()
        return took

    took = run(main())
    assert took < 0.5, took  # went at its deadline (50 ms), not after max_wait (2 s)


def test_streams_share_batches_fairly_and_backends_never_mix() -> None:
    async def main() -> tuple[Recorder, list[BatchRecord]]:
        rec = Recorder()
        seen: list[BatchRecord] = []
        with ThreadPoolExecutor(1) as pool:
            b = DynamicBatcher(rec, max_batch=4, max_wait=0.0, executor=pool, observer=seen.append)
            b.start()
            loop = asyncio.get_running_loop()
            now = loop.time()
            rec.gate.clear()
            busy = asyncio.ensure_future(b.submit("busy", "mesh", 1, now, "busy"))
            await asyncio.sleep(0.05)
            # Stream A has a backlog of 8 frames, all more urgent than stream B's single frame;
            # stream C waits on another backend.
            jobs = [asyncio.ensure_future(b.submit("A", "mesh", 1, now + 0.01 * i, f"A{i}")) for i in range(8)]
            jobs.append(asyncio.ensure_future(b.submit("B", "mesh", 1, now + 1.0, "B0")))
            jobs.append(asyncio.ensure_future(b.submit("C", "inswapper", 1, now + 0.5, "C0")))
            await asyncio.sleep(0.05)
            rec.gate.set()
            await asyncio.gather(busy, *jobs)
            await b.close()
        return rec, seen

    rec, seen = run(main())
    batches = [(key, payloads) for key, payloads in rec.calls[1:]]
    # B is not starved behind A's backlog: it takes one slot of the first batch.
    assert batches[0] == ("mesh", ["A0", "B0", "A1", "A2"])
    assert batches[1] == ("mesh", ["A3", "A4", "A5", "A6"])
    # C's backend never shares a batch with mesh requests; it runs when its deadline is the earliest.
    assert ("inswapper", ["C0"]) in batches
    for key, payloads in batches:
        assert all(p.startswith("C") == (key == "inswapper") for p in payloads)
    assert all(r.faces <= 4 for r in seen)


def test_a_failing_batch_fails_its_requests_only() -> None:
    def runner(key: Hashable, payloads: list[Any]) -> list[Any]:
        return [ValueError(f"bad {p}") if p == "bad" else p for p in payloads]

    async def main() -> tuple[Any, Any]:
        with ThreadPoolExecutor(1) as pool:
            b = DynamicBatcher(runner, max_batch=4, max_wait=0.01, executor=pool)
            b.start()
            now = asyncio.get_running_loop().time()
            good, bad = await asyncio.gather(b.submit("a", "k", 1, now + 1, "good"),
                                             b.submit("b", "k", 1, now + 1, "bad"),
                                             return_exceptions=True)
            await b.close()
        return good, bad

    good, bad = run(main())
    assert good == "good"
    assert isinstance(bad, ValueError) and "bad bad" in str(bad)


def test_bad_settings_are_refused_with_the_value() -> None:
    with pytest.raises(ValueError, match="max_batch must be 1..64, got 0"):
        DynamicBatcher(lambda k, p: p, max_batch=0)
    with pytest.raises(ValueError, match="max_wait must be >= 0 seconds, got -1"):
        DynamicBatcher(lambda k, p: p, max_wait=-1)
    with pytest.raises(ValueError, match="max_in_flight must be 1..8, got 0"):
        DynamicBatcher(lambda k, p: p, max_in_flight=0)


@pytest.mark.parametrize("in_flight", [1, 2])
def test_the_next_batch_is_handed_over_while_one_runs_one_frame_of_a_stream_each(in_flight: int) -> None:
    """The analysis batcher (`max_in_flight=2`, `one_per_stream`): a stream's three requests go in
    three batches, in order; the second is handed to the executor while the first still runs (the
    worker, held for 0.3 s, finds it queued), which one batch in flight never does."""
    rec = Recorder()
    queued_while_running: list[int] = []

    async def main() -> list[Any]:
        with ThreadPoolExecutor(1) as pool:
            def runner(key: Hashable, payloads: list[Any]) -> list[Any]:
                if not rec.calls:  # the first batch: give the loop time to hand over the next
                    threading.Event().wait(0.3)
                queued_while_running.append(pool._work_queue.qsize())
                return rec(key, payloads)

            b = DynamicBatcher(runner, max_batch=4, max_wait=0.0, executor=pool, sources=lambda: ["a"],
                               max_in_flight=in_flight, one_per_stream=True)
            b.start()
            now = asyncio.get_running_loop().time()
            # Bounded: a batcher that is not woken when a batch lands would hang here.
            out = await asyncio.wait_for(
                asyncio.gather(*(b.submit("a", "analyse", 1, now + 1, f"f{i}") for i in range(3))), 10)
            await b.close()
        return out

    out = run(main())
    assert out == [("done", "f0"), ("done", "f1"), ("done", "f2")]
    assert [p for _k, p in rec.calls] == [["f0"], ["f1"], ["f2"]]
    # While the first batch ran, the second waited in the executor's queue only with two in flight.
    assert queued_while_running[0] == (1 if in_flight == 2 else 0), queued_while_running


def test_close_sends_nothing_more_with_batches_in_flight() -> None:
    """Closing while a batch runs and another waits in the executor's queue: the waiting requests
    are cancelled, and no batch goes out after `close()` (a batch that lands while the in-flight
    ones are cancelled must not wake a loop that sends the rest)."""
    gate = threading.Event()
    ran: list[list[Any]] = []

    def runner(key: Hashable, payloads: list[Any]) -> list[Any]:
        gate.wait(5)
        ran.append(list(payloads))
        return payloads

    async def main() -> tuple[list[Any], int]:
        with ThreadPoolExecutor(1) as pool:
            b = DynamicBatcher(runner, max_batch=2, max_wait=0.0, executor=pool, sources=lambda: ["a", "b", "c"],
                               max_in_flight=2, one_per_stream=True)
            b.start()
            now = asyncio.get_running_loop().time()
            reqs = [asyncio.ensure_future(b.submit(s, "analyse", 1, now + 5, f"{s}{i}"))
                    for i in range(2) for s in "abc"]
            await asyncio.sleep(0.1)  # two batches handed over, the first held by the gate
            await b.close()
            gate.set()
            results = await asyncio.gather(*reqs, return_exceptions=True)
        return results, b.batches

    results, _batches = run(main())
    # The batch that was running when the batcher closed may finish in the thread; nothing after it.
    assert len(ran) <= 2, ran
    assert all(isinstance(r, asyncio.CancelledError) for r in results), results

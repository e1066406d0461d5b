"""The WHIP relay's bookkeeping (`runtime.whip_relay.PoolRelay`): which sessions count against
`--max-sessions` and as streams of which worker, as the workers' load reports come in. The relay's
traffic with real worker processes is tested in tests/stream/test_whip_runtime.py."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from typing import Any

import pytest

from swapstream.config import load_config
from swapstream.runtime.whip_relay import REPORT_GRACE_S, WHIP_ID_PREFIX, PoolRelay, RelayedSession
from swapstream.runtime.workers import Worker, WorkerPool


@pytest.fixture
def pool() -> Iterator[WorkerPool]:
    """A pool of two workers that report ready; none is started (the relay only reads their state
    and reports)."""
    p = WorkerPool(load_config(None), devices=["cpu"], per_device=2)
    for w in p.workers:
        w.state = "ready"
    yield p
    shutil.rmtree(p._dir, ignore_errors=True)  # its socket folder, made at construction


def session(kind: str, w: Worker, age: float) -> RelayedSession:
    return RelayedSession(kind, w, time.monotonic() - age)


def report(w: Worker, sessions: list[str], at: float | None = None) -> None:
    w.load = {"rtc_sessions": sessions}
    w.load_at = time.monotonic() if at is None else at


def test_sessions_count_until_their_worker_stops_listing_them(pool: WorkerPool) -> None:
    w0, w1 = pool.workers
    relay = PoolRelay(pool, "mesh")
    old = REPORT_GRACE_S + 1
    relay.sessions_by_id = {"a" * 32: session("WHIP", w0, old), "b" * 32: session("WHIP", w1, old),
                            "c" * 32: session("WHEP", w0, old), "d" * 32: session("WHIP", w0, 0.1)}
    report(w0, ["a" * 32, "c" * 32])  # "d" is too young to be in a report yet: kept
    report(w1, [])  # "b" ended there (its publisher left without a DELETE)
    assert relay.sessions("WHIP") == 2 and relay.sessions("WHEP") == 1
    assert set(relay.sessions_by_id) == {"a" * 32, "c" * 32, "d" * 32}
    # A report taken before a session was made says nothing about it.
    relay.sessions_by_id["e" * 32] = session("WHIP", w1, old)
    report(w1, [], at=relay.sessions_by_id["e" * 32].created - 1.0)
    assert relay.sessions("WHIP") == 3
    # A worker that is not ready any more took its sessions with it.
    w0.state = "restarting"
    assert relay.sessions("WHIP") == 1 and relay.sessions("WHEP") == 0


def test_publishers_count_as_their_workers_streams_for_placement(pool: WorkerPool) -> None:
    w0, w1 = pool.workers
    relay = PoolRelay(pool, "mesh")
    assert pool.relay is relay
    relay.sessions_by_id = {"a" * 32: session("WHIP", w0, 0.0), "b" * 32: session("WHEP", w0, 0.0)}
    token: Any = object()
    relay.offering[id(token)] = w1  # an offer on its way to w1
    assert pool.streams_on(w0) == 1 and pool.streams_on(w1) == 1  # a viewer is not a stream
    # The API finds a publisher's stream on its worker.
    assert relay.stream_worker(WHIP_ID_PREFIX + "a" * 12) is w0
    assert pool.owner(WHIP_ID_PREFIX + "a" * 12).worker is w0
    assert relay.stream_worker(WHIP_ID_PREFIX + "b" * 12) is None
    # What a crash of w0 names (its log line): the publisher's stream, not the viewer.
    assert relay.streams_of(w0) == [WHIP_ID_PREFIX + "a" * 12] and relay.streams_of(w1) == []


def test_an_api_stream_cannot_take_a_publishers_id() -> None:
    """`whip-...` ids name WHIP publishers' streams (the API finds a publisher's stream by it): a
    request for one is refused with why, before anything is opened."""
    import asyncio

    from swapstream.runtime.manager import StreamRequestError, StreamRuntime
    from swapstream.runtime.stream import InputSpec, StreamSpec

    async def scenario() -> str:
        runtime = StreamRuntime(load_config("multi_stream"), devices=["cpu"])
        await runtime.start()
        try:
            await runtime.add_stream(StreamSpec(WHIP_ID_PREFIX + "0123456789ab", InputSpec("rtmp://127.0.0.1/live/x")))
        except StreamRequestError as e:
            return f"{e.status} {e}"
        finally:
            await runtime.close()
        return "accepted"

    answer = asyncio.run(scenario())
    assert answer.startswith("400 ") and "WHIP publishers" in answer, answer

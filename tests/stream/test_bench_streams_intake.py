"""The many-stream benchmark's intake rule (tools/bench_streams.py `Intake`), on the CPU.

The benchmark itself needs the GPU machine; this is the part of its main loop that decides which
decoded frames a round analyses, which are dropped as late, and which wait for the next round, run
here against a real queue with plain stream records."""

from __future__ import annotations

import queue
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

TOOLS = Path(__file__).resolve().parents[2] / "tools"
sys.path.insert(0, str(TOOLS))
from bench_streams import Encoder, Intake, run_configs, stream_phases  # noqa: E402

PERIOD = 1 / 30


class FakeStream:
    """What Intake reads and writes of a stream: its id, counters and the slot it gives back."""

    def __init__(self, sid: int) -> None:
        self.sid = sid
        self.frames = self.dropped = 0
        self.given_back: list[Any] = []

    def give_back(self, buf: Any, event: Any) -> None:
        self.given_back.append(buf)


def _queue(items: list[tuple[FakeStream, str, float]]) -> queue.SimpleQueue[Any]:
    q: queue.SimpleQueue[Any] = queue.SimpleQueue()
    for s, buf, arrival in items:
        q.put((s, buf, arrival, None))
    return q


def test_one_frame_per_stream_per_round_in_order() -> None:
    a, b = FakeStream(0), FakeStream(1)
    now = time.perf_counter()
    q = _queue([(a, "a0", now), (a, "a1", now), (b, "b0", now), (a, "a2", now)])
    intake = Intake(q, PERIOD, t_warm=0.0, limit=16)
    rounds = []
    while not intake.empty():
        pending, _waited = intake.round(0.0)
        rounds.append([buf for _s, buf, _a, _e in pending])
    # A stream's second frame waits for the next round, and its frames keep their order.
    assert rounds == [["a0", "b0"], ["a1"], ["a2"]]
    assert (a.frames, b.frames, a.dropped) == (3, 1, 0)
    assert intake.taken == 4


def test_late_frames_are_dropped_counted_and_their_slots_given_back() -> None:
    s = FakeStream(0)
    now = time.perf_counter()
    q = _queue([(s, "warmup_late", now - 3 * PERIOD), (s, "late", now - 2 * PERIOD), (s, "fresh", now)])
    intake = Intake(q, PERIOD, t_warm=now - 2.5 * PERIOD, limit=16)
    pending, _ = intake.round(0.0)
    assert [buf for _s, buf, _a, _e in pending] == ["fresh"]
    assert s.given_back == ["warmup_late", "late"]
    # Only frames that arrive after the warm-up count, as drops or as frames.
    assert (s.dropped, s.frames) == (1, 1)


def test_a_round_takes_at_most_limit_frames() -> None:
    streams = [FakeStream(i) for i in range(5)]
    now = time.perf_counter()
    q = _queue([(s, f"f{s.sid}", now) for s in streams])
    intake = Intake(q, PERIOD, t_warm=0.0, limit=3)
    first, _ = intake.round(0.0)
    second, _ = intake.round(0.0)
    assert [b for _s, b, _a, _e in first] == ["f0", "f1", "f2"]
    assert [b for _s, b, _a, _e in second] == ["f3", "f4"]
    assert intake.empty()


def test_an_idle_round_waits_for_the_first_frame_and_reports_the_wait() -> None:
    s = FakeStream(0)
    q: queue.SimpleQueue[Any] = queue.SimpleQueue()
    intake = Intake(q, PERIOD, t_warm=0.0, limit=16)
    pending, waited = intake.round(0.02)
    assert pending == [] and waited >= 0.015
    threading.Timer(0.01, lambda: q.put((s, "late_arrival", time.perf_counter(), None))).start()
    pending, waited = intake.round(0.5)
    assert [b for _s, b, _a, _e in pending] == ["late_arrival"]
    assert 0.005 <= waited < 0.4
    # With work in hand the round does not block.
    t0 = time.perf_counter()
    assert intake.round(0.0) == ([], 0.0)
    assert time.perf_counter() - t0 < 0.01


def test_the_gather_window_waits_for_more_frames_from_the_oldest_arrival() -> None:
    a, b, c = FakeStream(0), FakeStream(1), FakeStream(2)
    q: queue.SimpleQueue[Any] = queue.SimpleQueue()
    intake = Intake(q, PERIOD, t_warm=0.0, limit=16, gather_s=0.08)
    t0 = time.perf_counter()
    q.put((a, "a0", t0, None))
    # b's frame is queued inside a's window and joins the round; c's comes after it closes.
    threading.Timer(0.02, lambda: q.put((b, "b0", time.perf_counter(), None))).start()
    threading.Timer(0.2, lambda: q.put((c, "c0", time.perf_counter(), None))).start()
    pending, waited = intake.round(0.0)
    took = time.perf_counter() - t0
    assert [buf for _s, buf, _a, _e in pending] == ["a0", "b0"]
    # The round closed when a0's window did (80 ms after its arrival), not at b0's or c0's.
    assert 0.07 <= took < 0.15 and 0.05 <= waited <= took
    pending, _ = intake.round(0.5)
    assert [buf for _s, buf, _a, _e in pending] == ["c0"]


def test_a_full_round_does_not_wait_for_the_window() -> None:
    streams = [FakeStream(i) for i in range(3)]
    now = time.perf_counter()
    q = _queue([(s, f"f{s.sid}", now) for s in streams])
    intake = Intake(q, PERIOD, t_warm=0.0, limit=3, gather_s=1.0)
    t0 = time.perf_counter()
    pending, waited = intake.round(0.0)
    assert len(pending) == 3 and waited == 0.0 and time.perf_counter() - t0 < 0.05


def test_a_round_with_faces_waiting_does_not_gather() -> None:
    a, b = FakeStream(0), FakeStream(1)
    q: queue.SimpleQueue[Any] = queue.SimpleQueue()
    intake = Intake(q, PERIOD, t_warm=0.0, limit=16, gather_s=0.5)
    q.put((a, "a0", time.perf_counter(), None))
    threading.Timer(0.05, lambda: q.put((b, "b0", time.perf_counter(), None))).start()
    t0 = time.perf_counter()
    pending, waited = intake.round(0.0, gather=False)
    # The caller has a swap batch waiting: the round takes what is there and returns.
    assert [buf for _s, buf, _a, _e in pending] == ["a0"] and waited == 0.0
    assert time.perf_counter() - t0 < 0.04
    pending, _ = intake.round(0.5)
    assert [buf for _s, buf, _a, _e in pending] == ["b0"]


def test_stream_phases_grouped_and_random() -> None:
    # grouped: stream j at j/N of the period, so consecutive streams (one worker's) arrive together.
    assert stream_phases(4, "grouped") == [0.0, 0.25, 0.5, 0.75]
    rnd = stream_phases(32, "random")
    assert len(rnd) == 32 and all(0.0 <= x < 1.0 for x in rnd)
    assert rnd == stream_phases(32, "random")  # seeded by N: a run can be repeated
    # Random phases spread one worker's four streams over much of the period (grouped: 3/32).
    spans = [max(rnd[i:i + 4]) - min(rnd[i:i + 4]) for i in range(0, 32, 4)]
    assert sum(spans) / len(spans) > 0.3
    # sorted: the same phases in phase order, so one worker's four streams arrive close together.
    srt = stream_phases(32, "sorted")
    assert srt == sorted(rnd)
    assert max(srt[i + 3] - srt[i] for i in range(0, 32, 4)) < min(0.3, sum(spans) / len(spans))


def test_run_configs_checks_every_list_option_before_start() -> None:
    import argparse

    def args(**kw: str) -> argparse.Namespace:
        base = {"sink": "null,x264", "res": "720", "ns": "24,32", "feeders": "0", "pipeline": "0,1",
                "gather_ms": "0,8", "phases": "grouped"}
        return argparse.Namespace(**{**base, **kw})

    got = run_configs(args())
    assert len(got) == 2 * 1 * 2 * 1 * 2 * 2 * 1
    assert got[0] == ("null", "720", 24, 0, 0, 0.0, "grouped")
    for opt, bad in (("res", "480"), ("sink", "file"), ("pipeline", "2"), ("gather_ms", "40"),
                     ("phases", "even"), ("ns", "x")):
        with pytest.raises(SystemExit, match=f"--{opt.replace('_', '-')} {bad}"):
            run_configs(args(**{opt: bad}))


def test_the_x264_sink_counts_only_frames_after_the_settle_second() -> None:
    """The x264 sink's latencies, like the null sink's, leave out the frames of the settle second
    (before this, x264's first frames were counted and raised its p99); the encoder still encodes
    them, so its stream stays whole."""
    import numpy as np

    pytest.importorskip("av")
    done: list[float] = []
    enc = Encoder(64, 48, done, threads=1)
    rng = np.random.default_rng()
    frames = [rng.integers(16, 235, (72, 64), dtype=np.uint8) for _ in range(5)]
    t = time.perf_counter()
    for i, f in enumerate(frames):
        enc.q.put((f, t, i >= 2))  # the first two arrive in the settle second
    enc.close()
    assert len(done) == 3
    assert all(0.0 <= ms < 10_000 for ms in done)


def test_a_bad_x264_thread_count_is_refused_before_start() -> None:
    import subprocess

    r = subprocess.run([sys.executable, str(TOOLS / "bench_streams.py"), "--x264-threads", "0",
                        "--clip720", "x.mp4", "--clip1080", "x.mp4"], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "error: --x264-threads 0: give at least 1" in r.stderr and "Traceback" not in r.stderr, r.stderr

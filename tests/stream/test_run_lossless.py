"""`swapstream run` is one stream of the runtime with the `lossless` option: a swap slower than the
file's decoding loses no frame (the reader waits), every frame is swapped from the first one on (the
source face is taken before it), and every audio packet is written, also those after the last frame."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest

from swapstream.config import load_config
from swapstream.demo import astronaut, grace_hopper, write_demo_clip
from swapstream.errors import OutputError, SwapStreamError
from swapstream.io.video import VideoWriter
from swapstream.runtime.manager import default_backend_factory
from swapstream.runtime.run import RunJob

from ..helpers.backends import slow_backends
from .measures import psnr
from .webrtc_peers import fresh_job, looks_swapped

SWAP_S = 0.05
"""A swap this slow a frame (20 fps) is slower than decoding the small clip: a live stream's queues
would drop frames here."""


def video_times(path: Path) -> list[float]:
    with av.open(str(path)) as c:
        return sorted(float(p.pts * p.time_base) for p in c.demux(video=0) if p.size and p.pts is not None)


def audio_packets(path: Path) -> tuple[int, float]:
    """Audio packets with data, and the end time of the last one."""
    with av.open(str(path)) as c:
        ps = [p for p in c.demux(audio=0) if p.size]
        return len(ps), max(float((p.pts + p.duration) * p.time_base) for p in ps)


def first_and_last(path: Path) -> tuple[np.ndarray, np.ndarray]:
    with av.open(str(path)) as c:
        frames = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
    return frames[0], frames[-1]


def test_a_slow_run_loses_no_frame_and_no_audio(tmp_path: Path) -> None:
    clip = tmp_path / "clip.mp4"
    n = write_demo_clip(clip, grace_hopper(), seconds=1.5, fps=20, size=(320, 240))
    # The tone goes on for 1.5 s after the last frame: audio a live stream would not carry.
    longer = tmp_path / "longer.mp4"
    subprocess.run(["ffmpeg", "-hide_banner", "-loglevel", "error", "-y", "-i", str(clip), "-f", "lavfi",
                    "-i", "sine=frequency=440:duration=3", "-map", "0:v", "-map", "1:a", "-c:v", "copy",
                    "-c:a", "aac", str(longer)], check=True)
    cfg = load_config(None, ["device=cpu", "smoothing.enabled=false"])
    job = RunJob(cfg, device="cpu", backend_factory=slow_backends(SWAP_S))
    job.set_source_image(astronaut(), "astronaut")
    out = tmp_path / "out.mp4"
    t0 = time.monotonic()
    try:
        stats = job.run(longer, out)
    finally:
        job.close()
    assert time.monotonic() - t0 >= n * SWAP_S  # the swap really was the slow stage
    assert stats.frames == stats.frames_swapped == stats.faces_swapped == n, stats
    # Every frame, at its own time.
    assert video_times(out) == pytest.approx(video_times(longer), abs=1e-3)
    # Every audio packet, up to the tone's end.
    packets, end = audio_packets(longer)
    assert stats.audio_packets == packets
    got, got_end = audio_packets(out)
    assert got == packets and got_end == pytest.approx(end, abs=0.03), (got, packets, got_end, end)
    # The first frame is swapped as the last one is: the face was there before the first frame.
    sent = first_and_last(longer)
    check = fresh_job()
    try:
        for seen, orig in zip(first_and_last(out), sent):
            to_swapped, to_sent = looks_swapped(seen, orig, check)
            assert to_swapped < 0.5 * to_sent, (to_swapped, to_sent)
    finally:
        check.close()


def run_in_thread(job: RunJob, clip: Path, out: Path, timeout: float = 60.0) -> BaseException | None:
    """`job.run` in a thread: what it raised (None: it returned); fails the test if it hangs."""
    got: list[BaseException | None] = []

    def go() -> None:
        try:
            job.run(clip, out)
            got.append(None)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            got.append(e)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), "the run hangs"
    return got[0]


@pytest.fixture(scope="module")
def small_clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    clip = tmp_path_factory.mktemp("run") / "clip.mp4"
    write_demo_clip(clip, grace_hopper(), seconds=0.5, fps=20, size=(320, 240))
    return clip


def test_an_output_that_cannot_be_finished_is_the_runs_error(small_clip: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer's close fails (a full disk when the last frames and the trailer go out): the run
    ends with that error, as the user's error, rather than wait for a stream that never says done."""
    def full_disk(self: VideoWriter) -> None:
        raise OutputError(f"cannot write '{self.path}': No space left on device")

    monkeypatch.setattr(VideoWriter, "close", full_disk)
    job = RunJob(load_config(None, ["device=cpu"]), device="cpu")
    job.set_source_image(astronaut(), "astronaut")
    try:
        err = run_in_thread(job, small_clip, tmp_path / "out.mp4")
    finally:
        job.close()
    assert isinstance(err, OutputError) and "No space left on device" in str(err), err


class BrokenBackend:
    """A backend whose swap fails: a model that raises on every batch."""

    def __init__(self, backend: Any) -> None:
        self.backend, self.name, self.max_batch = backend, backend.name, backend.max_batch

    def identity(self, image: np.ndarray) -> Any:
        return self.backend.identity(image)

    def swap(self, items: list[Any]) -> list[int]:
        raise RuntimeError("the model ran out of memory")

    def close(self) -> None:
        self.backend.close()


def test_a_failed_swap_fails_the_run(small_clip: Path, tmp_path: Path) -> None:
    """A live stream passes a frame whose batch failed on unswapped; a file must not be written with
    such frames as if it were complete: the run fails, naming the frame and the cause."""
    job = RunJob(load_config(None, ["device=cpu"]), device="cpu",
                 backend_factory=lambda n, c, d: BrokenBackend(default_backend_factory(n, c, d)))
    job.set_source_image(astronaut(), "astronaut")
    try:
        err = run_in_thread(job, small_clip, tmp_path / "out.mp4")
    finally:
        job.close()
    assert isinstance(err, SwapStreamError), err
    assert "swapping the faces of frame 0 failed" in str(err) and "ran out of memory" in str(err), err


def cpu_run(clip: Path, out: Path, sets: list[str]) -> Any:
    """`run` on the CPU with the astronaut's face and `sets`; its stats."""
    # The mark carries a fixed stream id: a random one per run would differ in every frame.
    job = RunJob(load_config(None, ["device=cpu", "watermark.stream_id=7", *sets]), device="cpu")
    job.set_source_image(astronaut(), "astronaut")
    try:
        return job.run(clip, out)
    finally:
        job.close()


def decoded(path: Path) -> list[np.ndarray]:
    with av.open(str(path)) as c:
        return [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]


@pytest.mark.parametrize("depth", [1, 2])
def test_frames_asked_ahead_of_their_analysis_come_out_as_in_turn(depth: int, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """`runtime.analysis_depth=2`: while a frame is analysed the next one is asked for (it waits in
    the analysis thread's queue), and the output is that of a run that asks for each frame's faces
    only once the last frame's have come back (depth 1), which never has one asked ahead. Tracking
    is deterministic, so any reordering of frames would show."""
    from swapstream.face.analyser import FaceAnalyser
    from swapstream.runtime.stream import StreamPipeline

    clip = tmp_path / "clip.mp4"
    n = write_demo_clip(clip, grace_hopper(), seconds=1.5, fps=20, size=(320, 240))
    asked = started = 0
    ahead_at_end: list[int] = []  # frames asked for beyond the one whose analysis ends
    ask, track = StreamPipeline._ask_faces, FaceAnalyser.track

    def counting_ask(self: StreamPipeline, w: Any) -> Any:
        nonlocal asked
        asked += 1
        return ask(self, w)

    def slow_track(self: FaceAnalyser, frame: Any) -> Any:
        nonlocal started
        started += 1
        time.sleep(0.03)  # slower than the reader and the swap: frames wait for the analysis
        faces = track(self, frame)
        ahead_at_end.append(asked - started)
        return faces

    monkeypatch.setattr(StreamPipeline, "_ask_faces", counting_ask)
    monkeypatch.setattr(FaceAnalyser, "track", slow_track)
    outs = {}
    for d in sorted({1, depth}):
        asked = started = 0
        ahead_at_end.clear()
        outs[d] = tmp_path / f"out{d}.mp4"
        stats = cpu_run(clip, outs[d], [f"runtime.analysis_depth={d}"])
        assert stats.frames == stats.frames_swapped == n, stats
        assert len(ahead_at_end) == n
        if d == 1:
            assert max(ahead_at_end) == 0, ahead_at_end
        else:
            assert max(ahead_at_end) == 1, ahead_at_end  # never more than the depth allows
            # The reader and the swap are faster than the analysis: nearly every frame's successor
            # was asked for while it was analysed.
            assert ahead_at_end.count(1) >= n // 2, ahead_at_end
    frames = {d: decoded(p) for d, p in outs.items()}
    assert len(frames[depth]) == n
    # Equal in every run on the development machine but two of about 60; in those (one of them a
    # depth-1 run against another depth-1 run, under GIL load) the frames from one point on differed
    # by a few levels, up to 23 in places, for a cause not found (docs/runtime.md). A frame out of
    # order, or swapped with another frame's faces, is far below 35 dB: two neighbouring frames of
    # this clip are at most 23.8 dB apart.
    for i, (a, b) in enumerate(zip(frames[1], frames[depth])):
        assert psnr(a, b) >= 35.0, i


def test_a_files_frames_are_swapped_in_batches_and_come_out_as_one_at_a_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`runtime.file_batch` (on by default): a file's analysed frames wait for each other and go to
    the swap `neural.max_batch` at a time, as the frame loop before the runtime swapped them; the
    output is that of a run that swaps each frame on its own (file_batch off). Every frame is swapped
    once, in order."""
    from swapstream.face.analyser import FaceAnalyser
    from swapstream.runtime.manager import DeviceSlot

    clip = tmp_path / "clip.mp4"
    n = write_demo_clip(clip, grace_hopper(), seconds=1.5, fps=20, size=(320, 240))
    sizes: list[int] = []
    run, track = DeviceSlot._run, FaceAnalyser.track

    def counting_run(self: DeviceSlot, key: Any, items: list[Any]) -> Any:
        sizes.append(len(items))
        return run(self, key, items)

    def slow_track(self: FaceAnalyser, frame: Any) -> Any:
        # The analysis as the slow stage, as on a GPU (on this CPU the swap is, and frames queue up
        # for it whatever file_batch says).
        time.sleep(0.03)
        return track(self, frame)

    monkeypatch.setattr(DeviceSlot, "_run", counting_run)
    monkeypatch.setattr(FaceAnalyser, "track", slow_track)
    outs, batches = {}, {}
    for on in (True, False):
        sizes.clear()
        outs[on] = tmp_path / f"out{on}.mp4"
        stats = cpu_run(clip, outs[on], [f"runtime.file_batch={str(on).lower()}", "neural.max_batch=4"])
        assert stats.frames == stats.frames_swapped == n, stats
        batches[on] = list(sizes)
    assert sum(batches[True]) == sum(batches[False]) == n
    # Analysing 3 frames of 320x240 takes about 0.1 s here, inside the 0.25 s a batch waits: every
    # batch is full but the last (n = 30 is not a multiple of 4) and, on a loaded machine, one or two
    # more. Without file_batch a frame goes as soon as it is analysed: most batches are one frame.
    assert batches[True].count(4) >= n // 4 - 2, batches[True]
    assert batches[False].count(1) > len(batches[False]) // 2, batches[False]
    frames = {on: decoded(p) for on, p in outs.items()}
    assert len(frames[True]) == len(frames[False]) == n
    # As in the depth test above: a frame out of order or swapped with another's faces is far below
    # 35 dB (neighbouring frames of this clip are at most 23.8 dB apart).
    for i, (a, b) in enumerate(zip(frames[False], frames[True])):
        assert psnr(a, b) >= 35.0, i

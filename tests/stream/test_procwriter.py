"""`ProcessWriter`: the live writer in a process of its own (`runtime.encoder_process`) must write what
`LiveWriter` writes, frame for frame and packet for packet, and turn a dead or failing child into an
`OutputError` that names the output, leaving no process behind."""

from __future__ import annotations

import multiprocessing as mp
import socket
import time
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest

av = pytest.importorskip("av")

from swapstream.errors import OutputError  # noqa: E402
from swapstream.io.video import AudioPacket  # noqa: E402
from swapstream.live.procwriter import ProcessWriter  # noqa: E402
from swapstream.live.streams import LiveWriter  # noqa: E402
from swapstream.types import Frame  # noqa: E402

from .clips import decoded_numbers, write_clip  # noqa: E402

SIZE = (160, 96)
FRAMES = 75  # 2.5 s at 30 fps: the writer holds a second of frames, then encodes them at once


def feed(writer: Any, clip: Path, fmt: str) -> int:
    """Every frame (as `fmt`: nv12 or rgb) and audio packet of `clip`, in file order, into `writer`."""
    n = 0
    with av.open(str(clip)) as c:
        for packet in c.demux():
            if packet.size == 0:
                continue
            if packet.stream.type == "audio":
                writer.write_audio(AudioPacket(packet))
                continue
            for f in packet.decode():
                if fmt == "nv12":
                    writer.write_nv12(f.reformat(format="nv12").to_ndarray(), f.pts, f.time_base)
                else:
                    writer.write(Frame(f.to_ndarray(format="rgb24"), f.pts, f.time_base, n))
                n += 1
    writer.close()
    return n


def packets(path: Path) -> list[tuple[str, int | None, int | None, bool, bytes]]:
    with av.open(str(path)) as c:
        return [(p.stream.type, p.pts, p.dts, bool(p.is_keyframe), bytes(p)) for p in c.demux() if p.size]


def open_writer(cls: Any, target: Path | str, clip: Path, **kw: Any) -> Any:
    # Not closed here: the writer copies its audio stream from this one when it starts (the stream
    # keeps its container alive), as a live job's writer does from its reader's.
    c = av.open(str(clip))
    return cls(str(target), kind=kw.pop("kind", "rtmp"), width=SIZE[0], height=SIZE[1], fps=30.0,
               time_base=c.streams.video[0].time_base, audio_from=c.streams.audio[0], crf=23, threads=1,
               **kw)


def no_children_left() -> bool:
    deadline = time.monotonic() + 5
    while mp.active_children() and time.monotonic() < deadline:
        time.sleep(0.05)
    return not mp.active_children()


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("procwriter") / "clip.mp4"
    write_clip(path, frames=FRAMES, size=SIZE)
    return path


@pytest.mark.parametrize("fmt", ["nv12", "rgb"])
def test_the_process_writer_writes_the_same_stream_as_the_live_writer(clip: Path, tmp_path: Path,
                                                                       fmt: str) -> None:
    here, there = tmp_path / "thread.flv", tmp_path / "process.flv"
    # The same clip, but each writer opens its own input: the audio template travels by value.
    assert feed(open_writer(LiveWriter, here, clip), clip, fmt) == FRAMES
    writer = open_writer(ProcessWriter, there, clip)
    assert feed(writer, clip, fmt) == FRAMES
    assert writer.frames == FRAMES and writer.dropped == 0 and writer.keyframes == 3  # one a second
    a, b = packets(here), packets(there)
    # x264 with one thread is deterministic: the same frames give the same bytes, and the audio is
    # passed through untouched; so every packet, its timestamps and its keyframe flag match.
    assert [p[:4] for p in b] == [p[:4] for p in a]
    assert [p[4] for p in b] == [p[4] for p in a]
    assert sum(1 for p in b if p[0] == "audio") > 50  # the audio did come through
    assert decoded_numbers(there) == list(range(FRAMES))
    assert no_children_left()


def test_hls_through_a_process_plays_every_frame(clip: Path, tmp_path: Path) -> None:
    folder = tmp_path / "hls"
    writer = open_writer(ProcessWriter, folder / "index.m3u8", clip, kind="hls")
    assert feed(writer, clip, "nv12") == FRAMES
    playlist = (folder / "index.m3u8").read_text()
    segments = b"".join((folder / s).read_bytes() for s in playlist.splitlines() if s.endswith(".ts"))
    (tmp_path / "all.ts").write_bytes(segments)
    assert decoded_numbers(tmp_path / "all.ts") == list(range(FRAMES))


def test_a_dead_encoder_process_is_an_output_error(clip: Path, tmp_path: Path) -> None:
    writer = open_writer(ProcessWriter, tmp_path / "out.flv", clip)
    frame = np.random.default_rng().integers(0, 256, (SIZE[1] * 3 // 2, SIZE[0]), np.uint8)
    writer.write_nv12(frame, 0, Fraction(1, 30))
    writer._proc.kill()
    writer._proc.join(5)
    with pytest.raises(OutputError, match=r"encoder process of live output '.*out\.flv' ended unexpectedly"):
        writer.write_nv12(frame, 1, Fraction(1, 30))
    writer.close()  # closing after the death says nothing more and raises nothing
    with pytest.raises(OutputError, match="is closed"):
        writer.write_nv12(frame, 2, Fraction(1, 30))
    assert no_children_left()


def test_an_unusable_output_fails_at_once_and_leaves_no_process(clip: Path, tmp_path: Path) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    with pytest.raises(OutputError, match="cannot open live output"):
        open_writer(ProcessWriter, blocked / "hls" / "index.m3u8", clip, kind="hls")
    assert no_children_left()


def test_a_push_nobody_takes_fails_in_the_child_and_is_raised_here(clip: Path) -> None:
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    writer = open_writer(ProcessWriter, f"rtmp://127.0.0.1:{port}/live/key", clip, reconnect_seconds=0.5)
    frame = np.random.default_rng().integers(0, 256, (SIZE[1] * 3 // 2, SIZE[0]), np.uint8)
    try:
        # Held for a second, then the push connects, fails, and is retried for 0.5 s of wall time.
        with pytest.raises(OutputError, match=f"'rtmp://127.0.0.1:{port}/live/key' has failed for 0.5 s"):
            for i in range(200):
                writer.write_nv12(frame, i, Fraction(1, 30))
                time.sleep(0.02)
    finally:
        writer.close()
    assert no_children_left()


def test_a_frame_larger_than_the_output_is_refused(clip: Path, tmp_path: Path) -> None:
    writer = open_writer(ProcessWriter, tmp_path / "out.flv", clip)
    try:
        with pytest.raises(ValueError, match="does not fit"):
            writer.write(Frame(np.zeros((SIZE[1] * 2, SIZE[0] * 2, 3), np.uint8), 0, Fraction(1, 30), 0))
    finally:
        writer.close()
    assert no_children_left()

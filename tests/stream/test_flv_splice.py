"""`SplicedFlv`: each packet leaves as it is muxed, and the stream is the FLV FFmpeg would write.

Written to a file (the raw `data` muxer takes a path as well as an RTMP URL, flushed per packet as
it is on a network output), then read back with FFmpeg's FLV demuxer. The RTMP round trip through
nginx-rtmp is in test_live_rtmp.py and tools/bench_live.py.
"""

from __future__ import annotations

import io
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest

from swapstream.live.flv import SplicedFlv

FPS = 30
RATE = 48000


def aac_template() -> tuple[Any, list[Any]]:
    """An AAC stream to copy (as a live job copies its input's audio) and its packets, 1 s."""
    memory = io.BytesIO()
    with av.open(memory, "w", format="flv") as c:
        a = c.add_stream("aac", rate=RATE)
        a.layout = "mono"
        rng = np.random.default_rng()
        for k in range(RATE // 1024 + 1):
            f = av.AudioFrame.from_ndarray(rng.uniform(-0.3, 0.3, (1, 1024)).astype(np.float32),
                                           format="fltp", layout="mono")
            f.sample_rate, f.pts, f.time_base = RATE, k * 1024, Fraction(1, RATE)
            for p in a.encode(f):
                c.mux(p)
    memory.seek(0)
    src = av.open(memory)
    return src, list(src.demux(src.streams.audio[0]))


def test_each_packet_goes_out_as_it_is_muxed_and_reads_back_as_muxed(tmp_path: Path) -> None:
    src, audio = aac_template()
    audio = [p for p in audio if p.size]
    out = tmp_path / "out.flv"
    flv = SplicedFlv(str(out), timeout=5.0, options={"flush_packets": "1"})
    v = flv.add_stream("libx264", rate=FPS)
    v.width, v.height, v.pix_fmt = 320, 240, "yuv420p"
    v.time_base = v.codec_context.time_base = Fraction(1, 1000)
    v.options = {"preset": "ultrafast", "tune": "zerolatency", "bf": "0"}
    a = flv.add_stream_from_template(src.streams.audio[0])
    flv.metadata.update({"comment": "synthetic content"})
    rng = np.random.default_rng()
    sent_video: list[int] = []
    sent_audio: list[int] = []
    grew = []
    for n in range(24):
        f = av.VideoFrame.from_ndarray(rng.integers(0, 256, (240, 320, 3), np.uint8), format="rgb24")
        f.pts, f.time_base = round(n * 1000 / FPS), Fraction(1, 1000)
        for p in v.encode(f):
            before = out.stat().st_size if out.exists() else 0
            sent_video.append(p.pts)
            flv.mux(p)
            grew.append(out.stat().st_size - before)
        # The audio lags the video by two frames, as a live job's does behind an interleaving
        # publisher: FFmpeg's own FLV muxer would hold each frame until later audio came.
        while audio and audio[0].pts * audio[0].time_base * 1000 <= (n - 2) * 1000 / FPS:
            p = audio.pop(0)
            sent_audio.append(round(p.pts * p.time_base * 1000))
            p.stream = a
            flv.mux(p)
    flv.close()
    assert len(grew) == 24 and min(grew) > 0, grew  # every frame's bytes were out on its own mux
    with av.open(str(out)) as c:
        assert {s.type for s in c.streams} == {"video", "audio"}
        assert c.metadata.get("comment") == "synthetic content"
        got_video, got_audio, decoded = [], [], 0
        for p in c.demux():
            if p.stream.type == "video" and p.size:
                got_video.append(round(p.pts * p.time_base * 1000))
                decoded += len(p.decode())
            elif p.stream.type == "audio" and p.size:
                got_audio.append(round(p.pts * p.time_base * 1000))
    assert got_video == sent_video  # every frame, in order, at its own time (FLV keeps ms)
    assert got_audio == sent_audio
    assert decoded >= 23  # the decoder may hold the last frame until its end


def test_a_stream_that_was_never_added_is_refused(tmp_path: Path) -> None:
    src, audio = aac_template()
    flv = SplicedFlv(str(tmp_path / "out.flv"), timeout=5.0)
    v = flv.add_stream("libx264", rate=FPS)
    with pytest.raises(ValueError, match="video stream already"):
        flv.add_stream("libx264", rate=FPS)
    p = audio[1]
    p.stream = src.streams.audio[0]  # another container's stream: this output has no audio
    with pytest.raises(ValueError, match="no audio stream"):
        flv.mux(p)
    assert v is not None
    flv.close()

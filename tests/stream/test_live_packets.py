"""`LiveReader(packets=True)`: the video as Annex-B access units, which is what NVDEC's parser takes
(the GPU live job feeds them to `NvdecAccessUnits`). Checked on the CPU by decoding the access units
with FFmpeg's H.264 decoder given *no* extradata: that only works when the SPS/PPS travel in-band
with start codes. The pictures must equal the ones the reader decodes itself, with the same pts.
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

av = pytest.importorskip("av")

from swapstream.io.video import AudioPacket  # noqa: E402
from swapstream.live.streams import LiveReader, VideoPacket  # noqa: E402
from swapstream.types import Frame  # noqa: E402

from .clips import number_of, write_clip  # noqa: E402

START_CODE = (b"\x00\x00\x00\x01", b"\x00\x00\x01")


@pytest.mark.parametrize("suffix", [".mp4", ".flv", ".ts"])
def test_packets_are_annexb_and_decode_to_the_same_frames(tmp_path: Path, suffix: str) -> None:
    clip = tmp_path / f"clip{suffix}"
    write_clip(clip, frames=25, size=(96, 64), rate=Fraction(25),
               time_base=Fraction(1, 1000) if suffix == ".flv" else None)
    frames = [x for x in LiveReader(str(clip)) if isinstance(x, Frame)]
    items = list(LiveReader(str(clip), packets=True))
    packets = [x for x in items if isinstance(x, VideoPacket)]
    assert any(isinstance(x, AudioPacket) for x in items), "audio must still come through"
    assert len(packets) == len(frames) == 25
    assert packets[0].keyframe and packets[0].data.startswith(START_CODE), packets[0].data[:8]
    for p in packets:
        assert p.data.startswith(START_CODE), f"packet {p.index} is not Annex-B: {p.data[:8].hex()}"
    # NAL type 7 (SPS) in-band in the first access unit
    assert b"\x00\x00\x01\x67" in packets[0].data or b"\x00\x00\x00\x01\x67" in packets[0].data

    codec = av.CodecContext.create("h264", "r")  # no extradata: in-band parameter sets or nothing
    decoded: list[np.ndarray] = []
    for p in packets:
        pkt = av.Packet(p.data)
        pkt.pts = p.pts
        decoded += [f.to_ndarray(format="rgb24") for f in codec.decode(pkt)]
    decoded += [f.to_ndarray(format="rgb24") for f in codec.decode(None)]
    assert len(decoded) == len(frames)
    for i, (a, b) in enumerate(zip(decoded, frames)):
        # The same bitstream through the same decoder: identical pictures.
        assert np.array_equal(a, b.data), f"frame {i} differs"
        assert number_of(a) == i
    assert [p.pts for p in packets] == [f.pts for f in frames]
    assert [p.index for p in packets] == list(range(25))
    assert len({p.time_base for p in packets}) == 1


def test_b_frame_packets_keep_their_decode_order(tmp_path: Path) -> None:
    # A stream with B-frames: packets come in decode order, their pts go back and forth; the
    # reader must neither reorder nor "fix" them (a decoder of packets reorders), and must say
    # that the stream reorders (the GPU job then decodes with NVDEC's reordering).
    from .test_nvcodec import write_h264

    clip = tmp_path / "b.mp4"
    write_h264(av, clip, bframes=True, frames=24)
    reader = LiveReader(str(clip), packets=True)
    packets = [x for x in reader if isinstance(x, VideoPacket)]
    assert reader.reorders
    pts = [p.pts for p in packets]
    assert pts != sorted(pts), "the clip was meant to have B-frames"
    frames = [x for x in LiveReader(str(clip)) if isinstance(x, Frame)]
    assert sorted(pts) == [f.pts for f in frames]
    codec = av.CodecContext.create("h264", "r")
    out = []
    for p in packets:
        pkt = av.Packet(p.data)
        pkt.pts = p.pts
        out += list(codec.decode(pkt))
    out += list(codec.decode(None))
    assert [f.pts for f in out] == [f.pts for f in frames]
    for a, b in zip(out, frames):
        assert np.array_equal(a.to_ndarray(format="rgb24"), b.data)
    reader.close()

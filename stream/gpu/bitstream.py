"""H.264 and HEVC Annex B byte streams: NAL units, access units and keyframes.

NVENC returns the bitstream of one or several pictures as one bytes object, and a muxer wants one
packet per picture: `split_access_units` cuts it, and `is_keyframe` says where a viewer can join.
Pure Python. [SRC] is PyNvVideoCodec's sources, as listed in `swapstream.gpu.pynvc`.
"""

from __future__ import annotations

__all__ = [
    "is_keyframe",
    "split_access_units",
]


_H264_AU_START = frozenset({6, 7, 8, 9, 14, 15, 16, 17, 18})  # SEI, SPS, PPS, AUD, prefix, reserved
_HEVC_AU_START = frozenset({32, 33, 34, 35, 39, 41, 42, 43, 44, 48, 49, 50, 51, 52, 53, 54, 55})


def _nal_starts(data: bytes) -> list[tuple[int, int]]:
    """(start, header) of each NAL unit of an Annex B stream: where its start code begins (a 4-byte
    code's leading zero included) and where its header byte is."""
    out = []
    i = data.find(b"\x00\x00\x01")
    while i != -1:
        out.append((i - 1 if i > 0 and data[i - 1] == 0 else i, i + 3))
        i = data.find(b"\x00\x00\x01", i + 3)
    return out


def _nal_kind(data: bytes, h: int, codec: str) -> tuple[bool, bool, bool, bool]:
    """(is a slice, is the first slice of its picture, starts an access unit before slices, is IRAP)."""
    if h >= len(data):
        return False, False, False, False
    if codec == "h264":
        t = data[h] & 0x1F
        vcl = 1 <= t <= 5
        # first_mb_in_slice is ue(v); it is 0, the first slice of a picture, iff its first bit is 1.
        first = t in (1, 2, 5) and h + 1 < len(data) and bool(data[h + 1] & 0x80)
        return vcl, first, t in _H264_AU_START, t == 5
    t = (data[h] >> 1) & 0x3F
    vcl = t < 32
    first = vcl and h + 2 < len(data) and bool(data[h + 2] & 0x80)  # first_slice_segment_in_pic_flag
    return vcl, first, t in _HEVC_AU_START, 16 <= t <= 21


def split_access_units(data: bytes, codec: str) -> list[bytes]:
    """Cut an H.264 or HEVC Annex B byte stream into access units (one coded picture each).

    NVENC returns the bitstream of one or several pictures as one bytes object ([SRC]
    PyNvEncoder.cpp concatenates them), and a muxer wants one packet per picture. A new access unit
    begins, after the last slice of a picture, at the first NAL unit that must precede a picture
    (AUD, parameter sets, prefix SEI: H.264 7.4.1.2.3, HEVC 7.4.2.4.4) or at the first slice of the
    next picture. Bytes before the first start code stay with the first unit.
    """
    if codec not in ("h264", "hevc"):
        raise ValueError(f"codec must be 'h264' or 'hevc', got {codec!r}")
    data = bytes(data)
    if not data:
        return []
    cuts = [0]
    seen_slice = False
    for start, header in _nal_starts(data):
        vcl, first, starter, _ = _nal_kind(data, header, codec)
        if seen_slice and (starter or (vcl and first)):
            cuts.append(start)
            seen_slice = False
        seen_slice = seen_slice or vcl
    cuts.append(len(data))
    return [data[a:b] for a, b in zip(cuts, cuts[1:]) if b > a]


def is_keyframe(access_unit: bytes, codec: str) -> bool:
    """Whether an access unit holds an IDR (H.264) or IRAP (HEVC) picture: a point to start decoding."""
    return any(_nal_kind(access_unit, h, codec)[3] for _, h in _nal_starts(access_unit))

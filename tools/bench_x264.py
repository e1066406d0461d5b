"""x264's encode time per frame (PyAV, the benchmark's settings), pixel format and threads side by side.

    python tools/bench_x264.py [--frames 60] [--out DIR]

Encodes random NV12 frames at 720p and 1080p with libx264 and the live outputs' settings
(`x264_live_options`: `ultrafast`, `zerolatency`, CRF 23, a keyframe every second), as
`tools/bench_streams.py`'s x264 sink does, once with yuv420p (the encoder converts from NV12, as the
product's writers do) and once with NV12 given as it is, each with 1 and 2 x264 threads. Host clock,
median and max after 10 warm-up frames, on an otherwise idle machine: what one stream's encoder
costs, not what it costs beside 31 others. Random frames are x264's worst case (nothing to predict):
the times are an upper bound for video.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np


def encode_ms(w: int, h: int, fmt: str, threads: int, frames: int) -> list[float]:
    import av

    from swapstream.live.streams import x264_live_options

    rng = np.random.default_rng()
    nv12 = rng.integers(0, 256, (h * 3 // 2, w), dtype=np.uint8)
    c = av.open(os.devnull, "w", format="h264")
    s = c.add_stream("libx264", rate=30)
    s.width, s.height, s.pix_fmt = w, h, fmt
    s.options = x264_live_options(30.0)
    s.thread_count = threads
    ts: list[float] = []
    for i in range(frames):
        vf = av.VideoFrame.from_ndarray(nv12, format="nv12")
        vf.pts = i
        t = time.perf_counter()
        for p in s.encode(vf):
            c.mux(p)
        ts.append((time.perf_counter() - t) * 1e3)
    c.close()
    return sorted(ts[10:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=60)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.frames < 20:
        sys.exit(f"error: --frames {args.frames}: give at least 20 (the first 10 are warm-up)")
    rows: list[dict[str, object]] = []
    for w, h in ((1280, 720), (1920, 1080)):
        for fmt in ("yuv420p", "nv12"):
            for threads in (1, 2):
                ts = encode_ms(w, h, fmt, threads, args.frames)
                rows.append({"size": f"{w}x{h}", "pix_fmt": fmt, "threads": threads,
                             "median_ms": round(ts[len(ts) // 2], 2), "max_ms": round(ts[-1], 2)})
                print(f"{w}x{h} {fmt} threads={threads}: median {rows[-1]['median_ms']:.2f} ms, "
                      f"max {rows[-1]['max_ms']:.2f} ms", flush=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "x264_encode.json").write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()

"""x264's encode time per frame (PyAV, the benchmark's settings), pixel format and threads side by side.

    python tools/bench_x264.py [--frames 60] [--out DIR]
    python tools/bench_x264.py --beside [--frames 120] [--out DIR] [--name x264_gil]

Encodes random NV12 frames at 720p and 1080p with libx264 and the live outputs' settings
(`x264_live_options`: `ultrafast`, `zerolatency`, CRF 23, a keyframe every second), as
`tools/bench_streams.py`'s x264 sink does, once with yuv420p (the encoder converts from NV12, as the
product's writers do) and once with NV12 given as it is, each with 1 and 2 x264 threads. Host clock,
median and max after 10 warm-up frames, on an otherwise idle machine: what one stream's encoder
costs, not what it costs beside 31 others. One random picture is encoded again and again: after the
first frame x264 has little to code, so the times are a lower bound for moving video (`--beside`
encodes a moving crop of noise, x264's hard case).

`--beside` asks what the same encode costs in a process whose other threads run Python, as a
`serve` worker's do (its event loop, analysis, swap and reader threads): the 720p NV12 frame's
picture (`VideoFrame.from_ndarray`), its encode, its encode and mux, and the product's live writer
(`LiveWriter.write_nv12`), each timed alone and beside one thread running a pure-Python loop
(`median_beside`), at the GIL switch interval the runtime sets by default (`runtime.switch_interval_ms`)
and at Python's default. Each step gives the GIL back around its native work and has to wait for it
again; the difference is that wait. The frames are a moving crop of a noise picture. Writes
NAME.json and .md under --out.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))


def open_x264(w: int, h: int, fmt: str, threads: int, container: str) -> tuple[Any, Any]:
    """An output to /dev/null in `container` and its libx264 stream with the live outputs' options."""
    import av

    from swapstream.live.streams import x264_live_options

    c = av.open(os.devnull, "w", format=container)
    s = c.add_stream("libx264", rate=30)
    s.width, s.height, s.pix_fmt = w, h, fmt
    s.options = x264_live_options(30.0)
    s.thread_count = threads
    return c, s


def encode_ms(w: int, h: int, fmt: str, threads: int, frames: int) -> list[float]:
    import av

    rng = np.random.default_rng()
    nv12 = rng.integers(0, 256, (h * 3 // 2, w), dtype=np.uint8)
    c, s = open_x264(w, h, fmt, threads, "h264")
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


def noise_pictures(w: int, h: int) -> list[np.ndarray]:
    """16 NV12 pictures, each a crop of one noise picture a little further on: moving noise."""
    rng = np.random.default_rng(0)
    base = rng.integers(0, 256, (h * 3 // 2 + 64, w + 64), dtype=np.uint8)
    return [np.ascontiguousarray(base[i % 64:i % 64 + h * 3 // 2, 2 * i % 64:2 * i % 64 + w]) for i in range(16)]


def median_beside(one_frame: Callable[[int], None], frames: int, warm: int, switch: float,
                  beside: bool) -> float:
    """Median host ms of `one_frame(i)` over `frames` frames after `warm` more, at GIL switch
    interval `switch`, alone or beside one thread running a pure-Python loop."""
    import threading

    stop = threading.Event()

    def spin() -> None:
        n = 0
        while not stop.is_set():
            n += 1

    before = sys.getswitchinterval()
    sys.setswitchinterval(switch)
    other = threading.Thread(target=spin, daemon=True)
    if beside:
        other.start()
    ts: list[float] = []
    try:
        for i in range(frames + warm):
            t = time.perf_counter()
            one_frame(i)
            ts.append((time.perf_counter() - t) * 1e3)
    finally:
        stop.set()
        if beside:
            other.join()
        sys.setswitchinterval(before)
    ts = sorted(ts[warm:])
    return round(ts[len(ts) // 2], 2)


def encode_steps_ms(w: int, h: int, frames: int, step: str, switch: float, beside: bool) -> float:
    """Median host ms per frame of `step` ("picture", "encode", "mux") at GIL switch interval
    `switch`, alone or beside one thread running a pure-Python loop."""
    import av

    pics = noise_pictures(w, h)
    # One x264 thread: one core for the encoder, one for the Python thread (a 2-core machine).
    c, s = open_x264(w, h, "yuv420p", 1, "flv")

    def one_frame(i: int) -> None:
        vf = av.VideoFrame.from_ndarray(pics[i % len(pics)], format="nv12")
        vf.pts = i
        if step != "picture":
            for p in s.encode(vf):
                if step == "mux":
                    c.mux(p)

    try:
        return median_beside(one_frame, frames - 10, 10, switch, beside)
    finally:
        c.close()


WRITER_WARM_FRAMES = 40
"""Frames a writer timing skips: a live writer holds its first second of frames to measure the rate
it declares, then encodes them at once."""


def writer_ms(w: int, h: int, frames: int, step: str, switch: float, beside: bool) -> float:
    """Median host ms per frame of the product's live writer (`LiveWriter.write_nv12`, FLV to
    /dev/null), alone or beside one thread running a pure-Python loop. `step` ("writer") is not
    read: the signature is `encode_steps_ms`'s, so that `beside_python` calls either."""
    from fractions import Fraction

    from swapstream.live.streams import LiveWriter

    pics = noise_pictures(w, h)
    tb = Fraction(1, 30)
    writer = LiveWriter(os.devnull, kind="rtmp", width=w, height=h, fps=30.0, time_base=tb, crf=23, threads=1)
    try:
        return median_beside(lambda i: writer.write_nv12(pics[i % len(pics)], i, tb), frames,
                             WRITER_WARM_FRAMES, switch, beside)
    finally:
        writer.close()


def beside_python(frames: int, out: Path | None, name: str) -> None:
    from benchlib import cpu_name, run_fields

    from swapstream.config import RuntimeConfig

    rows: list[dict[str, object]] = []
    for switch in (RuntimeConfig().switch_interval_ms / 1e3, 0.005):
        for step in ("picture", "encode", "mux", "writer"):
            timing = writer_ms if step == "writer" else encode_steps_ms
            alone = timing(1280, 720, frames, step, switch, beside=False)
            near = timing(1280, 720, frames, step, switch, beside=True)
            rows.append({"switch_ms": switch * 1e3, "step": step, "alone_ms": alone, "beside_ms": near,
                         "lost_ms": round(near - alone, 2)})
            print(f"switch {switch * 1e3:g} ms, {step:7s}: alone {alone:.2f} ms, beside a Python thread "
                  f"{near:.2f} ms", flush=True)
    if out is None:
        return
    cmd = "python tools/bench_x264.py --beside --frames %d --name %s" % (frames, name)
    fields = run_fields(cpu_name(), cmd)
    records = [{"metric": f"x264_720p_{r['step']}_ms_switch_{r['switch_ms']:g}ms", "value": r["beside_ms"],
                "unit": "ms", "stat": "p50", "config": {"alone_ms": r["alone_ms"], "threads": 1}, **fields}
               for r in rows]
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(records, indent=1) + "\n")
    lines = [f"# x264 beside Python threads ({fields['device']}, {fields['commit']}, {fields['date']})", "",
             f"Command: `{cmd}`", "",
             "One 720p30 stream's x264 frame (`x264_live_options`, one x264 thread, NV12 in, FLV out to "
             "/dev/null) through PyAV, each step timed alone and beside one thread running a pure-Python "
             "loop (as a `serve` worker's other threads do), at the runtime's GIL switch interval and at "
             "Python's default. Median host ms per frame; each of picture, encode and mux includes the "
             "ones before it. `writer` is the product's live writer (`LiveWriter.write_nv12`, FLV to "
             f"/dev/null), after {WRITER_WARM_FRAMES} warm-up frames.", "",
             "| switch interval | step | alone ms | beside a Python thread ms | lost ms |", "|---|---|---|---|---|"]
    lines += [f"| {r['switch_ms']:g} ms | {r['step']} | {r['alone_ms']} | {r['beside_ms']} | {r['lost_ms']} |"
              for r in rows]
    (out / f"{name}.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out / name}.json and .md")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=60)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--beside", action="store_true",
                    help="the encode's steps alone and beside a Python thread (see the docstring)")
    ap.add_argument("--name", default="x264_gil")
    args = ap.parse_args()
    if args.frames < 20:
        sys.exit(f"error: --frames {args.frames}: give at least 20 (the first 10 are warm-up)")
    if args.beside:
        beside_python(args.frames, args.out, args.name)
        return
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

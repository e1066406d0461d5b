"""Does NVDEC decode through PyNvVideoCodec run in parallel threads of one process?

    python tools/bench_decode_threads.py --clip .bench/streams_720p30.mp4 [--sources 8] [--frames 150]
        [--out DIR]                                (on the GPU machine)

Decodes `--frames` frames from each of `--sources` NvdecSources of the same clip into RGB
(`NvdecFrame.copy_to`, as the stream benchmark does), once from one thread taking the sources in
turn and once with one thread per source. If the threaded run's frames/s are well above the
sequential one's, the library releases the GIL while NVDEC works and decode can leave the main loop
of a many-stream process. Also reports the host time per frame of the demux+decode call and of the
conversion, from the sequential run.

`--gil` also measures how much of each decode holds the GIL: a pure-Python counting loop runs in
the main thread for two seconds, alone and then beside one thread decoding `--sources` streams at
30 fps each (paced, as live frames arrive); the loop's lost share, spread over the frames decoded,
is the GIL time per frame. It is measured with the frame's pts read (`getPTS`) and without.
Writes decode_threads.json (and .md) under --out.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import gpu_name, run_fields  # noqa: E402


def open_sources(clip: Path, sources: int) -> tuple[list[Any], list[Any], list[Any]]:
    """`sources` NVDEC decoders of `clip`, each past its first frame (set-up is not timed), their
    frame iterators, and an RGB buffer for each."""
    import cupy

    from swapstream.gpu.nvdemux import NvdecSource

    srcs = [NvdecSource(clip, low_latency=True) for _ in range(sources)]
    its = [iter(s) for s in srcs]
    first = next(its[0])
    rgbs = [cupy.empty((first.height, first.width, 3), cupy.uint8) for _ in srcs]
    for it in its[1:]:
        next(it)
    cupy.cuda.Device().synchronize()
    return srcs, its, rgbs


def decode_some(it: Any, rgb: Any, frames: int, split: list[float] | None,
                done: list[int], errors: list[BaseException]) -> None:
    """Decode `frames` frames into `rgb`; counts them in `done`, and an error goes to `errors` (a
    thread that died must not leave its frames counted as decoded)."""
    try:
        for _ in range(frames):
            t0 = time.perf_counter()
            fr = next(it)
            t1 = time.perf_counter()
            fr.copy_to(rgb).synchronize()
            done.append(1)
            if split is not None:
                split[0] += t1 - t0
                split[1] += time.perf_counter() - t1
    except BaseException as e:  # noqa: BLE001 - reported by the caller
        errors.append(e)


def run(clip: Path, sources: int, frames: int, threaded: bool) -> dict[str, Any]:
    srcs, its, rgbs = open_sources(clip, sources)
    h, w = rgbs[0].shape[:2]
    split = [0.0, 0.0]
    done: list[int] = []
    errors: list[BaseException] = []
    t0 = time.perf_counter()
    if threaded:
        ths = [threading.Thread(target=decode_some, args=(it, rgb, frames, None, done, errors))
               for it, rgb in zip(its, rgbs)]
        for th in ths:
            th.start()
        for th in ths:
            th.join()
    else:
        for _ in range(frames):
            for it, rgb in zip(its, rgbs):
                decode_some(it, rgb, 1, split, done, errors)
    wall = time.perf_counter() - t0
    for s in srcs:
        s.close()
    if errors:
        raise SystemExit(f"error: decoding '{clip}' failed: {errors[0]!r} (is the clip longer than "
                         f"--frames {frames}?)")
    n = len(done)
    row = {"res": f"{w}x{h}", "sources": sources, "threads": sources if threaded else 1,
           "frames": n, "frames_per_s": round(n / wall, 1)}
    if not threaded:
        row["host_ms_decode_call"] = round(split[0] * 1e3 / n, 3)
        row["host_ms_convert_and_wait"] = round(split[1] * 1e3 / n, 3)
    return row


def count_for(seconds: float) -> int:
    """Iterations of a pure-Python loop in `seconds` (it runs only while it holds the GIL)."""
    n = 0
    end = time.perf_counter() + seconds
    while True:
        for _ in range(1000):
            n += 1
        if time.perf_counter() >= end:
            return n


def gil_probe(clip: Path, sources: int, read_pts: bool, seconds: float = 2.0) -> dict[str, Any]:
    # nvdec owns `_frame_pts` and the `_wrap_frame` that calls it, so replacing it there reaches
    # every NvdecSource's frames.
    from swapstream.gpu import nvdec

    srcs, its, rgbs = open_sources(clip, sources)
    alone = count_for(seconds)
    stop = time.perf_counter() + seconds
    decoded = [0]
    real = nvdec._frame_pts

    def paced() -> None:
        period = 1.0 / (30.0 * sources)
        due = time.perf_counter()
        k = 0
        while due < stop:
            wait = due - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            next(its[k % sources]).copy_to(rgbs[k % sources]).synchronize()
            decoded[0] += 1
            k += 1
            due += period

    if not read_pts:
        nvdec._frame_pts = lambda frame: None  # type: ignore[assignment]  # the probe's variant only
    try:
        th = threading.Thread(target=paced)
        th.start()
        beside = count_for(seconds)
        th.join()
    finally:
        nvdec._frame_pts = real  # type: ignore[assignment]
    for s in srcs:
        s.close()
    lost = max(0.0, 1.0 - beside / alone)
    return {"res": f"{rgbs[0].shape[1]}x{rgbs[0].shape[0]}", "sources": sources, "read_pts": read_pts,
            "frames": decoded[0], "loop_share_lost": round(lost, 3),
            "gil_ms_per_frame": round(lost * seconds * 1e3 / max(decoded[0], 1), 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clip", action="append", required=True)
    ap.add_argument("--sources", type=int, default=8)
    ap.add_argument("--frames", type=int, default=150, help="per source; the clip must be longer")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--gil", action="store_true")
    args = ap.parse_args()
    # Every row under the switch interval tools/bench_streams.py's workers run with (it was set by
    # the --gil probe only, so the thread rows' setting depended on that flag).
    sys.setswitchinterval(0.0005)
    rows = []
    gil = []
    if args.gil:
        for clip in args.clip:
            for read_pts in (True, False):
                g = gil_probe(Path(clip), args.sources, read_pts)
                print(json.dumps(g), flush=True)
                gil.append(g)
    for clip in args.clip:
        for threaded in (False, True):
            row = run(Path(clip), args.sources, args.frames, threaded)
            print(json.dumps(row), flush=True)
            rows.append(row)
    if args.out:
        common = run_fields(gpu_name(), f"python tools/bench_decode_threads.py --sources {args.sources} "
                                        f"--frames {args.frames}")
        args.out.mkdir(parents=True, exist_ok=True)
        recs = [{"metric": f"nvdec_{r['res']}_threads{r['threads']}_frames_per_s", "value": r["frames_per_s"],
                 "unit": "frames/s", "stat": "mean", "config": r, **common} for r in rows]
        recs += [{"metric": f"nvdec_{g['res']}_gil_ms_per_frame{'' if g['read_pts'] else '_no_pts'}",
                  "value": g["gil_ms_per_frame"], "unit": "ms", "stat": "mean", "config": g, **common} for g in gil]
        (args.out / "decode_threads.json").write_text(json.dumps(recs, indent=1) + "\n")
        lines = [f"# NVDEC decode from threads ({common['device']})", "",
                 f"`{common['command']}`, commit {common['commit']}, {common['date']}.", "",
                 "| res | sources | threads | frames/s | host ms/frame: decode call | host ms/frame: convert + wait |",
                 "|---|---|---|---|---|---|"]
        lines += [f"| {r['res']} | {r['sources']} | {r['threads']} | {r['frames_per_s']} | "
                  f"{r.get('host_ms_decode_call', '')} | {r.get('host_ms_convert_and_wait', '')} |" for r in rows]
        if gil:
            lines += ["", "GIL held per decoded frame (a Python loop beside one paced decode thread):", "",
                      "| res | streams at 30 fps | pts read | frames | loop share lost | GIL ms per frame |",
                      "|---|---|---|---|---|---|"]
            lines += [f"| {g['res']} | {g['sources']} | {g['read_pts']} | {g['frames']} | {g['loop_share_lost']} "
                      f"| {g['gil_ms_per_frame']} |" for g in gil]
        (args.out / "decode_threads.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
